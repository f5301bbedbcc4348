"""The operator chain of a subtask: batches pass through its operators by function call.

``OperatorChain.process(batch)`` runs the chain's operators (maps, filters, keyed
operators ...; the source and the sink are the task's ends, not in the chain) and names the
batch's origin in a user-code error: the input channel it came from, or the source position
it was read up to.

**Event time** (a pipeline with ``assign_timestamps``; :class:`EventTime`, used only then,
so a pipeline without it pays nothing): a delivered batch is split at its
:class:`~cutline.protocol.watermarks.Watermark` / ``IDLE`` items.  Records go through
``process``; a watermark goes to the task's :class:`WatermarkTracker` for its input
channel, and when the combined watermark advances every operator gets ``on_watermark(ts)``
in chain order (operator i's output goes through operators i+1.. first), then the router
broadcasts ``Watermark(ts)`` on every output channel, after the records already buffered.
An assigner in the chain (``AssignTimestamps``) starts a new *segment*: the operators after
it follow its watermarks, not the input's.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import Any

from ..protocol.watermarks import (
    IDLE,
    NO_WATERMARK,
    InputIdle,
    Watermark,
    WatermarkTracker,
    encode_ts,
    restored_ts,
)
from .operators import UserFunctionError

__all__ = ["EventTime", "OperatorChain", "describe_position", "restored_segments"]

_TIME_TYPES = frozenset((Watermark, InputIdle))


def describe_position(pos: Any) -> str:
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


class OperatorChain:
    """The operators between a subtask's input (a source or channels) and its output."""

    def __init__(self, ops: list, task_id: str, source_uid: str | None, index: int,
                 reader: Any) -> None:
        self.ops = ops
        self.task_id, self.source_uid, self.index, self.reader = task_id, source_uid, index, reader
        self.origin: str | None = None  # input channel of the batch in the chain

    def process(self, batch: list) -> list:
        op = None
        try:
            for op in self.ops:
                if not batch:
                    return batch
                batch = op.process(batch)
        except UserFunctionError as exc:
            # the first operator got the source's batch as read: its index is the reader's
            exc.locate(self.where(exc.index if op is self.ops[0] else None))
            raise
        return batch

    def where(self, index: int | None = None) -> str:
        """Where the batch in the chain came from (record ``index`` of what the source
        read, if known): for errors and dead letters."""
        if self.origin is not None:
            return f"input channel {self.origin!r} of task {self.task_id}"
        if self.reader is not None:
            locate = getattr(self.reader, "locate", None)
            at = locate(index) if locate is not None else None
            if at:
                return f"source {self.source_uid!r} subtask {self.index}, {at}"
            return (f"source {self.source_uid!r} subtask {self.index}, in the batch read "
                    f"up to {describe_position(self.reader.snapshot())}")
        return f"task {self.task_id}"

    def run_from(self, batch: list, start: int) -> list:
        """``batch`` through operators ``start``.. (a pipeline without event time)."""
        for op in self.ops[start:]:
            if not batch:
                break
            batch = op.process(batch)
        return batch

    def flush(self, run: Callable[[list, int], list], emit: Callable[[list], None]) -> None:
        """The operators that hold output back (``Operator.flushes``: a two-phase
        aggregation's combine, a time-sized update stream) send it on, in chain order: each
        one's through the operators after it (``run(batch, start)``), then ``emit``."""
        try:
            for i, op in enumerate(self.ops):
                if op.flushes:
                    out = op.flush()
                    if out:
                        emit(run(out, i + 1))
        except UserFunctionError as exc:
            exc.locate(self.where())
            raise

    def keyed(self) -> list:
        """The operators with keyed state (snapshotted and restored by uid)."""
        return [op for op in self.ops if op.keyed]

    def close(self) -> None:
        for op in self.ops:  # state backends: RocksDB removes its local files
            try:
                getattr(op, "close", lambda: None)()
            except Exception:  # noqa: BLE001, S110 - closing on the way out
                pass


def restored_segments(state: Mapping[str, Any]) -> list[float]:
    """The segments' watermarks of an :meth:`EventTime.snapshot`, as a restore takes them:
    one at the end of input (``"inf"``) as its last real one (:func:`restored_ts`)."""
    saved = state.get("segments") or []
    real = (state.get("real") or {}).get("segments") or []
    return [restored_ts(v, dict(enumerate(real)), k) for k, v in enumerate(saved)]


class EventTime:
    """The event-time part of a subtask's chain (only for pipelines with event time).

    ``chain``: the :class:`OperatorChain`; ``inputs``: the input channels (none for a source
    task); ``emit(batch)`` routes records, ``broadcast(item)`` puts a time item on every
    output channel (the router; a sink drops it).

    Segment 0 is the operators before the chain's first assigner, driven by the input
    channels' combined watermark; segment k the operators after assigner k-1, driven by it.
    The last segment's watermark is the task's output watermark.
    """

    def __init__(self, chain: OperatorChain, inputs: list[str],
                 emit: Callable[[list], None], broadcast: Callable[[Any], None]) -> None:
        self.chain, self.ops, self.emit, self.broadcast = chain, chain.ops, emit, broadcast
        self.tracker = WatermarkTracker(inputs)
        self.assigners = [i for i, op in enumerate(self.ops) if op.emits_watermarks]
        self.starts = [0] + [a + 1 for a in self.assigners]
        self.ends = self.assigners + [len(self.ops)]
        self.segment_after = {a: k + 1 for k, a in enumerate(self.assigners)}
        self.wm = [NO_WATERMARK] * len(self.starts)  # per segment: what its operators saw
        self.real = list(self.wm)  # per segment: its last finite watermark (once at inf)
        self.last = len(self.starts) - 1
        self.idle_assigners = [self.ops[a] for a in self.assigners
                               if self.ops[a].idle_timeout is not None]

    @property
    def output(self) -> float:
        """The task's output watermark (what it broadcast last)."""
        return self.wm[self.last]

    # ------------------------------------------------------------------ data path

    def deliver(self, batch: list, channel: str | None) -> None:
        """A batch from input ``channel`` (``None``: the task's source), records and time
        items in channel order: each part in turn, outputs emitted."""
        try:
            if _TIME_TYPES.isdisjoint(map(type, batch)):  # the common case, at C speed
                self._records(batch, channel)
                return
            start, n = 0, len(batch)
            tracker, advance = self.tracker, self.advance
            for i, item in enumerate(batch):
                t = type(item)
                if t is not Watermark and t is not InputIdle:
                    continue
                if i > start:
                    self._records(batch[start:i], channel)
                start = i + 1
                if t is Watermark:
                    ts = tracker.on_watermark(channel, item.ts)
                else:
                    ts = tracker.on_idle(channel)
                if ts is not None:
                    advance(0, ts)
                if t is InputIdle and self.last == 0 and tracker.all_idle:
                    self.go_idle()  # every input idle: so is this task's output
            if start == 0:
                self._records(batch, channel)
            elif start < n:
                self._records(batch[start:], channel)
        except UserFunctionError as exc:
            exc.locate(self.chain.where())
            raise

    def _records(self, records: list, channel: str | None) -> None:
        if channel is not None:
            ts = self.tracker.on_active(channel)
            if ts is not None:
                self.advance(0, ts)
        self.emit(self.run(records, 0))
        if self.idle_assigners:  # records a filter before the assigner drops are no input
            self.check_idle(time.monotonic())

    def run(self, batch: list, start: int) -> list:
        """``batch`` through operators ``start``..; an assigner whose watermark rose sends
        the rest of the batch on, then advances its segment."""
        ops = self.ops
        for i in range(start, len(ops)):
            if not batch:
                return batch
            op = ops[i]
            batch = op.process(batch)
            if op.emits_watermarks:
                ts = op.take_watermark()
                if ts is not None:
                    self.emit(self.run(batch, i + 1))
                    self.advance(self.segment_after[i], ts)
                    return []
        return batch

    def advance(self, segment: int, ts: float) -> None:
        """Segment ``segment``'s watermark reached ``ts``: its operators' ``on_watermark``
        in order (each one's output through the operators after it), then (the last
        segment) ``Watermark(ts)`` on every output channel."""
        if ts <= self.wm[segment]:
            return
        if ts == math.inf:  # the end of input: keep the last real one for a continued run
            if segment == 0 and self.wm[0] < self.tracker.real < math.inf:
                self.advance(0, self.tracker.real)  # (the inputs': whichever ended last)
            self.real[segment] = self.wm[segment]
        self.wm[segment] = ts
        ops, run, emit = self.ops, self.run, self.emit
        for i in range(self.starts[segment], self.ends[segment]):
            out = ops[i].on_watermark(ts)
            if out:
                emit(run(out, i + 1))
        if segment == self.last:
            self.broadcast(Watermark(ts))

    def on_close(self, channel: str) -> None:
        """Input ``channel`` ended (EOF)."""
        ts = self.tracker.on_close(channel)
        if ts is not None:
            try:
                self.advance(0, ts)
            except UserFunctionError as exc:
                exc.locate(self.chain.where())
                raise

    def end_of_input(self) -> None:
        """The task's input is exhausted: every segment's watermark goes to ``math.inf``
        (every window and event-time timer fires) before the outputs close."""
        try:
            for seg in range(len(self.wm)):
                if seg > 0:
                    self.ops[self.assigners[seg - 1]].end_of_input()
                self.advance(seg, math.inf)
        except UserFunctionError as exc:
            exc.locate(self.chain.where())
            raise

    def check_idle(self, now: float) -> None:
        """The task has nothing to read, or nothing it read reached an assigner (a filter
        before it dropped all): an assigner quiet for its ``idle_timeout`` makes the output
        idle (when it drives the output).  An assigner with a watermark per split takes
        its watermark again first: a split may have gone idle since its last batch (a
        Kafka partition with nothing new for the idle timeout) and hold nothing back."""
        for a in self.assigners:  # per split: a split gone idle holds nothing back now
            op = self.ops[a]
            if getattr(op, "splits", None) is not None:
                ts = op.take_watermark()
                if ts is not None:
                    self.advance(self.segment_after[a], ts)
        for op in self.idle_assigners:
            if op.check_idle(now) and op is self.ops[self.assigners[-1]]:
                self.go_idle()

    def go_idle(self) -> None:
        """The task's output goes idle: what a combine holds (two-phase aggregation) goes
        first, so no watermark of another input passes its partials downstream while the
        output is idle (they would be late where their records were not)."""
        for i, op in enumerate(self.ops):
            if op.flushes and not op.keyed:
                out = op.flush()
                if out:
                    self.emit(self.run(out, i + 1))
        self.broadcast(IDLE)

    # ------------------------------------------------------------------ checkpoints

    def snapshot(self) -> dict[str, Any]:
        """msgpack-able: the input tracker, the segments' watermarks, each assigner's
        emitted watermark and generator state (by uid), the output watermark.  After the
        end of input (``"inf"``), ``"real"``: ``{"segments": [...], "output": wm}``, the
        last real watermarks, which a restore takes (:func:`restored_segments`)."""
        out = {"input": self.tracker.snapshot(),
               "segments": [encode_ts(w) for w in self.wm],
               "assigners": {self.ops[a].uid: self.ops[a].time_snapshot()
                             for a in self.assigners},
               "output": encode_ts(self.output)}
        if math.inf in self.wm:
            real = [encode_ts(r if w == math.inf else w) for w, r in zip(self.wm, self.real)]
            out["real"] = {"segments": real, "output": real[self.last]}
        return out

    def restore(self, own: Mapping[str, Any] | None, old: list[Mapping[str, Any]],
                upstream_floor: float | Mapping[str, float] | None) -> None:
        """``own``: this subtask's state, when its chain kept its parallelism (exact); else
        ``old``, every old subtask's of this chain (each watermark the lowest of theirs).
        ``upstream_floor``: when the input channels changed (this chain or an upstream one
        rescaled), where each input channel starts (by name; never early: see
        :meth:`RestoreView.input_floors <cutline.runtime.restore.RestoreView.input_floors>`)."""
        segs = len(self.wm)
        self.real = [NO_WATERMARK] * segs
        if own is not None:
            self.tracker.restore(own.get("input") or {})
            saved = restored_segments(own)
            self.wm = [saved[k] if k < len(saved) else NO_WATERMARK for k in range(segs)]
            assigners = own.get("assigners") or {}
            for a in self.assigners:
                st = assigners.get(self.ops[a].uid)
                if st is not None:
                    self.ops[a].time_restore([st], exact=True)
        elif old:
            saved_old = [restored_segments(o) for o in old]
            self.wm = [min(s[k] if k < len(s) else NO_WATERMARK for s in saved_old)
                       for k in range(segs)]
            self.tracker.current = min(
                restored_ts((o.get("input") or {}).get("current"),
                            (o.get("input") or {}).get("real"), "current") for o in old)
            for a in self.assigners:
                uid = self.ops[a].uid
                states = [(o.get("assigners") or {}).get(uid) for o in old]
                self.ops[a].time_restore([s or {} for s in states], exact=False)
        if upstream_floor is not None:
            current = self.tracker.current
            self.tracker.restore_rescaled(upstream_floor)
            if own is not None or old:
                self.tracker.current = min(current, self.tracker.current)
