"""A slot's lifecycle as data (cutline.runtime.slot_state): no threads, sockets or clocks.

The outcome of every sequence of events is the one the slot's seven flags decided before
(an oracle that replays them), the actions only ever name live subtasks, and the
stuck-thread rule holds: once the attempt is over, no subtask thread is waited for past
the grace (the slot ends, naming the ones that did not return), while a job that stops or
runs on waits for its subtasks as long as they take."""

from __future__ import annotations

import logging
import re
import threading
import time

import pytest
from hypothesis import given, settings, strategies as st

from cutline.runtime.slot_state import (
    GRACE,
    AbandonSubtasks,
    Outcome,
    SlotState,
    StopSubtasks,
    TellDriver,
)

TASKS = ("src.0", "map.0", "sink.0")


def test_a_failure_abandons_the_siblings_and_is_fatal_only_first():
    s = SlotState(TASKS)
    assert s.on_subtask_failed("map.0", True, 1.0) == [AbandonSubtasks(("src.0", "sink.0"))]
    assert s.fatal and s.ending and s.failing
    s.on_subtask_failed("sink.0", False, 1.1)  # a sibling ending badly: no news
    for t in TASKS:
        s.on_subtask_ended(t, 1.2)
    assert s.outcome() is Outcome.FATAL
    # a fatal failure after something was ending is no cause
    s = SlotState(TASKS)
    s.on_stop("attempt 3 lost slot 1", 1.0)
    s.on_subtask_failed("map.0", True, 1.1)
    assert not s.fatal and s.outcome() is Outcome.ABANDONED


def test_the_driver_gone_stops_every_live_subtask():
    s = SlotState(TASKS)
    s.on_subtask_ended("src.0", 0.5)
    assert s.on_connection_lost(1.0) == [StopSubtasks(("map.0", "sink.0"))]
    assert s.on_send_failed(1.1) == [StopSubtasks(("map.0", "sink.0"))]
    assert s.on_driver_silent("the driver went silent", 1.2) == [TellDriver(
        "the driver went silent")]
    for t in TASKS:
        s.on_subtask_ended(t, 1.3)
    assert s.outcome() is Outcome.DRIVER_SILENT


def test_a_stuck_thread_does_not_outlive_its_attempt():
    s = SlotState(TASKS, grace=5.0)
    s.on_subtask_failed("src.0", False, 10.0)
    s.on_subtask_ended("src.0", 10.1)
    s.on_subtask_ended("sink.0", 10.2)
    assert s.next_due(10.2) == 15.0
    s.tick(14.9)
    assert s.stuck == ()
    s.tick(15.0)  # map.0 never returned
    assert s.stuck == ("map.0",) and s.outcome() is Outcome.STUCK
    assert s.next_due(16.0) is None


def test_a_stopping_or_running_job_waits_for_its_subtasks():
    s = SlotState(TASKS)
    assert s.next_due(0.0) is None  # running: as long as it takes
    s.on_stop("", 1.0)  # stop-with-savepoint: subtasks commit, then end
    assert s.ending and s.stopping and s.next_due(1.0) is None
    s.tick(1000.0)
    s.on_connection_lost(1000.0)  # the driver closes it once the job stopped
    s.tick(2000.0)
    assert s.stuck == () and s.next_due(2000.0) is None
    s.on_subtask_failed("sink.0", False, 1001.0)  # a peer going away after a stop
    for t in TASKS:
        s.on_subtask_ended(t, 1001.5)
    assert s.outcome() is Outcome.DONE


# ---------------------------------------------------------------- as data, any sequence

event = st.one_of(
    st.tuples(st.just("failed"), st.sampled_from(TASKS), st.booleans()),
    st.tuples(st.just("stop"), st.sampled_from(["", "attempt 0 lost slot 1"])),
    st.tuples(st.just("lost")),
    st.tuples(st.just("send_failed")),
    st.tuples(st.just("silent"), st.sampled_from(["silent a", "silent b"])),
    st.tuples(st.just("ended"), st.sampled_from(TASKS)),
    st.tuples(st.just("wait"), st.floats(0.0, 4.0)),
)


def oracle(events) -> Outcome:
    """The seven flags of the slot before SlotState, replayed (stuck threads aside)."""
    stopping = ending = failing = fatal = False
    abandoned, driver_silent = "", None
    for e in events:
        if e[0] == "failed":
            fatal = fatal or (e[2] and not ending)
            failing = ending = True
        elif e[0] == "stop":
            if e[1]:
                abandoned = e[1]
            else:
                stopping = True
            ending = True
        elif e[0] == "lost":
            ending = True
        elif e[0] == "silent":
            driver_silent = e[1]
    if driver_silent and not fatal:
        return Outcome.DRIVER_SILENT
    if abandoned and not fatal:
        return Outcome.ABANDONED
    if fatal:
        return Outcome.FATAL
    if failing and not stopping:
        return Outcome.FAILED
    return Outcome.DONE


@settings(max_examples=200, deadline=None)
@given(st.lists(event, max_size=25))
def test_any_sequence_decides_as_the_flags_did_and_never_waits_forever(events):
    s = SlotState(TASKS, grace=GRACE)
    now = 0.0
    over_at = None
    stopping = False
    for e in events:
        kind = e[0]
        alive_before, stuck_before = set(s.alive), s.stuck
        if kind == "failed":
            if e[1] not in s.alive:
                continue  # a thread that returned fails no more
            actions = s.on_subtask_failed(e[1], e[2], now)
        elif kind == "stop":
            actions = s.on_stop(e[1], now)
        elif kind == "lost":
            actions = s.on_connection_lost(now)
        elif kind == "send_failed":
            actions = s.on_send_failed(now)
        elif kind == "silent":
            actions = s.on_driver_silent(e[1], now)
        elif kind == "ended":
            actions = s.on_subtask_ended(e[1], now)
        else:
            now += e[1]
            actions = s.tick(now)
        if over_at is None and (kind in ("failed", "silent", "send_failed")
                                or (kind == "stop" and e[1])
                                or (kind == "lost" and not stopping)):
            over_at = now
        stopping = stopping or (kind == "stop" and not e[1])
        for a in actions:  # only live subtasks are told anything; never the failing one
            if isinstance(a, (AbandonSubtasks, StopSubtasks)):
                assert a.tasks and set(a.tasks) <= alive_before
                if isinstance(a, AbandonSubtasks):
                    assert e[1] not in a.tasks
        # nothing is given up before the grace, or while the attempt is not over; what is
        # given up was running then
        if s.stuck and kind == "wait" and not stuck_before:
            assert over_at is not None and now >= over_at + GRACE
            assert set(s.stuck) == alive_before
    # the join loop ends: past the grace, every thread returned or was given up
    if over_at is not None:
        s.tick(max(now, over_at + GRACE))
        assert s.alive <= set(s.stuck) and s.next_due(now + GRACE) is None
    else:
        assert not s.stuck and s.next_due(now) is None  # running or stopping: waits
    replay = [e for e in events]
    expected = Outcome.STUCK if s.stuck else oracle(_effective(replay))
    assert s.outcome() is expected


def _effective(events):
    """The events as the slot saw them: a failure of a thread that had returned is none."""
    alive, out = set(TASKS), []
    for e in events:
        if e[0] == "failed" and e[1] not in alive:
            continue
        if e[0] == "ended":
            alive.discard(e[1])
        out.append(e)
    return out


# ---------------------------------------------------------------- in a slot, on threads

ENTERED = threading.Event()  # subtask 0's map is inside its call that does not return
RELEASE = threading.Event()  # the test is over: let it return


def stuck_or_bad(x: int) -> int:
    if x == 6:  # subtask 0 reads 0, 2, 4, 6, ...
        ENTERED.set()
        RELEASE.wait(120)
    if x == 5:  # subtask 1 reads 1, 3, 5, ...: fails once subtask 0 is stuck
        ENTERED.wait(30)
        raise ValueError("bad record 5")
    return x


def test_a_stuck_subtask_thread_ends_its_slot_naming_it(tmp_path, caplog):
    """The job fails with the bad record; the slot whose subtask is stuck in user code
    does not wait for it forever once its attempt is over (it did: it waited for a
    failure of its own): it ends, naming the stuck thread.  On Spark that ends the worker
    process (cutline.spark.probe), so the thread cannot outlive its attempt there."""
    from cutline import CheckpointConfig, Pipeline
    from cutline.connectors import CollectSink, GeneratorSource
    from cutline.driver.dataflow import JobFailed

    ENTERED.clear()
    RELEASE.clear()
    p = Pipeline("stuck", parallelism=2, checkpoint=CheckpointConfig(
        interval=0.5, storage=f"file://{tmp_path}/chk"))
    p.source(GeneratorSource(count=100)).map(stuck_or_bad).sink(CollectSink())
    try:
        with caplog.at_level(logging.ERROR, logger="cutline.task"):
            with pytest.raises(JobFailed, match="bad record 5"):
                p.run(engine="threads", timeout=60, progress=False)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and "did not return" not in caplog.text:
                time.sleep(0.1)
    finally:
        RELEASE.set()
    assert ENTERED.is_set()
    assert re.search(r"slot 0: subtask thread\(s\) \S+\.0 did not return within 5 s after "
                     r"the driver is gone: the process that runs them ends", caplog.text), \
        caplog.text


def _stuck_main(spec, k):
    from cutline.runtime.slot_state import StuckSubtasks

    raise StuckSubtasks(f"slot {k}: subtask thread(s) map.{k} did not return", (f"map.{k}",))


def _failing_main(spec, k):
    raise ValueError("bad record")


def test_on_spark_a_stuck_slot_ends_its_worker_process(monkeypatch):
    """The Spark task's wrapper ends the (reused) Python worker on StuckSubtasks; any other
    failure goes to Spark as before."""
    import os

    import pyspark

    from cutline.spark import probe

    class Context:
        @staticmethod
        def get():
            return Context()

        def partitionId(self):
            return 1

    exits = []

    def fake_exit(code):
        exits.append(code)
        raise SystemExit(code)

    monkeypatch.setattr(pyspark, "BarrierTaskContext", Context)
    monkeypatch.setattr(os, "_exit", fake_exit)
    with pytest.raises(SystemExit):
        list(probe.guarded(_stuck_main, None, ())(iter([])))
    assert exits == [70]
    with pytest.raises(ValueError, match="bad record"):
        list(probe.guarded(_failing_main, None, ())(iter([])))
    assert exits == [70]


def test_a_stopping_job_whose_driver_goes_silent_gives_a_stuck_thread_up():
    # stop-with-savepoint, then the driver goes silent and a thread never returns: the slot
    # must not wait for it forever in a reused worker (a review finding)
    s = SlotState(TASKS, grace=5.0)
    s.on_stop("", 1.0)
    assert s.next_due(1.0) is None  # finishing its work: waited for
    s.on_driver_silent("the driver went silent", 2.0)
    s.on_connection_lost(2.1)
    assert s.next_due(2.1) == 7.0
    s.on_subtask_ended(TASKS[0], 3.0)
    s.tick(7.0)
    assert s.stuck == TASKS[1:] and s.outcome() is Outcome.STUCK
    t = SlotState(TASKS, grace=5.0)
    t.on_stop("", 1.0)
    t.on_send_failed(2.0)
    assert t.next_due(2.0) == 7.0
