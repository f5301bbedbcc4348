"""The coordinator's decisions as data: feed times and acks, assert the exact commands."""

import heapq
import math

import pytest
from hypothesis import event, given, settings, strategies as st

from cutline.protocol import ProtocolError
from cutline.protocol.coordinator import (
    Abort, AckResult, CheckpointCoordinator, CheckpointPolicy, Complete, FailJob,
    FailureCounter, PendingCheckpoints, Trigger, TriggerPolicy,
)

TASKS = ("src-0", "map-0", "sink-0")


def coord(interval=10.0, *, timeout=100.0, min_pause=0.0, max_concurrent=1, tolerable=0,
          tasks=TASKS, first_id=1):
    policy = CheckpointPolicy(interval, timeout, min_pause, max_concurrent, tolerable)
    return CheckpointCoordinator(policy, tasks, first_id=first_id, started_at=0.0)


def ack_all(c, n, now, tasks=TASKS):
    cmds = []
    for t in tasks:
        cmds += c.on_ack(t, n, now, {"size": 1})
    return cmds


# ---------------------------------------------------------------- policy validation


@pytest.mark.parametrize("kwargs, field", [
    (dict(interval=0), "interval"), (dict(interval=-1), "interval"),
    (dict(interval=math.inf), "interval"), (dict(interval=math.nan), "interval"),
    (dict(interval=1, timeout=0), "timeout"), (dict(interval=1, min_pause=-0.1), "min_pause"),
    (dict(interval=1, max_concurrent=0), "max_concurrent"),
    (dict(interval=1, max_concurrent=1.5), "max_concurrent"),
    (dict(interval=1, tolerable_failures=-1), "tolerable_failures"),
    (dict(interval=1, tolerable_failures=True), "tolerable_failures"),
    (dict(interval="5"), "interval"),
])
def test_policy_validation_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=rf"CheckpointPolicy\.{field} must be"):
        CheckpointPolicy(**kwargs)


def test_policy_defaults_and_infinite_timeout():
    p = CheckpointPolicy(5, timeout=math.inf)
    assert (p.min_pause, p.max_concurrent, p.tolerable_failures) == (0.0, 1, 0)


# ---------------------------------------------------------------- pieces on their own


def test_trigger_policy_interval_min_pause_and_concurrency():
    tp = TriggerPolicy(CheckpointPolicy(10, min_pause=4, max_concurrent=3), started_at=100)
    assert tp.next_due(100) == 110
    assert not tp.should_trigger(109.9) and tp.should_trigger(110)
    tp.triggered(110)
    assert tp.next_due(111, pending=1) is None  # min_pause > 0: nothing while one is in flight
    assert tp.next_due(118, last_completed=117) == 121  # min pause after completion
    assert tp.next_due(118, last_completed=112) == 120  # interval from the last trigger
    assert tp.next_due(130, last_completed=112) == 130  # overdue: due now
    tp2 = TriggerPolicy(CheckpointPolicy(10, max_concurrent=2), started_at=0)
    assert tp2.next_due(0, pending=1) == 10 and tp2.next_due(0, pending=2) is None


def test_pending_checkpoints_bookkeeping():
    pc = PendingCheckpoints(timeout=5)
    pc.start(1, ["a", "b"], now=0)
    assert pc.ack(1, "a", 1, {"x": 1}) == "pending"
    assert pc.ack(1, "a", 1, {"x": 2}) is AckResult.DUPLICATE
    assert pc.get(1).acks == {"a": {"x": 1}}  # the duplicate changed nothing
    assert pc.ack(1, "b", 2, {}) == "complete"
    assert pc.ack(9, "a", 2, {}) is AckResult.UNKNOWN
    with pytest.raises(ProtocolError, match="task 'z' is not part of checkpoint 1"):
        pc.ack(1, "z", 2, {})
    with pytest.raises(ProtocolError, match="already in flight"):
        pc.start(1, ["a"], now=3)
    pc.pop(1)
    pc.start(2, ["a"], now=3)
    pc.start(3, ["a"], now=4)
    assert pc.next_deadline() == 8
    assert [p.checkpoint_id for p in pc.expire(7.99)] == []
    assert [p.checkpoint_id for p in pc.expire(8)] == [2]
    assert pc.decline(3, "a", "boom").checkpoint_id == 3 and len(pc) == 0
    assert pc.decline(3, "a", "again") is None


def test_failure_counter_threshold_reset_and_revoke():
    fc = FailureCounter(tolerable=2)
    assert fc.failure(1, "expired") is None and fc.failure(2, "declined") is None
    fc.success(3)
    assert fc.count == 0
    assert fc.failure(2, "late news about an old one") is None and fc.count == 0
    assert fc.failure(4, "expired") is None
    # 3's _metadata failed after all: 1, 2, 3, 4 failed in a row
    verdict = fc.revoke_success(3, "storage failure: disk full")
    assert fc.count == 4 and verdict.startswith(
        "Exceeded checkpoint tolerable failure threshold (2): 4 consecutive")
    assert "checkpoint 3 storage failure: disk full" in verdict


# ---------------------------------------------------------------- coordinator examples


def test_periodic_trigger_complete_and_first_id():
    c = coord(first_id=8)
    assert c.tick(0) == [] and c.next_due(0) == 10
    assert c.tick(10) == [Trigger(8)]
    assert c.next_due(10) == 110  # max_concurrent=1: only the timeout is due
    assert c.on_ack("src-0", 8, 11, {"size": 3}) == []
    cmds = ack_all(c, 8, 12)
    assert cmds == [Complete(8, {t: {"size": 3 if t == "src-0" else 1} for t in TASKS},
                             False, 10, 12)]
    assert c.latest_completed_id == 8 and c.next_due(12) == 20
    assert c.tick(20) == [Trigger(9)]


def test_started_at_defaults_to_first_call():
    c = CheckpointCoordinator(CheckpointPolicy(5), TASKS)
    assert c.tick(1000.0) == [] and c.next_due(1000.0) == 1005.0


def test_time_must_not_go_backwards():
    c = coord()
    c.tick(5)
    with pytest.raises(ValueError, match="time went backwards"):
        c.tick(4)


def test_timeout_aborts_and_tolerable_zero_fails_the_job():
    c = coord(timeout=3)
    assert c.tick(10) == [Trigger(1)]
    assert c.tick(12.9) == []
    cmds = c.tick(13)
    assert cmds[0] == Abort(1, "expired after 3s (no ack from map-0, sink-0, src-0)")
    assert isinstance(cmds[1], FailJob) and len(cmds) == 2
    assert "Exceeded checkpoint tolerable failure threshold (0)" in cmds[1].reason
    assert "last: checkpoint 1 expired after 3s (no ack from" in cmds[1].reason
    assert c.tick(100) == [] and c.next_due(100) is None and c.on_ack("src-0", 1, 101) == []


def test_ack_at_the_deadline_is_too_late():
    c = coord(timeout=3, tolerable=5)
    c.tick(10)
    ack_all(c, 1, 12, TASKS[:2])
    assert c.on_ack("sink-0", 1, 13) == [Abort(1, "expired after 3s (no ack from sink-0)")]


def test_tolerable_failures_and_reset_by_success():
    c = coord(tolerable=1)
    assert c.tick(10) == [Trigger(1)]
    assert c.on_decline("map-0", 1, "disk full", 11) == [
        Abort(1, "declined by task 'map-0': disk full")]
    assert c.tick(20) == [Trigger(2)]
    assert ack_all(c, 2, 21)[0].checkpoint_id == 2  # success resets the count
    assert c.tick(30) == [Trigger(3)]
    c.on_decline("map-0", 3, "disk full", 31)
    assert c.tick(40) == [Trigger(4)]
    cmds = c.on_decline("sink-0", 4, "cannot pre-commit", 41)
    assert cmds[0] == Abort(4, "declined by task 'sink-0': cannot pre-commit")
    assert cmds[1] == FailJob(
        "Exceeded checkpoint tolerable failure threshold (1): 2 consecutive checkpoint "
        "failures; last: checkpoint 4 declined by task 'sink-0': cannot pre-commit")


def test_late_and_duplicate_acks_are_ignored():
    c = coord(timeout=5, tolerable=9)
    c.tick(10)
    c.tick(15)  # checkpoint 1 expired
    assert c.on_ack("src-0", 1, 16) == []  # late ack of an aborted checkpoint
    c.tick(20)
    assert c.on_ack("src-0", 2, 21) == [] and c.on_ack("src-0", 2, 21) == []
    assert ack_all(c, 2, 22)[0] == Complete(2, {t: {"size": 1} if t != "src-0" else {}
                                                for t in TASKS}, False, 20, 22)
    assert c.on_ack("map-0", 2, 23) == []  # after completion


def test_newer_completion_subsumes_older_pending():
    c = coord(interval=1, max_concurrent=3)
    assert [c.tick(t) for t in (1, 2, 3)] == [[Trigger(1)], [Trigger(2)], [Trigger(3)]]
    cmds = ack_all(c, 2, 3.5)
    assert cmds[0].checkpoint_id == 2 and isinstance(cmds[0], Complete)
    assert cmds[1:] == [Abort(1, "subsumed by checkpoint 2")]
    assert list(c.pending) == [3] and ack_all(c, 1, 3.6) == []  # 1 is gone: late acks ignored


def test_decline_subsumed_by_a_newer_barrier_is_not_a_failure():
    c = coord(interval=1, max_concurrent=2, tolerable=0)
    c.tick(1), c.tick(2)
    assert c.on_decline("map-0", 1, "subsumed by checkpoint 2", 2.5) == [
        Abort(1, "declined by task 'map-0': subsumed by checkpoint 2")]
    assert c.failures.count == 0 and not c.closed


def test_storage_failure_in_flight_and_after_complete():
    c = coord(tolerable=1)
    c.tick(10)
    assert c.on_storage_failure(1, "mkdir failed", 11) == [
        Abort(1, "storage failure: mkdir failed")]
    c.tick(20)
    assert isinstance(ack_all(c, 2, 21)[0], Complete) and c.failures.count == 0
    cmds = c.on_storage_failure(2, "_metadata write failed", 22)
    assert cmds[0] == Abort(2, "storage failure: _metadata write failed")
    assert isinstance(cmds[1], FailJob) and "2 consecutive" in cmds[1].reason
    assert c.latest_completed_id is None


def test_storage_failure_of_an_older_checkpoint_is_ignored():
    c = coord(tolerable=0)
    for k, t in enumerate((10, 20), start=1):
        c.tick(t)
        ack_all(c, k, t + 1)
    assert c.on_storage_failure(1, "late news", 22) == [] and not c.closed


def test_savepoint_ignores_schedule_and_is_not_subsumed():
    c = coord(interval=10, min_pause=5, max_concurrent=1)
    assert c.trigger_savepoint(1) == [Trigger(1, savepoint=True)]
    assert c.tick(10) == []  # the savepoint is in flight, and min_pause > 0
    assert c.trigger_savepoint(11) == [Trigger(2, savepoint=True)]  # ignores max_concurrent
    done = ack_all(c, 2, 12)
    assert done == [Complete(2, {t: {"size": 1} for t in TASKS}, True, 11, 12)]
    assert list(c.pending) == [1]  # a savepoint neither subsumes nor is subsumed
    assert c.latest_completed_id is None and c.last_completed_at is None
    # the interval runs from 0, untouched by savepoints: due already, so the event triggers
    assert ack_all(c, 1, 13) == [Complete(1, {t: {"size": 1} for t in TASKS}, True, 1, 13),
                                 Trigger(3)]


def test_savepoint_failure_is_not_counted():
    c = coord(timeout=2, tolerable=0)
    c.trigger_savepoint(1)
    assert c.tick(3) == [Abort(1, "expired after 2s (no ack from map-0, sink-0, src-0)",
                               savepoint=True)]
    assert not c.closed


def test_shutdown_aborts_in_flight_and_goes_inert():
    c = coord(interval=1, max_concurrent=2)
    c.tick(1), c.tick(2)
    assert c.shutdown("task map-0 failed", 3) == [
        Abort(1, "task map-0 failed"), Abort(2, "task map-0 failed")]
    assert c.tick(10) == [] and c.trigger_savepoint(10) == []


def test_unknown_task_ack_is_a_driver_bug():
    c = coord()
    c.tick(10)
    with pytest.raises(ProtocolError, match="not part of checkpoint 1"):
        c.on_ack("ghost", 1, 11)


# ---------------------------------------------------------------- property: random timings


@st.composite
def setups(draw):
    interval = draw(st.sampled_from([0.5, 1.0, 2.0, 3.0]))
    return dict(
        interval=interval,
        timeout=draw(st.sampled_from([1.0, 2.5, 5.0, 20.0])),
        min_pause=draw(st.sampled_from([0.0, 0.0, 0.7, 2.0])),
        max_concurrent=draw(st.integers(1, 3)),
        tolerable=draw(st.integers(0, 3)),
        tasks=tuple(f"t{i}" for i in range(draw(st.integers(1, 4)))),
    )


@settings(max_examples=300, deadline=None)
@given(setup=setups(), data=st.data())
def test_schedule_invariants_over_random_ack_timings(setup, data):
    """Drive the coordinator like a real driver (tick at next_due, acks after random delays,
    some declines) and check every decision against the policy."""
    tasks = setup.pop("tasks")
    c = coord(tasks=tasks, **setup)
    p = c.policy
    events: list = []  # (time, seq, kind, task, id)
    seq = 0
    now = 0.0
    triggers: list[tuple[float, int]] = []
    started: dict[int, float] = {}
    last_completion = None
    ended: set[int] = set()
    failed = False
    while now < 60 and not failed:
        due = c.next_due(now)
        nxt = math.inf if due is None else due
        if events:
            nxt = min(nxt, events[0][0])
        if nxt == math.inf:
            break
        now = max(now, nxt)
        if events and events[0][0] <= now:
            _, _, kind, task, n = heapq.heappop(events)
            if kind == "ack":
                cmds = c.on_ack(task, n, now, {"by": task})
            else:
                cmds = c.on_decline(task, n, "boom", now)
        else:
            cmds = c.tick(now)
        completed = []
        for cmd in cmds:
            assert not failed, "nothing after FailJob"
            if isinstance(cmd, Trigger):
                assert not cmd.savepoint
                periodic = [n for n in c.pending if n != cmd.checkpoint_id]
                assert len(periodic) < p.max_concurrent
                if p.min_pause > 0:
                    assert not periodic
                    if last_completion is not None:
                        assert now >= last_completion + p.min_pause
                assert now >= (triggers[-1][0] if triggers else 0.0) + p.interval
                triggers.append((now, cmd.checkpoint_id))
                started[cmd.checkpoint_id] = now
                for task in tasks:
                    dice = data.draw(st.integers(0, 19), label="dice")  # 0: decline, 1: late
                    lo, hi = (p.timeout, 2 * p.timeout) if dice == 1 else (0, 0.8 * p.timeout)
                    delay = data.draw(st.floats(lo, hi), label="delay")
                    kind = "decline" if dice == 0 else "ack"
                    seq += 1
                    heapq.heappush(events, (now + delay, seq, kind, task, cmd.checkpoint_id))
            elif isinstance(cmd, Complete):
                n = cmd.checkpoint_id
                assert n not in ended and now < started[n] + p.timeout
                assert set(cmd.stats_by_task) == set(tasks)
                ended.add(n)
                completed.append(n)
                last_completion = now
            elif isinstance(cmd, Abort):
                assert cmd.checkpoint_id not in ended
                ended.add(cmd.checkpoint_id)
                if cmd.reason.startswith("expired"):
                    assert now >= started[cmd.checkpoint_id] + p.timeout
            else:
                assert isinstance(cmd, FailJob)
                assert c.failures.count > p.tolerable_failures
                failed = True
        # a completion ends (subsumes) every older checkpoint in the same call
        assert all(m in ended for n in completed for m in started if m < n)
        assert len(c.pending) <= p.max_concurrent
        # every checkpoint is in flight or ended exactly once; none overstays its timeout
        assert set(c.pending) | ended == set(started) and not set(c.pending) & ended
        assert all(now < started[n] + p.timeout for n in c.pending)
    assert [n for _, n in triggers] == list(range(1, len(triggers) + 1))
    event(f"failed={failed}, completed>0={bool(last_completion)}, triggers>3={len(triggers) > 3}")
    if failed:
        assert not c.pending and c.closed


@settings(max_examples=100, deadline=None)
@given(interval=st.floats(0.1, 10), ack_delay=st.floats(0, 0.09))
def test_fast_acks_trigger_exactly_on_the_interval(interval, ack_delay):
    """No trigger is missed: with quick acks, checkpoint k starts at k * interval."""
    c = coord(interval=interval, timeout=1000)
    now = 0.0
    for k in range(1, 6):
        now = c.next_due(now)
        assert c.tick(now) == [Trigger(k)] and now == pytest.approx(k * interval)
        now += ack_delay * interval
        assert isinstance(ack_all(c, k, now)[-1], Complete)
