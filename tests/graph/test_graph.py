"""Process graphs on the threads engine: the same hosts, TCP channels, driver and storage as
on Spark, without Spark.  Every snapshot of a traced run is judged by the consistent-cut
checker (Dijkstra's colouring of the real trace), not only by the predicates."""

from __future__ import annotations

import collections
from pathlib import Path

import pytest

from cutline.analysis import GlobalState, deadlock
from cutline.graph import (
    GraphSnapshot,
    Process,
    ProcessGraph,
    at_most_one,
    conserved,
    deadlocked,
    invariant,
    load_snapshot,
    terminated,
)
from cutline.graph.cli import load_program
from cutline.driver.dataflow import JobFailed
from graph_programs import BALANCE, Frozen, ledger_graph, ledger_problems

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def example(name: str):
    return load_program(str(EXAMPLES / f"{name}.py"))


def assert_cuts_exact(result) -> None:
    reports = result.check_cuts()
    assert reports, "no snapshot to check"
    bad = [r.explain() for r in reports.values() if not r.ok]
    assert not bad, bad[0]


# ---------------------------------------------------------------------- predicates


def snap(states, channels, passive=None) -> GraphSnapshot:
    return GraphSnapshot(1, states, channels, passive or {p: True for p in states})


def test_predicates_on_a_hand_made_snapshot():
    s = snap({"a": 3, "b": 4}, {("a", "b"): [2, 1], ("b", "a"): []})
    assert conserved(10).evaluate(s).holds
    c = conserved(7).evaluate(s)
    assert c.violated and "10 = 7 + 3 in transit" in c.detail
    assert at_most_one(lambda v: v > 3).evaluate(s).holds
    two = at_most_one(lambda v: v > 3, message=lambda m: m == 2).evaluate(s)
    assert not two.holds and "in transit on a->b" in two.detail
    assert not terminated().evaluate(s).holds  # messages in transit
    assert terminated().evaluate(snap({"a": 0}, {}, {"a": True})).detected
    assert not terminated().evaluate(snap({"a": 0}, {}, {"a": False})).holds
    broken = invariant(lambda s: 1 / 0, name="broken").evaluate(s)
    assert broken.violated and "ZeroDivisionError" in broken.detail


def test_deadlock_needs_a_cycle_of_passive_processes_and_empty_answers():
    waits = {"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"], "e": []}
    gs = GlobalState(waits, {})
    assert deadlock(gs, lambda w: w) == ["a", "b", "c", "d"]  # d waits on the cycle
    # an answer in transit from b to a may release a: no deadlock claimed
    assert deadlock(GlobalState(waits, {"b->a": ["fork"]}), lambda w: w) == []
    assert deadlock(GlobalState({"a": ["b"], "b": []}, {}), lambda w: w) == []
    s = snap(waits, {}, {p: p != "c" for p in waits})  # c has a timer: it can give up
    assert not deadlocked(lambda w: w).evaluate(s).holds


# ---------------------------------------------------------------------- runs


def test_bank_every_snapshot_conserves_and_is_a_consistent_cut(tmp_path):
    g = ledger_graph(6, 80)
    result = g.run(engine="threads", tasks=3, snapshot_interval=0.03, initiators=2,
                   storage=f"file://{tmp_path}", trace=True, seed=3, timeout=60)
    assert result.stopped == "terminated"
    assert len(result.snapshots) >= 5
    assert not result.violations
    assert any(s.in_transit for s in result.snapshots), "no snapshot caught money in transit"
    assert_cuts_exact(result)
    final = result.stopped_by
    assert final.terminated and final.states == result.final_states
    assert sum(s["balance"] for s in final.states.values()) == 6 * BALANCE
    assert not ledger_problems(final.states)
    # every snapshot is stored, with its checks, and reads back identically
    stored = load_snapshot(final.path)
    assert stored.states == final.states and stored.checks == final.checks


def test_snapshots_initiated_by_processes_mid_batch_and_by_the_driver_at_once(tmp_path):
    g = ledger_graph(5, 100, 0.002, initiate=0.05)
    result = g.run(engine="threads", tasks=2, snapshot_interval=0.02, initiators=3,
                   max_concurrent=3, storage=f"file://{tmp_path}", trace=True, timeout=60)
    by_process = [s for s in result.snapshots if not s.by_driver]
    assert len(result.snapshots) >= 10 and by_process
    assert all(len(s.initiators) == 3 for s in result.snapshots if s.by_driver)
    assert len({s.id for s in result.snapshots}) == len(result.snapshots)
    spans = sorted((s.started, s.completed) for s in result.snapshots)
    overlap = any(b[0] < a[1] for a, b in zip(spans, spans[1:]))
    assert overlap, "no two snapshots were in flight at once"
    assert not result.violations
    assert_cuts_exact(result)


def test_restore_redelivers_messages_in_transit_exactly_once(tmp_path):
    """Restore a stored snapshot into accounts that make no more transfers: every account
    ends with exactly its recorded balance plus the transfers recorded in transit to it."""
    source = None
    for attempt in range(5):
        g = ledger_graph(6, 80, 0.002)
        result = g.run(engine="threads", tasks=2, snapshot_interval=0.02,
                       storage=f"file://{tmp_path}/run{attempt}", timeout=60)
        busy = [s for s in result.snapshots if s.in_transit >= 2 and s.path]
        if busy:
            source = busy[-1]
            break
    assert source is not None, "no stored snapshot had messages in transit"
    frozen = ledger_graph(6, 80, 0.002, cls=Frozen)
    again = frozen.run(engine="threads", tasks=3, snapshot_interval=0.02,
                       restore_from=source.path, storage=f"file://{tmp_path}/restored",
                       trace=True, timeout=60)
    assert again.stopped == "terminated" and again.restored_from == source.path
    expected = {a: s["balance"] for a, s in source.states.items()}
    seen = {a: collections.Counter(map(tuple, s["seen"])) for a, s in source.states.items()}
    for (_src, dst), msgs in source.channels.items():
        for sender, seq, amount in msgs:
            expected[dst] += amount
            seen[dst][(sender, seq)] += 1
    got = {a: s["balance"] for a, s in again.final_states.items()}
    assert got == expected
    assert {a: collections.Counter(map(tuple, s["seen"]))
            for a, s in again.final_states.items()} == seen
    assert sum(got.values()) == 6 * BALANCE
    assert again.delivered == source.in_transit  # nothing else moved
    assert_cuts_exact(again)  # re-delivered messages read as sent before the run


def test_restore_then_continue_loses_and_duplicates_nothing(tmp_path):
    g = ledger_graph(5, 60, 0.002)
    first = g.run(engine="threads", tasks=2, snapshot_interval=0.01,
                  storage=f"file://{tmp_path}", timeout=60)
    running = [s for s in first.snapshots if any(v["left"] for v in s.states.values())]
    mid = max(running, key=lambda s: s.in_transit)  # preferably with messages in transit
    again = ledger_graph(5, 60, 0.002).run(engine="threads", tasks=2, restore_from=mid.path,
                                            snapshot_interval=0.01, trace=True,
                                            storage=f"file://{tmp_path}", timeout=60)
    assert again.stopped == "terminated"
    assert min(s.id for s in again.snapshots) > max(s.id for s in first.snapshots)
    assert not again.violations
    assert not ledger_problems(again.final_states)
    # FIFO across the restore: a channel's re-delivered messages (negative ids, in their
    # recorded order) are received before any sent in this run, so its received ids rise
    received = collections.defaultdict(list)
    for e in again.trace:
        if e.kind == "recv":
            received[e.channel].append(e.message)
    assert all(ids == sorted(ids) for ids in received.values())
    assert_cuts_exact(again)  # ids of re-delivered and new messages kept apart


def test_termination_is_never_detected_early():
    build = example("diffusing")
    for seed in range(3):
        result = build(processes=8, budget=8, work=0.01).run(
            engine="threads", tasks=2, snapshot_interval=0.02, trace=True, seed=seed,
            timeout=60)
        end = result.stopped_by
        assert result.stopped == "terminated" and end.terminated
        # nothing happened after the detecting cut: it holds every event of the run
        events = collections.Counter(e.process for e in result.trace
                                     if e.kind in ("send", "recv"))
        everything = {p: events.get(p, 0) for p in result.names}
        assert end.states == result.final_states
        assert sum(s["done"] for s in end.states.values()) > 8
        # any snapshot that shows termination holds every event of the run in its cut:
        # nothing happened after it (another one in flight may see it too, never earlier)
        assert all(s.cut == everything for s in result.snapshots if s.terminated)
        assert any(s.cut != everything for s in result.snapshots)
        assert not result.violations
        assert_cuts_exact(result)


def test_deadlock_is_detected_and_is_real():
    build = example("deadlock")
    result = build(philosophers=4, think=0.0, eat=0.005).run(
        engine="threads", tasks=2, snapshot_interval=0.02, timeout=60)
    assert result.stopped == "deadlock detected"
    end = result.stopped_by
    assert all(s["waiting_for"] for s in end.states.values())
    assert end.states == result.final_states  # stuck for good: nothing moved after
    polite = build(philosophers=4, think=0.0, eat=0.005, meals=5, polite=True).run(
        engine="threads", tasks=2, snapshot_interval=0.02, timeout=60)
    assert polite.stopped == "terminated"
    assert not [c for _, c in polite.detections if c.name == "deadlock"]


def test_token_ring_mutual_exclusion_on_every_snapshot():
    build = example("token_ring")
    result = build(processes=5, rounds=20, hold=0.002).run(
        engine="threads", tasks=2, snapshot_interval=0.004, initiators=2, trace=True,
        timeout=60)
    assert result.stopped == "terminated"
    assert not result.violations
    assert any(s.in_transit for s in result.snapshots), "the token was never caught moving"
    assert any(len(s.initiators) == 1 and s.initiators[0] == "P4" for s in result.snapshots)
    assert_cuts_exact(result)


class Source(Process):
    def __init__(self, n: int) -> None:
        self.state, self.n = 0, n

    def on_start(self, ctx) -> None:
        ctx.schedule(0.0)

    def on_timer(self, ctx, tag) -> None:
        if self.state < self.n:
            ctx.send(ctx.outputs[0], 1)
            self.state += 1
            ctx.schedule(0.001)


class Sink(Process):
    def __init__(self) -> None:
        self.state = 0

    def on_message(self, ctx, sender, msg) -> None:
        self.state += msg


def test_a_dag_where_markers_cannot_reach_everyone(tmp_path):
    """The initiator is the sink: the driver also triggers the processes no marker reaches."""
    g = ProcessGraph("dag")
    g.add("s1", Source(50))
    g.add("s2", Source(50))
    g.add("sink", Sink())
    g.connect("s1", "sink")
    g.connect("s2", "sink")
    g.check(invariant(lambda s: s.states["sink"] + s.in_transit
                      == s.states["s1"] + s.states["s2"], name="nothing lost"))
    result = g.run(engine="threads", tasks=2, snapshot_interval=0.01, initiators=["sink"],
                   storage=f"file://{tmp_path}", trace=True, timeout=60)
    assert result.stopped == "terminated"
    assert len(result.snapshots) >= 3 and not result.violations
    assert result.stopped_by.states == {"s1": 50, "s2": 50, "sink": 100}
    assert_cuts_exact(result)


class Boom(Process):
    def on_start(self, ctx) -> None:
        ctx.send(ctx.outputs[0], "x")

    def on_message(self, ctx, sender, msg) -> None:
        raise KeyError("no such account")


def test_a_process_that_raises_fails_the_run_naming_it():
    g = ProcessGraph("boom")
    g.add("a", Boom())
    g.add("b", Boom())
    g.connect_both("a", "b")
    with pytest.raises(JobFailed, match=r"process [ab]: on_message from [ab] raised KeyError"):
        g.run(engine="threads", tasks=2, timeout=30)


def test_bad_graphs_and_options_are_refused(tmp_path):
    g = ProcessGraph("g")
    with pytest.raises(ValueError, match="process name"):
        g.add("a/b", Process())
    g.add("a", Process())
    with pytest.raises(ValueError, match="unknown process 'x'"):
        g.connect("a", "x")
    with pytest.raises(ValueError, match="itself"):
        g.connect("a", "a")
    with pytest.raises(ValueError, match="snapshot_interval"):
        g.run(engine="threads", snapshot_interval=0)
    with pytest.raises(ValueError, match="unknown initiator"):
        g.run(engine="threads", initiators=["zz"])
    first = ledger_graph(3, 5).run(engine="threads", tasks=1, snapshot_interval=0.01,
                                   storage=f"file://{tmp_path}", timeout=30)
    with pytest.raises(ValueError, match="does not fit graph"):
        ledger_graph(4, 5).run(engine="threads", restore_from=first.snapshots[0].path)


def test_one_host_and_many_hosts_agree():
    for tasks in (1, 4):
        result = ledger_graph(6, 40, 0.002).run(engine="threads", tasks=tasks,
                                                snapshot_interval=0.02, trace=True, timeout=60)
        assert result.stopped == "terminated" and not result.violations
        assert not ledger_problems(result.final_states)
        assert_cuts_exact(result)
