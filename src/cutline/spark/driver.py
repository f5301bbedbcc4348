"""The job driver: the checkpoint coordinator as a service in the Spark driver process.

Tasks connect (per-job secret), register their channel addresses, and get ``start`` with
the address map, the run attempt and the checkpoint to restore.  The driver turns the
pure :class:`~cutline.protocol.coordinator.CheckpointCoordinator` decisions into messages,
writes ``_metadata`` last when a checkpoint completes, applies retention, and decides when
the job is done.  A task connection that drops means the attempt failed: Spark resubmits
the barrier stage, the new tasks register, and the driver starts a new attempt from the
latest completed checkpoint.
"""

from __future__ import annotations

import logging
import queue
import secrets
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from ..api import CheckpointConfig
from ..plan import PhysicalPlan
from ..protocol.coordinator import (
    Abort,
    CheckpointCoordinator,
    CheckpointPolicy,
    Complete,
    FailJob,
    Trigger,
)
from ..runtime.control import ControlService, FrameConnection
from ..runtime.restore import check_compatible, plan_summary, read_states
from ..storage.checkpoints import CheckpointStorage

log = logging.getLogger("cutline.driver")

__all__ = ["JobDriver", "CheckpointRecord", "JobFailed"]


class JobFailed(RuntimeError):
    pass


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

    @property
    def duration(self) -> float:
        return self.completed - self.started


@dataclass
class _Attempt:
    number: int
    conns: dict[int, FrameConnection] = field(default_factory=dict)
    pids: dict[int, int] = field(default_factory=dict)
    addresses: dict[str, Any] = field(default_factory=dict)
    slot_tasks: dict[int, set] = field(default_factory=dict)
    cpu: dict[int, float] = field(default_factory=dict)
    started: bool = False


class SavepointError(RuntimeError):
    """A savepoint could not be taken (job not running, finishing, restarted, or aborted)."""


class JobDriver:
    def __init__(self, plan: PhysicalPlan, config: CheckpointConfig, job: str,
                 restore_from: str | None = None, host: str = "127.0.0.1") -> None:
        self.plan, self.config, self.job = plan, config, job
        self.storage = CheckpointStorage(config.storage, job, config.storage_options)
        self.secret = secrets.token_bytes(32)
        self.tasks = [c.task_id(i) for c, i in plan.tasks()]
        self.sources = {c.task_id(i) for c, i in plan.tasks() if c.is_source}
        self._slot_of = {c.task_id(i): i for c, i in plan.tasks()}  # slot k hosts subtask k
        # iterations: heads report when their inputs from outside the loop ended; then
        # checkpoints probe the loop until one shows it empty, and the heads close it
        self.loop_heads = {c.task_id(i) for c in plan.loop_heads for i in range(c.parallelism)}
        self._forward_closed: set[str] = set()
        self._loop_closed = False
        self._probe_at: float | None = None
        self.policy = CheckpointPolicy(
            interval=config.interval, timeout=config.timeout, min_pause=config.min_pause,
            max_concurrent=config.max_concurrent,
            tolerable_failures=config.tolerable_failures)
        self.restore_path = restore_from
        if restore_from is not None:
            handle = self.storage.open(restore_from)
            self.next_id = max(handle.id + 1, self.storage.next_id())
            self.restored_from = handle.path
        else:
            self.next_id = 1
            self.restored_from = None
        self.checkpoints: list[CheckpointRecord] = []
        self.attempt = _Attempt(0)
        self.attempts = 0
        self.events: queue.Queue = queue.Queue()
        self.done = threading.Event()
        self.error: str | None = None
        self.cancel_requested: str | None = None  # RunningJob.cancel(): why
        # set by check_restore: the checkpoint attempt 0 restores, verified once
        self._checked_restore = False
        self._latest_at_start: str | None = None
        self._savepoints: dict[int, tuple[Future, bool]] = {}  # id -> (waiter, stop after)
        self.stopped_with_savepoint: str | None = None
        self._control = ControlService(host, self.secret, self.events, "cutline-driver")
        self.address = self._control.address
        self._stopping = False
        self._triggered: dict[int, float] = {}
        self._final: int | None = None
        self._drained: set[str] = set()
        self._finished: set[str] = set()
        self.coordinator: CheckpointCoordinator | None = None
        self.metrics: dict[str, tuple[int, bool]] = {}  # task -> (records in, is source)
        self.source_records_before = 0  # records read by sources in earlier attempts

    # ------------------------------------------------------------------ network

    def start(self) -> None:
        from .admin import AdminServer

        self.admin = AdminServer(self, self.address[0])  # cutline savepoint from outside
        self.admin.start()
        self._control.start()
        self._threads = [
            threading.Thread(target=self._main_loop, name="cutline-driver", daemon=True)]
        for t in self._threads:
            t.start()

    # ------------------------------------------------------------------ main loop

    def _main_loop(self) -> None:
        try:
            while not self.done.is_set():
                try:
                    conn, msg = self.events.get(timeout=0.02)
                    self._handle(conn, msg)
                except queue.Empty:
                    pass
                if self.coordinator is not None and self.attempt.started:
                    self._run(self.coordinator.tick(time.monotonic()))
                    self._maybe_probe(time.monotonic())
        except Exception as exc:  # pragma: no cover - reported to the caller
            log.exception("driver failed")
            self.error = f"driver failed: {exc}"
            self.done.set()

    def _broadcast(self, msg: dict) -> None:
        for conn in list(self.attempt.conns.values()):
            try:
                conn.send(msg)
            except OSError:
                pass

    def _handle(self, conn: FrameConnection, msg: dict) -> None:
        op = msg.get("op")
        if op == "register":
            self._register(conn, msg)
            return
        if op == "_savepoint":
            self._trigger_savepoint(msg["future"], bool(msg.get("stop")))
            return
        if op == "_stage_ended":  # Spark returned: every task is gone, finished or not
            if not self.done.is_set():
                self.error = ("the Spark stage ended before every task finished "
                              f"(finished: {sorted(self._finished)})")
                self.done.set()
            return
        if conn not in self.attempt.conns.values():
            return  # a message from a previous attempt
        now = time.monotonic()
        if op == "ack":
            self._run(self.coordinator.on_ack(msg["task"], msg["checkpoint"], now,
                                              msg.get("stats") or {}))
        elif op == "decline":
            self._run(self.coordinator.on_decline(msg["task"], msg["checkpoint"],
                                                  msg.get("reason", ""), now))
        elif op == "drained":
            task = msg["task"]
            self._drained.add(task)
            self._trigger_pending_at(task)
            self._maybe_final(now)
        elif op == "forward_closed":
            task = msg["task"]
            self._forward_closed.add(task)
            # it snapshots, sends the barrier round the loop and logs the feedback edge
            self._trigger_pending_at(task)
            if self._forward_closed >= self.loop_heads:
                self._probe_at = now
        elif op == "metrics":
            self.metrics[msg["task"]] = (msg.get("records", 0), bool(msg.get("source")))
            self._note_cpu(conn, msg)
        elif op == "finished":
            self._note_cpu(conn, msg)
            self._finished.add(msg["task"])
            if self._finished >= set(self.tasks):
                self.done.set()
        elif op == "failed":
            if msg.get("fatal"):
                self.error = f"task {msg.get('task')}: {msg.get('error')}"
                self.done.set()
            else:
                log.warning("task %s failed: %s", msg.get("task"), msg.get("error"))
        elif op == "_disconnected":
            slot = next((s for s, c in self.attempt.conns.items() if c is conn), None)
            done_tasks = self.attempt.slot_tasks.get(slot)
            if done_tasks and done_tasks <= self._finished:
                return  # a slot whose tasks all finished closes its connection
            if self.attempt.started and not self.done.is_set():
                log.warning("attempt %d lost a task; waiting for Spark to restart the stage",
                            self.attempt.number)

    def _trigger_pending_at(self, task: str) -> None:
        """Checkpoints in flight whose barriers can no longer reach ``task`` (its inputs
        ended, or its inputs from outside a loop did): trigger them there directly."""
        for n in list(self.coordinator.pending):
            pending = self.coordinator.pending.get(n)
            if pending is not None and task in pending.missing:
                self._send_to_task(task, {"op": "trigger", "checkpoint": n, "task": task})

    def _note_cpu(self, conn: FrameConnection, msg: dict) -> None:
        slot = next((s for s, c in self.attempt.conns.items() if c is conn), None)
        if slot is not None and "cpu" in msg:
            self.attempt.cpu[slot] = max(self.attempt.cpu.get(slot, 0.0), float(msg["cpu"]))

    @property
    def cpu_seconds(self) -> dict[int, float]:
        """CPU seconds each slot's process spent in the current attempt (all its threads)."""
        return dict(self.attempt.cpu)

    def _register(self, conn: FrameConnection, msg: dict) -> None:
        slot = msg["slot"]
        if self.attempt.started or slot in self.attempt.conns:
            self._new_attempt()
        self.attempt.conns[slot] = conn
        self.attempt.pids[slot] = msg.get("pid")
        self.attempt.addresses.update(msg.get("tasks") or {})
        self.attempt.slot_tasks[slot] = set(msg.get("tasks") or {})
        if len(self.attempt.conns) == self.plan.slots:
            self._start_attempt()

    # ------------------------------------------------------------------ savepoints

    def savepoint(self, stop: bool = False) -> Future:
        """Trigger a savepoint; the future's result is its path.  With ``stop``, the job stops
        once the savepoint is complete and its sink transactions are committed (Flink's
        stop-with-savepoint): a run restored from it continues exactly once."""
        future: Future = Future()
        self.events.put((None, {"op": "_savepoint", "future": future, "stop": stop}))
        return future

    def _trigger_savepoint(self, future: Future, stop: bool) -> None:
        if self.done.is_set():
            future.set_exception(SavepointError(f"job {self.job!r} is not running"))
        elif not self.attempt.started or self.coordinator is None:
            future.set_exception(SavepointError(
                f"job {self.job!r} has not started yet (attempt {self.attempt.number} is "
                "waiting for its tasks): try again in a moment"))
        elif self._final is not None or self._drained:
            future.set_exception(SavepointError(
                f"job {self.job!r} is finishing (its input is exhausted): the final "
                "checkpoint holds its last state"))
        else:
            commands = self.coordinator.trigger_savepoint(time.monotonic())
            for cmd in commands:
                if isinstance(cmd, Trigger) and cmd.savepoint:
                    self._savepoints[cmd.checkpoint_id] = (future, stop)
            self._run(commands)

    def _fail_savepoints(self, why: str, only: int | None = None) -> None:
        for n in [n for n in self._savepoints if only is None or n == only]:
            future, _ = self._savepoints.pop(n)
            if not future.done():
                future.set_exception(SavepointError(f"savepoint {n} of job {self.job!r} "
                                                    f"failed: {why}"))

    def _new_attempt(self) -> None:
        self._fail_savepoints(f"the job restarted (attempt {self.attempt.number + 1}) before "
                              "it completed; trigger it again")
        for c in self.attempt.conns.values():
            try:
                c.send({"op": "stop"})
            except OSError:
                pass
        self.source_records_before += self.source_records()
        self.metrics.clear()
        self.attempt = _Attempt(self.attempt.number + 1)
        self._drained.clear()
        self._finished.clear()
        self._forward_closed.clear()
        self._loop_closed = False
        self._probe_at = None
        self._final = None
        self._triggered.clear()

    def _start_attempt(self) -> None:
        if self.checkpoints:  # a restart: the newest checkpoint this run completed
            path = self.checkpoints[-1].path
        elif self.restore_path is not None:  # the user's choice wins over older leftovers
            path = self.restore_path
        elif self._checked_restore:  # check_restore verified it: no second full read
            path = self._latest_at_start
        else:
            latest = self.storage.latest()
            path = latest.path if latest is not None else None
        self.next_id = max(self.next_id, self.storage.next_id())
        if self.attempt.number == 0 and path is not None:
            self.restored_from = path
        self.coordinator = CheckpointCoordinator(self.policy, set(self.tasks),
                                                 first_id=self.next_id)
        self.attempt.started = True
        self.attempts = self.attempt.number + 1
        for conn in self.attempt.conns.values():
            conn.send({"op": "start", "attempt": self.attempt.number,
                       "addresses": self.attempt.addresses, "restore": path})
        log.info("attempt %d started%s", self.attempt.number,
                 f" from {path}" if path else "")

    # ------------------------------------------------------------------ commands

    def _maybe_probe(self, now: float) -> None:
        """Every iteration head's outside inputs ended: checkpoint until the loop is empty."""
        if self._probe_at is None or now < self._probe_at or self._loop_closed:
            return
        if list(self.coordinator.pending):
            return  # the one in flight is the probe
        self._probe_at = None
        self._run(self.coordinator.trigger_now(now))

    def _check_loop(self, stats: dict, now: float) -> None:
        """A completed checkpoint: is every iteration empty on it?  Sound because the
        checkpoint is a consistent cut: every head had taken all its outside input before
        its snapshot, and no record crossed the cut anywhere (nothing in flight recorded,
        feedback included), so nothing will ever enter the loop again."""
        if not self.loop_heads or self._loop_closed or \
                not self._forward_closed >= self.loop_heads:
            return
        empty = all(stats.get(h, {}).get("forward_closed") for h in self.loop_heads) and \
            sum(int(s.get("in_flight") or 0) for s in stats.values()) == 0
        if not empty:
            self._probe_at = now + 0.05
            return
        self._loop_closed = True
        log.info("iteration empty on its checkpoint: closing it")
        for h in sorted(self.loop_heads):
            self._send_to_task(h, {"op": "close_loop", "task": h})

    def _maybe_final(self, now: float) -> None:
        """Every task drained: the final checkpoint, triggered at every task directly."""
        if self._final is None and self._drained >= set(self.tasks):
            self._run(self.coordinator.trigger_now(now), final=True)

    def _run(self, commands: list, final: bool = False) -> None:
        for cmd in commands:
            if isinstance(cmd, Trigger):
                n = cmd.checkpoint_id
                self.next_id = max(self.next_id, n + 1)
                self._triggered[n] = time.monotonic()
                if final and self._final is None:
                    self._final = n  # only the checkpoint trigger_now started
                # sources inject the barrier; drained tasks snapshot directly
                for task in sorted(self.sources | self._drained | self._forward_closed):
                    self._send_to_task(task, {"op": "trigger", "checkpoint": n, "task": task})
            elif isinstance(cmd, Complete):
                self._complete(cmd)
            elif isinstance(cmd, Abort):
                self._broadcast({"op": "abort", "checkpoint": cmd.checkpoint_id})
                self._fail_savepoints(getattr(cmd, "reason", "aborted"), cmd.checkpoint_id)
                if self._forward_closed >= self.loop_heads and self.loop_heads \
                        and not self._loop_closed:
                    self._probe_at = time.monotonic() + 0.05  # the probe failed: again
                if cmd.checkpoint_id == self._final:  # the job still needs a last one
                    self._final = None
                    self._maybe_final(time.monotonic())
            elif isinstance(cmd, FailJob):
                self.error = cmd.reason
                self.done.set()

    def _send_to_task(self, task: str, msg: dict) -> None:
        conn = self.attempt.conns.get(self._slot_of[task])
        if conn is not None:
            try:
                conn.send(msg)
            except OSError:
                pass

    def _complete(self, cmd: Complete) -> None:
        n = cmd.checkpoint_id
        stats = cmd.stats_by_task
        metadata = {
            "job": self.job, "checkpoint": n, "attempt": self.attempt.number,
            "mode": self.config.protocol_mode.value,
            "tasks": {t: {k: s.get(k) for k in ("path", "size", "sha256", "chain")}
                      for t, s in stats.items()},
            "chains": {c.uid: c.parallelism for c in self.plan.chains},
            "max_parallelism": self.plan.max_parallelism, "time": time.time(),
            "plan": plan_summary(self.plan),
        }
        try:
            path = self.storage.commit(n, metadata, savepoint=cmd.savepoint, states=stats)
        except Exception as exc:
            self._run(self.coordinator.on_storage_failure(n, str(exc), time.monotonic()))
            return
        final = n == self._final
        self.checkpoints.append(CheckpointRecord(
            n, self._triggered.get(n, time.monotonic()), time.monotonic(),
            sum(int(s.get("bytes") or 0) for s in stats.values()),
            sum(int(s.get("in_flight") or 0) for s in stats.values()), path, final,
            self.attempt.number, max(float(s.get("alignment") or 0) for s in stats.values())))
        self._broadcast({"op": "complete", "checkpoint": n, "final": final})
        self.storage.retain(self.config.retained)
        self._check_loop(stats, time.monotonic())
        waiter = self._savepoints.pop(n, None)
        if waiter is not None:
            future, stop = waiter
            if stop:  # after "complete" on the same connections: sinks commit, then stop
                self.stopped_with_savepoint = path
                self._broadcast({"op": "stop"})
                self.done.set()
            future.set_result(path)

    def check_restore(self, allow_non_restored_state: bool = False) -> str | None:
        """Before the run: the checkpoint attempt 0 will restore (``restore_from``, else the
        latest under the job's storage) must fit the pipeline; raises
        :class:`~cutline.runtime.restore.IncompatibleCheckpointError` naming what changed."""
        try:
            if self.restore_path is not None:
                handle = self.storage.open(self.restore_path)
            else:
                handle = self.storage.latest()
            self._checked_restore = True
            self._latest_at_start = handle.path if handle is not None else None
            if handle is None:
                return None
            for warning in check_compatible(handle.metadata, read_states(handle), self.plan,
                                            handle.path, allow_non_restored_state):
                log.warning("%s", warning)
            return handle.path
        except BaseException:
            self._control.close()  # the run does not start: leave no listener behind
            raise

    def stop(self) -> None:
        self._stopping = True
        self.done.set()
        if getattr(self, "admin", None) is not None:
            self.admin.stop()
        self._fail_savepoints("the job stopped")
        self._control.close()  # and every task connection, of this attempt or older ones
        for t in getattr(self, "_threads", ()):
            if t is not threading.current_thread():
                t.join(timeout=2)

    def source_records(self) -> int:
        """Records read by the sources in the current attempt."""
        return sum(n for n, is_source in self.metrics.values() if is_source)

    @property
    def task_pids(self) -> dict[int, int]:
        return dict(self.attempt.pids)
