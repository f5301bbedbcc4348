"""The driver's snapshot service of a process-graph run.

Hosts (Spark tasks, or threads) connect with the run's secret, register their channel
address, and get ``start``: the address map, the attempt number and the snapshot to
restore.  Then the :class:`GraphDriver`:

* starts a snapshot every ``snapshot_interval`` at random initiators, plus the processes no
  marker could reach from them; hands out snapshot ids to processes that start their own;
* assembles each snapshot from the processes' parts, evaluates the predicates on it, writes
  it to checkpoint storage (``_metadata`` last) and applies retention;
* ends the run on termination (or another stopping predicate, a violation if asked, or
  ``duration``): ``stop`` to every host, which answers with its final states;
* when a host goes away, stops triggering and waits for Spark to resubmit the stage; the
  hosts of the new attempt register, and it starts them from the snapshot this run
  completed last.

It imports nothing from pyspark: :mod:`cutline.spark.graph` launches the hosts.
"""

from __future__ import annotations

import logging
import pickle
import queue
import random
import secrets
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from ..graph.predicates import Predicate, terminated
from ..graph.result import Attempt, RunResult
from ..graph.snapshot import KIND, decode, open_snapshot, write_snapshot
from ..analysis.trace import TraceEvent
from ..protocol import messages as m
from ..runtime.control import CLOSED, ControlService, FrameConnection
from ..storage.checkpoints import CheckpointStorage
from .dataflow import STAGE_ENDED

log = logging.getLogger("cutline.graph.driver")

__all__ = ["GraphDriver", "RunOptions"]

ID_POOL = 8

CANCEL = object()
"""Put on the driver's queue as ``(None, CANCEL)``: stop the run (the caller gave up)."""


@dataclass(frozen=True)
class RunOptions:
    engine: str = "spark"
    tasks: int | None = None
    snapshot_interval: float | None = 1.0
    initiators: int | tuple[str, ...] = 1
    max_concurrent: int = 4
    storage: str | None = None
    retained: int = 20
    restore_from: str | None = None
    stop_on_termination: bool = True
    stop_on_violation: bool = False
    duration: float | None = None
    timeout: float | None = None
    trace: bool = False
    seed: int | None = None

    def validate(self, names: list[str]) -> None:
        if self.engine not in ("spark", "threads"):
            raise ValueError(f"engine must be 'spark' or 'threads', got {self.engine!r}")
        if self.snapshot_interval is not None and not self.snapshot_interval > 0:
            raise ValueError(f"snapshot_interval must be > 0 seconds or None, "
                             f"got {self.snapshot_interval!r}")
        if self.tasks is not None and not 1 <= self.tasks:
            raise ValueError(f"tasks must be >= 1, got {self.tasks!r}")
        if isinstance(self.initiators, int):
            if not 1 <= self.initiators <= len(names):
                raise ValueError(f"initiators must be between 1 and the number of processes "
                                 f"({len(names)}), got {self.initiators}")
        else:
            unknown = [n for n in self.initiators if n not in names]
            if unknown or not self.initiators:
                raise ValueError(f"unknown initiator(s) {unknown or '(none given)'}")
        if self.max_concurrent < 1:
            raise ValueError(f"max_concurrent must be >= 1, got {self.max_concurrent}")
        if self.retained < 1:
            raise ValueError(f"retained must be >= 1, got {self.retained}")
        for what, v in (("duration", self.duration), ("timeout", self.timeout)):
            if v is not None and not v > 0:
                raise ValueError(f"{what} must be > 0 seconds, got {v!r}")


@dataclass
class _Pending:
    started: float
    initiators: list[str] = field(default_factory=list)
    parts: dict[str, dict] = field(default_factory=dict)
    scheduled: bool = False


@dataclass
class _Attempt:
    number: int
    conns: dict[int, FrameConnection] = field(default_factory=dict)
    pids: dict[int, int] = field(default_factory=dict)
    addresses: dict[int, Any] = field(default_factory=dict)
    finals: dict[int, m.FinalStates] = field(default_factory=dict)
    trace: list = field(default_factory=list)
    metrics: dict[int, m.HostMetrics] = field(default_factory=dict)
    started: bool = False
    lost: bool = False  # a host went away: no more triggers until the next attempt


class GraphDriver:
    """The snapshot service of one run, in the driver process."""

    def __init__(self, graph: Any, opts: RunOptions, placement: dict[str, int], hosts: int,
                 storage_url: str, host: str = "127.0.0.1",
                 on_snapshot: Any = None) -> None:
        self.graph, self.opts = graph, opts
        self.names = list(graph.processes)
        self.edges = [tuple(e) for e in graph.edges]
        self.placement, self.hosts = placement, hosts
        self.storage = CheckpointStorage(storage_url, graph.name)
        self.secret = secrets.token_bytes(32)
        self.predicates: list[Predicate] = list(graph.predicates)
        if opts.stop_on_termination and not any(
                p.kind == "stable" and p.name == "terminated" for p in self.predicates):
            self.predicates.append(terminated())
        self.on_snapshot = on_snapshot
        self.rng = random.Random(opts.seed)
        self.next_id = self.storage.next_id()
        self.restore_path: str | None = None
        self.restore_info: tuple[int | None, int] = (None, 0)
        if opts.restore_from is not None:
            self.restore_path = self._check_restore(opts.restore_from)
        self.snapshots: list = []  # GraphSnapshot, completion order
        self.checkpoints = self.snapshots  # spark.faults.Kill counts these
        self.pending: dict[int, _Pending] = {}
        self.attempt = _Attempt(-1)
        self.attempts: list[Attempt] = []
        self.events: queue.Queue = queue.Queue()
        self.done = threading.Event()
        self.error: str | None = None
        self.stopping: str | None = None
        self.stopped_by: Any = None  # the GraphSnapshot that ended the run
        self.stop_deadline = 0.0
        self.t_run = time.time()
        self.last_trigger = 0.0
        self._reach = self._adjacency()
        self._cover_cache: dict[frozenset, list[str]] = {}
        self._control = ControlService(host, self.secret, self.events, "cutline-graph")
        self.address: tuple[str, int] = self._control.address

    # ------------------------------------------------------------------ set-up

    def _check_restore(self, path: str) -> str:
        handle = open_snapshot(path)
        meta = handle.metadata
        if meta.get("kind") != KIND:
            raise ValueError(f"{handle.path} is not a process-graph snapshot")
        stored = set(meta.get("processes") or {})
        if stored != set(self.names):
            extra, missing = sorted(stored - set(self.names)), sorted(set(self.names) - stored)
            raise ValueError(f"snapshot {handle.path} does not fit graph {self.graph.name!r}: "
                             f"processes only in the snapshot {extra}, only in the graph "
                             f"{missing}")
        stored_edges = {tuple(e) for e in meta.get("edges") or []}
        if stored_edges != set(self.edges):
            raise ValueError(f"snapshot {handle.path} was taken on other channels than graph "
                             f"{self.graph.name!r} has")
        self.next_id = max(self.next_id, handle.id + 1)
        self.restore_info = (handle.id, int(meta.get("in_transit") or 0))
        return handle.path

    def _adjacency(self) -> dict[str, list[str]]:
        adj: dict[str, list[str]] = {n: [] for n in self.names}
        for a, b in self.edges:
            adj[a].append(b)
        return adj

    def _cover(self, initiators: list[str]) -> list[str]:
        """Processes to trigger besides ``initiators`` so that every process takes part:
        those no marker can reach from the initiators (and what they reach)."""
        key = frozenset(initiators)
        got = self._cover_cache.get(key)
        if got is not None:
            return got
        seen: set[str] = set()

        def reach(start: str) -> None:
            todo = deque([start])
            seen.add(start)
            while todo:
                for b in self._reach[todo.popleft()]:
                    if b not in seen:
                        seen.add(b)
                        todo.append(b)

        for n in initiators:
            if n not in seen:
                reach(n)
        extra = []
        for n in self.names:
            if n not in seen:
                extra.append(n)
                reach(n)
        if len(self._cover_cache) < 4096:
            self._cover_cache[key] = extra
        return extra

    # ------------------------------------------------------------------ network

    def start(self) -> None:
        self._control.start()
        self._threads = [
            threading.Thread(target=self._main_loop, name="cutline-graph-driver", daemon=True)]
        for t in self._threads:
            t.start()

    def _send(self, conn: FrameConnection | None, msg: m.Message) -> None:
        if conn is None:
            return
        try:
            conn.send(msg)
        except OSError:
            pass

    def _broadcast(self, msg: m.Message) -> None:
        for conn in list(self.attempt.conns.values()):
            self._send(conn, msg)

    # ------------------------------------------------------------------ main loop

    def _main_loop(self) -> None:
        try:
            while not self.done.is_set():
                try:
                    conn, msg = self.events.get(timeout=0.01)
                    self._handle(conn, msg)
                except queue.Empty:
                    pass
                self._tick()
        except Exception as exc:  # pragma: no cover - reported to the caller
            log.exception("graph driver failed")
            self.error = f"driver failed: {type(exc).__name__}: {exc}"
            self.done.set()

    def _tick(self) -> None:
        if not self.attempt.started or self.done.is_set():
            return
        now = time.monotonic()
        if self.stopping is not None:
            if now > self.stop_deadline:
                log.warning("run stopped, but hosts %s sent no final state",
                            sorted(set(self.attempt.conns) - set(self.attempt.finals)))
                self.done.set()
            return
        if self.attempt.lost:
            return
        opts = self.opts
        if opts.duration is not None and time.time() - self.t_run >= opts.duration:
            self._stop("duration")
            return
        if opts.snapshot_interval is None or now - self.last_trigger < opts.snapshot_interval:
            return
        if sum(p.scheduled for p in self.pending.values()) >= opts.max_concurrent:
            return
        self.last_trigger = now
        if isinstance(opts.initiators, int):
            who = self.rng.sample(self.names, opts.initiators)
        else:
            who = list(opts.initiators)
        n = self._alloc(1)[0]
        self.pending[n] = _Pending(now, list(who), scheduled=True)
        self._trigger(n, who + self._cover(who))

    def _alloc(self, k: int) -> list[int]:
        ids = list(range(self.next_id, self.next_id + k))
        self.next_id += k
        return ids

    def _trigger(self, n: int, names: list[str]) -> None:
        by_host: dict[int, list[str]] = {}
        for name in names:
            by_host.setdefault(self.placement[name], []).append(name)
        for slot, who in by_host.items():
            self._send(self.attempt.conns.get(slot), m.TriggerProcesses(n, who))

    def _handle(self, conn: FrameConnection | None, msg: Any) -> None:
        t = type(msg)
        if t is m.Register and conn is not None:
            self._register(conn, msg)
            return
        if msg is CANCEL:
            if self.stopping is None:
                self._stop("cancelled")
            return
        if msg is STAGE_ENDED:
            if not self.done.is_set():
                got = sorted(self.attempt.finals)
                self.error = self.error or ("the Spark stage ended before the run did "
                                            f"(final states from hosts {got})")
                self.done.set()
            return
        if conn not in self.attempt.conns.values():
            return  # from an earlier attempt
        slot = next(s for s, c in self.attempt.conns.items() if c is conn)
        if t is m.Parts:
            for n, name, part in msg.parts:
                pending = self.pending.get(n)
                if pending is None:
                    pending = self.pending[n] = _Pending(time.monotonic())
                pending.parts[name] = part
                if len(pending.parts) == len(self.names):
                    self._complete(n)
        elif t is m.Initiated:
            n, name = msg.checkpoint, msg.process
            pending = self.pending.setdefault(n, _Pending(time.monotonic()))
            pending.initiators.append(name)
            extra = self._cover([name])
            if extra:
                self._trigger(n, extra)
        elif t is m.IdsWanted:
            self._send(conn, m.Ids(self._alloc(ID_POOL)))
        elif t is m.HostMetrics:
            self.attempt.metrics[slot] = msg
        elif t is m.TraceEvents:
            self.attempt.trace.extend(msg.events)
        elif t is m.FinalStates:
            self.attempt.finals[slot] = msg
            if self.stopping is not None and len(self.attempt.finals) == self.hosts:
                self.done.set()
        elif t is m.Failed:
            if msg.fatal:
                self.error = msg.error or "a process failed"
                self.done.set()
            else:
                log.warning("host %s failed: %s", slot, msg.error)
        elif msg is CLOSED:
            if slot in self.attempt.finals:
                return
            self.attempt.lost = True
            if self.attempts and self.attempts[-1].lost_at is None:
                self.attempts[-1].lost_at = time.time()
            if not self.done.is_set():
                log.warning("attempt %d lost host %d; waiting for Spark to restart the stage",
                            self.attempt.number, slot)

    def _register(self, conn: FrameConnection, msg: m.Register) -> None:
        slot = msg.slot
        if self.stopping is not None or self.done.is_set():
            self._send(conn, m.Stop())
            return
        if self.attempt.started or slot in self.attempt.conns:
            self._new_attempt()
        self.attempt.conns[slot] = conn
        self.attempt.pids[slot] = msg.pid
        self.attempt.addresses[slot] = msg.addresses.get(str(slot))
        if len(self.attempt.conns) == self.hosts:
            self._start_attempt()

    def _new_attempt(self) -> None:
        for c in self.attempt.conns.values():
            self._send(c, m.Stop())
        self.attempt = _Attempt(self.attempt.number + 1)
        self.pending.clear()  # markers of the lost attempt will never arrive

    def _start_attempt(self) -> None:
        if self.attempt.number < 0:
            self.attempt.number = 0
        kept = set(self.storage.completed()) if self.snapshots else set()
        done = [s for s in self.snapshots if s.path and s.id in kept]
        # the snapshot this run completed last (retention keeps the highest ids, and ids
        # handed to processes complete out of order, so check it is still there)
        path = done[-1].path if done else self.restore_path
        info = ((done[-1].id, done[-1].in_transit) if done else self.restore_info
                if path else (None, 0))
        self.next_id = max(self.next_id, self.storage.next_id())
        self.attempt.started = True
        t0 = time.time()
        if not self.attempts:
            self.t_run = t0  # times of the run count from when its processes started
        self.attempts.append(Attempt(self.attempt.number, t0, path, restored_id=info[0],
                                     redelivered=info[1]))
        self.last_trigger = time.monotonic()
        for conn in self.attempt.conns.values():
            self._send(conn, m.Start(self.attempt.number,
                                     {str(k): v for k, v in self.attempt.addresses.items()},
                                     path, t0))
        log.info("attempt %d started%s", self.attempt.number, f" from {path}" if path else "")

    # ------------------------------------------------------------------ snapshots

    def _complete(self, n: int) -> None:
        pending = self.pending.pop(n)
        snap = decode(n, pending.parts, self.edges, self.names)
        snap.initiators = sorted(set(pending.initiators))
        snap.by_driver = pending.scheduled
        snap.attempt = self.attempt.number
        base = self.attempts[-1].started - self.t_run if self.attempts else 0.0
        snap.started = round(base + min(snap.taken_at.values(), default=0.0), 6)
        snap.completed = round(time.time() - self.t_run, 6)
        snap.checks = [p.evaluate(snap) for p in self.predicates]
        files: dict[str, dict] = {}
        for name, part in pending.parts.items():
            files.setdefault(f"host-{self.placement[name]}", {})[name] = part
        metadata = {"job": self.graph.name, "snapshot": n, "attempt": snap.attempt,
                    "initiators": snap.initiators, "by_driver": snap.by_driver,
                    "names": self.names,
                    "edges": [list(e) for e in self.edges],
                    "passive": sum(snap.passive.values()), "in_transit": snap.in_transit,
                    "started": snap.started, "completed": snap.completed, "time": time.time(),
                    "checks": [c.as_dict() for c in snap.checks]}
        try:
            snap.path = write_snapshot(self.storage, n, files, metadata)
            self.storage.retain(self.opts.retained)
        except Exception as exc:  # a storage failure loses this snapshot, not the run
            log.warning("snapshot %d could not be stored: %s", n, exc)
        self.snapshots.append(snap)
        for c in snap.checks:
            if c.violated:
                log.warning("snapshot %d violates %s: %s", n, c.name, c.detail)
        if self.on_snapshot is not None:
            try:
                self.on_snapshot(snap)
            except Exception:  # noqa: BLE001 - a callback must not kill the driver
                log.exception("on_snapshot callback failed")
        if self.stopping is None:
            stop = next((c for c, p in zip(snap.checks, self.predicates)
                         if c.detected and p.stop), None)
            if stop is not None:
                self.stopped_by = snap
                self._stop(stop.name if stop.name == "terminated" else f"{stop.name} detected")
            elif self.opts.stop_on_violation and snap.violations:
                self.stopped_by = snap
                self._stop(f"{snap.violations[0].name} violated")

    def _stop(self, reason: str) -> None:
        self.stopping = reason
        self.stop_deadline = time.monotonic() + 30.0
        self._broadcast(m.Stop())

    def close(self) -> None:
        self.done.set()
        self._control.close()  # and every task connection
        for t in getattr(self, "_threads", ()):
            if t is not threading.current_thread():
                t.join(timeout=2)

    @property
    def task_pids(self) -> dict[int, int]:
        return dict(self.attempt.pids)

    # ------------------------------------------------------------------ the result

    def result(self, duration: float) -> RunResult:
        res = RunResult(self.graph.name, self.names, self.edges, list(self.snapshots),
                        self.stopping or "", self.stopped_by, attempts=list(self.attempts),
                        duration=duration, storage=self.storage.fs.unstrip_protocol(
                            self.storage.dir), restored_from=self.restore_path,
                        task_pids=self.task_pids, started_at=self.t_run)
        for final in self.attempt.finals.values():
            for name, blob in final.states.items():
                try:
                    res.final_states[name] = pickle.loads(blob)
                except Exception:  # noqa: BLE001
                    pass
            res.trace_dropped += final.trace_dropped
            res.delivered += final.delivered
        events = sorted(self.attempt.trace, key=lambda ev: ev[0])
        res.trace = [TraceEvent(t, p, k, index=i, message=m, channel=c, checkpoint=n)
                     for t, p, k, i, m, c, n in events]
        return res
