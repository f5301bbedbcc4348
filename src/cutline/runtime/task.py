"""The task executor: one subtask of one chain, driving the snapshot protocol.

A record flows: input channel -> ``SnapshotHandler`` (Deliver) -> the chain's operators ->
output buffers -> output channels.  A barrier flows: coordinator ``trigger`` (sources) or an
input channel -> handler -> TakeSnapshot (operator state, source position, sink
pre-commit) -> EmitBarrier -> FinishSnapshot (state file written) -> ``ack`` to the
coordinator, which writes ``_metadata`` and sends ``complete`` (sinks commit).

A :class:`Subtask` is made of: its operators (:mod:`~cutline.runtime.chain`), its
routing and output channels (:mod:`~cutline.runtime.routing`), and its part of checkpoints
(:mod:`~cutline.runtime.snapshots`: assembled, written, acknowledged, committed, restored).
This module runs the main loops, interprets the protocol's actions and the coordinator's
messages (:mod:`cutline.protocol.messages`); planned faults (tests, chaos) are a
:class:`~cutline.runtime.faults.FaultPlan` installed only when some are planned.

Nothing here knows about Spark; :mod:`cutline.spark` runs :class:`Slot` inside a Spark task.
"""

from __future__ import annotations

import heapq
import logging
import math
import os
import queue
import threading
import time
import traceback
from dataclasses import dataclass, replace
from typing import Any

from ..logical import WindowPartial
from ..plan import Chain, ChannelId, PhysicalPlan
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
from ..protocol.liveness import HEARTBEAT_TIMEOUT
from ..protocol.watermarks import (
    NO_WATERMARK,
    InputIdle,
    Watermark,
    decode_ts,
    encode_ts,
    paused_by_alignment,
)
from .chain import EventTime, OperatorChain
from .channels import InputGate, OutputChannel
from .control import FrameConnection, connect
from .deadletter import DeadLetters
from .failures import describe, repeats, setup_error
from .faults import FaultPlan
from .heartbeats import Heartbeats
from .operators import AssignTimestamps, Filter, FlatMap, Map, UserFunctionError
from .registry import build_operator
from .process import Process
from .restore import RestoreView, read_states
from .routing import Router
from .slot_state import (
    AbandonSubtasks,
    Outcome,
    SlotAction,
    SlotState,
    StopSubtasks,
    StuckSubtasks,
    TellDriver,
)
from .tls import JobSecret
from .windows import WindowOperator
from .snapshots import Snapshots

log = logging.getLogger("cutline.task")

__all__ = ["JobSpec", "Slot", "Subtask"]


@dataclass
class JobSpec:
    """Everything a task needs, shipped to every Spark task (pickled with the closure)."""

    plan: PhysicalPlan
    job: str
    secret: JobSecret  # repr shows no key
    coordinator: tuple[str, int]
    mode: str
    aligned_timeout: float | None
    storage_url: str
    batch_size: int = 1000
    flush_interval: float = 0.01
    host: str = "127.0.0.1"
    # Fault injection (tests, chaos): (point, slot, checkpoint) -> SIGKILL this worker in
    # the first attempt (:mod:`cutline.runtime.faults`).
    faults: tuple[tuple[str, int, int], ...] = ()
    # fsspec options for storage_url (CheckpointConfig.storage_options)
    storage_options: dict | None = None
    # a peer (the driver, a channel's other end) silent this long is failed
    heartbeat_timeout: float = HEARTBEAT_TIMEOUT


_TIME_TYPES = frozenset((Watermark, InputIdle))


class _Stop(Exception):
    pass


class AttemptAbandoned(RuntimeError):
    """The driver gave up this attempt (another task of it was lost): the Spark task fails
    with it, so Spark reruns the whole barrier stage."""


class _Abandon:
    """Put on a subtask's control queue by its slot when a sibling subtask failed: end now,
    quietly (the sibling's failure is the news)."""


def _count(batch: Any, timed: bool = False) -> int:
    """Records in a batch: the rows of a batch stream's record batches.  With event time
    (``timed``) a batch also carries watermarks and idle markers: they are not records; and
    a window's partial aggregates (two-phase) count as the records they hold."""
    if timed and batch:
        types = set(map(type, batch))
        if not _TIME_TYPES.isdisjoint(types):
            batch = [x for x in batch if type(x) not in _TIME_TYPES]
        if WindowPartial in types:
            return sum(x.n if type(x) is WindowPartial else 1 for x in batch)
    if batch and type(batch[0]).__module__ == "pyarrow.lib":
        return sum(getattr(b, "num_rows", 1) for b in batch)
    return len(batch)


def _address_towards(peer: tuple[str, int]) -> str:
    """This host's address on the interface that routes to ``peer`` (no packet is sent)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(peer)
        return s.getsockname()[0]


class Subtask:
    """One subtask of one chain: its input (a source or channels), operator chain, routing
    and snapshots, driven by the snapshot protocol and the coordinator's messages."""

    def __init__(self, spec: JobSpec, chain: Chain, index: int, slot: Slot) -> None:
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
                              unbounded=self.back, heartbeats=slot.heartbeats) \
            if self.inputs else None
        nodes = chain.nodes
        self.reader = None
        self.writer = None
        if nodes[0].kind == "source":
            self.reader = nodes[0].fn.create_reader()
            nodes = nodes[1:]
        if nodes and nodes[-1].kind == "sink":
            self.writer = nodes[-1].fn.create_writer()
            self.writer.operator = nodes[-1].uid  # named in its errors
            nodes = nodes[:-1]
        ops = [build_operator(n, index, chain.parallelism, plan.max_parallelism,
                              state_backend=plan.state_backend, storage=slot.storage)
               for n in nodes]
        self.operators = OperatorChain(ops, self.task_id, chain.head.uid, index, self.reader)
        self.router = Router(self.task_id, [
            (e, [str(c) for c in chans], plan.chains[e.dst].parallelism, plan.chains[e.dst].uid)
            for e, chans in outputs], plan.max_parallelism, self.writer, self.operators.where,
            spec.batch_size, self._while_blocked)
        self.dead_letters = DeadLetters.for_subtask(plan, chain, index, ops, spec.job,
                                                    self.task_id, self.operators.where)
        self.snapshots = Snapshots(self.task_id, chain, index, ops, self.reader, self.writer,
                                   self.dead_letters, slot.storage, self.channel_ids,
                                   slot.send)
        # event time: only a pipeline with assign_timestamps splits batches at watermarks
        self.event_time: EventTime | None = None
        # watermark alignment across the source's subtasks (assign_timestamps(max_drift=)):
        # its assigner, and the group's floor the driver sent last (m.Align)
        self.aligned: AssignTimestamps | None = None
        self.align_floor: float | None = None
        # until the driver knows every member's watermark (no floor yet), this subtask
        # holds itself to max_drift above its own first watermark: a member that starts
        # late (a starved thread, a slow worker) is not left behind by files of the others
        self.align_start: float | None = None
        if plan.timed:
            self.event_time = EventTime(self.operators, self.inputs, self.router.emit,
                                  self.router.broadcast)
            # one watermark per source split: the assigner right after the source, or
            # after stateless operators only (a batch is then still one split's records)
            stamp = next((op for op in ops if isinstance(op, AssignTimestamps)), None)
            if self.reader is not None and stamp is not None and all(
                    type(op) in (Map, FlatMap, Filter) for op in ops[:ops.index(stamp)]):
                stamp.read_splits_of(self.reader)
                if stamp.max_drift is not None:
                    self.aligned = stamp  # aligned with the source's other subtasks
            self.snapshots.event_time = self.event_time
        self.handler = SnapshotHandler(self.inputs, spec.mode, back_edges=self.back,
                                       aligned_timeout=spec.aligned_timeout)
        # operators with processing-time timers (process with on_timer): polled by the loop
        self.processing_timers = [i for i, op in enumerate(ops)
                                  if getattr(op, "has_processing_timers", False)]
        # operators holding output back (two-phase aggregation, time-sized updates): flushed
        # before each snapshot, at the end of input and every ``flush_every`` seconds
        self.flushing = any(op.flushes for op in ops)
        self.flush_every = min((op.interval for op in ops if op.flushes and op.interval),
                               default=None)
        self.next_flush = time.monotonic() + (self.flush_every or 0.0)
        # the record path, looked up once
        self._process, self._emit = self.operators.process, self.router.emit
        self.flush_all, self.flush_full = self.router.flush_all, self.router.flush_full
        self.drained = False
        self.forward_closed_sent = False
        self.control: queue.Queue = queue.Queue()
        self.blocked: set[str] = set()
        self.timers: list[tuple[float, int]] = []
        self.records_in = 0
        self.error: BaseException | None = None
        self.last_metrics = 0.0
        # pending timers for the live view: counted every few seconds (RocksDB reads them)
        self.timer_ops = [op for op in ops if isinstance(op, Process) and op.has_processing_timers]
        # window operators that drop late records (no .late()): counts for the driver
        self.late_ops = [op for op in ops
                         if isinstance(op, WindowOperator) and not op.spec.emit_late]
        self.timers_counted, self.timers_at = 0, -math.inf
        # a source that tells its lag per split and why it is stalled (KafkaSource)
        lag, stalled = getattr(self.reader, "lag", None), getattr(self.reader, "stalled", None)
        self.reader_lag = lag if callable(lag) else None
        self.reader_stalled = stalled if callable(stalled) else None
        # a sink that tells why it is stalled (KafkaSink waiting for its broker's
        # acknowledgements): it calls on_wait while it waits, so the driver hears of it
        writer = self.writer
        stalled = getattr(writer, "stalled", None)
        self.writer_stalled = stalled if callable(stalled) else None
        if writer is not None and self.writer_stalled is not None and \
                hasattr(writer, "on_wait"):
            writer.on_wait = self._metrics

    def plan_faults(self, attempt: int) -> None:
        """Install the faults planned for this subtask in ``attempt`` (tests, chaos)."""
        if self.spec.faults:
            self.snapshots.faults = FaultPlan.for_subtask(
                self.spec.faults, self.slot.slot, attempt, self.writer is not None)

    # ------------------------------------------------------------------ wiring

    @property
    def address(self) -> tuple[str, int] | None:
        return self.gate.address if self.gate else None

    def connect_outputs(self, addresses: dict[str, tuple[str, int]]) -> None:
        """``addresses``: each task's input gate (a channel id as key: that channel's own
        route, a test's fault-injecting proxy)."""
        for ch in self.router.buffers:
            dst_task = self.channel_ids[ch].dst_task
            local = self.slot.by_id.get(dst_task)
            if local is not None and local.gate is not None:  # same process: no socket
                self.router.channels[ch] = local.gate.attach_local(ch)
            else:
                self.router.channels[ch] = OutputChannel(
                    ch, addresses.get(ch) or addresses[dst_task], self.spec.secret,
                    heartbeats=self.slot.heartbeats)

    def open(self, view: RestoreView | None) -> None:
        """Open the source and sink, and restore what ``view`` (a checkpoint) holds for this
        subtask (:meth:`Snapshots.restore`)."""
        if self.reader is not None:
            self.reader.open(self.index, self.chain.parallelism)
        if self.writer is not None:
            self.writer.open(self.index, self.chain.parallelism, self.spec.job)
        self.snapshots.restore(view, self.gate, self.inputs)

    # ------------------------------------------------------------------ data path

    def _while_blocked(self) -> None:
        self._metrics()  # a task waiting for credit reports it (backpressure)
        self._control()
        if self.timers:
            self._timers()
        if self.gate is not None:
            for ch, barrier in self.gate.announcements():
                self.perform(self.handler.on_announce(ch, barrier))

    # ------------------------------------------------------------------ protocol actions

    def perform(self, actions: list) -> None:
        for a in actions:
            t = type(a)
            if t is Deliver:
                self.records_in += _count(a.records, self.event_time is not None)
                self.operators.origin = a.channel
                if self.event_time is None:
                    self._emit(self._process(list(a.records)))
                else:
                    self.event_time.deliver(list(a.records), a.channel)
            elif t is RecordChannelState:
                self.snapshots.record_channel(a.checkpoint_id, a.channel, a.records)
            elif t is TakeSnapshot:
                if self.flushing:  # what is held back leaves before the barrier
                    self._flush_held()
                self.snapshots.take(a.checkpoint_id, self._forward_closed())
            elif t is EmitBarrier:
                if a.barrier.unaligned:
                    # Output-side overtaking: the barrier leaves now, ahead of buffered
                    # output, which belongs to this snapshot and is sent after the barrier.
                    self.snapshots.record_output(a.barrier.checkpoint_id, self.router.buffers)
                else:
                    self.flush_all()
                self.router.send_barrier(a.barrier)
            elif t is FinishSnapshot:
                self.snapshots.finish(a.checkpoint_id)
            elif t is BlockChannel:
                self.snapshots.channel_blocked(a.channel, self.handler.aligning)
                self.blocked.add(a.channel)
            elif t is UnblockChannel:
                self.blocked.discard(a.channel)
            elif t is ScheduleTimeout:
                heapq.heappush(self.timers, (time.monotonic() + a.delay, a.checkpoint_id))
            elif t is PrioritizeBarrier:
                # Copy, don't take: the overtaken records become channel state now and are
                # processed later in queue order, so the task is free for the next barrier.
                assert self.gate is not None  # a barrier came on an input channel
                overtaken = self.gate.copy_through_barrier(a.channel, a.checkpoint_id)
                if overtaken is not None:
                    self.perform(self.handler.on_barrier(
                        a.channel, Barrier(a.checkpoint_id, unaligned=True), overtaken,
                        deliver_overtaken=False))
            elif t is DeclineSnapshot:
                self.snapshots.drop(a.checkpoint_id)
                self.slot.send(m.Decline(self.task_id, a.checkpoint_id, a.reason))

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
                self.snapshots.drop(msg.checkpoint)
                self.perform(self.handler.on_abort(msg.checkpoint))
            elif t is m.Complete:
                self.snapshots.commit_upto(msg.checkpoint)
                if msg.final:
                    raise _Stop
            elif t is m.Stop or t is _Abandon:
                raise _Stop
            elif t is m.CloseLoop:  # a checkpoint showed this iteration empty: end it
                self.router.close_outputs()
            elif t is m.Align:  # the slowest subtask's watermark of this source
                self.align_floor = decode_ts(msg.watermark)
            else:
                log.error("task %s: unexpected control message %r dropped", self.task_id, msg)
            try:
                msg = self.control.get_nowait()
            except queue.Empty:
                return

    def _metrics(self, force: bool = False) -> None:
        now = time.monotonic()
        # (a source aligned with its other subtasks reports 10x as often: the slowest's
        # watermark is what the others wait for)
        if force or now - self.last_metrics >= (0.5 if self.aligned is None else 0.05):
            self.last_metrics = now
            et = self.event_time
            if self.timer_ops and (force or now - self.timers_at >= 5.0):
                self.timers_at, left = now, m.TIMERS_COUNTED
                for op in self.timer_ops:
                    left -= op.timer_count(left)
                    if left <= 0:
                        break
                self.timers_counted = m.TIMERS_COUNTED - left
            late = first = None
            if self.late_ops:
                late = {op.uid: op.late.total for op in self.late_ops}
                first = {op.uid: list(op.late.first) for op in self.late_ops
                         if op.late.first is not None} or None
            lag = self.reader_lag() if self.reader_lag is not None else None
            stalled = self.reader_stalled() if self.reader_stalled is not None else None
            if stalled is None and self.writer_stalled is not None:
                stalled = self.writer_stalled()
            self.slot.send(m.Metrics(self.task_id, self.records_in, self.reader is not None,
                                     self.slot.cpu(), et is not None,
                                     None if et is None else encode_ts(et.output),
                                     self.router.backpressured_now(), self.timers_counted,
                                     late, first, lag, stalled, self._idle_for_alignment()))

    def _idle_for_alignment(self) -> bool:
        """Watermark alignment: this source subtask holds no other back (its assigner is
        idle, or it has no split to read now)."""
        op = self.aligned
        if op is None:
            return False
        reader = self.reader
        return bool(op.idle) or (op.splits is not None and reader is not None
                                 and not reader.split_keys())

    def _timers(self) -> None:
        now = time.monotonic()
        while self.timers and self.timers[0][0] <= now:
            _, n = heapq.heappop(self.timers)
            self.perform(self.handler.on_timeout(n))

    def _fire_processing_timers(self) -> None:
        """Fire the processing-time timers that are due (wall clock, epoch seconds); each
        operator's output goes through the operators after it.  On the task's thread
        between batches: a timer's effects and output fall on one side of every barrier."""
        now = time.time()
        ops = self.operators.ops
        try:
            for i in self.processing_timers:
                op = ops[i]
                if op.next_processing_time() > now:
                    continue
                out = op.on_processing_time(now)
                if not out:
                    continue
                if self.event_time is not None:
                    out = self.event_time.run(out, i + 1)
                else:
                    for later in ops[i + 1:]:
                        if not out:
                            break
                        out = later.process(out)
                self._emit(out)
        except UserFunctionError as exc:
            exc.locate(f"processing-time timers of task {self.task_id}")
            raise

    def _end_output(self) -> None:
        """Input exhausted: flush, send EOF downstream, tell the driver this task drained.

        The final checkpoint of a bounded job is triggered at every task directly once all
        drained, so it covers every record (no barrier can leave data behind it).  With
        event time, every watermark of the task goes to ``inf`` first: each window and
        event-time timer fires, and the final checkpoint records the end of input."""
        if self.event_time is not None:
            self.event_time.end_of_input()
        if self.flushing:
            self._flush_held()
        self.router.close_outputs()
        self.drained = True
        self._metrics(force=True)  # its final counts
        self.slot.send(m.Drained(self.task_id))

    def _flush_held(self) -> None:
        """What operators held back (:attr:`flushing`) goes on now, on the task's thread
        between batches (:meth:`OperatorChain.flush`)."""
        et = self.event_time
        self.operators.flush(et.run if et is not None else self.operators.run_from,
                             self._emit)
        if self.flush_every is not None:
            self.next_flush = time.monotonic() + self.flush_every

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
        except Exception as exc:  # noqa: BLE001 - reported to the driver
            # Bad records, user-code errors, unpicklable records and a sink refusing a
            # commit (its target holds another run's output) repeat on every retry: the job
            # fails with them named.  Anything else (a peer died) fails the Spark task:
            # Spark restarts.  A task failing because its slot or job is going away (a
            # sibling failed, a stop) is no news: the first failure is the cause.
            self.error = exc
            fatal = repeats(exc)
            # a broken channel is news unless the job is ending (give a Stop in flight
            # half a second to arrive: peers stop in no particular order)
            # (a peer gone silent is news at once: this task found the cause, the peer's
            # other partners only see it close)
            silent = getattr(exc, "silent", False)
            quiet = self.slot.ending.is_set() or (
                not fatal and not silent and self.slot.ending.wait(0.5))
            self.slot.failed(self, fatal)
            if quiet:
                log.debug("task %s ended: %s", self.task_id, exc)
                return
            if not fatal:
                log.warning("task %s failed: %s", self.task_id, exc)
            try:
                self.slot.send(m.Failed(self.task_id, fatal, describe(exc),
                                        traceback.format_exc()[-4000:]))
            except OSError:
                pass
            return
        finally:
            self.close()
        if not self.slot.failing:
            self.slot.send(m.Finished(self.task_id, self.slot.cpu()))

    def _run_source(self) -> None:
        size, router, reader = self.spec.batch_size, self.router, self.reader
        assert reader is not None
        while True:
            self._control()
            if self.drained:
                self._control(block=0.5)
                continue
            aligned = self.aligned
            if aligned is not None and self.align_start is None \
                    and aligned.emitted != NO_WATERMARK:
                self.align_start = aligned.emitted
            if aligned is not None and paused_by_alignment(
                    aligned.emitted, self.align_floor if self.align_floor is not None
                    else self.align_start, aligned.max_drift) \
                    and not self._idle_for_alignment():  # (with no split: read to the end)
                self._metrics()  # (its watermark still reaches the driver)
                self.flush_all(interruptible=True)
                self._control(block=0.01)  # until the slowest caught up (m.Align)
                continue
            batch = reader.read_batch(size)
            self._metrics()
            if self.flush_every is not None and time.monotonic() >= self.next_flush:
                self._flush_held()
            if batch is None:
                self._end_output()
            elif batch:
                self.records_in += _count(batch)
                if self.event_time is None:
                    self._emit(self._process(batch))
                else:
                    self.event_time.deliver(batch, None)
                self.flush_full()
                if time.monotonic() - router.last_flush > self.spec.flush_interval:
                    self.flush_all(interruptible=True)
            else:
                if self.event_time is not None and self.event_time.idle_assigners:
                    self.event_time.check_idle(time.monotonic())
                self.flush_all(interruptible=True)
                self._control(block=0.005)

    def _run_operator(self) -> None:
        gate, h, router = self.gate, self.handler, self.router
        assert gate is not None
        while True:
            self._control()
            if self.timers:
                self._timers()
            if self.drained:
                self._control(block=0.5)
                continue
            if self.processing_timers:
                self._fire_processing_timers()
            if self.flush_every is not None and time.monotonic() >= self.next_flush:
                self._flush_held()
            for ch, barrier in gate.announcements():
                self.perform(h.on_announce(ch, barrier))
            item = gate.poll(self.blocked, timeout=self.spec.flush_interval)
            self._metrics()
            if item is None:
                if self.event_time is not None and self.event_time.idle_assigners:
                    self.event_time.check_idle(time.monotonic())
                self.flush_all(interruptible=True)
                continue
            ch, kind, payload = item
            if kind == "records":
                self.perform(h.on_records(ch, payload))
            elif kind == "barrier":
                self.perform(h.on_barrier(ch, payload))
            else:
                self.perform(h.on_close(ch))
                if self.event_time is not None:
                    self.event_time.on_close(ch)
                if not h.open_inputs:
                    self._end_output()
                    continue
                if self.back and not self.forward_closed_sent and self._forward_closed():
                    self.forward_closed_sent = True
                    self.slot.send(m.ForwardClosed(self.task_id))
            self.flush_full()
            if time.monotonic() - router.last_flush > self.spec.flush_interval:
                self.flush_all(interruptible=True)

    def close(self) -> None:
        if getattr(self, "_closed", False):
            return
        self._closed = True
        self.router.close()
        if self.gate is not None:
            self.gate.close()
        for res in (self.reader, self.writer, self.dead_letters):
            if res is not None:
                try:
                    res.close()
                except Exception:  # noqa: BLE001, S110 - closing on the way out
                    pass
        self.snapshots.close()
        self.operators.close()


class Slot:
    """The subtasks one Spark task hosts, and their connection to the coordinator.

    Its lifecycle (a subtask failed, the driver stopped the job or gave the attempt up, the
    driver is gone or silent, a subtask thread is stuck) is a
    :class:`~cutline.runtime.slot_state.SlotState`: the threads that learn something
    (subtasks, the control reader, the heartbeat monitor, the joining main thread) tell it
    under one lock and carry out the actions it returns."""

    def __init__(self, spec: JobSpec, slot: int) -> None:
        from ..storage.checkpoints import CheckpointStorage

        if not spec.host:  # cluster: listen on this executor's address towards the driver
            spec = replace(spec, host=_address_towards(spec.coordinator))
        self.spec, self.slot = spec, slot
        self.storage = CheckpointStorage(spec.storage_url, spec.job, spec.storage_options)
        # mirrors of the state for the subtask threads: end quietly (a subtask failed, the
        # job stops, the driver is gone); the control connection closed
        self.ending = threading.Event()
        self._lost = threading.Event()
        self._lock = threading.Lock()  # the state's: events come from several threads
        self.heartbeats = Heartbeats(spec.heartbeat_timeout, f"cutline-heartbeats-{slot}")
        self.subtasks: list[Subtask] = []
        try:
            for c, i in spec.plan.tasks_in_slot(slot):
                self.subtasks.append(Subtask(spec, c, i, self))
        except Exception as exc:
            for s in self.subtasks:
                s.close()
            raise setup_error(f"setting up slot {slot} of job {spec.job!r} failed", exc) \
                from exc
        self.by_id = {s.task_id: s for s in self.subtasks}
        self.state = SlotState(self.by_id)
        self.conn: FrameConnection | None = None
        self.attempt = -1
        self._cpu0 = time.process_time()  # Spark reuses worker processes: count from here

    def cpu(self) -> float:
        """CPU seconds this process (every thread of it) spent since the slot began."""
        return time.process_time() - self._cpu0

    @property
    def failing(self) -> bool:
        """A subtask failed."""
        return self.state.failing

    def _tell(self, event: Any, *args: Any) -> None:
        """``event(*args, now)`` on the state, then its actions."""
        with self._lock:
            actions = event(*args, time.monotonic())
            ending = self.state.ending
        if ending:
            self.ending.set()
        self._act(actions)

    def _act(self, actions: list[SlotAction]) -> None:
        for a in actions:
            if type(a) is AbandonSubtasks:
                for task in a.tasks:
                    self.by_id[task].control.put(_Abandon())
            elif type(a) is StopSubtasks:
                for task in a.tasks:
                    self.by_id[task].control.put(m.Stop(lost=True))
            elif type(a) is TellDriver:
                if self.conn is not None:
                    self.conn.try_send(m.Failed(f"slot {self.slot}", False, a.reason))

    def failed(self, subtask: Subtask, fatal: bool) -> None:
        """``subtask`` failed: its siblings end now (the Spark task must end within
        seconds, for a restart or for the job to fail), quietly."""
        self._tell(self.state.on_subtask_failed, subtask.task_id, fatal)

    def send(self, msg: m.Message) -> None:
        if self.conn is None:
            return
        try:
            self.conn.send(msg)
        except OSError:  # the coordinator is gone: this attempt is over, nobody to tell
            self._tell(self.state.on_send_failed)

    def run(self) -> dict:
        """Register, wait for the start signal, run every subtask to the end."""
        try:
            return self._run()
        finally:  # whatever happened, leave no listener, channel or connection behind
            self.heartbeats.stop()
            for s in self.subtasks:
                s.close()
            if self.conn is not None:
                self.conn.close()

    def _run(self) -> dict:
        self.conn = connect(self.spec.coordinator, self.spec.secret,
                            timeout=min(30.0, self.spec.heartbeat_timeout))
        self.heartbeats.start()
        self.heartbeats.watch(self.conn.conn, "the driver", self._driver_went_silent)
        self.send(m.Register(self.slot, os.getpid(),
                             {s.task_id: list(s.address) if s.address else None
                              for s in self.subtasks}))
        start = self.conn.recv()
        if type(start) is not m.Start:
            raise RuntimeError(f"coordinator did not start the job: {start}")
        self.attempt = start.attempt
        addresses = {k: tuple(v) for k, v in start.addresses.items() if v}
        try:
            view = self._load_restore(start.restore)
            for s in self.subtasks:
                s.plan_faults(self.attempt)
                s.connect_outputs(addresses)
            for s in self.subtasks:
                s.open(view)
        except Exception as exc:
            err = setup_error(f"slot {self.slot} of job {self.spec.job!r} could not restore or "
                              "open its tasks", exc)
            if not repeats(err):
                raise
            self.send(m.Failed(f"slot {self.slot}", True, str(err),
                               traceback.format_exc()[-4000:]))
            self._wait_for_driver()
            return {"slot": self.slot, "attempt": start.attempt, "failed": str(err)}
        threads = [threading.Thread(target=s.run, name=s.task_id, daemon=True)
                   for s in self.subtasks]
        reader = threading.Thread(target=self._read_control, name="control", daemon=True)
        reader.start()
        for t in threads:
            t.start()
        self._join(threads)
        state = self.state
        outcome = state.outcome()
        if outcome is Outcome.STUCK:
            # a thread that outlives its attempt must not go on in a reused worker: the
            # process ends (cutline.spark.probe), after the driver heard a fatal failure
            if state.fatal:
                self._wait_for_driver()
            why = (f"a subtask failed ({', '.join(state.failed)})" if state.failed
                   else f"the driver gave the attempt up ({state.abandoned})"
                   if state.abandoned else "the driver is gone")
            message = (f"slot {self.slot}: subtask thread(s) {', '.join(state.stuck)} did "
                       f"not return within {state.grace:g} s after {why}: the process that "
                       "runs them ends")
            log.error("%s", message)
            raise StuckSubtasks(message, state.stuck)
        if outcome is Outcome.DRIVER_SILENT:  # a Spark task fails: Spark retries
            raise ConnectionError(f"slot {self.slot}: {state.driver_silent}")
        if outcome is Outcome.ABANDONED:
            raise AttemptAbandoned(f"slot {self.slot}: {state.abandoned}")
        if outcome is Outcome.FATAL:
            # The driver fails the job with the cause: no Spark retry, no second report.
            self._wait_for_driver()
        elif outcome is Outcome.FAILED:
            raise next(s.error for s in self.subtasks if s.error is not None)
        return {"slot": self.slot, "attempt": start.attempt,
                "records": sum(s.records_in for s in self.subtasks)}

    def _join(self, threads: list[threading.Thread]) -> None:
        """Until every subtask thread returned, or the state gave the rest up (stuck past
        the grace once the attempt was over)."""
        by_task = {s.task_id: t for s, t in zip(self.subtasks, threads)}
        while True:
            with self._lock:
                now = time.monotonic()
                for task, t in by_task.items():
                    if task in self.state.alive and not t.is_alive():
                        self.state.on_subtask_ended(task, now)
                self.state.tick(now)
                waiting = [t for task, t in by_task.items()
                           if task in self.state.alive and task not in self.state.stuck]
            if not waiting:
                return
            waiting[0].join(0.1)

    def _wait_for_driver(self, timeout: float = 10.0) -> None:
        """After a fatal failure: the driver ends the job and closes our connection."""
        self._lost.wait(timeout)

    def _driver_went_silent(self, reason: str) -> None:
        """Tell the driver, if it still listens (one direction of a half-open connection
        may work): its job error then says why this slot left."""
        self._tell(self.state.on_driver_silent, reason)

    def _load_restore(self, path: str | None) -> RestoreView | None:
        if not path:
            return None
        return RestoreView(read_states(self.storage.open(path)), self.spec.plan)

    def _read_control(self) -> None:
        conn = self.conn
        assert conn is not None
        try:
            while True:
                try:
                    msg = conn.recv()
                except m.MessageError as exc:
                    log.error("slot %d: dropped a control message: %s", self.slot, exc)
                    continue
                target = getattr(msg, "task", None)
                if type(msg) is m.Stop:
                    self._tell(self.state.on_stop, msg.abandoned)
                for s in self.subtasks:
                    if target is None or target == s.task_id:
                        s.control.put(msg)
        except (ConnectionError, OSError):
            self._lost.set()
            self._tell(self.state.on_connection_lost)  # coordinator gone: stop everything
