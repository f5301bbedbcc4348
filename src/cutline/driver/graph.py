"""The driver's snapshot service of a process-graph run.

Hosts (Spark tasks, or threads) connect with the run's secret, register their channel
address, and get ``start``: the address map, the attempt number and the snapshot to
restore.  Then the driver (:func:`graph_driver`: the one
:class:`~cutline.driver.shell.Driver`, whose run is a :class:`GraphRun`):

* starts a snapshot every ``snapshot_interval`` at random initiators, plus the processes no
  marker could reach from them; hands out snapshot ids to processes that start their own;
* assembles each snapshot from the processes' parts, evaluates the predicates on it, writes
  it to checkpoint storage (``_metadata`` last) and applies retention;
* ends the run on termination (or another stopping predicate, a violation if asked, or
  ``duration``): ``stop`` to every host, which answers with its final states;
* when a host goes away, stops triggering and waits for Spark to resubmit the stage; the
  hosts of the new attempt register, and it starts them from the snapshot this run
  completed last; a host that goes silent (a frozen process: its heartbeats stop) fails
  the run, naming it.

The connections, heartbeats, TLS, clock and event loop are the driver's own; what is a
process graph's (snapshot assembly and storage, predicates, ``on_snapshot``, the
:class:`~cutline.graph.result.RunResult`) is :class:`GraphRun`'s, the
:class:`~cutline.driver.shell.RunKind` it carries out.  It imports nothing from pyspark:
:mod:`cutline.spark.graph` launches the hosts.
"""

from __future__ import annotations

import logging
import pickle
import random
import time
from dataclasses import dataclass
from typing import Any

from ..graph.predicates import Predicate, terminated
from ..graph.result import Attempt, RunResult
from ..graph.snapshot import KIND, decode, open_snapshot, write_snapshot
from ..analysis.trace import TraceEvent
from ..protocol import messages as m
from ..protocol.graphjob import GraphCommand, GraphController, RestorePoint, StoreSnapshot
from ..protocol.liveness import HEARTBEAT_TIMEOUT, check_timeout
from ..storage.checkpoints import CheckpointStorage
from .shell import Driver

log = logging.getLogger("cutline.graph.driver")

__all__ = ["GraphRun", "RunOptions", "graph_driver"]


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
    # hosts and driver silent this long are failed (cutline.protocol.liveness)
    heartbeat_timeout: float = HEARTBEAT_TIMEOUT
    tls: bool | None = None  # None: on when the engine's own traffic is encrypted

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
        check_timeout(self.heartbeat_timeout)
        if self.tls not in (None, True, False):
            raise ValueError(f"tls must be True, False or None (on when Spark encrypts its "
                             f"own traffic), got {self.tls!r}")


def graph_driver(graph: Any, opts: RunOptions, placement: dict[str, int], hosts: int,
                 storage_url: str, host: str = "127.0.0.1", on_snapshot: Any = None,
                 tls: bool = False) -> Driver[GraphRun]:
    """The driver of one process-graph run: a :class:`~cutline.driver.shell.Driver` whose
    run is a :class:`GraphRun`."""
    run = GraphRun(graph, opts, placement, hosts, storage_url, on_snapshot=on_snapshot)
    return Driver(run, host=host, tls=tls, heartbeat_timeout=opts.heartbeat_timeout,
                  name="cutline-graph", peer="the host")


class GraphRun:
    """The snapshot service of one run, in the driver process (a
    :class:`~cutline.driver.shell.RunKind`): a
    :class:`~cutline.protocol.graphjob.GraphController`, the commands of its own, storage,
    predicates and callbacks, and what callers read (the snapshots, the result)."""

    def __init__(self, graph: Any, opts: RunOptions, placement: dict[str, int], hosts: int,
                 storage_url: str, on_snapshot: Any = None) -> None:
        self.graph, self.opts = graph, opts
        self.names = list(graph.processes)
        self.edges = [tuple(e) for e in graph.edges]
        self.placement, self.hosts = placement, hosts
        self.storage = CheckpointStorage(storage_url, graph.name)
        self.predicates: list[Predicate] = list(graph.predicates)
        if opts.stop_on_termination and not any(
                p.kind == "stable" and p.name == "terminated" for p in self.predicates):
            self.predicates.append(terminated())
        self.on_snapshot = on_snapshot
        self.restore_path: str | None = None
        first_id, restore = self.storage.next_id(), None
        if opts.restore_from is not None:
            restore = self._check_restore(opts.restore_from)
            self.restore_path = restore.path
            first_id = max(first_id, (restore.snapshot_id or 0) + 1)
        # the driver's clock is monotonic; the hosts and the result see wall-clock times
        self.clock_offset = time.time() - Driver.clock()
        self.controller = GraphController(
            self.names, self.edges, placement, hosts, interval=opts.snapshot_interval,
            initiators=opts.initiators, max_concurrent=opts.max_concurrent,
            duration=opts.duration, first_id=first_id, restore=restore,
            rng=random.Random(opts.seed), clock_offset=self.clock_offset)
        self.snapshots: list = []  # GraphSnapshot, completion order
        self.checkpoints = self.snapshots  # spark.faults.Kill counts these
        self.stopped_by: Any = None  # the GraphSnapshot that ended the run
        self.trace: list = []  # the current attempt's trace events
        self.metrics: dict[int, m.HostMetrics] = {}  # slot -> latest, current attempt
        self._data_attempt = -1

    # ------------------------------------------------------------------ set-up

    def _check_restore(self, path: str) -> RestorePoint:
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
        return RestorePoint(handle.id, handle.path, int(meta.get("in_transit") or 0))

    # ------------------------------------------------------------------ what callers read

    @property
    def attempt(self) -> Any:
        """The current attempt (number, started, pids: spark.faults and chaos read it)."""
        return self.controller.attempt

    @property
    def attempts(self) -> list[Attempt]:
        """The run's attempts, their times on the wall clock."""
        off = self.clock_offset
        return [Attempt(a.number, a.started + off, a.restored_from, restored_id=a.restored_id,
                        redelivered=a.redelivered,
                        lost_at=a.lost_at + off if a.lost_at is not None else None)
                for a in self.controller.attempts]

    @property
    def stopping(self) -> str | None:
        return self.controller.stopping

    @property
    def t_run(self) -> float:
        """When the run's processes started (the wall clock)."""
        t = self.controller.t_run
        return t + self.clock_offset if t is not None else time.time()

    @property
    def task_pids(self) -> dict[int, int]:
        return dict(self.controller.attempt.pids)

    # ------------------------------------------------------------------ the driver's hooks

    def attach(self, driver: Driver[Any]) -> None:
        pass  # (the run needs nothing of its driver)

    def before_start(self) -> None:
        pass

    def before_stop(self) -> None:
        pass

    def after_stop(self) -> None:
        pass

    def idle(self, now: float) -> float | None:
        return None

    def outgoing(self, msg: Any) -> Any:
        return msg

    def observe(self, conn: Any, msg: Any, now: float) -> None:
        """Keep the current attempt's metrics and trace events."""
        c = self.controller
        slot = c.slot_of(conn)
        if slot is None:
            return  # from an earlier attempt
        if self._data_attempt != c.attempt.number:
            self._data_attempt = c.attempt.number
            self.trace, self.metrics = [], {}
        t = type(msg)
        if t is m.HostMetrics:
            self.metrics[slot] = msg
        elif t is m.TraceEvents:
            self.trace.extend(msg.events)

    def effect(self, cmd: GraphCommand) -> list[GraphCommand]:
        if type(cmd) is StoreSnapshot:
            return self._store(cmd)
        raise TypeError(f"{type(self).__name__} cannot carry out {cmd!r}")

    # ------------------------------------------------------------------ snapshots

    def _store(self, cmd: StoreSnapshot) -> list[GraphCommand]:
        n, c = cmd.snapshot_id, self.controller
        snap = decode(n, cmd.parts, self.edges, self.names)
        snap.initiators = list(cmd.initiators)
        snap.by_driver = cmd.by_driver
        snap.attempt = cmd.attempt
        t_run = c.t_run if c.t_run is not None else Driver.clock()
        base = c.attempts[-1].started - t_run if c.attempts else 0.0
        snap.started = round(base + min(snap.taken_at.values(), default=0.0), 6)
        snap.completed = round(Driver.clock() - t_run, 6)
        snap.checks = [p.evaluate(snap) for p in self.predicates]
        files: dict[str, dict] = {}
        for name, part in cmd.parts.items():
            files.setdefault(f"host-{self.placement[name]}", {})[name] = part
        metadata = {"job": self.graph.name, "snapshot": n, "attempt": snap.attempt,
                    "initiators": snap.initiators, "by_driver": snap.by_driver,
                    "names": self.names,
                    "edges": [list(e) for e in self.edges],
                    "passive": sum(snap.passive.values()), "in_transit": snap.in_transit,
                    "started": snap.started, "completed": snap.completed, "time": time.time(),
                    "checks": [c.as_dict() for c in snap.checks]}
        kept = None
        try:
            snap.path = write_snapshot(self.storage, n, files, metadata)
            self.storage.retain(self.opts.retained)
            kept = self.storage.completed()
        except Exception as exc:  # a storage failure loses this snapshot, not the run
            log.warning("snapshot %d could not be stored: %s", n, exc)
        self.snapshots.append(snap)
        for check in snap.checks:
            if check.violated:
                log.warning("snapshot %d violates %s: %s", n, check.name, check.detail)
        if self.on_snapshot is not None:
            try:
                self.on_snapshot(snap)
            except Exception:  # noqa: BLE001 - a callback must not kill the driver
                log.exception("on_snapshot callback failed")
        stop = None
        if c.stopping is None:
            hit = next((ch for ch, p in zip(snap.checks, self.predicates)
                        if ch.detected and p.stop), None)
            if hit is not None:
                stop = hit.name if hit.name == "terminated" else f"{hit.name} detected"
            elif self.opts.stop_on_violation and snap.violations:
                stop = f"{snap.violations[0].name} violated"
            if stop is not None:
                self.stopped_by = snap
        return c.stored(n, path=snap.path, in_transit=snap.in_transit, kept=kept, stop=stop,
                        now=Driver.clock())

    # ------------------------------------------------------------------ the result

    def result(self, duration: float) -> RunResult:
        res = RunResult(self.graph.name, self.names, self.edges, list(self.snapshots),
                        self.stopping or "", self.stopped_by, attempts=list(self.attempts),
                        duration=duration, storage=self.storage.fs.unstrip_protocol(
                            self.storage.dir), restored_from=self.restore_path,
                        task_pids=self.task_pids, started_at=self.t_run)
        for final in self.controller.finals.values():
            for name, blob in final.states.items():
                try:
                    res.final_states[name] = pickle.loads(blob)
                except Exception:  # noqa: BLE001
                    pass
            res.trace_dropped += final.trace_dropped
            res.delivered += final.delivered
        events = sorted(self.trace, key=lambda ev: ev[0])
        res.trace = [TraceEvent(t, p, k, index=i, message=m, channel=c, checkpoint=n)
                     for t, p, k, i, m, c, n in events]
        return res
