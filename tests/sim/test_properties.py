"""Property tests in the simulator: random graphs, schedules, initiators and failures.

The oracles are the consistent-cut checker (Dijkstra's colouring), token conservation,
and, for the dataflow modes, the output of a failure-free run.
"""

import random
from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cutline.analysis import GlobalState, check_cut, total
from cutline.sim import Simulation
from cutline.sim.dataflow import build_dag
from cutline.sim.graphs import random_dag, strongly_connected
from cutline.sim.scenarios import tokens

SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(n=st.integers(2, 8), seed=st.integers(0, 2**31), initiators=st.integers(1, 3),
       count=st.integers(1, 4), spacing=st.floats(0.1, 4.0))
def test_chandy_lamport_snapshots_are_consistent_and_conserve_tokens(
        n, seed, initiators, count, spacing):
    sim = tokens.build(processes=n, tokens=50, seed=seed, period=0.7)
    rng = random.Random(seed)
    names = list(sim.procs)
    for k in range(1, count + 1):
        t0 = 1.0 + k * spacing  # small spacing: several snapshots in flight at once
        for who in rng.sample(names, min(initiators, n)):
            sim.snapshot_at(t0 + rng.uniform(0, 1.5), k, [who])
    sim.run(until=40.0)
    assert len(sim.completed) == count  # strongly connected: every snapshot completes
    for snap in sim.completed:
        report = check_cut(sim.trace, snap, sim.procs, sim.chans)
        assert report.ok, report.explain()
        assert total(GlobalState.of(snap)) == n * 50


@SETTINGS
@given(n=st.integers(2, 6), seed=st.integers(0, 2**31), at=st.floats(2.0, 15.0))
def test_restoring_a_chandy_lamport_snapshot_redelivers_in_transit_tokens_once(n, seed, at):
    sim = tokens.build(processes=n, tokens=30, seed=seed)
    sim.snapshot_at(at, 1, [list(sim.procs)[0]])
    sim.run(until=at + 10)
    snap = sim.snapshots[1]
    again = tokens.build(processes=n, tokens=30, seed=seed + 1, graph_seed=seed)
    again.restore(snap)
    again.snapshot_at(5.0, 2, [list(again.procs)[-1]])
    again.run(until=30)
    later = again.snapshots[2]
    assert later.complete
    assert check_cut(again.trace, later, again.procs, again.chans).ok
    assert total(GlobalState.of(later)) == n * 30


def _slow_banks(n: int, seed: int, graph_seed: int) -> Simulation:
    """Tokens on a strongly connected graph, where taking a message costs time: inboxes
    queue, so a restored channel state is still waiting when new messages arrive."""
    sim = Simulation("chandy_lamport", seed=seed, delay=(0.1, 1.0), service_time=0.3,
                     batch_size=1)
    names = [f"P{i + 1}" for i in range(n)]
    for name in names:
        sim.add_process(name, tokens.Bank(30, 0.5))
    for a, b in strongly_connected(n, random.Random(graph_seed)):
        sim.connect(names[a], names[b])
    return sim


@settings(SETTINGS, max_examples=25)
@given(n=st.integers(2, 5), seed=st.integers(0, 2**31), at=st.floats(2.0, 6.0),
       later=st.lists(st.floats(0.0, 4.0), min_size=1, max_size=3))
def test_a_restored_channel_state_is_received_before_anything_sent_after_the_restore(
        n, seed, at, later):
    sim = _slow_banks(n, seed, seed)
    sim.snapshot_at(at, 1, [list(sim.procs)[0]])
    sim.run(until=at + 10)
    snap = sim.snapshots[1]
    again = _slow_banks(n, seed + 1, seed)
    again.restore(snap)
    for k, t in enumerate(sorted(later), start=2):  # early: restored messages still queued
        again.snapshot_at(t, k, [list(again.procs)[k % n]])
    again.run(until=10)
    # FIFO across the restore: the restore numbers the recorded messages first, in channel
    # order, so on every channel the received ids rise
    received: dict[str, list[int]] = {}
    for e in again.trace:
        if e.kind == "recv":
            received.setdefault(e.channel, []).append(e.message)
    assert all(ids == sorted(ids) for ids in received.values()), received
    sent = {e.message for e in again.trace if e.kind == "send"}
    redelivered = {c: [i for i in ids if i not in sent] for c, ids in received.items()}
    assert {c: len(ids) for c, ids in redelivered.items() if ids} == {
        c: len(ms) for c, ms in snap.channels.items() if ms}
    for later_snap in again.completed:  # exact although they hold old and new messages
        report = check_cut(again.trace, later_snap, again.procs, again.chans)
        assert report.ok, report.explain()
        assert total(GlobalState.of(later_snap)) == n * 30


def _dataflow(edges, mode, timeout, seed, interval=0.8):
    sim = Simulation(mode, seed=seed, delay=(0.05, 0.5), aligned_timeout=timeout,
                     service_time=0.01)
    build_dag(sim, edges)
    return sim


def _outputs(sim):
    out = Counter()
    counts = {}
    for name, p in sim.procs.items():
        if p.inputs:
            out.update(p.logic.state["out"])
            counts[name] = dict(p.logic.state["counts"])
    return out, counts


MODES = [("aligned", None), ("aligned", 0.1), ("unaligned", None), ("at_least_once", None)]


@SETTINGS
@given(layers=st.lists(st.integers(1, 3), min_size=2, max_size=4), seed=st.integers(0, 2**31),
       mode=st.sampled_from(MODES), fail=st.floats(0.1, 0.9))
def test_restore_and_replay_gives_the_failure_free_output(layers, seed, mode, fail):
    edges = random_dag(layers, random.Random(seed))
    name, timeout = mode
    reference = _dataflow(edges, name, timeout, seed)
    reference.snapshot_every(0.8, until=200)
    reference.run()
    expected, expected_counts = _outputs(reference)
    end = max(e.time for e in reference.trace if e.kind in ("send", "recv"))

    crashed = _dataflow(edges, name, timeout, seed)
    crashed.snapshot_every(0.8, until=200)
    crashed.run(until=fail * end)
    assert sum(_outputs(crashed)[0].values()) < sum(expected.values()), "fault never fired"
    last = crashed.latest_completed()
    for snap in crashed.completed:
        report = check_cut(crashed.trace, snap, crashed.procs, crashed.chans)
        if name != "at_least_once":
            assert report.ok, report.explain()
    resumed = _dataflow(edges, name, timeout, seed + 7)
    first = 1
    if last is not None:
        resumed.restore(last)
        first = last.id + 1
    resumed.snapshot_every(0.8, until=200, first_id=first)
    resumed.run()
    got, got_counts = _outputs(resumed)
    assert not expected - got, "records lost"  # no loss in any mode
    if name != "at_least_once":
        assert got == expected  # exactly once: same records, each once
        assert got_counts == expected_counts  # and the same operator state


def test_restore_refuses_a_snapshot_of_another_graph():
    import pytest
    sim = tokens.build(processes=3, tokens=5, seed=0)
    sim.snapshot_at(2.0, 1, ["P1"])
    sim.run(until=20)
    other = Simulation("chandy_lamport")
    for p in ("P1", "P2", "P3"):
        other.add_process(p, tokens.Bank(5, 1.0))
    other.connect("P1", "P2")
    with pytest.raises(ValueError, match="channels this world lacks"):
        other.restore(sim.snapshots[1])
