"""A slot's lifecycle, sans-IO: events in, actions out (like dask's ``WorkerState``).

A slot (:class:`cutline.runtime.task.Slot`, one Spark task) runs one thread per subtask, a
reader of the driver's control connection and a heartbeat monitor.  What each of them
learns goes here as an event; what the slot must do about it comes back as actions; what
the Spark task ends with (its :meth:`SlotState.outcome`) is decided here too, from
everything that happened, in one place:

* a subtask failed (:meth:`~SlotState.on_subtask_failed`): its siblings end now, quietly
  (:class:`AbandonSubtasks`); the failure is fatal (a retry repeats it) only if nothing was
  ending before it;
* the driver stopped the job (:meth:`~SlotState.on_stop`; stop-with-savepoint), or gave
  this attempt up (``abandoned``: a task of it was lost);
* the control connection closed (:meth:`~SlotState.on_connection_lost`) or a send on it
  failed (:meth:`~SlotState.on_send_failed`): every subtask stops (:class:`StopSubtasks`);
* the heartbeat monitor gave the driver up (:meth:`~SlotState.on_driver_silent`): tell it,
  if it still listens (:class:`TellDriver`);
* a subtask thread returned (:meth:`~SlotState.on_subtask_ended`); and time passes
  (:meth:`~SlotState.tick`, next due at :meth:`~SlotState.next_due`).

**Stuck threads.**  Once the attempt is over for this slot (a subtask failed, the attempt
was abandoned, the driver is lost or silent), every subtask thread has ``grace`` seconds
to return.  A thread that does not (user code blocked in a call that never returns, a send
to a frozen peer that its channel's heartbeats have not failed yet) must
not outlive its attempt: PySpark reuses its worker processes, so it would go on inside
the next attempt's (or the next job's) worker, holding sockets, state and sink
transactions.  The outcome then says :attr:`Outcome.STUCK`, naming them, and the shell
ends the worker process (:class:`StuckSubtasks`).  A job that stops (``on_stop`` without
``abandoned``) or runs to its end waits for its subtasks as long as they take: they are
finishing their work, not abandoning it; unless the driver goes silent or a send to it
fails meanwhile (then nobody collects that work: the grace applies).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypeAlias

__all__ = ["AbandonSubtasks", "GRACE", "Outcome", "SlotAction", "SlotState", "StopSubtasks",
           "StuckSubtasks", "TellDriver"]

GRACE = 5.0
"""Seconds a subtask thread has to return once its attempt is over for this slot."""


class StuckSubtasks(RuntimeError):
    """Subtask threads did not return within the grace after their attempt ended: the
    process that runs them must end too (a Spark worker is reused otherwise)."""

    end_process = True  # what cutline.spark.probe looks for (it imports nothing of cutline)

    def __init__(self, message: str, tasks: tuple[str, ...]) -> None:
        super().__init__(message)
        self.tasks = tasks


@dataclass(frozen=True, slots=True)
class AbandonSubtasks:
    """Tell these subtasks to end now, quietly (a sibling's failure is the news)."""
    tasks: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class StopSubtasks:
    """Tell these subtasks the driver is gone: stop (``Stop(lost=True)``)."""
    tasks: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class TellDriver:
    """Tell the driver, if it still listens, why this slot leaves (a non-fatal failure)."""
    reason: str


SlotAction: TypeAlias = AbandonSubtasks | StopSubtasks | TellDriver


class Outcome(enum.Enum):
    """How the slot's Spark task ends, once every subtask thread returned (or was given
    up).  In order of precedence."""

    STUCK = "stuck"
    """Subtask threads outlived the grace: end the process (after the rest is said)."""
    DRIVER_SILENT = "driver silent"
    """Fail the Spark task (Spark retries): the driver went silent."""
    ABANDONED = "abandoned"
    """Fail the Spark task: the driver gave the attempt up (never a success Spark keeps)."""
    FATAL = "fatal"
    """A failure a retry repeats was reported: the driver fails the job; wait for it to
    close the connection, then return."""
    FAILED = "failed"
    """Raise the first subtask failure: Spark restarts the stage."""
    DONE = "done"
    """Every subtask finished, or the job stopped: return the slot's result."""


class SlotState:
    """The lifecycle of one slot of one attempt (see the module docstring).  ``tasks``: its
    subtasks; every ``now`` is the slot's monotonic clock."""

    def __init__(self, tasks: Iterable[str], grace: float = GRACE) -> None:
        self.tasks = tuple(tasks)
        self.grace = grace
        self.alive: set[str] = set(self.tasks)  # subtask threads not returned yet
        self.stuck: tuple[str, ...] = ()  # given up on after the grace
        self.failed: list[str] = []  # subtasks that failed, in order
        self.fatal = False  # the first failure (before anything was ending) repeats
        self.stopping = False  # the driver stopped the job
        self.abandoned = ""  # why the driver gave this attempt up
        self.lost = False  # the control connection closed
        self.driver_silent: str | None = None  # why the heartbeat monitor gave it up
        self.ending_since: float | None = None  # when something ended the attempt here
        self.over_since: float | None = None  # when the attempt was over (grace from then)

    # ------------------------------------------------------------------ queries

    @property
    def ending(self) -> bool:
        """Subtasks should end: a failure, a stop, or the driver gone."""
        return self.ending_since is not None

    @property
    def failing(self) -> bool:
        return bool(self.failed)

    def next_due(self, now: float) -> float | None:
        """When :meth:`tick` may give up on the threads still running (None: never; they
        are running or finishing their work)."""
        if self.over_since is None or not self.alive or self.stuck:
            return None
        return max(self.over_since + self.grace, now)

    def outcome(self) -> Outcome:
        """How the Spark task ends (call once no subtask thread is :attr:`alive` but the
        :attr:`stuck` ones)."""
        if self.stuck:
            return Outcome.STUCK
        if self.driver_silent and not self.fatal:
            return Outcome.DRIVER_SILENT
        if self.abandoned and not self.fatal:
            return Outcome.ABANDONED
        if self.fatal:
            return Outcome.FATAL
        if self.failed and not self.stopping:  # after a stop, peers going away is expected
            return Outcome.FAILED
        return Outcome.DONE

    # ------------------------------------------------------------------ events

    def on_subtask_failed(self, task: str, fatal: bool, now: float) -> list[SlotAction]:
        """``task`` failed; its siblings end now."""
        self.fatal = self.fatal or (fatal and not self.ending)
        if task not in self.failed:
            self.failed.append(task)
        self._end(now, over=True)
        others = tuple(t for t in self.tasks if t != task and t in self.alive)
        return [AbandonSubtasks(others)] if others else []

    def on_stop(self, abandoned: str, now: float) -> list[SlotAction]:
        """The driver's ``Stop``: the job stops (``abandoned`` empty), or it gave this
        attempt up.  (The message itself goes to every subtask as any control message.)"""
        if abandoned:
            self.abandoned = abandoned
        else:
            self.stopping = True
        self._end(now, over=bool(abandoned))
        return []

    def on_connection_lost(self, now: float) -> list[SlotAction]:
        """The control connection closed: nobody to work for.  (After the job's stop the
        driver closes it when it is done: subtasks still committing are finishing their
        work, not abandoning it.)"""
        self.lost = True
        self._end(now, over=not self.stopping)
        return self._stop_all()

    def on_send_failed(self, now: float) -> list[SlotAction]:
        """A message to the driver could not be sent: the driver is gone, and the attempt
        is over for this slot even if the job was stopping (nobody collects its end)."""
        self._over(now)
        return self._stop_all()

    def on_driver_silent(self, reason: str, now: float) -> list[SlotAction]:
        """The heartbeat monitor gave the driver up (it closes the connection next): the
        attempt is over, even if the job was stopping."""
        if self.driver_silent is None:
            self.driver_silent = reason
        self._over(now)
        return [TellDriver(reason)]

    def on_subtask_ended(self, task: str, now: float) -> list[SlotAction]:
        self.alive.discard(task)
        return []

    def tick(self, now: float) -> list[SlotAction]:
        """Past the grace: the threads still running are given up (:attr:`stuck`)."""
        due = self.next_due(now)
        if due is not None and now >= due:
            self.stuck = tuple(t for t in self.tasks if t in self.alive)
        return []

    # ------------------------------------------------------------------ internals

    def _end(self, now: float, *, over: bool) -> None:
        if self.ending_since is None:
            self.ending_since = now
        if over and self.over_since is None:
            self.over_since = now

    def _over(self, now: float) -> None:
        """The grace starts (the driver is gone), without making a later failure any less
        the news (it stays fatal if a retry repeats it)."""
        if self.over_since is None:
            self.over_since = now

    def _stop_all(self) -> list[SlotAction]:
        alive = tuple(t for t in self.tasks if t in self.alive)
        return [StopSubtasks(alive)] if alive else []
