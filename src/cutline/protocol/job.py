"""A job's decisions, sans-IO: events in, commands out, beside the checkpoint coordinator.

:class:`AttemptTracker` keeps the run's attempts (which connection is which slot, when an
attempt is complete and starts, when a registration means Spark restarted the stage); both
drivers, the dataflow's and the process graph's, use it.  :class:`JobController` owns
everything else a dataflow job decides: the coordinator of each attempt, triggering at the
sources (and directly at tasks no barrier can reach), the final checkpoint of a bounded
job, iteration-end probes, savepoints and their waiters, and when the job is done.

Connections are opaque hashable handles (the driver's sockets; plain strings in tests).
Every method takes ``now`` (the driver's monotonic clock) and returns the commands to carry
out in order.  The driver performs them: sends messages, writes ``_metadata`` and reports
back with :meth:`JobController.committed` or :meth:`JobController.commit_failed`, resolves
savepoint waiters.  Nothing here reads a clock, a socket or a file.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from . import messages as m
from .controller import Conn, Done, DoneCause, Send
from .watermarks import SubtaskAlignment, decode_ts, encode_ts
from .coordinator import (
    Abort,
    CheckpointCoordinator,
    CheckpointPolicy,
    Complete,
    FailJob,
    Trigger,
)

log = logging.getLogger("cutline.driver")

__all__ = [
    "Attempt", "AttemptStarted", "AttemptTracker", "CheckpointRecord", "CommitCheckpoint",
    "Conn", "Done", "DoneCause", "FailedCheckpoint", "JobCommand", "JobController", "JobShape",
    "Resubmit", "SavepointFailed", "SavepointReady", "Send",
]

# ---------------------------------------------------------------- commands


@dataclass(frozen=True, slots=True)
class CommitCheckpoint:
    """Write ``_metadata`` of checkpoint ``checkpoint_id`` (the commit point; a savepoint's
    files move to its own directory), apply retention, then report
    :meth:`JobController.committed` or :meth:`JobController.commit_failed`."""
    checkpoint_id: int
    metadata: dict = field(hash=False)
    states: dict = field(hash=False)
    savepoint: bool = False


@dataclass(frozen=True, slots=True)
class SavepointReady:
    token: Hashable
    path: str


@dataclass(frozen=True, slots=True)
class SavepointFailed:
    token: Hashable
    reason: str


@dataclass(frozen=True, slots=True)
class Resubmit:
    """Cancel the stage (Spark's job group: whatever tasks of it still run) and submit it
    again: no attempt started within the restart deadline, Spark will not restart it."""
    reason: str


JobCommand: TypeAlias = (Send | CommitCheckpoint | SavepointReady | SavepointFailed | Done
                         | Resubmit)


# ---------------------------------------------------------------- attempts


@dataclass
class Attempt:
    number: int
    conns: dict[int, Conn] = field(default_factory=dict)  # slot -> connection
    pids: dict[int, int] = field(default_factory=dict)
    addresses: dict[str, Any] = field(default_factory=dict)
    slot_tasks: dict[int, set[str]] = field(default_factory=dict)
    cpu: dict[int, float] = field(default_factory=dict)
    started: bool = False
    # over: a task of it was lost (or the driver gave up waiting for it); its tasks were
    # told to stop and what its connections still say is stale
    lost: bool = False

    def slot_of(self, conn: Conn) -> int | None:
        return next((s for s, c in self.conns.items() if c == conn), None)


class AttemptTracker:
    """Which connections form the current attempt.

    Spark restarts a failed barrier stage as a whole: its tasks register again.  A
    registration after the attempt started (or was lost), or a second one for a slot, opens
    the next attempt; the connections of the old one are returned so the driver can stop
    them.  An attempt starts when all ``slots`` registered.  Messages from connections that
    are not the current attempt's, or from a lost attempt, are stale (:meth:`current`)."""

    def __init__(self, slots: int, first: int = 0) -> None:
        self.slots = slots
        self.attempt = Attempt(first)

    @property
    def number(self) -> int:
        return self.attempt.number

    def register(self, conn: Conn, msg: m.Register) -> tuple[list[Conn], bool]:
        """Returns (connections of an attempt this registration replaced, all registered)."""
        stale: list[Conn] = []
        a = self.attempt
        if a.started or a.lost or msg.slot in a.conns:
            stale = list(a.conns.values())
            a = self.attempt = Attempt(a.number + 1)
        a.conns[msg.slot] = conn
        a.pids[msg.slot] = msg.pid
        a.addresses.update(msg.addresses)
        a.slot_tasks[msg.slot] = set(msg.addresses)
        return stale, len(a.conns) == self.slots

    def current(self, conn: Conn) -> bool:
        return not self.attempt.lost and conn in self.attempt.conns.values()


# ---------------------------------------------------------------- the dataflow job


@dataclass
class CheckpointRecord:
    id: int
    started: float
    completed: float
    bytes: int
    in_flight: int
    path: str
    final: bool = False
    attempt: int = 0
    alignment: float = 0.0  # longest alignment of any task
    in_flight_bytes: int = 0  # persisted size of the in-flight records
    savepoint: bool = False
    # per task: what its snapshot cost (seconds: ``end_to_end`` from the trigger to its
    # ack, ``alignment``, ``sync``, ``async``; ``bytes`` of state, ``in_flight`` records
    # and their ``in_flight_bytes``), what Flink's checkpoint tab shows per subtask
    tasks: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def duration(self) -> float:
        return self.completed - self.started


@dataclass(frozen=True)
class AttemptStarted:
    """An attempt of the run started (all its slots registered): when, from which
    checkpoint, and after which task failure (``None``: the first, or no cause reported)."""
    number: int
    at: float
    restored_from: str | None
    after_failure: str | None = None


@dataclass(frozen=True)
class FailedCheckpoint:
    """A checkpoint that was aborted (declined, expired, its storage failed)."""
    id: int
    attempt: int
    started: float
    failed: float
    reason: str
    acked: int = 0  # tasks that had acknowledged it when it was aborted


HISTORY = 1000
"""How many completed checkpoints, failed checkpoints and attempts a controller remembers
(the newest; counts cover the whole run): a job that runs for days keeps a flat driver."""

TASK_STATS_HISTORY = 100
"""How many of the newest completed checkpoints keep their per-task stats
(:attr:`CheckpointRecord.tasks`, one row per task: the bulk of a record)."""


def remember(history: list, item: Any, keep: int | None = None) -> None:
    """Append ``item`` to ``history`` and drop the oldest beyond ``keep`` (:data:`HISTORY`)."""
    history.append(item)
    keep = HISTORY if keep is None else keep
    if len(history) > keep:
        del history[:len(history) - keep]


_TASK_STATS = ("bytes", "in_flight", "in_flight_bytes", "alignment", "sync")


def _task_stats(stats: Mapping[str, Any], acked: float | None,
                triggered: float) -> dict[str, float]:
    row = {k: stats.get(k) or 0 for k in _TASK_STATS}
    row["async"] = max(0.0, float(stats.get("duration") or 0) - row["sync"])
    row["end_to_end"] = max(0.0, acked - triggered) if acked is not None else 0.0
    return row


@dataclass(frozen=True)
class JobShape:
    """What the controller knows of the physical plan."""
    tasks: tuple[str, ...]
    sources: frozenset[str]
    slot_of: Mapping[str, int]  # task -> slot hosting it
    slots: int
    loop_heads: frozenset[str] = frozenset()
    # watermark alignment (assign_timestamps(max_drift=)): group (its uid) -> source tasks
    align_groups: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


class JobController:
    """The decisions of one dataflow job, across its attempts.

    ``restore``: the checkpoint attempt 0 starts from (the user's ``restore_from``, or the
    latest one verified before the run); later attempts restart from the newest checkpoint
    this run completed, else from ``restore``.  ``first_id``: the first checkpoint id
    (above every id in storage).  ``metadata``: called with ``(checkpoint id, attempt,
    stats by task)`` to build a checkpoint's ``_metadata`` body (the plan summary lives in
    the driver).

    ``restart_timeout``: the recovery watchdog.  Whenever an attempt loses a task, a new
    attempt must start within this many seconds; else the controller asks the driver to
    :class:`Resubmit` the stage (Spark may never restart it: a task it cannot kill holds its
    slot, capacity is gone), at most ``resubmits`` times in a row (reset by a completed
    checkpoint), then fails the job with the reason.  None: wait for Spark as long as it
    takes (an engine that cannot resubmit).

    ``start_timeout``: the same watch over the job's start, from the stage's submission to
    its first attempt (and over each resubmission before any attempt ever started).  A
    first start is slower than a restart (executors launching, Python workers importing,
    a busy cluster's queue), so it has its own deadline, like Flink's
    ``slot.request.timeout`` beside its restart strategy.  None: ``restart_timeout``.
    """

    def __init__(self, shape: JobShape, policy: CheckpointPolicy, *, job: str,
                 restore: str | None, first_id: int,
                 metadata: Any = None, restart_timeout: float | None = None,
                 start_timeout: float | None = None, resubmits: int = 2) -> None:
        self.shape, self.policy, self.job = shape, policy, job
        self.restart_timeout, self.max_resubmits = restart_timeout, resubmits
        self.start_timeout = start_timeout if start_timeout is not None else restart_timeout
        self.resubmits = 0  # in a row, since the last completed checkpoint
        self.resubmitted = 0  # in all
        self.waiting_since: float | None = None  # no attempt running since then
        self.waiting_for = ""  # why: "the stage was submitted", "attempt 0 lost slot 1"
        self.waiting_limit: float | None = None  # the deadline of that wait (start/restart)
        self.restore = restore
        self.next_id = first_id
        self.metadata = metadata or (lambda n, attempt, stats: {"checkpoint": n})
        self.attempts = AttemptTracker(shape.slots)
        self.coordinator: CheckpointCoordinator | None = None
        self.checkpoints: list[CheckpointRecord] = []  # the newest HISTORY, oldest first
        self.restored_from: str | None = None
        self.started_attempts = 0
        self.done = False
        self.error: str | None = None
        self.cause: DoneCause | None = None  # why it is done
        # the last attempt's first task failure (its cause: later ones are often peers
        # losing their channels to it), and the Python traceback of that or of the fatal
        # one (for the log file, not the terminal)
        self.last_failure: str | None = None
        self.trace = ""
        self.stopped_with_savepoint: str | None = None
        self.metrics: dict[str, m.Metrics] = {}  # task -> its latest, current attempt
        # the newest HISTORY of each, and how many there were in the whole run
        self.failed_checkpoints: list[FailedCheckpoint] = []
        self.attempt_log: list[AttemptStarted] = []
        self.checkpoints_completed = 0
        self.checkpoints_failed = 0
        self.watermarks: dict[str, float] = {}  # task -> output watermark (event time)
        self.source_records_before = 0
        self._savepoints: dict[int, tuple[Hashable, bool]] = {}  # id -> (token, stop after)
        self._committing: dict[int, Complete] = {}
        self.alignment = {g: SubtaskAlignment(tasks) for g, tasks in shape.align_groups.items()}
        self.align_group = {t: g for g, tasks in shape.align_groups.items() for t in tasks}
        self._reset_attempt_state()

    def _reset_attempt_state(self) -> None:
        for a in getattr(self, "alignment", {}).values():
            a.reset()
        self.drained: set[str] = set()
        self.finished: set[str] = set()
        self.forward_closed: set[str] = set()
        self.loop_closed = False
        self.probe_at: float | None = None
        self.final: int | None = None
        self.triggered: dict[int, float] = {}
        self._acked: dict[int, dict[str, float]] = {}  # checkpoint -> task -> when
        self._cause_known = False  # a task failure of this attempt was reported

    # ------------------------------------------------------------------ queries

    @property
    def attempt(self) -> Attempt:
        return self.attempts.attempt

    @property
    def running(self) -> bool:
        return self.attempt.started and not self.done

    @property
    def failure_reported(self) -> bool:
        """A task failure of the current attempt was reported (:attr:`last_failure`)."""
        return self._cause_known

    def source_records(self) -> int:
        """Records read by the sources in the current attempt."""
        return sum(x.records for x in list(self.metrics.values()) if x.source)

    def watermark(self) -> float | None:
        """The job's event time: the lowest output watermark of its timed tasks (``None``
        without event time; ``-inf`` before the first watermark)."""
        return min(self.watermarks.values()) if self.watermarks else None

    # ------------------------------------------------------------------ events

    def on_message(self, conn: Conn, msg: Any, now: float) -> list[JobCommand]:
        """A message from a task's connection (typed: :mod:`cutline.protocol.messages`)."""
        cmds: list[JobCommand] = []
        t = type(msg)
        if t is m.Register:
            self._register(conn, msg, now, cmds)
            return cmds
        if t is m.Failed and msg.fatal and not self.done:
            # it will fail again on a retry: whichever attempt it comes from (or none: a
            # slot that could not even be set up), the job fails with it
            self.trace = msg.trace
            self._finish(f"task {msg.who}: {msg.error}", cmds, DoneCause.TASK_FAILED)
            return cmds
        if self.done or not self.attempts.current(conn) or self.coordinator is None:
            return cmds  # stale: a previous attempt's, or the job is over
        if t is m.Ack:
            if msg.checkpoint in self.triggered:
                self._acked.setdefault(msg.checkpoint, {})[msg.task] = now
            self._run(self.coordinator.on_ack(msg.task, msg.checkpoint, now,
                                              msg.stats.as_dict()), now, cmds)
        elif t is m.Decline:
            self._run(self.coordinator.on_decline(msg.task, msg.checkpoint, msg.reason, now),
                      now, cmds)
        elif t is m.Drained:
            self.drained.add(msg.task)
            self._trigger_pending_at(msg.task, cmds)
            self._maybe_final(now, cmds)
        elif t is m.ForwardClosed:
            self.forward_closed.add(msg.task)
            # it snapshots, sends the barrier round the loop and logs the feedback edge
            self._trigger_pending_at(msg.task, cmds)
            if self.forward_closed >= self.shape.loop_heads:
                self.probe_at = now
        elif t is m.Metrics:
            self.metrics[msg.task] = msg
            if msg.timed:
                self.watermarks[msg.task] = decode_ts(msg.watermark)
                group = self.align_group.get(msg.task)
                if group is not None:
                    self._align(group, msg, cmds)
            self._note_cpu(conn, msg.cpu)
        elif t is m.Finished:
            self._note_cpu(conn, msg.cpu)
            self.finished.add(msg.task)
            if self.finished >= set(self.shape.tasks):
                self._finish(None, cmds, DoneCause.FINISHED)
        elif t is m.Failed:
            log.warning("task %s failed: %s", msg.who, msg.error)
            self._note_failure(f"task {msg.who}: {msg.error}", msg.trace)
        else:
            log.error("job %s: unexpected %r from a task dropped", self.job, msg)
        return cmds

    def on_submitted(self, now: float) -> list[JobCommand]:
        """The driver submitted the stage: its first attempt must start within
        ``start_timeout``."""
        self._wait_for_attempt(now, "the stage was submitted", self.start_timeout)
        return []

    def on_closed(self, conn: Conn, now: float, cause: str | None = None) -> list[JobCommand]:
        """A task connection closed (``cause``: why, when the driver closed it: its task
        went silent).  During a running attempt its task is lost: the attempt is over.
        Its other tasks are told to stop now rather than left to Spark: Spark kills them
        through the PySpark daemon, and with the daemon gone (``kill -9``, the OOM killer)
        they would run on, holding the task slots the stage's next attempt needs, while
        they wait for a driver that waits for Spark."""
        a = self.attempt
        slot = a.slot_of(conn)
        if slot is None:
            return []
        done_tasks = a.slot_tasks.get(slot)
        if done_tasks and done_tasks <= self.finished:
            return []  # a slot whose tasks all finished closes its connection
        cmds: list[JobCommand] = []
        if a.started and not a.lost and not self.done:
            a.lost = True
            why = f"attempt {a.number} lost slot {slot}" + (f": {cause}" if cause else "")
            if cause:
                self._note_failure(f"slot {slot}: {cause}", "")
            cmds.extend(Send(c, m.Stop(abandoned=why)) for s, c in sorted(a.conns.items())
                        if s != slot)
            self._wait_for_attempt(now, why, self.restart_timeout)
        return cmds

    def on_stage_ended(self, now: float) -> list[JobCommand]:
        """Spark's stage call returned: every task is gone, finished or not.  (The end of a
        stage the driver cancelled to resubmit it is not reported.)"""
        cmds: list[JobCommand] = []
        if self.done:
            return cmds
        if (self.attempt.lost and self.restart_timeout is not None
                and self.resubmits < self.max_resubmits):
            # its tasks ended without a failure Spark would retry (told to stop, say,
            # when a control connection broke but no process died): run it again
            self._resubmit(now, f"the Spark stage ended after {self.waiting_for}", cmds)
        else:
            self._finish("the Spark stage ended before every task finished "
                         f"(finished: {sorted(self.finished)})", cmds, DoneCause.STAGE_ENDED)
        return cmds

    def request_savepoint(self, token: Hashable, stop: bool, now: float) -> list[JobCommand]:
        """Take a savepoint; :class:`SavepointReady` (or :class:`SavepointFailed`) for
        ``token`` follows.  With ``stop`` the job ends once it is committed."""
        cmds: list[JobCommand] = []
        if self.done:
            cmds.append(SavepointFailed(token, f"job {self.job!r} is not running"))
        elif not self.attempt.started or self.coordinator is None:
            cmds.append(SavepointFailed(token, (
                f"job {self.job!r} has not started yet (attempt {self.attempt.number} is "
                "waiting for its tasks): try again in a moment")))
        elif self.final is not None or self.drained:
            cmds.append(SavepointFailed(token, (
                f"job {self.job!r} is finishing (its input is exhausted): the final "
                "checkpoint holds its last state")))
        else:
            commands = self.coordinator.trigger_savepoint(now)
            for c in commands:
                if isinstance(c, Trigger) and c.savepoint:
                    self._savepoints[c.checkpoint_id] = (token, stop)
            self._run(commands, now, cmds)
        return cmds

    def tick(self, now: float) -> list[JobCommand]:
        cmds: list[JobCommand] = []
        a = self.attempt
        if self.coordinator is not None and a.started and not a.lost and not self.done:
            self._run(self.coordinator.tick(now), now, cmds)
            self._maybe_probe(now, cmds)
        self._watch(now, cmds)
        return cmds

    def next_due(self, now: float) -> float | None:
        """When :meth:`tick` has something to do next (>= ``now``): the coordinator's next
        trigger or expiry, an iteration probe, the watchdog's deadline; None: nothing until
        the next event."""
        if self.done:
            return None
        times: list[float] = []
        a = self.attempt
        if self.coordinator is not None and a.started and not a.lost:
            due = self.coordinator.next_due(now)
            if due is not None:
                times.append(due)
            if self.probe_at is not None and not self.loop_closed:
                times.append(self.probe_at)
        if self.waiting_limit is not None and self.waiting_since is not None:
            times.append(self.waiting_since + self.waiting_limit)
        return max(min(times), now) if times else None

    def cancel(self, now: float) -> list[JobCommand]:
        """The caller gave up: nothing to say to the tasks (the driver closes their
        connections, and they end)."""
        return []

    def committed(self, checkpoint_id: int, path: str, now: float) -> list[JobCommand]:
        """The driver wrote ``_metadata`` of ``checkpoint_id`` at ``path``."""
        cmds: list[JobCommand] = []
        cmd = self._committing.pop(checkpoint_id, None)
        if cmd is None:
            return cmds
        n, stats = checkpoint_id, cmd.stats_by_task
        final = n == self.final
        started = self.triggered.pop(n, cmd.triggered_at)
        acked = self._acked.pop(n, {})
        tasks = {str(t): _task_stats(s, acked.get(str(t)), started) for t, s in stats.items()}
        self.resubmits = 0  # the job makes progress
        if self.coordinator is not None:
            self.coordinator.committed(n)
        self.checkpoints_completed += 1
        if len(self.checkpoints) >= TASK_STATS_HISTORY:
            self.checkpoints[-TASK_STATS_HISTORY].tasks = {}
        remember(self.checkpoints, CheckpointRecord(
            n, started, now,
            sum(int(s.get("bytes") or 0) for s in stats.values()),
            sum(int(s.get("in_flight") or 0) for s in stats.values()), path, final,
            self.attempt.number,
            max((float(s.get("alignment") or 0) for s in stats.values()), default=0.0),
            sum(int(s.get("in_flight_bytes") or 0) for s in stats.values()), cmd.savepoint,
            tasks))
        self._broadcast(m.Complete(n, final), cmds)
        self._check_loop({str(t): s for t, s in stats.items()}, now, cmds)
        waiter = self._savepoints.pop(n, None)
        if waiter is not None:
            token, stop = waiter
            if stop:  # after Complete on the same connections: sinks commit, then stop
                self.stopped_with_savepoint = path
                self._broadcast(m.Stop(), cmds)
                self._finish(None, cmds, DoneCause.SAVEPOINT)
            cmds.append(SavepointReady(token, path))
        return cmds

    def commit_failed(self, checkpoint_id: int, reason: str, now: float) -> list[JobCommand]:
        cmds: list[JobCommand] = []
        if self._committing.pop(checkpoint_id, None) is not None and self.coordinator:
            self._run(self.coordinator.on_storage_failure(checkpoint_id, reason, now), now,
                      cmds)
        return cmds

    def shutdown(self, why: str) -> list[JobCommand]:
        """The run is over (the driver stops): fail whatever still waits."""
        cmds: list[JobCommand] = []
        self._fail_savepoints(why, cmds)
        self.done = True
        return cmds

    # ------------------------------------------------------------------ attempts

    def _register(self, conn: Conn, msg: m.Register, now: float,
                  cmds: list[JobCommand]) -> None:
        before = self.attempt
        stale, ready = self.attempts.register(conn, msg)
        if self.attempt is not before:
            self._fail_savepoints(f"the job restarted (attempt {self.attempt.number}) before "
                                  "it completed; trigger it again", cmds)
            cmds.extend(Send(c, m.Stop()) for c in stale)
            self.source_records_before += self.source_records()
            self.metrics.clear()
            self._reset_attempt_state()
        if ready:
            self._start_attempt(now, cmds)

    def _start_attempt(self, now: float, cmds: list[JobCommand]) -> None:
        a = self.attempt
        # a restart: the newest checkpoint this run completed; else the one chosen up front
        path = self.checkpoints[-1].path if self.checkpoints else self.restore
        if a.number == 0 and path is not None:
            self.restored_from = path
        self.coordinator = CheckpointCoordinator(self.policy, set(self.shape.tasks),
                                                 first_id=self.next_id, started_at=now)
        a.started = True
        self.waiting_since = None
        self.started_attempts = a.number + 1
        remember(self.attempt_log, AttemptStarted(a.number, now, path,
                                                  self.last_failure if a.number else None))
        for conn in a.conns.values():
            cmds.append(Send(conn, m.Start(a.number, dict(a.addresses), path)))
        log.info("attempt %d started%s", a.number, f" from {path}" if path else "")

    def _wait_for_attempt(self, now: float, why: str, limit: float | None) -> None:
        self.waiting_since, self.waiting_for, self.waiting_limit = now, why, limit
        if why != "the stage was submitted":
            log.warning("%s; waiting %sfor Spark to restart the stage", why,
                        f"up to {limit:g} s " if limit is not None else "")

    def _watch(self, now: float, cmds: list[JobCommand]) -> None:
        """The watchdog: no attempt started within the deadline of what it waits for
        (``start_timeout`` for the job's start, ``restart_timeout`` after a loss)."""
        limit, since = self.waiting_limit, self.waiting_since
        if limit is None or since is None or self.done or now - since < limit:
            return
        waited = (f"no attempt of the stage started within {limit:g} s after "
                  f"{self.waiting_for}")
        if self.resubmits >= self.max_resubmits:
            tries = (f", nor after the driver resubmitted it {self.resubmits} time"
                     f"{'s' if self.resubmits != 1 else ''}" if self.resubmits else "")
            self._finish(f"{waited}{tries} (the stage needs {self.shape.slots} free task "
                         "slots at once: is capacity missing, or a task Spark cannot end "
                         "holding one?)", cmds, DoneCause.NO_ATTEMPT)
            return
        self._resubmit(now, waited, cmds)

    def _resubmit(self, now: float, why: str, cmds: list[JobCommand]) -> None:
        self.resubmits += 1
        self.resubmitted += 1
        # whatever registered of the attempt it waited for is over: stop it
        a = self.attempt
        if not a.lost:
            a.lost = True
            cmds.extend(Send(c, m.Stop(abandoned=why)) for _, c in sorted(a.conns.items()))
        reason = f"{why}: resubmitting it ({self.resubmits} of {self.max_resubmits})"
        log.warning("%s", reason)
        self.waiting_since = now
        cmds.append(Resubmit(reason))

    def _note_failure(self, failure: str, trace: str) -> None:
        if not self._cause_known:
            self._cause_known = True
            self.last_failure, self.trace = failure, trace

    def _note_cpu(self, conn: Conn, cpu: float) -> None:
        slot = self.attempt.slot_of(conn)
        if slot is not None:
            self.attempt.cpu[slot] = max(self.attempt.cpu.get(slot, 0.0), cpu)

    # ------------------------------------------------------------------ checkpoints

    def _align(self, group: str, msg: m.Metrics, cmds: list[JobCommand]) -> None:
        """A member of watermark-alignment ``group`` reported: send the group's floor to
        its members when it rose (:class:`SubtaskAlignment`)."""
        alignment = self.alignment[group]
        floor = alignment.on_report(msg.task, decode_ts(msg.watermark), msg.idle)
        if floor is not None:
            for task in self.shape.align_groups[group]:
                self._send_to_task(task, m.Align(task, encode_ts(floor)), cmds)

    def _send_to_task(self, task: str, msg: Any, cmds: list[JobCommand]) -> None:
        conn = self.attempt.conns.get(self.shape.slot_of[task])
        if conn is not None:
            cmds.append(Send(conn, msg))

    def _broadcast(self, msg: Any, cmds: list[JobCommand]) -> None:
        cmds.extend(Send(c, msg) for c in self.attempt.conns.values())

    def _trigger_pending_at(self, task: str, cmds: list[JobCommand]) -> None:
        """Checkpoints in flight whose barriers can no longer reach ``task`` (its inputs
        ended, or its inputs from outside a loop did): trigger them there directly."""
        assert self.coordinator is not None
        for n in list(self.coordinator.pending):
            pending = self.coordinator.pending.get(n)
            if pending is not None and task in pending.missing:
                self._send_to_task(task, m.Trigger(n, task), cmds)

    def _maybe_final(self, now: float, cmds: list[JobCommand]) -> None:
        """Every task drained: the final checkpoint, triggered at every task directly."""
        if self.final is None and self.drained >= set(self.shape.tasks):
            assert self.coordinator is not None
            self._run(self.coordinator.trigger_now(now), now, cmds, final=True)

    def _maybe_probe(self, now: float, cmds: list[JobCommand]) -> None:
        """Every iteration head's outside inputs ended: checkpoint until the loop is empty."""
        if self.probe_at is None or now < self.probe_at or self.loop_closed:
            return
        assert self.coordinator is not None
        if list(self.coordinator.pending):
            return  # the one in flight is the probe
        self.probe_at = None
        self._run(self.coordinator.trigger_now(now), now, cmds)

    def _check_loop(self, stats: Mapping[str, Mapping[str, Any]], now: float,
                    cmds: list[JobCommand]) -> None:
        """A completed checkpoint: is every iteration empty on it?  Sound because the
        checkpoint is a consistent cut: every head had taken all its outside input before
        its snapshot, and no record crossed the cut anywhere (nothing in flight recorded,
        feedback included), so nothing will ever enter the loop again."""
        heads = self.shape.loop_heads
        if not heads or self.loop_closed or not self.forward_closed >= heads:
            return
        empty = all(stats.get(h, {}).get("forward_closed") for h in heads) and \
            sum(int(s.get("in_flight") or 0) for s in stats.values()) == 0
        if not empty:
            self.probe_at = now + 0.05
            return
        self.loop_closed = True
        log.info("iteration empty on its checkpoint: closing it")
        for h in sorted(heads):
            self._send_to_task(h, m.CloseLoop(h), cmds)

    def _run(self, commands: Iterable[Any], now: float, cmds: list[JobCommand],
             final: bool = False) -> None:
        for cmd in commands:
            if isinstance(cmd, Trigger):
                n = cmd.checkpoint_id
                self.next_id = max(self.next_id, n + 1)
                self.triggered[n] = now
                if final and self.final is None:
                    self.final = n  # only the checkpoint trigger_now started
                # sources inject the barrier; drained tasks snapshot directly
                for task in sorted(self.shape.sources | self.drained | self.forward_closed):
                    self._send_to_task(task, m.Trigger(n, task), cmds)
            elif isinstance(cmd, Complete):
                self._committing[cmd.checkpoint_id] = cmd
                stats = {t: dict(s) for t, s in cmd.stats_by_task.items()}
                cmds.append(CommitCheckpoint(
                    cmd.checkpoint_id, self.metadata(cmd.checkpoint_id, self.attempt.number,
                                                     stats), stats, cmd.savepoint))
            elif isinstance(cmd, Abort):
                n = cmd.checkpoint_id
                acked = len(self._acked.pop(n, {}))
                self.checkpoints_failed += 1
                remember(self.failed_checkpoints, FailedCheckpoint(
                    n, self.attempt.number, self.triggered.pop(n, now), now, cmd.reason,
                    acked))
                self._broadcast(m.Abort(cmd.checkpoint_id), cmds)
                self._fail_savepoints(cmd.reason, cmds, only=cmd.checkpoint_id)
                heads = self.shape.loop_heads
                if heads and self.forward_closed >= heads and not self.loop_closed:
                    self.probe_at = now + 0.05  # the probe failed: again
                if cmd.checkpoint_id == self.final:  # the job still needs a last one
                    self.final = None
                    self._maybe_final(now, cmds)
            elif isinstance(cmd, FailJob):
                self._finish(cmd.reason, cmds, DoneCause.CHECKPOINTS_FAILED)

    def _fail_savepoints(self, why: str, cmds: list[JobCommand],
                         only: int | None = None) -> None:
        for n in [n for n in self._savepoints if only is None or n == only]:
            token, _ = self._savepoints.pop(n)
            cmds.append(SavepointFailed(token, f"savepoint {n} of job {self.job!r} "
                                               f"failed: {why}"))

    def _finish(self, error: str | None, cmds: list[JobCommand], cause: DoneCause) -> None:
        if self.done:
            return
        self.done = True
        self.error = error
        self.cause = cause
        cmds.append(Done(cause, error))

