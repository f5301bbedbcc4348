"""ABS on a cyclic dataflow: alignment never waits on the feedback edge; the records on it
are logged after the snapshot until its barrier returns (Carbone et al., the ABS paper)."""

from collections import Counter

import pytest

from cutline.analysis import check_cut
from cutline.sim import SimProcess, Simulation
from cutline.sim.dataflow import Source


class Head(SimProcess):
    """Iteration head: merges new records and fed-back ones, counts what it saw."""

    def __init__(self):
        self.state = {"seen": 0}

    def on_receive(self, ctx, channel, payload):
        self.state["seen"] += 1
        if channel.startswith("src"):
            key, rid = payload
            payload = (rid, 3)  # iterate three more times
        ctx.send("head->tail", payload)


class Tail(SimProcess):
    """Iteration tail: loops a record back until its rounds are done, then emits it."""

    def __init__(self):
        self.state = {"loops": 0}

    def on_receive(self, ctx, channel, payload):
        rid, rounds = payload
        if rounds > 0:
            self.state["loops"] += 1
            ctx.send("tail->head", (rid, rounds - 1))
        else:
            ctx.send("tail->sink", rid)


class Sink(SimProcess):
    def __init__(self):
        self.state = []

    def on_receive(self, ctx, channel, payload):
        self.state.append(payload)


def world(mode, seed, timeout=None):
    sim = Simulation(mode, seed=seed, delay=(0.05, 0.4), service_time=0.01,
                     aligned_timeout=timeout)
    sim.add_process("src", Source(0, 60, 5, 0.05))
    for name, logic in (("head", Head()), ("tail", Tail()), ("sink", Sink())):
        sim.add_process(name, logic)
    sim.connect("src", "head")
    sim.connect("head", "tail")
    sim.connect("tail", "head", back_edge=True)
    sim.connect("tail", "sink")
    return sim


@pytest.mark.parametrize("mode, timeout", [("aligned", None), ("aligned", 0.05),
                                           ("unaligned", None)])
@pytest.mark.parametrize("seed", range(4))
def test_feedback_loop_restores_exactly_once(mode, timeout, seed):
    ref = world(mode, seed, timeout)
    ref.snapshot_every(0.5, until=60)
    ref.run(until=60)
    expected = Counter(ref.procs["sink"].logic.state)
    assert sum(expected.values()) == 60

    crashed = world(mode, seed, timeout)
    crashed.snapshot_every(0.5, until=60)
    crashed.run(until=2.0)
    assert len(crashed.procs["sink"].logic.state) < 60, "fault never fired"
    last = crashed.latest_completed()
    assert last is not None
    report = check_cut(crashed.trace, last, crashed.procs, crashed.chans)
    assert report.ok, report.explain()

    resumed = world(mode, seed + 100, timeout)
    resumed.restore(last)
    resumed.snapshot_every(0.5, start=2.5, until=60, first_id=last.id + 1)
    resumed.run(until=60)
    assert Counter(resumed.procs["sink"].logic.state) == expected


def test_back_edge_records_are_logged_in_aligned_snapshots():
    logged = 0
    for seed in range(6):
        sim = world("aligned", seed)
        sim.snapshot_every(0.5, until=5)
        sim.run(until=8)
        for snap in sim.completed:
            assert check_cut(sim.trace, snap, sim.procs, sim.chans).ok
            logged += len(snap.channels.get("tail->head", []))
            # forward channels are never recorded in aligned mode
            assert not snap.channels.get("src->head") and not snap.channels.get("head->tail")
    assert logged > 0
