"""The job controller as data: events in, commands out; no sockets, threads or Spark."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from cutline.protocol import messages as m
from cutline.protocol.coordinator import CheckpointPolicy
from cutline.protocol.job import (
    CommitCheckpoint,
    Done,
    DoneCause,
    JobController,
    JobShape,
    SavepointFailed,
    SavepointReady,
    Send,
)

# two slots: slot 0 hosts src.0 and sink.0, slot 1 hosts src.1 and sink.1
TASKS = ("src.0", "src.1", "sink.0", "sink.1")
SHAPE = JobShape(tasks=TASKS, sources=frozenset({"src.0", "src.1"}),
                 slot_of={"src.0": 0, "sink.0": 0, "src.1": 1, "sink.1": 1}, slots=2)


def controller(interval: float = 1.0, restore: str | None = None, **kw) -> JobController:
    return JobController(SHAPE, CheckpointPolicy(interval=interval, **kw), job="j",
                         restore=restore, first_id=5)


def register(c: JobController, attempt: int, now: float = 0.0) -> list:
    cmds = []
    for slot in (0, 1):
        tasks = [t for t in TASKS if SHAPE.slot_of[t] == slot]
        cmds += c.on_message(f"a{attempt}s{slot}", m.Register(slot, 100 + slot,
                                                             {t: None for t in tasks}), now)
    return cmds


def sent(cmds, kind=None) -> list[tuple]:
    return [(c.conn, c.msg) for c in cmds if type(c) is Send
            and (kind is None or type(c.msg) is kind)]


def ack_all(c: JobController, n: int, now: float, conn_of=lambda t: f"a0s{SHAPE.slot_of[t]}"):
    cmds = []
    for t in TASKS:
        cmds += c.on_message(conn_of(t), m.Ack(t, n, m.SnapshotStats(bytes=1)), now)
    return cmds


def test_an_attempt_starts_when_every_slot_registered():
    c = controller(restore="/ckpt/chk-4")
    cmds = c.on_message("a0s0", m.Register(0, 1, {"src.0": ["h", 1], "sink.0": None}), 0.0)
    assert cmds == [] and not c.attempt.started
    cmds = c.on_message("a0s1", m.Register(1, 2, {"src.1": None, "sink.1": ["h", 2]}), 0.0)
    starts = sent(cmds, m.Start)
    assert [conn for conn, _ in starts] == ["a0s0", "a0s1"]
    assert starts[0][1] == m.Start(0, {"src.0": ["h", 1], "sink.0": None, "src.1": None,
                                       "sink.1": ["h", 2]}, "/ckpt/chk-4")
    assert c.restored_from == "/ckpt/chk-4" and c.started_attempts == 1


def test_a_checkpoint_is_triggered_at_the_sources_committed_then_completed():
    c = controller(interval=1.0)
    register(c, 0)
    assert c.tick(0.5) == []
    cmds = c.tick(1.0)
    assert sent(cmds) == [("a0s0", m.Trigger(5, "src.0")), ("a0s1", m.Trigger(5, "src.1"))]
    cmds = ack_all(c, 5, 1.2)
    commits = [x for x in cmds if type(x) is CommitCheckpoint]
    assert [x.checkpoint_id for x in commits] == [5] and set(commits[0].states) == set(TASKS)
    assert sent(cmds, m.Complete) == []  # not before _metadata is written
    cmds = c.committed(5, "/s/chk-5", 1.3)
    assert sent(cmds) == [("a0s0", m.Complete(5, False)), ("a0s1", m.Complete(5, False))]
    assert [r.id for r in c.checkpoints] == [5] and c.checkpoints[0].bytes == 4


def test_a_failed_commit_is_no_checkpoint():
    c = controller(interval=1.0, tolerable_failures=0)
    register(c, 0)
    c.tick(1.0)
    ack_all(c, 5, 1.1)
    cmds = c.commit_failed(5, "disk full", 1.2)
    assert Done(DoneCause.CHECKPOINTS_FAILED,
                "Exceeded checkpoint tolerable failure threshold (0): 1 consecutive "
                "checkpoint failures; last: checkpoint 5 storage failure: disk full") in cmds
    assert c.checkpoints == [] and c.done


def test_a_bounded_job_ends_with_a_final_checkpoint_at_every_task():
    c = controller(interval=100.0)
    register(c, 0)
    cmds = []
    for t in TASKS:
        cmds += c.on_message(f"a0s{SHAPE.slot_of[t]}", m.Drained(t), 1.0)
    assert sorted(msg.task for _, msg in sent(cmds, m.Trigger)) == sorted(TASKS)
    ack_all(c, 5, 1.1)
    assert sent(c.committed(5, "/s/chk-5", 1.2), m.Complete)[0][1] == m.Complete(5, True)
    cmds = []
    for t in TASKS:
        cmds += c.on_message(f"a0s{SHAPE.slot_of[t]}", m.Finished(t, 0.1), 1.3)
    assert cmds == [Done(DoneCause.FINISHED)]


def test_a_restart_stops_the_old_attempt_and_resumes_from_this_runs_checkpoint():
    c = controller(interval=1.0)
    register(c, 0)
    c.tick(1.0)
    ack_all(c, 5, 1.1)
    c.committed(5, "/s/chk-5", 1.2)
    c.tick(2.0)  # checkpoint 6 in flight when slot 1 dies
    cmds = c.on_message("a1s0", m.Register(0, 7, {"src.0": None, "sink.0": None}), 3.0)
    assert sorted(sent(cmds, m.Stop)) == [("a0s0", m.Stop()), ("a0s1", m.Stop())]
    # stale messages of attempt 0 change nothing
    assert c.on_message("a0s1", m.Ack("src.1", 6, m.SnapshotStats()), 3.1) == []
    cmds = c.on_message("a1s1", m.Register(1, 8, {"src.1": None, "sink.1": None}), 3.2)
    assert {msg.restore for _, msg in sent(cmds, m.Start)} == {"/s/chk-5"}
    assert c.attempt.number == 1 and c.started_attempts == 2
    # ids never repeat across attempts
    trig = sent(c.tick(10.0), m.Trigger)
    assert trig and all(msg.checkpoint >= 7 for _, msg in trig)


def test_savepoints_answer_their_waiter_and_stop_the_job_when_asked():
    c = controller(interval=100.0)
    assert type(c.request_savepoint("early", False, 0.0)[0]) is SavepointFailed
    register(c, 0)
    cmds = c.request_savepoint("w", True, 1.0)
    (n,) = {msg.checkpoint for _, msg in sent(cmds, m.Trigger)}
    ack_all(c, n, 1.1)
    cmds = c.committed(n, "/s/savepoint-5", 1.2)
    kinds = [type(x.msg) if type(x) is Send else type(x) for x in cmds]
    assert kinds == [m.Complete, m.Complete, m.Stop, m.Stop, Done, SavepointReady]
    assert c.stopped_with_savepoint == "/s/savepoint-5"


def test_a_restart_fails_the_savepoints_in_flight():
    c = controller(interval=100.0)
    register(c, 0)
    c.request_savepoint("w", False, 1.0)
    cmds = register(c, 1, 2.0)
    failed = [x for x in cmds if type(x) is SavepointFailed]
    assert [x.token for x in failed] == ["w"] and "restarted" in failed[0].reason


def test_what_the_dashboard_reads_per_subtask_failed_checkpoints_and_attempts():
    c = controller(interval=1.0, tolerable_failures=5)
    register(c, 0, now=0.0)
    c.tick(1.0)  # checkpoint 5 triggered at 1.0
    for i, t in enumerate(TASKS):
        stats = m.SnapshotStats(bytes=10 + i, in_flight=i, in_flight_bytes=100 * i,
                                alignment=0.01 * i, sync=0.1, duration=0.25)
        c.on_message(f"a0s{SHAPE.slot_of[t]}", m.Ack(t, 5, stats), 1.5 + i)
    c.committed(5, "/s/chk-5", 6.0)
    (r,) = c.checkpoints
    assert (r.bytes, r.in_flight, r.in_flight_bytes, r.alignment) == (46, 6, 600, 0.03)
    assert r.tasks["sink.1"] == {"bytes": 13, "in_flight": 3, "in_flight_bytes": 300,
                                 "alignment": 0.03, "sync": 0.1, "async": 0.15,
                                 "end_to_end": 3.5}
    assert [r.tasks[t]["end_to_end"] for t in TASKS] == [0.5, 1.5, 2.5, 3.5]
    # checkpoint 6 was due at the last ack (4.5): declined
    c.on_message("a0s0", m.Decline("src.0", 6, "no space"), 7.5)
    (f,) = c.failed_checkpoints
    assert (f.id, f.attempt, f.started, f.failed) == (6, 0, 4.5, 7.5) and "no space" in f.reason
    c.on_message("a0s1", m.Failed("sink.1", False, "ChannelError: peer lost"), 8.0)
    register(c, 1, now=9.0)  # Spark restarted the stage
    assert [(a.number, a.at, a.restored_from, a.after_failure) for a in c.attempt_log] == [
        (0, 0.0, None, None), (1, 9.0, "/s/chk-5", "task sink.1: ChannelError: peer lost")]
    c.on_message("a1s0", m.Metrics("src.0", 42, True, 0.1, backpressured=1.5), 9.5)
    assert c.metrics["src.0"].backpressured == 1.5 and c.source_records() == 42


def test_a_fatal_task_failure_fails_the_job_once():
    c = controller()
    register(c, 0)
    cmds = c.on_message("a0s1", m.Failed("sink.1", True, "bad record at file x line 3"), 1.0)
    assert cmds == [Done(DoneCause.TASK_FAILED, "task sink.1: bad record at file x line 3")]
    assert c.on_message("a0s0", m.Failed("src.0", True, "again"), 1.1) == []
    assert c.on_stage_ended(1.2) == []


EVENTS = st.lists(st.one_of(
    st.tuples(st.just("tick"), st.floats(0.0, 0.7)),
    st.tuples(st.just("ack"), st.sampled_from(TASKS)),
    st.tuples(st.just("decline"), st.sampled_from(TASKS)),
    st.tuples(st.just("drained"), st.sampled_from(TASKS)),
    st.tuples(st.just("restart"), st.just(None)),
    st.tuples(st.just("savepoint"), st.booleans()),
), max_size=60)


@settings(max_examples=300, deadline=None)
@given(EVENTS)
def test_any_order_of_events_keeps_the_job_consistent(events):
    """Whatever happens: messages go to the current attempt only (an old attempt just gets
    Stop); Complete follows its commit; checkpoint ids never repeat; Done comes once; once
    every task drained, a final checkpoint is in flight or committed."""
    c = controller(interval=0.5, max_concurrent=2, tolerable_failures=100)
    now, attempt = 0.0, 0
    register(c, 0, now)
    committed: list[int] = []
    done = 0
    for kind, arg in events:
        cmds = []
        conns = dict(c.attempt.conns)
        if kind == "tick":
            now += arg
            cmds = c.tick(now)
        elif kind in ("ack", "decline"):
            pending = list(c.coordinator.pending) if c.coordinator else []
            for n in pending:
                conn = conns[SHAPE.slot_of[arg]]
                msg = (m.Ack(arg, n, m.SnapshotStats()) if kind == "ack"
                       else m.Decline(arg, n, "x"))
                cmds += c.on_message(conn, msg, now)
        elif kind == "drained":
            cmds = c.on_message(conns[SHAPE.slot_of[arg]], m.Drained(arg), now)
        elif kind == "restart":
            attempt += 1
            cmds = register(c, attempt, now)
        else:
            cmds = c.request_savepoint(object(), arg, now)
        while cmds:
            more = []
            for cmd in cmds:
                if type(cmd) is Send:
                    current = cmd.conn in c.attempt.conns.values()
                    assert current or type(cmd.msg) is m.Stop, cmd
                    if type(cmd.msg) is m.Complete:
                        assert cmd.msg.checkpoint in committed
                elif type(cmd) is CommitCheckpoint:
                    assert cmd.checkpoint_id not in committed
                    committed.append(cmd.checkpoint_id)
                    more += c.committed(cmd.checkpoint_id, f"/s/chk-{cmd.checkpoint_id}", now)
                elif type(cmd) is Done:
                    done += 1
            cmds = more
        assert done <= 1
        if c.done:
            break
        if c.drained >= set(TASKS) and c.attempt.started:
            assert c.final is not None
    assert len(committed) == len(set(committed))


def test_the_job_s_event_time_is_its_lowest_timed_task_s_watermark():
    c = controller()
    register(c, 0)
    assert c.watermark() is None  # no event time
    c.on_message("a0s0", m.Metrics("src.0", 10, True, 0.1, True, 120.0), 1.0)
    c.on_message("a0s1", m.Metrics("src.1", 10, True, 0.1, True, None), 1.0)
    c.on_message("a0s1", m.Metrics("sink.1", 10, False, 0.1), 1.0)  # untimed: not counted
    assert c.watermark() == float("-inf")  # src.1 has none yet
    c.on_message("a0s1", m.Metrics("src.1", 20, True, 0.2, True, 100.5), 2.0)
    assert c.watermark() == 100.5
    c.on_message("a0s1", m.Metrics("src.1", 30, True, 0.3, True, "inf"), 3.0)
    assert c.watermark() == 120.0 and c.source_records() == 40


def _footprint(obj, seen=None) -> int:
    """Entries in every list, dict and set reachable from ``obj`` (its attributes included):
    what grows when something is remembered per checkpoint, attempt or message."""
    seen = set() if seen is None else seen
    if id(obj) in seen or isinstance(obj, (str, bytes, int, float, bool, type(None))):
        return 0
    seen.add(id(obj))
    if isinstance(obj, dict):
        return len(obj) + sum(_footprint(k, seen) + _footprint(v, seen)
                              for k, v in list(obj.items()))
    if isinstance(obj, (list, tuple, set, frozenset)):
        return len(obj) + sum(_footprint(x, seen) for x in list(obj))
    fields = getattr(obj, "__dict__", None) or {
        s: getattr(obj, s) for s in getattr(type(obj), "__slots__", ()) if hasattr(obj, s)}
    return sum(_footprint(v, seen) for v in fields.values() if not callable(v))


def test_a_job_running_for_days_keeps_a_flat_driver(monkeypatch):
    # thousands of checkpoints, declines, savepoints, metrics and restarts, as data: what
    # the controller holds stops growing once its history is full; the counts go on
    from cutline.protocol import job

    monkeypatch.setattr(job, "HISTORY", 20)
    monkeypatch.setattr(job, "TASK_STATS_HISTORY", 5)
    c = controller(interval=0.5, tolerable_failures=10**9)
    attempt, now, sizes = 0, 0.0, {}
    conn = lambda t: f"a{attempt}s{SHAPE.slot_of[t]}"  # noqa: E731
    register(c, attempt, now)
    completed = failed = 0
    for i in range(2000):
        now += 1.0
        cmds = c.tick(now)
        ((n,),) = [{msg.checkpoint for _, msg in sent(cmds, m.Trigger)}]
        for t in TASKS:
            c.on_message(conn(t), m.Metrics(t, i, t.startswith("src"), 0.1, True, now), now)
        if i % 3 == 2:  # declined
            c.on_message(conn("sink.0"), m.Decline("sink.0", n, "no space"), now + 0.05)
            failed += 1
        else:
            commits = [x for x in ack_all(c, n, now + 0.05, conn) if type(x) is CommitCheckpoint]
            assert [x.checkpoint_id for x in commits] == [n]
            c.committed(n, f"/s/chk-{n}", now + 0.1)
            completed += 1
        if i % 50 == 49:  # a savepoint, committed
            cmds = c.request_savepoint(f"w{i}", False, now + 0.15)
            (s,) = {msg.checkpoint for _, msg in sent(cmds, m.Trigger)}
            ack_all(c, s, now + 0.2, conn)
            assert type(c.committed(s, f"/s/savepoint-{s}", now + 0.25)[-1]) is SavepointReady
            completed += 1
        if i % 10 == 9 and i < 500:  # a task lost: Spark restarts the stage (then: days)
            c.on_message(conn("sink.1"), m.Failed("sink.1", False, "lost"), now + 0.3)
            c.on_closed(conn("sink.1"), now + 0.3)
            attempt += 1
            register(c, attempt, now + 0.3)
        if i + 1 in (1000, 2000):
            sizes[i + 1] = _footprint(c)
    assert sizes[1000] == sizes[2000], sizes
    assert (c.checkpoints_completed, c.checkpoints_failed) == (completed, failed)
    assert (len(c.checkpoints), len(c.failed_checkpoints), len(c.attempt_log)) == (20, 20, 20)
    assert c.attempt_log[-1].number == attempt == 50 and c.started_attempts == 51
    assert [bool(r.tasks) for r in c.checkpoints] == [False] * 15 + [True] * 5
    assert c.checkpoints[-1].path.endswith(f"-{c.next_id - 1}")  # the newest


# ---------------------------------------------------------------- next_due: the shell sleeps


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["ack", "decline", "wait", "lost", "register",
                                           "drained"]),
                          st.floats(0.0, 3.0)), max_size=30),
       st.floats(0.1, 2.0), st.sampled_from([None, 5.0]))
def test_nothing_is_due_before_next_due(events, interval, restart_timeout):
    """The driver shell sleeps until ``next_due`` (or an event): a tick any earlier must
    have nothing to do, or a trigger, expiry, probe or watchdog would come late."""
    import copy

    c = JobController(SHAPE, CheckpointPolicy(interval=interval, timeout=4.0,
                                              tolerable_failures=100),
                      job="j", restore=None, first_id=1, restart_timeout=restart_timeout)
    now, attempt = 0.0, 0
    c.on_submitted(now)
    register(c, attempt, now)
    for kind, x in events:
        if kind == "wait":
            now += x
        elif kind == "register":
            attempt += 1
            register(c, attempt, now)
        elif kind == "lost":
            c.on_closed(f"a{attempt}s0", now)
        elif kind in ("ack", "decline") and c.coordinator is not None:
            for n in list(c.coordinator.pending):
                t = TASKS[int(x) % len(TASKS)]
                conn = f"a{attempt}s{SHAPE.slot_of[t]}"
                msg = (m.Ack(t, n, m.SnapshotStats(bytes=1)) if kind == "ack"
                       else m.Decline(t, n, "no"))
                for cmd in c.on_message(conn, msg, now):
                    if type(cmd) is CommitCheckpoint:
                        c.committed(cmd.checkpoint_id, f"/chk-{cmd.checkpoint_id}", now)
        elif kind == "drained":
            c.on_message(f"a{attempt}s0", m.Drained(TASKS[int(x) % len(TASKS)]), now)
        due = c.next_due(now)
        assert due is None or due >= now
        probe = copy.deepcopy(c)
        before = now + (x if due is None else min(x, (due - now) * 0.99))
        if due is None or before < due:
            assert probe.tick(before) == [], (now, due, before)
        c.tick(now)
