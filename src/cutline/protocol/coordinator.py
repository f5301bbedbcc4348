"""The checkpoint coordinator's decisions, sans-IO: events in, commands out.

It never reads a clock, sleeps, opens a socket or writes a file.  Every method takes
``now``: seconds on the driver's monotonic clock (``time.monotonic()``; only differences
matter; it must never go backwards).  The driver carries out the returned commands in order,
then calls ``tick`` no later than :meth:`~CheckpointCoordinator.next_due`.

Split by concern, unlike Flink's 2,500-line ``CheckpointCoordinator.java``:
:class:`CheckpointPolicy` (the knobs), :class:`TriggerPolicy` (when the next trigger is due),
:class:`PendingCheckpoints` (who acknowledged, what timed out), :class:`FailureCounter`
(consecutive failures), composed by :class:`CheckpointCoordinator`.  Writing ``_metadata``
and retention belong to the driver and :mod:`cutline.storage.checkpoints`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, TypeAlias

from .events import ProtocolError

__all__ = [
    "Abort", "AckResult", "CheckpointCoordinator", "CheckpointPolicy", "Command", "Complete",
    "FailJob", "FailureCounter", "PendingCheckpoint", "PendingCheckpoints", "Trigger",
    "TriggerPolicy",
]

Task: TypeAlias = Hashable


def _check(name: str, value: Any, kind: type | tuple, minimum: int, *, strict: bool = False,
           infinite: bool = False) -> None:
    ok = isinstance(value, kind) and not isinstance(value, bool) and not value != value  # NaN
    ok = ok and (value > minimum if strict else value >= minimum)
    if not (ok and (infinite or math.isfinite(value))):
        what = "an integer" if kind is int else "a number of seconds"
        raise ValueError(f"CheckpointPolicy.{name} must be {what} {'>' if strict else '>='} "
                         f"{minimum}, got {value!r}")


@dataclass(frozen=True, slots=True)
class CheckpointPolicy:
    """When checkpoints are taken and how many failures a job survives.

    ``interval``: seconds between the starts of two periodic checkpoints.
    ``timeout``: a checkpoint not complete this many seconds after its trigger is aborted
    (``math.inf``: never).  ``min_pause``: seconds between the end of the last completed
    checkpoint and the next trigger; when > 0 no checkpoint is triggered while another is in
    flight (as in Flink: the pause is measured from an end that has not happened yet).
    ``max_concurrent``: checkpoints (and savepoints) in flight at once.
    ``tolerable_failures``: consecutive failed checkpoints the job survives.
    """

    interval: float
    timeout: float = 600.0
    min_pause: float = 0.0
    max_concurrent: int = 1
    tolerable_failures: int = 0

    def __post_init__(self) -> None:
        _check("interval", self.interval, (int, float), 0, strict=True)
        _check("timeout", self.timeout, (int, float), 0, strict=True, infinite=True)
        _check("min_pause", self.min_pause, (int, float), 0)
        _check("max_concurrent", self.max_concurrent, int, 1)
        _check("tolerable_failures", self.tolerable_failures, int, 0)


@dataclass(frozen=True, slots=True)
class Trigger:
    """Inject barrier ``checkpoint_id`` at the sources."""
    checkpoint_id: int
    savepoint: bool = False


@dataclass(frozen=True, slots=True)
class Complete:
    """Every task acknowledged: the driver writes ``_metadata`` (the commit point), then
    notifies the tasks (2PC sinks commit), or reports ``on_storage_failure``.
    ``stats_by_task``: each task's ack ``stats`` (e.g. its ``write_task_state`` result)."""

    checkpoint_id: int
    stats_by_task: Mapping[Task, Mapping[str, Any]] = field(hash=False)
    savepoint: bool = False
    triggered_at: float = 0.0
    completed_at: float = 0.0


@dataclass(frozen=True, slots=True)
class Abort:
    """Give up ``checkpoint_id``: tell the tasks (2PC sinks roll back), drop its files."""
    checkpoint_id: int
    reason: str
    savepoint: bool = False


@dataclass(frozen=True, slots=True)
class FailJob:
    """Too many consecutive checkpoint failures: fail (and restart) the job."""
    reason: str


Command: TypeAlias = Trigger | Complete | Abort | FailJob


class TriggerPolicy:
    """When the next periodic checkpoint is due.

    Interval is measured from the last periodic trigger (the first from ``started_at``),
    min pause from the end of the last completed checkpoint, and nothing is due while
    ``max_concurrent`` checkpoints are in flight (or any, when ``min_pause > 0``).
    """

    def __init__(self, policy: CheckpointPolicy, started_at: float) -> None:
        self.policy = policy
        self.started_at = started_at
        self.last_trigger: float | None = None

    def next_due(self, now: float, *, last_completed: float | None = None,
                 pending: int = 0) -> float | None:
        """The earliest time (>= ``now``) a trigger is due; ``None`` while concurrency blocks
        (an ack, abort or expiry must happen first)."""
        p = self.policy
        if pending >= p.max_concurrent or (pending and p.min_pause > 0):
            return None
        base = self.started_at if self.last_trigger is None else self.last_trigger
        due = base + p.interval
        if last_completed is not None:
            due = max(due, last_completed + p.min_pause)
        return max(due, now)

    def should_trigger(self, now: float, *, last_completed: float | None = None,
                       pending: int = 0) -> bool:
        due = self.next_due(now, last_completed=last_completed, pending=pending)
        return due is not None and due <= now

    def triggered(self, now: float) -> None:
        self.last_trigger = now


class AckResult(str, Enum):
    COMPLETE = "complete"    # every task has acknowledged
    PENDING = "pending"      # acknowledged, others still missing
    DUPLICATE = "duplicate"  # this task had acknowledged already: ignored
    UNKNOWN = "unknown"      # not in flight (late ack of an aborted/completed one): ignored


@dataclass(slots=True, eq=False)
class PendingCheckpoint:
    checkpoint_id: int
    tasks: frozenset[Task]
    started_at: float
    deadline: float
    savepoint: bool = False
    acks: dict[Task, dict[str, Any]] = field(default_factory=dict)

    @property
    def missing(self) -> frozenset[Task]:
        return self.tasks - self.acks.keys()


class PendingCheckpoints:
    """Bookkeeping of in-flight checkpoints; knows nothing of triggering or failing."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._by_id: dict[int, PendingCheckpoint] = {}

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, checkpoint_id: object) -> bool:
        return checkpoint_id in self._by_id

    def __iter__(self) -> Iterator[int]:
        return iter(sorted(self._by_id))

    def get(self, checkpoint_id: int) -> PendingCheckpoint | None:
        return self._by_id.get(checkpoint_id)

    def start(self, checkpoint_id: int, tasks: Iterable[Task], now: float, *,
              savepoint: bool = False) -> PendingCheckpoint:
        if checkpoint_id in self._by_id:
            raise ProtocolError(f"checkpoint {checkpoint_id} is already in flight")
        tasks = frozenset(tasks)
        if not tasks:
            raise ValueError(f"checkpoint {checkpoint_id} needs at least one task to acknowledge")
        p = PendingCheckpoint(checkpoint_id, tasks, now, now + self.timeout, savepoint)
        self._by_id[checkpoint_id] = p
        return p

    def ack(self, checkpoint_id: int, task: Task, now: float,
            stats: Mapping[str, Any] | None = None) -> AckResult:
        """Record ``task``'s acknowledgement.  A complete checkpoint stays here until
        :meth:`pop`; acks of ids not in flight are late and ignored."""
        p = self._by_id.get(checkpoint_id)
        if p is None:
            return AckResult.UNKNOWN
        if task not in p.tasks:
            raise ProtocolError(f"task {task!r} is not part of checkpoint {checkpoint_id}")
        if task in p.acks:
            return AckResult.DUPLICATE
        p.acks[task] = dict(stats or {})
        return AckResult.COMPLETE if len(p.acks) == len(p.tasks) else AckResult.PENDING

    def decline(self, checkpoint_id: int, task: Task, reason: str) -> PendingCheckpoint | None:
        """Remove and return the checkpoint ``task`` declined (``None`` if not in flight)."""
        p = self._by_id.get(checkpoint_id)
        if p is None:
            return None
        if task not in p.tasks:
            raise ProtocolError(f"task {task!r} is not part of checkpoint {checkpoint_id}")
        return self._by_id.pop(checkpoint_id)

    def expire(self, now: float) -> list[PendingCheckpoint]:
        """Remove and return, oldest first, the checkpoints whose deadline is ``<= now``."""
        gone = [p for p in self._by_id.values() if p.deadline <= now]
        for p in gone:
            del self._by_id[p.checkpoint_id]
        return sorted(gone, key=lambda p: p.checkpoint_id)

    def pop(self, checkpoint_id: int) -> PendingCheckpoint:
        return self._by_id.pop(checkpoint_id)

    def older_than(self, checkpoint_id: int) -> list[int]:
        """In-flight checkpoints (not savepoints) older than ``checkpoint_id``."""
        return sorted(n for n, p in self._by_id.items() if n < checkpoint_id and not p.savepoint)

    def next_deadline(self) -> float | None:
        return min((p.deadline for p in self._by_id.values()), default=None)


class FailureCounter:
    """Consecutive failed checkpoints against ``tolerable`` (Flink's CheckpointFailureManager).

    A success resets the count.  A failure of a checkpoint older than the last success is
    not counted (the job has a newer checkpoint).  :meth:`revoke_success` turns the last
    success into a failure (its ``_metadata`` could not be written) and restores the count
    it had reset.
    """

    def __init__(self, tolerable: int) -> None:
        self.tolerable = tolerable
        self.count = 0
        self.last_reason: str | None = None
        self.last_success: int | None = None
        self._undo: tuple[int | None, int] | None = None  # (previous success, count it reset)

    @property
    def exceeded(self) -> bool:
        return self.count > self.tolerable

    def success(self, checkpoint_id: int) -> None:
        if self.last_success is not None and checkpoint_id < self.last_success:
            return
        self._undo = (self.last_success, self.count)
        self.last_success, self.count = checkpoint_id, 0

    def failure(self, checkpoint_id: int, reason: str) -> str | None:
        """Count a failure; return the job's failure reason if the threshold is exceeded."""
        if self.last_success is not None and checkpoint_id < self.last_success:
            return None
        self.count += 1
        self.last_reason = f"checkpoint {checkpoint_id} {reason}"
        return self._verdict()

    def revoke_success(self, checkpoint_id: int, reason: str) -> str | None:
        if checkpoint_id != self.last_success or self._undo is None:
            return None
        self.last_success, before = self._undo
        self._undo = None
        self.count += before + 1
        self.last_reason = f"checkpoint {checkpoint_id} {reason}"
        return self._verdict()

    def _verdict(self) -> str | None:
        if not self.exceeded:
            return None
        return (f"Exceeded checkpoint tolerable failure threshold ({self.tolerable}): "
                f"{self.count} consecutive checkpoint failures; last: {self.last_reason}")


class CheckpointCoordinator:
    """Composes trigger policy, pending bookkeeping and failure counting.

    Every event method first expires timed-out checkpoints at ``now``, then handles the
    event, then triggers a periodic checkpoint if one is due, and returns the commands in
    the order the driver must carry them out.  After :class:`FailJob` or :meth:`shutdown`
    it is inert (every method returns ``[]``).

    ``tasks``: every task that must acknowledge a checkpoint.  ``first_id``: the first id to
    hand out; ids increase by one per trigger, checkpoints and savepoints alike.  They must
    not repeat an id used by an earlier run (use ``CheckpointStorage.next_id()``).
    ``started_at``: when the first interval starts; by default the ``now`` of the first call.
    """

    def __init__(self, policy: CheckpointPolicy, tasks: Iterable[Task], *, first_id: int = 1,
                 started_at: float | None = None) -> None:
        self.policy = policy
        self.tasks = frozenset(tasks)
        if not self.tasks:
            raise ValueError("a checkpoint coordinator needs at least one task")
        if not isinstance(first_id, int) or isinstance(first_id, bool) or first_id < 1:
            raise ValueError(f"first_id must be an integer >= 1, got {first_id!r}")
        self.next_id = first_id
        self.pending = PendingCheckpoints(policy.timeout)
        self.failures = FailureCounter(policy.tolerable_failures)
        self.trigger_policy = TriggerPolicy(policy, 0.0 if started_at is None else started_at)
        self._anchored = started_at is not None
        self.latest_completed_id: int | None = None
        self.last_completed_at: float | None = None
        self.failed: str | None = None  # the FailJob reason
        self.closed = False  # failed or shut down: inert from now on
        self._previous_completed_id: int | None = None
        self._committing_savepoints: set[int] = set()
        self._newest_triggered = first_id - 1
        self._now = -math.inf

    # ------------------------------------------------------------------ queries

    def next_due(self, now: float) -> float | None:
        """When to call :meth:`tick` next (>= ``now``): the next trigger or the earliest
        timeout, whichever is sooner.  ``None``: nothing scheduled (closed, or in-flight
        checkpoints with ``timeout=inf`` block triggering): wait for the next event."""
        self._clock(now)
        if self.closed:
            return None
        times = [t for t in (self.pending.next_deadline(), self._trigger_due(now))
                 if t is not None]
        return max(min(times), now) if times else None

    # ------------------------------------------------------------------ events

    def tick(self, now: float) -> list[Command]:
        return self._run(now, lambda _: None)

    def on_ack(self, task: Task, checkpoint_id: int, now: float,
               stats: Mapping[str, Any] | None = None) -> list[Command]:
        def handle(cmds: list[Command]) -> None:
            if self.pending.ack(checkpoint_id, task, now, stats) is AckResult.COMPLETE:
                self._complete(checkpoint_id, now, cmds)
        return self._run(now, handle)

    def on_decline(self, task: Task, checkpoint_id: int, reason: str, now: float) -> list[Command]:
        """A task declined.  Not counted as a failure when a newer checkpoint was triggered
        already: tasks decline an id exactly when a newer barrier subsumes it."""
        def handle(cmds: list[Command]) -> None:
            p = self.pending.decline(checkpoint_id, task, reason)
            if p is not None:
                counts = checkpoint_id >= self._newest_triggered
                self._abort(p, f"declined by task {task!r}: {reason}", cmds, count=counts)
        return self._run(now, handle)

    def on_storage_failure(self, checkpoint_id: int, reason: str, now: float) -> list[Command]:
        """Writing a checkpoint failed: while in flight (aborted and counted), or after
        :class:`Complete` (its ``_metadata`` did not commit: aborted, and the success it
        counted is revoked).  Reports for older completed checkpoints are ignored."""
        def handle(cmds: list[Command]) -> None:
            why = f"storage failure: {reason}"
            if checkpoint_id in self.pending:
                self._abort(self.pending.pop(checkpoint_id), why, cmds, count=True)
            elif checkpoint_id in self._committing_savepoints:
                self._committing_savepoints.discard(checkpoint_id)
                cmds.append(Abort(checkpoint_id, why, savepoint=True))
            elif checkpoint_id == self.latest_completed_id:
                self.latest_completed_id = self._previous_completed_id
                cmds.append(Abort(checkpoint_id, why))
                verdict = self.failures.revoke_success(checkpoint_id, why)
                if verdict:
                    self._fail(verdict, cmds)
        return self._run(now, handle)

    def committed(self, checkpoint_id: int) -> None:
        """The driver wrote ``_metadata`` of ``checkpoint_id``: a savepoint is no longer
        waiting for a storage failure (a completed checkpoint's failure after this, of the
        latest one, is still taken back by :meth:`on_storage_failure`)."""
        self._committing_savepoints.discard(checkpoint_id)

    def trigger_savepoint(self, now: float) -> list[Command]:
        """Trigger a savepoint now, ignoring interval, min pause *and* max concurrent (a
        user's request is neither refused nor queued).  It shares the id sequence, counts as
        in flight for periodic triggers, times out like a checkpoint, is never subsumed and
        never subsumes, and neither counts towards nor resets tolerable failures.  Returns
        no :class:`Trigger` once the job failed."""
        def handle(cmds: list[Command]) -> None:
            cmds.append(self._start(now, savepoint=True))
        return self._run(now, handle)

    def trigger_now(self, now: float) -> list[Command]:
        """Trigger a regular checkpoint now, ignoring interval, min pause and max concurrent:
        the final checkpoint of a bounded job, after every source ended."""
        def handle(cmds: list[Command]) -> None:
            cmds.append(self._start(now, savepoint=False))
        return self._run(now, handle)

    def shutdown(self, reason: str, now: float) -> list[Command]:
        """Abort everything in flight (e.g. a task failed and the run is torn down)."""
        self._clock(now)
        cmds: list[Command] = []
        for n in list(self.pending):
            p = self.pending.pop(n)
            cmds.append(Abort(n, reason, p.savepoint))
        self.closed = True
        return cmds

    # ------------------------------------------------------------------ mechanics

    def _run(self, now: float, handle: Callable[[list[Command]], None]) -> list[Command]:
        self._clock(now)
        cmds: list[Command] = []
        if self.closed:
            return cmds
        for p in self.pending.expire(now):
            missing = ", ".join(sorted(map(str, p.missing)))
            self._abort(p, f"expired after {self.policy.timeout:g}s (no ack from {missing})",
                        cmds, count=True)
            if self.closed:
                return cmds
        handle(cmds)
        if not self.closed and self._trigger_due(now) == now:
            cmds.append(self._start(now, savepoint=False))
        return cmds

    def _clock(self, now: float) -> None:
        if not isinstance(now, (int, float)) or isinstance(now, bool) or math.isnan(now):
            raise TypeError(f"now must be a number of seconds, got {now!r}")
        if now < self._now:
            raise ValueError(f"time went backwards: now={now!r} after {self._now!r}; "
                             "pass a monotonic clock")
        self._now = now
        if not self._anchored:
            self.trigger_policy.started_at, self._anchored = now, True

    def _trigger_due(self, now: float) -> float | None:
        return self.trigger_policy.next_due(
            now, last_completed=self.last_completed_at, pending=len(self.pending))

    def _start(self, now: float, *, savepoint: bool) -> Trigger:
        n = self.next_id
        self.next_id += 1
        self._newest_triggered = n
        self.pending.start(n, self.tasks, now, savepoint=savepoint)
        if not savepoint:
            self.trigger_policy.triggered(now)
        return Trigger(n, savepoint)

    def _complete(self, checkpoint_id: int, now: float, cmds: list[Command]) -> None:
        p = self.pending.pop(checkpoint_id)
        cmds.append(Complete(checkpoint_id, p.acks, p.savepoint, p.started_at, now))
        if p.savepoint:
            self._committing_savepoints.add(checkpoint_id)
            return
        self._previous_completed_id = self.latest_completed_id
        self.latest_completed_id = checkpoint_id
        self.last_completed_at = now
        self.failures.success(checkpoint_id)
        for older in self.pending.older_than(checkpoint_id):
            self.pending.pop(older)
            cmds.append(Abort(older, f"subsumed by checkpoint {checkpoint_id}"))

    def _abort(self, p: PendingCheckpoint, reason: str, cmds: list[Command], *,
               count: bool) -> None:
        cmds.append(Abort(p.checkpoint_id, reason, p.savepoint))
        if count and not p.savepoint:
            verdict = self.failures.failure(p.checkpoint_id, reason)
            if verdict:
                self._fail(verdict, cmds)

    def _fail(self, reason: str, cmds: list[Command]) -> None:
        for n in list(self.pending):
            p = self.pending.pop(n)
            cmds.append(Abort(n, "job failing: too many checkpoint failures", p.savepoint))
        cmds.append(FailJob(reason))
        self.failed = reason
        self.closed = True
