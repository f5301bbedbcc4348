"""A host runs a group of processes of a graph: one thread, one snapshot handler per process.

The data path of a message: ``ctx.send`` -> same host: the receiver's inbox for that
channel; other host: :class:`~cutline.graph.transport.Transport` (one FIFO TCP channel per
host pair, the process channels multiplexed in it, markers in band) -> demultiplexed into
the receiver's inbox.  Each inbox is a FIFO per input channel of the process.

The snapshot path: a ``trigger`` from the driver (or ``ctx.initiate_snapshot()``, when the
running handler returns) -> :class:`~cutline.protocol.SnapshotHandler` in
``chandy_lamport`` mode -> ``TakeSnapshot`` (state and pending timers pickled now) ->
``EmitBarrier`` (a marker on every output channel) -> ``RecordChannelState`` while markers
are outstanding -> ``FinishSnapshot`` -> the part goes to the driver, which assembles,
checks and stores the global snapshot.

Nothing here imports pyspark; :mod:`cutline.spark.graph` runs :class:`Host` in a Spark task.

It is longer than most modules on purpose: the host's one thread runs its processes, their
handlers, timers and snapshot parts, and that ordering is what makes a process's snapshot
consistent with its channels, so it stays in one place.
"""

from __future__ import annotations

import heapq
import logging
import os
import pickle
import queue
import random
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from ..protocol import (
    Barrier,
    Deliver,
    EmitBarrier,
    FinishSnapshot,
    RecordChannelState,
    SnapshotHandler,
    TakeSnapshot,
)
from ..protocol import messages as m
from ..protocol.liveness import HEARTBEAT_TIMEOUT
from ..runtime.channels import ChannelError
from ..runtime.control import FrameConnection, connect
from ..runtime.heartbeats import Heartbeats
from ..runtime.tls import JobSecret
from .api import Context, Process
from .snapshot import dumps, load_parts
from .transport import Transport

log = logging.getLogger("cutline.graph")

__all__ = ["GraphSpec", "Host", "ProcessFailed"]

TRACE_LIMIT = 200_000  # trace events kept per host; later ones are dropped
ID_POOL_LOW = 4
PART_CHUNK = 8 << 20  # bytes of parts per control frame (frames are capped at 64 MiB)


@dataclass
class GraphSpec:
    """Everything a host needs, shipped to every Spark task."""

    job: str
    names: list[str]
    processes: dict[str, Process]
    edges: list[tuple[str, str]]
    placement: dict[str, int]  # process -> host
    hosts: int
    secret: JobSecret | bytes = field(repr=False)  # never in a repr or a log line
    coordinator: tuple[str, int]
    trace: bool = False
    seed: int | None = None
    host_addr: str = "127.0.0.1"
    batch_size: int = 256
    heartbeat_timeout: float = HEARTBEAT_TIMEOUT  # a silent driver ends the host


class ProcessFailed(RuntimeError):
    """User code raised: fails the run (it would fail again on every retry)."""


class _Mark:
    __slots__ = ("n",)

    def __init__(self, n: int) -> None:
        self.n = n


class _Proc:
    def __init__(self, name: str, obj: Process) -> None:
        self.name, self.obj = name, obj
        self.in_edges: list[int] = []
        self.inbox: dict[int, deque] = {}
        self.out: dict[str, int] = {}  # destination -> edge
        self.send_seq: dict[int, int] = {}
        self.events = 0  # application events (sends and receives) so far
        self.timers: dict[int, tuple[float, Any]] = {}  # seq -> (due, tag)
        self.parts: dict[int, dict] = {}  # open snapshots: id -> part
        self._handler: SnapshotHandler | None = None  # both set when the run starts
        self._ctx: _Ctx | None = None
        self.running = False  # inside one of its handlers

    @property
    def handler(self) -> SnapshotHandler:
        if self._handler is None:
            raise RuntimeError(f"process {self.name!r} used before the run started")
        return self._handler

    @property
    def ctx(self) -> _Ctx:
        if self._ctx is None:
            raise RuntimeError(f"process {self.name!r} used before the run started")
        return self._ctx


class _Ctx(Context):
    def __init__(self, host: Host, p: _Proc, outputs: list[str], inputs: list[str],
                 rng: random.Random) -> None:
        self._h, self._p = host, p
        self.name = p.name
        self.outputs = tuple(outputs)
        self.inputs = tuple(inputs)
        self.rng = rng

    @property
    def now(self) -> float:
        return time.monotonic() - self._h.mono0

    def send(self, dst: str, msg: Any) -> None:
        self._h._send(self._p, dst, msg)

    def schedule(self, delay: float, tag: Any = None) -> None:
        self._h._schedule(self._p, max(float(delay), 0.0), tag)

    def initiate_snapshot(self) -> int:
        return self._h._initiate(self._p)

    def __repr__(self) -> str:
        return f"<Context of {self.name}>"


class Host:
    """The processes placed on host ``slot``, and their connection to the driver."""

    def __init__(self, spec: GraphSpec, slot: int) -> None:
        self.spec, self.slot = spec, slot
        self.edges = [tuple(e) for e in spec.edges]
        self.E = max(len(self.edges), 1)
        place = spec.placement
        self.here = [n for n in spec.names if place[n] == slot]
        self.procs = {n: _Proc(n, spec.processes[n]) for n in self.here}
        self.edge_dst: list[_Proc | None] = [self.procs.get(d) for _, d in self.edges]
        self.recv_seq: dict[int, int] = {}
        for e, (s, d) in enumerate(self.edges):
            if d in self.procs:
                p = self.procs[d]
                p.in_edges.append(e)
                p.inbox[e] = deque()
                self.recv_seq[e] = 0
            if s in self.procs:
                self.procs[s].out[d] = e
                self.procs[s].send_seq[e] = 0
        senders = sorted({place[s] for s, d in self.edges if place[d] == slot and place[s] != slot})
        peers = sorted({place[d] for s, d in self.edges if place[s] == slot and place[d] != slot})
        self.transport = Transport(slot, senders, peers, spec.secret, spec.host_addr)
        self.ready: dict[str, None] = {}
        self.timer_heap: list = []
        self.timer_seq = 0
        self.finished: list = []  # (id, process, part) ready for the driver
        self.control: queue.Queue = queue.Queue()
        self.early: deque = deque()
        self.ids: deque = deque()
        self.ids_asked = False
        self.conn: FrameConnection | None = None
        self.attempt = -1
        self.t0 = time.time()
        self.mono0 = time.monotonic()
        self.trace: list = []
        self.trace_dropped = 0
        self.delivered = self.sent = 0
        self.last_metrics = 0.0
        self._cpu0 = time.process_time()
        self._closed = False
        self.lost = False
        self.deferred: list = []  # (process, snapshot id) initiated inside a handler
        self.heartbeats = Heartbeats(spec.heartbeat_timeout, f"cutline-host-{slot}-heartbeats")

    # ------------------------------------------------------------------ wiring

    @property
    def address(self) -> tuple[str, int] | None:
        return self.transport.address

    def _tell(self, msg: m.Message) -> None:
        if self.conn is None:
            return
        try:
            self.conn.send(msg)
        except OSError:
            self.control.put(m.Stop(lost=True))  # the driver is gone: nobody to work for

    def run(self) -> dict:
        """Register, wait for ``start``, run the processes until ``stop``."""
        try:
            self.conn = connect(self.spec.coordinator, self.spec.secret,
                                timeout=min(30.0, self.spec.heartbeat_timeout))
            # heartbeats both ways: the driver fails a frozen host; a silent driver ends it
            self.heartbeats.start()
            self.heartbeats.watch(self.conn.conn, "the driver")
            self._tell(m.Register(self.slot, os.getpid(),
                                  {str(self.slot): list(self.address) if self.address
                                   else None}))
            start = self.conn.recv()
            if type(start) is m.Stop:  # the run ended while Spark restarted us
                return {"slot": self.slot, "attempt": None, "delivered": 0}
            if type(start) is not m.Start:
                raise RuntimeError(f"the graph driver did not start the run: {start}")
            threading.Thread(target=self._read_control, daemon=True,
                             name=f"cutline-host-{self.slot}-control").start()
            try:
                self._start(start)
                self._loop()
                if not self.lost:
                    self._stop()
            except ProcessFailed as exc:
                self._tell(m.Failed(f"host-{self.slot}", True, str(exc),
                                    traceback.format_exc()[-4000:]))
                raise
            except ChannelError as exc:
                log.warning("host %d: %s", self.slot, exc)
                self._tell(m.Failed(f"host-{self.slot}", False, str(exc)))
                raise
            return {"slot": self.slot, "attempt": self.attempt, "delivered": self.delivered}
        finally:
            self.close()

    def _read_control(self) -> None:
        conn = self.conn
        if conn is None:
            raise RuntimeError("host control reader started before the driver connection")
        try:
            while True:
                try:
                    self.control.put(conn.recv())
                except m.MessageError as exc:
                    log.error("host %d: dropped a control message: %s", self.slot, exc)
        except (ConnectionError, OSError):
            self.control.put(m.Stop(lost=True))

    def _start(self, start: m.Start) -> None:
        spec = self.spec
        self.attempt = start.attempt
        self.t0 = start.t0 or time.time()
        self.mono0 = time.monotonic() - (time.time() - self.t0)
        addresses = {int(k): tuple(v) for k, v in start.addresses.items() if v}
        self.transport.connect(addresses)
        restore = start.restore
        parts = load_parts(restore, self.here) if restore else {}
        for name, p in self.procs.items():
            seed = f"{spec.seed}:{name}:{self.attempt}" if spec.seed is not None else None
            ins = [self.edges[e][0] for e in p.in_edges]
            p._ctx = _Ctx(self, p, list(p.out), ins, random.Random(seed))
            p._handler = SnapshotHandler(p.in_edges, "chandy_lamport")
        if parts:
            self._restore(parts)
        for p in self.procs.values():
            what = "on_restore" if parts else "on_start"
            self._call(p, what, getattr(p.obj, what), p.ctx)
            self._run_deferred()

    def _restore(self, parts: dict[str, dict]) -> None:
        index = {e: i for i, e in enumerate(self.edges)}
        for name, part in parts.items():
            p = self.procs[name]
            self._call(p, "restore_state", p.obj.restore_state, pickle.loads(part["state"]))
            for remaining, tag in (pickle.loads(part["timers"]) if part.get("timers") else []):
                self._schedule(p, max(float(remaining), 0.0), tag)
            for src, blobs in (part.get("channels") or {}).items():
                e = index.get((src, name))
                if e is None:
                    raise ValueError(f"the snapshot records channel {src}->{name}, which this "
                                     f"graph does not have")
                msgs = [msg for blob in blobs for _, msg in pickle.loads(blob)]
                # re-delivered first, before anything sent in this run; negative sequence
                # numbers keep their message ids apart from those of this run's messages
                for k, msg in enumerate(msgs):
                    p.inbox[e].append((self._mid(e, k - len(msgs)), msg))
                if msgs:
                    self.ready[name] = None

    # ------------------------------------------------------------------ process side

    def _mid(self, e: int, k: int) -> int:
        return k * self.E + e + 1

    def _call(self, p: _Proc, what: str, fn, *args) -> Any:
        was, p.running = p.running, True
        try:
            return fn(*args)
        except ProcessFailed:
            raise
        except Exception as exc:
            raise ProcessFailed(f"process {p.name}: {what} raised "
                                f"{type(exc).__name__}: {exc}") from exc
        finally:
            p.running = was

    def _now(self) -> float:
        return time.time() - self.t0

    def _record(self, *event) -> None:
        if len(self.trace) < TRACE_LIMIT:
            self.trace.append(event)
        else:
            self.trace_dropped += 1

    def _send(self, p: _Proc, dst: str, msg: Any) -> None:
        e = p.out.get(dst)
        if e is None:
            raise ValueError(f"process {p.name} has no channel to {dst!r} "
                             f"(its outputs: {', '.join(p.out) or 'none'})")
        k = p.send_seq[e]
        p.send_seq[e] = k + 1
        p.events += 1
        self.sent += 1
        if self.spec.trace:
            self._record(self._now(), p.name, "send", p.events - 1, self._mid(e, k),
                         f"{p.name}->{dst}", None)
        q = self.edge_dst[e]
        if q is not None:
            q.inbox[e].append((self._mid(e, k), msg))
            self.ready[dst] = None
        else:
            self.transport.put(self.spec.placement[dst], (e, msg))

    def _schedule(self, p: _Proc, delay: float, tag: Any) -> None:
        self.timer_seq += 1
        due = time.monotonic() + delay
        p.timers[self.timer_seq] = (due, tag)
        heapq.heappush(self.timer_heap, (due, self.timer_seq, p.name))

    def _initiate(self, p: _Proc) -> int:
        if not self.ids:
            self._ask_ids()
            deadline = time.monotonic() + 30.0
            while not self.ids:  # rare: the pool ran dry; wait for the driver
                try:
                    msg = self.control.get(timeout=max(deadline - time.monotonic(), 0.001))
                except queue.Empty:
                    raise RuntimeError("the driver handed out no snapshot id within 30 s")
                if type(msg) is m.Ids:
                    self.ids.extend(msg.ids)
                    self.ids_asked = False
                else:
                    self.early.append(msg)
        n = self.ids.popleft()
        if len(self.ids) < ID_POOL_LOW:
            self._ask_ids()
        self._tell(m.Initiated(n, p.name))
        # Recorded when the handler returns: a state is taken between events, never inside
        # one (a batch being delivered must not be split by the cut), and passivity is
        # defined there.
        self.deferred.append((p, n))
        return n

    def _run_deferred(self) -> None:
        while self.deferred:
            p, n = self.deferred.pop(0)
            self._perform(p, p.handler.on_trigger(n))

    def _ask_ids(self) -> None:
        if not self.ids_asked:
            self.ids_asked = True
            self._tell(m.IdsWanted(self.slot))

    def _perform(self, p: _Proc, actions: list) -> None:
        for a in actions:
            t = type(a)
            if t is Deliver:
                src = self.edges[a.channel][0]
                fn, ctx = p.obj.on_message, p.ctx
                p.running = True
                try:
                    for mid, msg in a.records:
                        p.events += 1
                        if self.spec.trace:
                            self._record(self._now(), p.name, "recv", p.events - 1, mid,
                                         f"{src}->{p.name}", None)
                        fn(ctx, src, msg)
                except ProcessFailed:
                    raise
                except Exception as exc:
                    raise ProcessFailed(
                        f"process {p.name}: on_message from {src} raised "
                        f"{type(exc).__name__}: {exc} (message: {msg!r:.200})") from exc
                finally:
                    p.running = False
                self.delivered += len(a.records)
            elif t is RecordChannelState:
                src = self.edges[a.channel][0]
                p.parts[a.checkpoint_id]["channels"].setdefault(src, []).append(
                    dumps(list(a.records)))
            elif t is TakeSnapshot:
                now = time.monotonic()
                timers = [(due - now, tag) for due, tag in p.timers.values()]
                state = self._call(p, "snapshot_state", p.obj.snapshot_state)
                try:
                    blob = dumps(state)
                except Exception as exc:
                    raise ProcessFailed(f"process {p.name}: its state cannot be pickled: "
                                        f"{type(exc).__name__}: {exc}") from exc
                # passive: nothing can wake it but a message.  A process that starts a
                # snapshot from inside a handler is running, so it is active.
                p.parts[a.checkpoint_id] = {
                    "state": blob, "timers": dumps(timers) if timers else b"",
                    "passive": not timers and not p.running, "cut": p.events,
                    "at": self._now(), "channels": {}}
                if self.spec.trace:
                    self._record(self._now(), p.name, "snapshot", None, None, None,
                                 a.checkpoint_id)
            elif t is EmitBarrier:
                n = a.barrier.checkpoint_id
                for dst, e in p.out.items():
                    if self.spec.trace:
                        self._record(self._now(), p.name, "marker_send", None, None,
                                     f"{p.name}->{dst}", n)
                    q = self.edge_dst[e]
                    if q is not None:
                        q.inbox[e].append(_Mark(n))
                        self.ready[dst] = None
                    else:
                        self.transport.put(self.spec.placement[dst], (~e, n))
            elif t is FinishSnapshot:
                self.finished.append((a.checkpoint_id, p.name, p.parts.pop(a.checkpoint_id)))
            else:  # pragma: no cover - chandy_lamport never blocks, aligns or declines
                raise RuntimeError(f"unexpected protocol action {a!r} in chandy_lamport mode")

    def _step(self, p: _Proc) -> None:
        """Handle what is queued on each input channel of ``p`` (a batch or a marker)."""
        size = self.spec.batch_size
        for e in p.in_edges:
            q = p.inbox[e]
            if not q:
                continue
            head = q[0]
            if type(head) is _Mark:
                q.popleft()
                if self.spec.trace:
                    self._record(self._now(), p.name, "marker_recv", None, None,
                                 f"{self.edges[e][0]}->{p.name}", head.n)
                self._perform(p, p.handler.on_barrier(e, Barrier(head.n)))
                continue
            batch: list = []
            while q and type(q[0]) is not _Mark and len(batch) < size:
                batch.append(q.popleft())
            self._perform(p, p.handler.on_records(e, batch))
            if self.deferred:
                self._run_deferred()

    # ------------------------------------------------------------------ the loop

    def _loop(self) -> None:
        while True:
            if self._control():
                return
            if self.timer_heap:
                self._fire_timers()
            for name in list(self.ready):
                p = self.procs[name]
                del self.ready[name]
                self._step(p)
                if any(p.inbox[e] for e in p.in_edges):
                    self.ready[name] = None
            self._pump(0.0)
            self.transport.flush()
            self._report()
            if not self.ready:
                wait = 0.002 if self.transport.backlog else 0.01
                if self.timer_heap:
                    wait = min(wait, max(self.timer_heap[0][0] - time.monotonic(), 0.0))
                if wait > 0:
                    self._pump(wait)

    def _control(self) -> bool:
        while True:
            if self.early:
                msg = self.early.popleft()
            else:
                try:
                    msg = self.control.get_nowait()
                except queue.Empty:
                    return False
            t = type(msg)
            if t is m.TriggerProcesses:
                n = msg.checkpoint
                for name in msg.processes:
                    p = self.procs.get(name)
                    if p is not None:
                        self._perform(p, p.handler.on_trigger(n))
            elif t is m.Ids:
                self.ids.extend(msg.ids)
                self.ids_asked = False
            elif t is m.Stop:
                # lost: the driver is gone; abandoned: it gave this attempt up (a host of
                # it went silent): either way nobody waits for final states
                self.lost = msg.lost or bool(msg.abandoned)
                return True
            else:
                log.error("host %d: unexpected control message %r dropped", self.slot, msg)

    def _fire_timers(self) -> None:
        now = time.monotonic()
        heap = self.timer_heap
        while heap and heap[0][0] <= now:
            _, seq, name = heapq.heappop(heap)
            p = self.procs[name]
            due_tag = p.timers.pop(seq, None)
            if due_tag is not None:
                self._call(p, "on_timer", p.obj.on_timer, p.ctx, due_tag[1])
                if self.deferred:
                    self._run_deferred()

    def _pump(self, timeout: float) -> None:
        """Move what arrived from other hosts into the inboxes (waits up to ``timeout``)."""
        if self.transport.gate is None:
            if timeout > 0:
                try:
                    self.early.append(self.control.get(timeout=timeout))
                except queue.Empty:
                    pass
            return
        E, recv_seq, edge_dst, ready = self.E, self.recv_seq, self.edge_dst, self.ready
        for batch in self.transport.receive(timeout):
            for e, v in batch:
                if e >= 0:  # a message: its id follows from its place on the channel
                    k = recv_seq[e]
                    recv_seq[e] = k + 1
                    p = edge_dst[e]
                    p.inbox[e].append((k * E + e + 1, v))
                else:  # a marker
                    p = edge_dst[~e]
                    p.inbox[~e].append(_Mark(v))
                ready[p.name] = None

    def _report(self) -> None:
        if self.finished:
            batch, size = [], 0
            for n, name, part in self.finished:
                batch.append([n, name, part])
                size += len(part["state"]) + sum(len(b) for bs in part["channels"].values()
                                                 for b in bs)
                if size > PART_CHUNK:
                    self._tell(m.Parts(self.slot, batch))
                    batch, size = [], 0
            if batch:
                self._tell(m.Parts(self.slot, batch))
            self.finished = []
        now = time.monotonic()
        if now - self.last_metrics >= 1.0:
            self.last_metrics = now
            self._tell(m.HostMetrics(self.slot, self.delivered, self.sent,
                                     time.process_time() - self._cpu0))

    # ------------------------------------------------------------------ the end

    def _stop(self) -> None:
        """Report the final states (and trace), end every output with EOF, and keep
        reading until every input ended, so no peer's last send hits a closed gate."""
        states = {}
        for name, p in self.procs.items():
            try:
                states[name] = dumps(p.obj.snapshot_state())
            except Exception:  # noqa: BLE001 - a final state is a courtesy, not a duty
                pass
        for i in range(0, len(self.trace), 50_000):
            self._tell(m.TraceEvents(self.slot,
                                     [list(ev) for ev in self.trace[i:i + 50_000]]))
        self._tell(m.FinalStates(
            self.slot, states,
            queued=sum(len(q) for p in self.procs.values() for q in p.inbox.values()),
            timers=sum(len(p.timers) for p in self.procs.values()),
            trace_dropped=self.trace_dropped, delivered=self.delivered, sent=self.sent,
            cpu=time.process_time() - self._cpu0))
        self.transport.finish()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.heartbeats.stop()
        self.transport.close()
        if self.conn is not None:
            self.conn.close()
