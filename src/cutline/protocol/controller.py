"""What every driver shell drives: a sans-IO run controller, its commands and its end.

Two controllers implement :class:`Controller`: a dataflow job's
(:class:`~cutline.protocol.job.JobController`) and a process graph's
(:class:`~cutline.protocol.graphjob.GraphController`).  The one driver shell
(:class:`cutline.driver.shell.Driver`) owns the sockets, heartbeats, TLS, the monotonic
clock and the event loop, and feeds a controller what happens: a message from a task
(:meth:`Controller.on_message`), a task connection that closed and why
(:meth:`Controller.on_closed`), the engine's stage call that returned
(:meth:`Controller.on_stage_ended`), the passing of time (:meth:`Controller.tick`, next due
at :meth:`Controller.next_due`).  Each returns the commands to carry out in order:
:class:`Send` and :class:`Done` are the shell's; the others are the controller's own (write
a checkpoint, store a snapshot, resolve a savepoint), which the driver hands to the
object of that kind of run it was given (``driver.dataflow.DataflowRun``,
``driver.graph.GraphRun``).

:class:`Done` carries a :class:`DoneCause`: the shell and the run function choose what to
tell the user from it, never from the error's wording.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias

__all__ = ["Conn", "Controller", "Done", "DoneCause", "Send"]

Conn: TypeAlias = Hashable
"""A task's connection: an opaque hashable handle (the driver's sockets; strings in tests)."""


class DoneCause(enum.Enum):
    """Why a run ended."""

    FINISHED = "finished"
    """Every task finished (a bounded dataflow's input all read), or a process graph
    stopped (terminated, a stopping predicate, its duration, a cancel) with its final
    states."""
    SAVEPOINT = "stopped with a savepoint"
    TASK_FAILED = "a task failed"
    """A task's failure that a retry would repeat (user code raised, a setup error)."""
    TASK_SILENT = "a task went silent"
    """The heartbeat monitor gave up a task (a frozen process, a dead link) that the engine
    will not restart: a process-graph host."""
    CHECKPOINTS_FAILED = "too many checkpoint failures"
    NO_ATTEMPT = "no attempt started"
    """The recovery watchdog: no attempt started within the start or restart deadline,
    resubmissions included."""
    STAGE_ENDED = "the engine's stage ended"
    """The engine's stage call returned before the run was over: the engine's own word
    (Spark's reason, a task's reported failure) is the cause to show."""
    DRIVER_FAILED = "the driver failed"
    """A bug in the driver's loop (its traceback is logged)."""

    @property
    def failed(self) -> bool:
        return self not in (DoneCause.FINISHED, DoneCause.SAVEPOINT)


@dataclass(frozen=True, slots=True)
class Send:
    """Send ``msg`` on ``conn`` (a lost connection is no error: the attempt is over)."""
    conn: Conn
    msg: Any


@dataclass(frozen=True, slots=True)
class Done:
    """The run is over, for ``cause``; ``error`` is the failure's text (None when it did
    not fail)."""
    cause: DoneCause
    error: str | None = None


class Controller(Protocol):
    """The sans-IO decisions of one run (see the module docstring).  ``now`` is the
    driver's monotonic clock, in seconds; every method returns the commands to carry out."""

    done: bool
    last_failure: str | None
    """The current attempt's first reported task failure (the cause of what followed)."""
    trace: str
    """The Python traceback of that failure, or of the fatal one, for the log file."""

    @property
    def failure_reported(self) -> bool:
        """A task failure of the current attempt was reported (:attr:`last_failure`)."""
        ...

    def on_submitted(self, now: float) -> list[Any]: ...

    def on_message(self, conn: Conn, msg: Any, now: float) -> list[Any]: ...

    def on_closed(self, conn: Conn, now: float, cause: str | None = None) -> list[Any]: ...

    def on_stage_ended(self, now: float) -> list[Any]: ...

    def tick(self, now: float) -> list[Any]: ...

    def next_due(self, now: float) -> float | None:
        """When :meth:`tick` has something to do next (>= ``now``), or None: nothing until
        the next event."""
        ...

    def cancel(self, now: float) -> list[Any]:
        """The caller gave up (timeout, interrupt): end the tasks as cleanly as the kind of
        run allows."""
        ...

    def shutdown(self, why: str) -> list[Any]:
        """The driver stops: fail whatever still waits."""
        ...
