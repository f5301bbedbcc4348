"""Event time on batch streams: timestamps from a column, windowed aggregations per key.

* :class:`BatchAssignTimestamps` (``assign_timestamps("ts", max_delay=...)`` on a batch
  stream): the watermark generator sees each record batch's largest timestamp (the
  bounded-out-of-orderness watermark is the same as record by record); per source split,
  idleness and checkpoints as :class:`~.operators.AssignTimestamps`.
* :class:`BatchWindowAggregate` (``key_by(cols).window(tumbling(...) | sliding(...))
  .agg(...)``): the per-record window operator (:class:`~.windows.WindowOperator`: its
  state, firing by watermark, allowed lateness, rescaling by key group and per-key-group
  watermarks are reused as they are) with a vectorised ``process``: per record batch, rows
  are assigned their windows with numpy, ``Table.group_by(keys + window start)`` computes
  one partial aggregate per key and window, and each is merged into the key's window
  accumulator (:func:`cutline.protocol.windows.columns`).  Fired windows leave as one
  record batch per watermark: ``(key columns..., start, end, aggregates...)``, one row per
  key and window, in the order the per-record operator emits them (by end, start).

Timestamps are seconds (int or float columns) or Arrow timestamps (any unit, converted to
seconds); a null timestamp fails the job naming the operator and the batch.  Session
windows (merging) are not vectorised: ``rows()`` first.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from ..logical import BatchWindowSpec, Node
from ..protocol.windows import Tumbling, WindowResult
from ..state.arrow_keys import key_groups
from .batches import Described, Partials
from .operators import AssignTimestamps, UserFunctionError
from .windows import WindowOperator

__all__ = ["BatchAssignTimestamps", "BatchWindowAggregate", "seconds"]

_START = "__window_start"
_PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}


def seconds(rb: pa.RecordBatch, column: str) -> np.ndarray:
    """Column ``column`` of ``rb`` as float64 seconds (numbers as they are, timestamps
    converted); missing, null or non-time columns raise."""
    arr = rb.column(column)
    if arr.null_count:
        raise ValueError(f"column {column!r} holds {arr.null_count} null timestamp(s)")
    t = arr.type
    if pa.types.is_timestamp(t):
        return arr.cast(pa.int64()).to_numpy(zero_copy_only=False) / _PER_SECOND[t.unit]
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        out = arr.to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
        if not np.isfinite(out).all():
            raise ValueError(f"column {column!r} holds a timestamp that is not finite")
        return out
    raise TypeError(f"column {column!r} is {t}: event time must be seconds (int or float) "
                    "or a timestamp")


class BatchAssignTimestamps(AssignTimestamps):
    """``assign_timestamps(column)`` on a batch stream (see the module docstring)."""

    def __init__(self, node: Node) -> None:
        super().__init__(node)
        self.column: str = node.fn.ts_fn.column

    def process(self, batch: list) -> list:
        if self.idle_timeout is not None:
            import time

            self.last_input = time.monotonic()
            self.idle = False
        on_event = self._generator().on_event
        for rb in batch:
            if rb.num_rows:
                try:
                    on_event(float(seconds(rb, self.column).max()))
                except (KeyError, ValueError, TypeError) as exc:
                    raise UserFunctionError(self.uid, "assign_timestamps", Described(rb),
                                            exc) from exc
        return batch


def _whole(x: float) -> Any:
    return int(x) if x.is_integer() else x


class BatchWindowAggregate(WindowOperator):
    """``key_by(cols).window(assigner).agg(...)`` on a batch stream (see the module
    docstring)."""

    def __init__(self, node: Node, subtask: int, parallelism: int, max_parallelism: int,
                 state_backend: str = "memory", storage: Any = None) -> None:
        super().__init__(node, subtask, parallelism, max_parallelism, state_backend, storage)
        spec: BatchWindowSpec = node.fn
        self.keys, self.column = list(spec.keys), spec.ts_column
        self.names = [name for name, _, _ in spec.aggs]
        self.partials = Partials(spec.aggs)
        self.kinds = [fn for _, _, fn in spec.aggs]
        a = self.assigner
        if type(a) is Tumbling:
            self.size, self.slide, self.offset, self.copies = a.size, a.size, a.offset, 1
        else:  # sliding: a row is in up to ceil(size / slide) windows
            self.size, self.slide, self.offset = a.size, a.slide, a.offset  # type: ignore
            self.copies = int(np.ceil(self.size / self.slide))

    # ------------------------------------------------------------------ records

    def process(self, batch: list) -> list:
        out: list = []
        for rb in batch:
            if rb.num_rows:
                try:
                    self._one(rb, out)
                except UserFunctionError:
                    raise
                except (KeyError, ValueError, TypeError, pa.ArrowInvalid,
                        pa.ArrowNotImplementedError) as exc:
                    raise UserFunctionError(self.uid, "window", Described(rb), exc) from exc
        self.state.after_batch()
        return out

    def _windows(self, rb: pa.RecordBatch) -> tuple[np.ndarray, np.ndarray]:
        """Each row's windows: (row index, window start) pairs."""
        ts = seconds(rb, self.column)
        last = ts - np.mod(ts - self.offset, self.slide)  # the latest window start <= ts
        if self.copies == 1:
            return np.arange(len(ts)), last
        rows, starts = [], []
        for i in range(self.copies):
            s = last - i * self.slide
            keep = np.nonzero(s + self.size > ts)[0]
            rows.append(keep)
            starts.append(s[keep])
        return np.concatenate(rows), np.concatenate(starts)

    def _one(self, rb: pa.RecordBatch, out: list) -> None:
        rows, starts = self._windows(rb)
        table = pa.table({**{k: rb.column(k) for k in self.keys},
                          **{c: rb.column(c) for c, _ in self.partials.parts if c}})
        if self.copies > 1:
            table = table.take(pa.array(rows))
        # the watermark each row meets: the operator's, or its key group's (after a rescale)
        cur = np.full(len(starts), self.wm)
        if self.ahead:
            marks = np.full(self.max_parallelism, -np.inf)
            for g, v in self.ahead.items():
                marks[g] = v
            cur = np.maximum(cur, marks[key_groups(table, self.keys, self.max_parallelism)])
        live = starts + self.size + self.lateness > cur
        if not live.all():
            self.late_records += int(len(live) - live.sum())
            table, starts = table.filter(pa.array(live)), starts[live]
            if not table.num_rows:
                return
        table = table.append_column(_START, pa.array(starts))
        _, keys, _, part_cols = self.partials.group(table, [*self.keys, _START])
        mutable, fast, lateness = self.windows.mutable, self.windows.fast, self.lateness
        create, add, at = self.agg.create, self.agg.add, self._at
        size, ahead, of = self.size, self.ahead, self.partials.of
        again: list = []
        for i, kw in enumerate(keys):
            k = kw[0] if len(kw) == 2 else kw[:-1]
            start = _whole(kw[-1])
            end = _whole(float(start + size))
            w = (start, end)
            m = fast.get(k)
            if m is None:
                m = mutable(k, dict)
            acc = m.get(w)
            now = self._watermark_of(k) if ahead else self.wm
            if acc is None:
                acc = create()
                if end > now:
                    at(end, k)
                if lateness:
                    at(end + lateness, k)
            m[w] = acc = add(acc, of(part_cols, i))
            if end <= now:  # a fired window, within the lateness: emitted again
                again.append(WindowResult(k, start, end, self.agg.result(acc)))
        if again:
            out.append(self._rows(again))

    # ------------------------------------------------------------------ time

    def on_watermark(self, ts: float) -> list:
        fired = super().on_watermark(ts)
        return [self._rows(fired)] if fired else []

    def _rows(self, results: list) -> pa.RecordBatch:
        """Window results as one record batch: key columns, start, end, aggregates."""
        cols: dict[str, Any] = {}
        if len(self.keys) == 1:
            cols[self.keys[0]] = pa.array([r.key for r in results])
        else:
            for j, k in enumerate(self.keys):
                cols[k] = pa.array([r.key[j] for r in results])
        cols["start"] = pa.array([float(r.start) for r in results], pa.float64())
        cols["end"] = pa.array([float(r.end) for r in results], pa.float64())
        for j, (name, fn) in enumerate(zip(self.names, self.kinds)):
            values = [r.value[j] for r in results]
            cols[name] = pa.array(values, pa.int64() if fn == "count" else
                                  pa.float64() if fn == "mean" else None)
        return pa.RecordBatch.from_pydict(cols)
