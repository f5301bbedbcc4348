"""The task executor: one subtask of one chain, driving the snapshot protocol.

A record flows: input channel -> ``SnapshotHandler`` (Deliver) -> the chain's operators ->
output buffers -> output channels.  A barrier flows: coordinator ``trigger`` (sources) or an
input channel -> handler -> TakeSnapshot (operator state, source position, sink
pre-commit) -> EmitBarrier -> FinishSnapshot (state file written) -> ``ack`` to the
coordinator, which writes ``_metadata`` and sends ``complete`` (sinks commit).

Nothing here knows about Spark; :mod:`cutline.spark` runs :class:`Slot` inside a Spark task.
"""

from __future__ import annotations

import heapq
import logging
import os
import pickle
import queue
import threading
import time
import traceback
from dataclasses import dataclass, replace
from typing import Any

from ..plan import HASH, Chain, ChannelId, PhysicalPlan
from ..state.keygroups import key_group, subtask_for_key_group
from ..protocol import (
    Barrier,
    BlockChannel,
    DeclineSnapshot,
    Deliver,
    EmitBarrier,
    FinishSnapshot,
    PrioritizeBarrier,
    RecordChannelState,
    ScheduleTimeout,
    SnapshotHandler,
    TakeSnapshot,
    UnblockChannel,
)
from ..protocol import messages as m
from .channels import InputGate, OutputChannel
from .control import FrameConnection, connect
from ..connectors.base import CommitError, RecordError
from .background import SnapshotUploads
from .deadletter import DeadLetters
from .operators import UserFunctionError, build_operator
from ..storage.schema import TaskState, encode_task_state
from .restore import RestoreView, read_states

log = logging.getLogger("cutline.task")

__all__ = ["JobSpec", "Slot", "Subtask"]


@dataclass
class JobSpec:
    """Everything a task needs, shipped to every Spark task (pickled with the closure)."""

    plan: PhysicalPlan
    job: str
    secret: bytes
    coordinator: tuple[str, int]
    mode: str
    aligned_timeout: float | None
    storage_url: str
    batch_size: int = 1000
    flush_interval: float = 0.01
    host: str = "127.0.0.1"
    # Fault injection (tests, chaos): (point, slot, checkpoint) -> SIGKILL this worker in
    # the first attempt.  Points: "alignment", "snapshot_write", "before_commit",
    # "after_commit" (sinks committed, the restart re-commits the same checkpoint).
    faults: tuple[tuple[str, int, int], ...] = ()
    # fsspec options for storage_url (CheckpointConfig.storage_options)
    storage_options: dict | None = None


class _Stop(Exception):
    pass


def _position(pos: Any) -> str:
    """A source position, short: file and line for files, else the position itself."""
    if isinstance(pos, dict) and pos.get("file") is not None:
        where = f"file {pos['file']!r}"
        if pos.get("line") is not None:
            where += f" line {pos['line']}"
        if pos.get("offset") is not None:
            where += f" (offset {pos['offset']})"
        return where
    text = repr(pos)
    return text if len(text) <= 200 else text[:200] + "..."


def _address_towards(peer: tuple[str, int]) -> str:
    """This host's address on the interface that routes to ``peer`` (no packet is sent)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(peer)
        return s.getsockname()[0]


def _fault(sub: "Subtask", point: str, checkpoint: int) -> None:
    """``kill -9`` this very process at ``point`` if a fault is planned there."""
    for where, slot, n in sub.spec.faults:
        if where == point and slot == sub.slot.slot and checkpoint >= n and sub.slot.attempt == 0:
            log.warning("fault injection: SIGKILL at %s of checkpoint %d", point, checkpoint)
            os.kill(os.getpid(), 9)


class Subtask:
    def __init__(self, spec: JobSpec, chain: Chain, index: int, slot: "Slot") -> None:
        self.spec, self.chain, self.index, self.slot = spec, chain, index, slot
        self.task_id = chain.task_id(index)
        plan = spec.plan
        # Channels are keyed by their text (as on the wire); ``channel_ids`` has their parts.
        inputs = plan.inputs(chain, index)
        outputs = plan.outputs(chain, index)
        self.channel_ids: dict[str, ChannelId] = {
            str(c): c for c in [*inputs, *(c for _, chans in outputs for c in chans)]}
        self.inputs = [str(c) for c in inputs]
        # an iteration's head: its feedback inputs are logged after a snapshot (ABS) and
        # never run out of credit
        self.back = frozenset(str(c) for c in plan.back_channels(chain, index))
        self.gate = InputGate(self.task_id, self.inputs, spec.secret, host=spec.host,
                              unbounded=self.back) if self.inputs else None
        self.outputs: list[tuple[Any, list[str], int]] = [
            (e, [str(c) for c in chans], plan.chains[e.dst].parallelism)
            for e, chans in outputs]
        self.channels: dict[str, OutputChannel] = {}
        self.buffers: dict[str, list] = {}
        self.rr = 0
        nodes = chain.nodes
        self.reader = None
        self.writer = None
        if nodes[0].kind == "source":
            self.reader = nodes[0].fn.create_reader()
            nodes = nodes[1:]
        if nodes and nodes[-1].kind == "sink":
            self.writer = nodes[-1].fn.create_writer()
            nodes = nodes[:-1]
        self.ops = [build_operator(n, index, chain.parallelism, plan.max_parallelism,
                                   state_backend=plan.state_backend, storage=slot.storage)
                    for n in nodes]
        self.uploads: SnapshotUploads | None = None  # asynchronous parts of snapshots
        self._origin: str | None = None  # input channel of the batch in the chain
        self.dead_letters = DeadLetters.for_subtask(plan, chain, index, self.ops, spec.job,
                                                    self.task_id, self._where)
        self.handler = SnapshotHandler(self.inputs, spec.mode, back_edges=self.back,
                                       aligned_timeout=spec.aligned_timeout)
        self.drained = False
        self.forward_closed_sent = False
        self.control: queue.Queue = queue.Queue()
        self.blocked: set[str] = set()
        self.timers: list[tuple[float, int]] = []
        self.pending: dict[int, dict[str, Any]] = {}
        self.uncommitted: dict[int, dict] = {}
        self.outputs_closed = False
        self.last_flush = time.monotonic()
        self.alignment_started: dict[int, float] = {}
        self.records_in = 0
        self.error: BaseException | None = None
        self.last_metrics = 0.0
        self._in_wait = False
        self.route_cache: dict[int, dict] = {}

    # ------------------------------------------------------------------ wiring

    @property
    def address(self) -> tuple[str, int] | None:
        return self.gate.address if self.gate else None

    def connect_outputs(self, addresses: dict[str, tuple[str, int]]) -> None:
        for _, chans, _ in self.outputs:
            for ch in chans:
                dst_task = self.channel_ids[ch].dst_task
                local = self.slot.by_id.get(dst_task)
                if local is not None:  # same process: hand batches over, no socket/pickle
                    self.channels[ch] = local.gate.attach_local(ch)
                else:
                    self.channels[ch] = OutputChannel(ch, tuple(addresses[dst_task]),
                                                      self.spec.secret)
                self.buffers[ch] = []

    def open(self, view: RestoreView | None) -> None:
        """Open the source and sink, and restore what ``view`` (a checkpoint) holds for this
        subtask: matched by operator uid, rescaled when the parallelism changed."""
        chain, index = self.chain, self.index
        if self.reader is not None:
            self.reader.open(index, chain.parallelism)
        if self.writer is not None:
            self.writer.open(index, chain.parallelism, self.spec.job)
        if self.dead_letters is not None:
            self.dead_letters.open(DeadLetters.restored_handles(view, chain, index))
        if view is None:
            if self.writer is not None:
                self.writer.recover([])  # drop staging left by an earlier run of the job
            return
        for op in self.ops:
            if op.keyed:
                op.restore(view.keyed_blobs(chain, index, op.uid))
        own = view.own(chain, index)
        if self.reader is not None:
            if own is not None and own.source is not None:
                self.reader.restore(own.source)
            elif view.source_states(chain.head.uid):
                rescale = getattr(self.reader, "rescale", None)
                if rescale is None:
                    raise RuntimeError(
                        f"source {chain.head.uid!r} cannot be rescaled (its reader has no "
                        f"rescale()): restore it at its old parallelism "
                        f"{view.old_parallelism.get(chain.uid)}")
                rescale(view.source_states(chain.head.uid))
        if self.writer is not None:
            self.writer.recover(view.sink_handles(chain, index, chain.nodes[-1].uid))
        if self.gate is None:
            return
        # inject() puts a batch at the front of its channel: one batch per channel.
        inputs = [self.channel_ids[ch] for ch in self.inputs]
        for ch, records in view.channel_records(chain, index, inputs):
            self.gate.inject(str(ch), records)

    # ------------------------------------------------------------------ data path

    def _chain(self, batch: list) -> list:
        try:
            for op in self.ops:
                if not batch:
                    return batch
                batch = op.process(batch)
        except UserFunctionError as exc:
            exc.locate(self._where())
            raise
        return batch

    def _where(self) -> str:
        """Where the batch in the chain came from: for errors and dead letters."""
        if self._origin is not None:
            return f"input channel {self._origin!r} of task {self.task_id}"
        if self.reader is not None:
            return (f"source {self.chain.head.uid!r} subtask {self.index}, in the batch read "
                    f"up to {_position(self.reader.snapshot())}")
        return f"task {self.task_id}"

    def _emit(self, batch: list) -> None:
        if not batch:
            return
        if self.outputs_closed and self.writer is None:
            raise RuntimeError(f"task {self.task_id} produced {len(batch)} records after its "
                               "outputs ended (an iteration found empty got more input)")
        if self.writer is not None:
            self.writer.write(batch)
            return
        for edge, chans, dst_p in self.outputs:
            if edge.partitioning == HASH:
                key_fn, maxp = edge.key_fn, self.spec.plan.max_parallelism
                cache = self.route_cache.setdefault(id(edge), {})
                if len(cache) > 100_000:
                    cache.clear()  # bounded: many distinct keys just recompute
                buffers = self.buffers
                for r in batch:
                    try:
                        k = key_fn(r)
                    except Exception as exc:  # a bad record: fails the job, named
                        err = UserFunctionError(self.spec.plan.chains[edge.dst].uid, "key_by",
                                                r, exc, index=batch.index(r),
                                                batch_size=len(batch))
                        err.locate(self._where())
                        raise err from exc
                    try:
                        ch = cache[k]
                    except (KeyError, TypeError):
                        ch = chans[subtask_for_key_group(key_group(k, maxp), dst_p, maxp)]
                        try:
                            cache[k] = ch
                        except TypeError:  # unhashable key: no caching
                            pass
                    buffers[ch].append(r)
            elif edge.partitioning == "broadcast":
                for ch in chans:
                    self.buffers[ch].extend(batch)
            else:  # forward (one channel) or rebalance (round robin per batch)
                ch = chans[self.rr % len(chans)]
                self.rr += 1
                self.buffers[ch].extend(batch)

    def _flush(self, ch: str, interruptible: bool = False) -> None:
        """Send the buffer of ``ch``.  At a safe point (between input batches) a send that
        waits for credit is interruptible: triggers, announcements and timers are handled
        between 10 ms waits, so backpressure does not hold a barrier back.  The records
        stay in the buffer until sent: an unaligned barrier emitted meanwhile records them
        as output channel state and goes first."""
        out = self.channels[ch]
        if not interruptible or self._in_wait:
            buf = self.buffers[ch]
            if buf:
                self.buffers[ch] = []
                out.send_records(buf)
            return
        while self.buffers[ch]:
            try:
                out.send_records(self.buffers[ch], timeout=0.01)
                self.buffers[ch] = []
            except TimeoutError:
                self._in_wait = True
                try:
                    self._while_blocked()
                finally:
                    self._in_wait = False

    def _while_blocked(self) -> None:
        self._control()
        if self.timers:
            self._timers()
        if self.gate is not None:
            for ch, barrier in self.gate.announcements():
                self.perform(self.handler.on_announce(ch, barrier))

    def flush_all(self, interruptible: bool = False) -> None:
        for ch in self.buffers:
            self._flush(ch, interruptible)
        self.last_flush = time.monotonic()

    def flush_full(self) -> None:
        """At a safe point: send the buffers that reached the batch size."""
        size = self.spec.batch_size
        for ch, buf in self.buffers.items():
            if len(buf) >= size:
                self._flush(ch, interruptible=True)

    # ------------------------------------------------------------------ protocol actions

    def perform(self, actions: list) -> None:
        for a in actions:
            t = type(a)
            if t is Deliver:
                self.records_in += len(a.records)
                self._origin = a.channel
                self._emit(self._chain(list(a.records)))
            elif t is RecordChannelState:
                # bytes now: a later in-place change of a record must not alter the snapshot
                snap = self.pending[a.checkpoint_id]
                snap["channels"].setdefault(a.channel, []).append(
                    pickle.dumps(a.records, protocol=5))
                snap["in_flight"] += len(a.records)
            elif t is TakeSnapshot:
                self._take_snapshot(a.checkpoint_id)
            elif t is EmitBarrier:
                if a.barrier.unaligned:
                    # Output-side overtaking: the barrier leaves now, ahead of buffered
                    # output; that output belongs to this snapshot as output channel
                    # state (re-sent first on restore) and is sent after the barrier.
                    snap = self.pending.get(a.barrier.checkpoint_id)
                    if snap is not None:
                        snap["out_channels"] = {ch: [pickle.dumps(buf, protocol=5)]
                                                for ch, buf in self.buffers.items() if buf}
                        snap["in_flight"] += sum(len(b) for b in self.buffers.values())
                else:
                    self.flush_all()
                if not self.outputs_closed:  # a drained task's outputs carry EOF already
                    for c in self.channels.values():
                        c.send_barrier(a.barrier)
            elif t is FinishSnapshot:
                self._finish_snapshot(a.checkpoint_id)
            elif t is BlockChannel:
                if self.spec.faults and self.handler.aligning is not None:
                    _fault(self, "alignment", self.handler.aligning)
                self.blocked.add(a.channel)
                self.alignment_started.setdefault(a.channel, time.monotonic())
            elif t is UnblockChannel:
                self.blocked.discard(a.channel)
            elif t is ScheduleTimeout:
                heapq.heappush(self.timers, (time.monotonic() + a.delay, a.checkpoint_id))
            elif t is PrioritizeBarrier:
                # Copy, don't take: the overtaken records become channel state now and are
                # processed later in queue order, so the task is free for the next barrier.
                overtaken = self.gate.copy_through_barrier(a.channel, a.checkpoint_id)
                if overtaken is not None:
                    self.perform(self.handler.on_barrier(
                        a.channel, Barrier(a.checkpoint_id, unaligned=True), overtaken,
                        deliver_overtaken=False))
            elif t is DeclineSnapshot:
                self.pending.pop(a.checkpoint_id, None)
                self.slot.send(m.Decline(self.task_id, a.checkpoint_id, a.reason))

    def _take_snapshot(self, n: int) -> None:
        now = time.monotonic()
        aligned_for = now - min(self.alignment_started.values()) if self.alignment_started else 0.0
        self.alignment_started.clear()
        snap: dict[str, Any] = {"started": now, "alignment": aligned_for, "channels": {},
                                "in_flight": 0, "forward_closed": self._forward_closed(),
                                "ops": {op.uid: op.snapshot() for op in self.ops if op.keyed}}
        if self.reader is not None:
            snap["source"] = self.reader.snapshot()
        if self.writer is not None:
            self.uncommitted[n] = self.writer.pre_commit(n)
            snap["sink"] = [self.uncommitted[k] for k in sorted(self.uncommitted)]
        if self.dead_letters is not None:
            snap["dead_letter"] = self.dead_letters.pre_commit(n)
        self.pending[n] = snap

    def _finish_snapshot(self, n: int) -> None:
        snap = self.pending.pop(n, None)
        if snap is None:
            return
        if any(not isinstance(b, bytes) for b in snap["ops"].values()):
            # A state backend's files (RocksDB) upload on this subtask's upload thread while
            # records keep flowing; the ack leaves once they are up.
            if self.uploads is None:
                self.uploads = SnapshotUploads(self.task_id)
            self.uploads.submit(lambda: self._write_snapshot(n, snap))
        else:
            self._write_snapshot(n, snap)

    def _write_snapshot(self, n: int, snap: dict) -> None:
        deferred = {uid: b for uid, b in snap["ops"].items() if not isinstance(b, bytes)}
        try:
            snap["ops"] = {uid: deferred[uid].finish(self.slot.storage, n) if uid in deferred
                           else b for uid, b in snap["ops"].items()}
        except Exception as exc:  # storage failure declines this checkpoint only
            self.slot.send(m.Decline(self.task_id, n, f"uploading state failed: {exc}"))
            return
        data = encode_task_state(TaskState(
            task=self.task_id, chain=self.chain.uid, index=self.index,
            parallelism=self.chain.parallelism, ops=snap["ops"],
            source_uid=self.chain.head.uid if self.reader is not None else None,
            source=snap.get("source"),
            sink_uid=self.chain.nodes[-1].uid if self.writer is not None else None,
            sink=tuple(snap.get("sink", ())), dead_letter=tuple(snap.get("dead_letter", ())),
            channels={self.channel_ids[ch]: tuple(b) for ch, b in snap["channels"].items()},
            out_channels={self.channel_ids[ch]: tuple(b)
                          for ch, b in snap.get("out_channels", {}).items()}))
        try:
            info = self.slot.storage.write_task_state(n, self.task_id, data)
        except Exception as exc:  # storage failure declines this checkpoint only
            self.slot.send(m.Decline(self.task_id, n, f"writing state failed: {exc}"))
            return
        if self.spec.faults:
            _fault(self, "snapshot_write", n)
        stats = m.SnapshotStats(
            path=info.get("path"), size=info.get("size"), sha256=info.get("sha256"),
            bytes=len(data) + sum(d.uploaded for d in deferred.values()),
            in_flight=snap["in_flight"], alignment=snap["alignment"],
            duration=time.monotonic() - snap["started"], chain=self.chain.uid,
            forward_closed=snap["forward_closed"],
            # shared files the state references: listed in _metadata
            shared={rel: ref for d in deferred.values() for rel, ref in d.shared.items()}
            if deferred else None)
        self.slot.send(m.Ack(self.task_id, n, stats))

    def _commit_upto(self, n: int) -> None:
        done = sorted(k for k in self.uncommitted if k <= n)
        if done and self.writer is not None:
            self.writer.commit([self.uncommitted[k] for k in done])
        for k in done:
            del self.uncommitted[k]
        if self.dead_letters is not None:
            self.dead_letters.commit_upto(n)

    # ------------------------------------------------------------------ control

    def _control(self, block: float = 0.0) -> None:
        try:
            msg = self.control.get(timeout=block) if block else self.control.get_nowait()
        except queue.Empty:
            return
        while True:
            t = type(msg)
            if t is m.Trigger:
                self.perform(self.handler.on_trigger(msg.checkpoint))
            elif t is m.Abort:
                self.pending.pop(msg.checkpoint, None)
                self.perform(self.handler.on_abort(msg.checkpoint))
            elif t is m.Complete:
                if self.spec.faults and self.writer is not None:
                    _fault(self, "before_commit", msg.checkpoint)
                self._commit_upto(msg.checkpoint)
                if self.spec.faults and self.writer is not None:
                    _fault(self, "after_commit", msg.checkpoint)
                if msg.final:
                    raise _Stop
            elif t is m.Stop:
                raise _Stop
            elif t is m.CloseLoop:  # a checkpoint showed this iteration empty: end it
                self._close_outputs()
            else:
                log.error("task %s: unexpected control message %r dropped", self.task_id, msg)
            try:
                msg = self.control.get_nowait()
            except queue.Empty:
                return

    def _metrics(self) -> None:
        now = time.monotonic()
        if now - self.last_metrics >= 0.5:
            self.last_metrics = now
            self.slot.send(m.Metrics(self.task_id, self.records_in, self.reader is not None,
                                     self.slot.cpu()))

    def _timers(self) -> None:
        now = time.monotonic()
        while self.timers and self.timers[0][0] <= now:
            _, n = heapq.heappop(self.timers)
            self.perform(self.handler.on_timeout(n))

    def _close_outputs(self) -> None:
        if self.outputs_closed:
            return
        self.flush_all()
        for c in self.channels.values():
            c.send_eof()
        self.outputs_closed = True

    def _end_output(self) -> None:
        """Input exhausted: flush, send EOF downstream, tell the driver this task drained.

        The final checkpoint of a bounded job is triggered at every task directly once all
        drained, so it covers every record (no barrier can leave data behind it)."""
        self._close_outputs()
        self.drained = True
        self.slot.send(m.Drained(self.task_id))

    def _forward_closed(self) -> bool:
        """An iteration head whose inputs from outside the loop all ended."""
        return bool(self.back) and not (set(self.handler.open_inputs) - self.back)

    # ------------------------------------------------------------------ main loops

    def run(self) -> None:
        try:
            if self.reader is not None:
                self._run_source()
            else:
                self._run_operator()
        except _Stop:
            pass
        except Exception as exc:
            self.error = exc
            # Bad records, user-code errors and a sink refusing a commit (its target holds
            # another run's output) repeat on every retry: the job fails with them named.
            # Anything else (a peer died) fails the Spark task: Spark restarts.
            fatal = isinstance(exc, (UserFunctionError, RecordError, CommitError))
            if not fatal:
                log.warning("task %s failed: %s", self.task_id, exc)
            try:
                self.slot.send(m.Failed(self.task_id, fatal,
                                        str(exc) if fatal else f"{type(exc).__name__}: {exc}",
                                        traceback.format_exc()[-4000:]))
            except OSError:
                pass
            return
        finally:
            self.close()
        self.slot.send(m.Finished(self.task_id, self.slot.cpu()))

    def _run_source(self) -> None:
        size = self.spec.batch_size
        while True:
            self._control()
            if self.drained:
                self._control(block=0.5)
                continue
            batch = self.reader.read_batch(size)
            self._metrics()
            if batch is None:
                self._end_output()
            elif batch:
                self.records_in += len(batch)
                self._emit(self._chain(batch))
                self.flush_full()
                if time.monotonic() - self.last_flush > self.spec.flush_interval:
                    self.flush_all(interruptible=True)
            else:
                self.flush_all(interruptible=True)
                self._control(block=0.005)

    def _run_operator(self) -> None:
        gate, h = self.gate, self.handler
        while True:
            self._control()
            if self.timers:
                self._timers()
            if self.drained:
                self._control(block=0.5)
                continue
            for ch, barrier in gate.announcements():
                self.perform(h.on_announce(ch, barrier))
            item = gate.poll(self.blocked, timeout=self.spec.flush_interval)
            self._metrics()
            if item is None:
                self.flush_all(interruptible=True)
                continue
            ch, kind, payload = item
            if kind == "records":
                self.perform(h.on_records(ch, payload))
            elif kind == "barrier":
                self.perform(h.on_barrier(ch, payload))
            else:
                self.perform(h.on_close(ch))
                if not h.open_inputs:
                    self._end_output()
                    continue
                if self.back and not self.forward_closed_sent and self._forward_closed():
                    self.forward_closed_sent = True
                    self.slot.send(m.ForwardClosed(self.task_id))
            self.flush_full()
            if time.monotonic() - self.last_flush > self.spec.flush_interval:
                self.flush_all(interruptible=True)

    def close(self) -> None:
        if getattr(self, "_closed", False):
            return
        self._closed = True
        for c in self.channels.values():
            try:
                c.close()
            except Exception:  # noqa: BLE001 - closing on the way out
                pass
        if self.gate is not None:
            self.gate.close()
        for res in (self.reader, self.writer, self.dead_letters):
            if res is not None:
                try:
                    res.close()
                except Exception:  # noqa: BLE001
                    pass
        if self.uploads is not None:
            self.uploads.close()
        for op in self.ops:  # state backends: RocksDB removes its local files
            try:
                getattr(op, "close", lambda: None)()
            except Exception:  # noqa: BLE001
                pass


class Slot:
    """The subtasks one Spark task hosts, and their connection to the coordinator."""

    def __init__(self, spec: JobSpec, slot: int) -> None:
        from ..storage.checkpoints import CheckpointStorage

        if not spec.host:  # cluster: listen on this executor's address towards the driver
            spec = replace(spec, host=_address_towards(spec.coordinator))
        self.spec, self.slot = spec, slot
        self.storage = CheckpointStorage(spec.storage_url, spec.job, spec.storage_options)
        self.subtasks = [Subtask(spec, c, i, self) for c, i in spec.plan.tasks_in_slot(slot)]
        self.by_id = {s.task_id: s for s in self.subtasks}
        self.conn: FrameConnection | None = None
        self.attempt = -1
        self._cpu0 = time.process_time()  # Spark reuses worker processes: count from here
        self.stopping = False  # the coordinator stopped the job (stop-with-savepoint)

    def cpu(self) -> float:
        """CPU seconds this process (every thread of it) spent since the slot began."""
        return time.process_time() - self._cpu0

    def send(self, msg: m.Message) -> None:
        if self.conn is None:
            return
        try:
            self.conn.send(msg)
        except OSError:  # the coordinator is gone: this attempt is over, nobody to tell
            for s in self.subtasks:
                s.control.put(m.Stop(lost=True))

    def run(self) -> dict:
        """Register, wait for the start signal, run every subtask to the end."""
        try:
            return self._run()
        finally:  # whatever happened, leave no listener, channel or connection behind
            for s in self.subtasks:
                s.close()
            if self.conn is not None:
                self.conn.close()

    def _run(self) -> dict:
        self.conn = connect(self.spec.coordinator, self.spec.secret)
        self.send(m.Register(self.slot, os.getpid(),
                             {s.task_id: list(s.address) if s.address else None
                              for s in self.subtasks}))
        start = self.conn.recv()
        if type(start) is not m.Start:
            raise RuntimeError(f"coordinator did not start the job: {start}")
        self.attempt = start.attempt
        addresses = {k: tuple(v) for k, v in start.addresses.items() if v}
        view = self._load_restore(start.restore)
        for s in self.subtasks:
            s.connect_outputs(addresses)
        for s in self.subtasks:
            s.open(view)
        threads = [threading.Thread(target=s.run, name=s.task_id, daemon=True)
                   for s in self.subtasks]
        reader = threading.Thread(target=self._read_control, name="control", daemon=True)
        reader.start()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        failed = [s.error for s in self.subtasks if s.error is not None]
        if failed and not self.stopping:  # after a stop, peers going away is expected
            raise failed[0]
        return {"slot": self.slot, "attempt": start.attempt,
                "records": sum(s.records_in for s in self.subtasks)}

    def _load_restore(self, path: str | None) -> RestoreView | None:
        if not path:
            return None
        return RestoreView(read_states(self.storage.open(path)), self.spec.plan)

    def _read_control(self) -> None:
        try:
            while True:
                try:
                    msg = self.conn.recv()
                except m.MessageError as exc:
                    log.error("slot %d: dropped a control message: %s", self.slot, exc)
                    continue
                target = getattr(msg, "task", None)
                if type(msg) is m.Stop:
                    self.stopping = True
                for s in self.subtasks:
                    if target is None or target == s.task_id:
                        s.control.put(msg)
        except (ConnectionError, OSError):
            for s in self.subtasks:  # coordinator gone: stop everything
                s.control.put(m.Stop(lost=True))
