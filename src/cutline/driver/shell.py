"""The one driver: sockets, heartbeats, TLS, the clock and the event loop, once.

A :class:`Driver` carries out the decisions of a sans-IO
:class:`~cutline.protocol.controller.Controller`.  It is the only driver class: what a kind
of run does beyond the shell comes in by composition, as the driver's :attr:`Driver.run`, a
:class:`RunKind` that owns the controller and carries out its own commands.  Two kinds exist:
a dataflow job's (:class:`~cutline.driver.dataflow.DataflowRun`: commit a checkpoint,
savepoints, the job's lease and admin port, what callers read of the job) and a process
graph's (:class:`~cutline.driver.graph.GraphRun`: store a snapshot, evaluate the predicates,
the run's result); :func:`~cutline.driver.dataflow.job_driver` and
:func:`~cutline.driver.graph.graph_driver` build a driver of each.

* **Connections**: a :class:`~cutline.runtime.control.ControlService` on the run's
  :class:`~cutline.runtime.tls.JobSecret` (per-run key; TLS 1.3 when asked), whose
  connections a :class:`~cutline.runtime.heartbeats.Heartbeats` monitor watches: a task
  that sends nothing for ``heartbeat_timeout`` is closed with the reason, and its
  controller hears it (:meth:`~cutline.protocol.controller.Controller.on_closed`).
* **Events**, typed, on one queue: :class:`~cutline.runtime.control.Received` and
  :class:`~cutline.runtime.control.Closed` from the tasks' connections,
  :class:`StageEnded` from the engine, :class:`Call` from the caller's thread (a savepoint
  request, a cancel): they run on the loop's thread, like everything the controller does.
* **Commands**: :class:`~cutline.protocol.controller.Send` and
  :class:`~cutline.protocol.controller.Done` are the shell's; any other goes to the run's
  :meth:`RunKind.effect` (which raises :class:`TypeError` for one it does not know).
* **Clock**: ``time.monotonic()``.  The loop sleeps until the next event or until the
  controller's :meth:`~cutline.protocol.controller.Controller.next_due` (at most
  :data:`MAX_WAIT`), then ticks it, then runs the run's :meth:`RunKind.idle`.
* **The end**: :class:`~cutline.protocol.controller.Done` sets :attr:`Driver.cause` and
  :attr:`Driver.error` and :attr:`Driver.done`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeAlias, TypeVar

from ..protocol.controller import Controller, Done, DoneCause, Send
from ..protocol.liveness import HEARTBEAT_TIMEOUT
from ..runtime.control import Closed, ControlService, Received
from ..runtime.heartbeats import Heartbeats
from ..runtime.tls import JobSecret

log = logging.getLogger("cutline.driver")

__all__ = ["Call", "Driver", "DriverEvent", "MAX_WAIT", "RunKind", "StageEnded"]

MAX_WAIT = 0.25
"""The longest the loop sleeps without an event: a controller's ``next_due`` is a promise,
and this bounds what a broken promise costs (and how late a caller's own hook runs)."""


@dataclass(frozen=True, slots=True)
class StageEnded:
    """The engine's stage call returned (every task is gone, finished or not)."""


@dataclass(frozen=True, slots=True, eq=False)
class Call:
    """Run ``fn(now)`` on the loop's thread; it returns commands to carry out."""
    fn: Callable[[float], list[Any]]


DriverEvent: TypeAlias = Received | Closed | StageEnded | Call


class RunKind(Protocol):
    """What one kind of run adds to the :class:`Driver` (see the module docstring): its
    controller, the commands of that controller's own, and hooks the driver calls on its
    loop's thread (:meth:`effect`, :meth:`observe`, :meth:`idle`, :meth:`outgoing`) or
    around its start and stop.  Kind-specific state and what callers read of the run live
    here, not on the driver."""

    @property
    def controller(self) -> Controller:
        """The run's sans-IO controller, built before the driver (the driver drives it)."""
        ...

    def attach(self, driver: Driver[Any]) -> None:
        """``driver`` carries this run out; called once, at the end of its ``__init__``."""
        ...

    def effect(self, cmd: Any) -> list[Any]:
        """Carry out a command of the controller's own kind; returns the controller's
        answer (more commands).  Raises :class:`TypeError` naming a command it does not
        know."""
        ...

    def observe(self, conn: Any, msg: Any, now: float) -> None:
        """``msg`` arrived on ``conn`` (the controller heard it first)."""
        ...

    def idle(self, now: float) -> float | None:
        """Runs on the loop after every event or tick; returns when it wants to run next
        (None: whenever)."""
        ...

    def outgoing(self, msg: Any) -> Any:
        """``msg`` as it goes to a task (tests reroute addresses here)."""
        ...

    def before_start(self) -> None:
        """:meth:`Driver.start` begins: before the driver listens and submits."""
        ...

    def before_stop(self) -> None:
        """:meth:`Driver.stop` begins: the loop is told to end; the controller's
        ``shutdown`` (failing what still waits) comes after this."""
        ...

    def after_stop(self) -> None:
        """:meth:`Driver.stop` ends: every connection is closed."""
        ...


K = TypeVar("K", bound=RunKind)


class Driver(Generic[K]):
    """The driver of one run (see the module docstring): the shell around the controller
    of :attr:`run`, which is a :class:`RunKind` (``Driver[DataflowRun]``,
    ``Driver[GraphRun]``)."""

    def __init__(self, run: K, *, host: str = "127.0.0.1", tls: bool = False,
                 heartbeat_timeout: float = HEARTBEAT_TIMEOUT, name: str = "cutline-driver",
                 peer: str = "the task", secret: JobSecret | None = None) -> None:
        self.run: K = run
        self.controller: Controller = run.controller
        self.name = name
        # the handshake key (and TLS certificate) of this run: shipped to the tasks only
        self.secret = secret if secret is not None else JobSecret.new(tls)
        self.events: queue.Queue[DriverEvent] = queue.Queue()
        self.done = threading.Event()
        self.error: str | None = None
        self.cause: DoneCause | None = None  # why the run ended, once it did
        self.cancel_requested: str | None = None  # the caller asked to cancel: why
        # the tasks' control connections: a task silent for heartbeat_timeout is lost
        self.heartbeats = Heartbeats(heartbeat_timeout, f"{name}-heartbeats")
        self._control = ControlService(host, self.secret, self.events, name,
                                       heartbeats=self.heartbeats, peer=peer)
        self.address: tuple[str, int] = self._control.address
        self._thread: threading.Thread | None = None
        self.run_log: Any = None  # the run's log file (driver.logs.RunLog), once it has one
        run.attach(self)

    # ------------------------------------------------------------------ the clock

    @staticmethod
    def clock() -> float:
        return time.monotonic()

    # ------------------------------------------------------------------ running

    def start(self) -> None:
        """Listen, watch, and run the loop (the engine is submitted after this)."""
        self.run.before_start()
        self.heartbeats.start()
        self._control.start()
        self._perform(self.controller.on_submitted(self.clock()))
        self._thread = threading.Thread(target=self._main_loop, name=self.name, daemon=True)
        self._thread.start()

    def stage_ended(self) -> None:
        """The engine's callback when its stage call returns."""
        self.events.put(StageEnded())

    def call(self, fn: Callable[[float], list[Any]]) -> None:
        """Run ``fn(now)`` on the loop's thread and carry out the commands it returns."""
        self.events.put(Call(fn))

    def cancel(self) -> None:
        """The caller gave up: let the tasks end as cleanly as the controller can."""
        self.call(self.controller.cancel)

    def _main_loop(self) -> None:
        c = self.controller
        hook_due: float | None = None
        try:
            while not self.done.is_set():
                now = self.clock()
                due = c.next_due(now)
                if hook_due is not None:
                    due = hook_due if due is None else min(due, hook_due)
                wait = MAX_WAIT if due is None else min(max(due - now, 0.0), MAX_WAIT)
                try:
                    event = self.events.get(timeout=wait) if wait > 0 else \
                        self.events.get_nowait()
                except queue.Empty:
                    pass
                else:
                    self._dispatch(event)
                if self.done.is_set():
                    break
                now = self.clock()
                self._perform(c.tick(now))
                hook_due = self.run.idle(now)
        except Exception as exc:  # pragma: no cover - reported to the caller
            log.exception("%s failed", self.name)
            self.error = self.error or f"driver failed: {type(exc).__name__}: {exc}"
            self.cause = self.cause or DoneCause.DRIVER_FAILED
            self.done.set()

    def _dispatch(self, event: DriverEvent) -> None:
        c, now = self.controller, self.clock()
        t = type(event)
        if t is Received:
            assert isinstance(event, Received)
            self._perform(c.on_message(event.conn, event.msg, now))
            self.run.observe(event.conn, event.msg, now)
        elif t is Closed:
            assert isinstance(event, Closed)
            self._perform(c.on_closed(event.conn, now, event.cause))
        elif t is StageEnded:
            self._perform(c.on_stage_ended(now))
        elif t is Call:
            assert isinstance(event, Call)
            self._perform(event.fn(now))
        else:  # pragma: no cover - a bug
            raise TypeError(f"unexpected driver event {event!r}")

    def _perform(self, commands: list[Any]) -> None:
        for cmd in commands:
            t = type(cmd)
            if t is Send:
                try:
                    cmd.conn.send(self.run.outgoing(cmd.msg))
                except OSError:
                    pass  # a lost task: the controller hears its connection close
            elif t is Done:
                if self.cause is None:
                    self.cause, self.error = cmd.cause, cmd.error
                self.done.set()
            else:
                self._perform(self.run.effect(cmd))

    def lease_lost(self, why: str) -> None:
        """Another driver took this run's storage over while this one was silent
        (:class:`cutline.storage.lease.JobLease`'s ``on_lost``): the run fails, saying so."""
        self.error = why
        self.done.set()

    def stop(self, why: str = "the job stopped") -> None:
        """End the loop, fail what still waits, close every connection (of any attempt)."""
        self.done.set()
        self.run.before_stop()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=2)
        self._perform(self.controller.shutdown(why))
        self._control.close()
        self.heartbeats.stop()
        self.run.after_stop()
