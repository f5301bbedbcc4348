"""The recovery watchdog as data: a lost task ends its attempt, and a job whose stage Spark
does not restart (or start: its own deadline) in time is resubmitted a bounded number of
times, then fails saying why.
No sockets, threads or Spark (the Spark cases are in tests/spark/test_cluster_daemon.py)."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from cutline.protocol import messages as m
from cutline.protocol.coordinator import CheckpointPolicy
from cutline.protocol.job import (
    CommitCheckpoint,
    Done,
    DoneCause,
    JobController,
    Resubmit,
    Send,
)

from test_job_controller import SHAPE, TASKS, ack_all, register, sent

LIMIT = 10.0


def controller(restart_timeout: float | None = LIMIT, resubmits: int = 2,
               start_timeout: float | None = None) -> JobController:
    c = JobController(SHAPE, CheckpointPolicy(interval=1.0), job="j", restore=None,
                      first_id=5, restart_timeout=restart_timeout, resubmits=resubmits,
                      start_timeout=start_timeout)
    c.on_submitted(0.0)
    return c


def test_a_lost_task_stops_the_rest_of_its_attempt_once():
    c = controller()
    register(c, 0)
    assert sent(c.tick(1.0), m.Trigger)
    cmds = c.on_closed("a0s1", 1.5)
    # the survivor is told to stop now: Spark may not be able to (its daemon is gone)
    assert cmds == [Send("a0s0", m.Stop(abandoned="attempt 0 lost slot 1"))]
    assert c.attempt.lost and c.waiting_for == "attempt 0 lost slot 1"
    assert c.on_closed("a0s0", 1.6) == []  # the survivor ending is no news
    # what the lost attempt still says is stale; no checkpoint is triggered into it
    assert c.on_message("a0s0", m.Ack("src.0", 5, m.SnapshotStats()), 1.7) == []
    assert c.on_message("a0s0", m.Finished("src.0", 0.1), 1.7) == [] and not c.finished
    assert c.tick(5.0) == []
    # Spark restarts the stage in time: the next attempt starts, no resubmission
    cmds = register(c, 1, 6.0)
    assert [conn for conn, _ in sent(cmds, m.Start)] == ["a1s0", "a1s1"]
    assert c.attempt.number == 1 and c.waiting_since is None
    assert not [x for x in c.tick(100.0) if type(x) is Resubmit]


def test_a_slot_that_finished_closing_is_no_loss():
    c = controller()
    register(c, 0)
    for t in ("src.1", "sink.1"):
        c.on_message("a0s1", m.Finished(t, 0.1), 1.0)
    assert c.on_closed("a0s1", 1.1) == [] and not c.attempt.lost


def test_no_new_attempt_in_time_resubmits_twice_then_fails_with_the_reason():
    c = controller()
    register(c, 0)
    c.on_closed("a0s0", 2.0)
    assert c.tick(2.0 + LIMIT - 0.1) == []
    cmds = c.tick(2.0 + LIMIT)
    # attempt 0's survivor was told to stop when it was lost: no second Stop
    assert [type(x) for x in cmds] == [Resubmit]
    assert "resubmitting it (1 of 2)" in cmds[-1].reason
    # the resubmitted stage registers only one slot: still no attempt
    c.on_message("b1s0", m.Register(0, 9, {"src.0": None, "sink.0": None}), 13.0)
    cmds = c.tick(2.0 + 2 * LIMIT)
    assert type(cmds[0].msg) is m.Stop and cmds[0].msg.abandoned
    assert cmds[0].conn == "b1s0" and "(2 of 2)" in cmds[1].reason
    assert c.attempt.lost  # the half-registered attempt is over
    cmds = c.tick(2.0 + 3 * LIMIT)
    assert cmds == [Done(
        DoneCause.NO_ATTEMPT,
        "no attempt of the stage started within 10 s after attempt 0 lost slot 0, nor "
        "after the driver resubmitted it 2 times (the stage needs 2 free task slots at "
        "once: is capacity missing, or a task Spark cannot end holding one?)")]
    assert c.done and c.tick(1000.0) == []


def test_the_first_attempt_is_watched_too_and_progress_resets_the_count():
    c = controller(resubmits=1)
    (x,) = c.tick(LIMIT)
    assert type(x) is Resubmit and "after the stage was submitted" in x.reason
    register(c, 1, LIMIT + 1)
    c.tick(LIMIT + 2)
    cmds = ack_all(c, 5, LIMIT + 2.5, conn_of=lambda t: f"a1s{SHAPE.slot_of[t]}")
    (commit,) = [x for x in cmds if type(x) is CommitCheckpoint]
    c.committed(5, "/s/chk-5", LIMIT + 3)
    assert c.resubmits == 0
    c.on_closed("a1s1", 20.0)
    assert type(c.tick(20.0 + LIMIT)[-1]) is Resubmit  # one more try after progress
    cmds = register(c, 2, 31.0)
    assert {msg.restore for _, msg in sent(cmds, m.Start)} == {"/s/chk-5"}


def test_a_slow_start_has_its_own_deadline():
    """A first attempt slower than the restart deadline (executors launching on a busy
    cluster) is no failure: the start is watched by ``start_timeout``, each loss after it
    by ``restart_timeout``."""
    c = controller(start_timeout=6 * LIMIT)
    assert c.tick(6 * LIMIT - 0.1) == []  # well past restart_timeout: still waiting
    register(c, 0, 6 * LIMIT - 0.1)
    assert c.attempt.started and c.resubmitted == 0
    c.on_closed("a0s1", 100.0)
    assert c.tick(100.0 + LIMIT - 0.1) == []
    (x,) = c.tick(100.0 + LIMIT)  # a restart gets restart_timeout, not the start's
    assert x == Resubmit("no attempt of the stage started within 10 s after attempt 0 lost "
                         "slot 1: resubmitting it (1 of 2)")
    # a start that never comes: each resubmission waits start_timeout again, then it fails
    c = controller(start_timeout=6 * LIMIT)
    assert [type(x) for x in c.tick(6 * LIMIT)] == [Resubmit]
    assert c.tick(12 * LIMIT - 0.1) == [] and type(c.tick(12 * LIMIT)[0]) is Resubmit
    assert c.tick(18 * LIMIT) == [Done(
        DoneCause.NO_ATTEMPT,
        "no attempt of the stage started within 60 s after the stage was submitted, nor after "
        "the driver resubmitted it 2 times (the stage needs 2 free task slots at once: is "
        "capacity missing, or a task Spark cannot end holding one?)")]


def test_a_stage_that_ends_after_a_loss_is_resubmitted_not_failed():
    c = controller()
    register(c, 0)
    c.on_closed("a0s1", 1.0)
    (x,) = c.on_stage_ended(2.0)
    assert x == Resubmit("the Spark stage ended after attempt 0 lost slot 1: resubmitting "
                         "it (1 of 2)")
    assert not c.done and c.resubmitted == 1
    register(c, 1, 3.0)
    assert c.attempt.started and c.waiting_since is None
    # without a loss, a stage that ended early fails the job as before
    (done,) = c.on_stage_ended(4.0)
    assert type(done) is Done and done.cause is DoneCause.STAGE_ENDED


def test_without_a_deadline_it_waits_for_spark():
    c = controller(restart_timeout=None)
    register(c, 0)
    c.on_closed("a0s1", 1.0)
    assert c.tick(1e9) == [] and not c.done


TICK = 6.0  # the longest step between two of the driver's ticks here
EVENTS = st.lists(st.one_of(
    st.tuples(st.just("tick"), st.floats(0.0, TICK)),
    st.tuples(st.just("lose"), st.sampled_from([0, 1])),
    st.tuples(st.just("register"), st.sampled_from([0, 1])),
    st.tuples(st.just("checkpoint"), st.none()),
), max_size=50)


@settings(max_examples=300, deadline=None)
@given(EVENTS)
def test_the_job_never_waits_for_an_attempt_longer_than_its_deadlines(events):
    """Whatever Spark does: a Resubmit comes only while no attempt runs, at most
    ``resubmits`` in a row without progress; Done comes once; and the job is never left
    without a running attempt for longer than (resubmits + 1) deadlines: it runs, or it
    failed saying why.  Each deadline is seen at the first tick after it, up to a tick late."""
    limit, start, most = 5.0, 8.0, 2
    c = controller(restart_timeout=limit, resubmits=most, start_timeout=start)
    now, conn_n, idle_since = 0.0, 0, 0.0
    in_a_row = done = 0
    for kind, arg in events:
        running = c.attempt.started and not c.attempt.lost
        cmds: list = []
        if kind == "tick":
            now += arg
            cmds = c.tick(now)
        elif kind == "lose" and arg in c.attempt.conns:
            cmds = c.on_closed(c.attempt.conns[arg], now)
        elif kind == "register":
            conn_n += 1
            cmds = c.on_message(f"c{conn_n}", m.Register(
                arg, conn_n, {t: None for t in TASKS if SHAPE.slot_of[t] == arg}), now)
        elif kind == "checkpoint" and running and c.coordinator is not None:
            now += 1.0
            cmds = c.tick(now)
            conns = dict(c.attempt.conns)
            for n in list(c.coordinator.pending):
                cmds += ack_all(c, n, now, conn_of=lambda t, conns=conns: conns[SHAPE.slot_of[t]])
        for cmd in cmds:
            if type(cmd) is Resubmit:
                assert not running, "resubmitted a running attempt"
                in_a_row += 1
                assert in_a_row <= most
            elif type(cmd) is CommitCheckpoint:
                c.committed(cmd.checkpoint_id, f"/s/chk-{cmd.checkpoint_id}", now)
                in_a_row = 0
            elif type(cmd) is Done:
                done += 1
        assert done <= 1
        if c.done:
            assert c.error and "no attempt of the stage started" in c.error
            break
        if c.attempt.started and not c.attempt.lost:
            idle_since = now
        else:
            # the start is watched by its own deadline, every restart by restart_timeout;
            # each of the (most + 1) deadlines seen up to a tick late; a checkpoint step 1 s
            deadline = start if c.started_attempts == 0 else limit
            assert now - idle_since <= (most + 1) * (deadline + TICK) + 1.0 + 1e-9
