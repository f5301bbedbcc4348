"""Event time on batch streams: timestamps from a column, windowed aggregations per key.

* :class:`BatchAssignTimestamps` (``assign_timestamps("ts", max_delay=...)`` on a batch
  stream): the watermark generator sees each record batch's largest timestamp (the
  bounded-out-of-orderness watermark is the same as record by record); per source split,
  idleness and checkpoints as :class:`~.operators.AssignTimestamps`.
* :class:`BatchWindowAggregate` (``key_by(cols).window(assigner).agg(...)``): the
  per-record window operator (:class:`~.windows.WindowOperator`: its state, firing by
  watermark, allowed lateness, late rows, rescaling by key group and per-key-group
  watermarks are reused as they are) with a vectorised ``process`` that gives its output
  row for row.  Per record batch:

  - tumbling / sliding: numpy assigns rows their windows; for the windows still open,
    ``Table.group_by(keys + window start)`` computes one partial aggregate per key and
    window, merged into the key's window accumulator
    (:func:`cutline.protocol.windows.columns`); nothing is emitted.  A row for a fired
    window (within ``allowed_lateness``) is added on its own and emits the window again,
    as a record does;
  - tumbling windows without allowed lateness, with numeric aggregates, on the memory
    backend: the open windows are held as columns, one row per (key, window start)
    (:class:`~cutline.state.columnar.ColumnarAggregates`): a batch's partials merge with
    numpy, no Python call per key and window (a batch of partials of a window no row
    holds yet adds its keys without a lookup), and a watermark fires its windows as one
    record batch with no Python call per window either.  The ``windows`` table keeps
    its per-key format: each snapshot writes the windows changed since the last into it,
    a fired window that a snapshot had written leaves it, and a restore loads it back
    into columns (or, after a rescale that left key groups at different watermarks, or
    with windows the end of an earlier run fired, the operator goes on key by key);
  - sliding windows whose size is a whole number of slides, without allowed lateness
    (``BatchWindowSpec.panes``): the state holds *panes*, one slide each, as Flink SQL
    slices hopping windows.  A row's partial goes to its one pane (``group_by(keys +
    pane)``: a fifth of the groups for ``sliding(10, 2)``), and a window fires as the
    merge of the panes it covers; a pane is dropped when its last window fired, and a row
    whose pane is gone is late (all its windows fired), as per record.  On the memory
    backend, with numeric aggregates, the panes are held as columns as the tumbling
    windows are (one row per key and pane), and a watermark fires its windows as one
    record batch: each pane's windows ending by it, sorted by (end, key), the panes of
    each merged with numpy (:meth:`ColumnarAggregates.merged`), no Python call per key
    and window;
  - sessions: a key whose rows all open windows past the watermark has them merged into
    sessions first (sorted by key and time; order does not matter, nothing fires), one
    partial per session merged into the key's sessions.  A key with a row at or behind
    the watermark takes its rows one at a time, in order (:meth:`_add_merging`): such a
    row may be late alone and not after another row bridged it to a later session.

  Rows late for all their windows are counted, and with ``.late()`` leave as one record
  batch (the input's columns, wrapped in a :class:`~.windows.LateRecord`) per batch.
  Fired windows leave as one record batch per watermark: ``(key columns..., start, end,
  aggregates...)``, one row per key and window, in the order the per-record operator
  emits them (by end, start).  Their event time is their window's last instant (``end``
  less 1 µs, the spec's ``ts_shift`` when a window reads them), as a record window's
  results: windows of windows follow.

Timestamps are seconds (int or float columns) or Arrow timestamps (any unit, converted to
seconds); a null timestamp fails the job naming the operator and the batch.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..logical import BatchWindowSpec, Node
from ..protocol.watermarks import NO_WATERMARK
from ..protocol.windows import Session, Tumbling
from ..state.arrow_keys import key_groups
from ..state.columnar import ColumnarAggregates, HeldKeys, SumOverflow, numeric
from .batches import Described, HeldPartials, Partials, is_partial
from .late import late_error
from .operators import AssignTimestamps, Operator, UserFunctionError
from .windows import LateRecord, WindowOperator, _whole

__all__ = ["BatchAssignTimestamps", "BatchWindowAggregate", "BatchWindowCombine", "seconds"]

_START, _ROW, _SESSION = "__window_start", "__row", "__session"
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


def latest_start(ts: np.ndarray, offset: float, slide: float) -> np.ndarray:
    """The latest window start <= ``ts``, as ``offset + k * slide`` (protocol.windows.
    _latest_start: ``ts - (ts - offset) % slide`` rounds, and a window would have two
    names); the window operator and its combine name windows with it."""
    last = offset + np.floor((ts - offset) / slide) * slide
    return np.where(last > ts, last - slide, np.where(last + slide <= ts, last + slide, last))


def _distinct(starts: np.ndarray) -> np.ndarray:
    """The distinct values of ``starts`` (window starts), sorted: most often one, found
    without sorting."""
    if len(starts) and starts.min() == starts.max():
        return starts[:1]
    return np.unique(starts)


def _key_ids(rb: pa.RecordBatch, columns: list[str]) -> np.ndarray:
    """A dense id per row of ``rb``, equal for rows with equal keys (the ``columns``)."""
    ids: np.ndarray | None = None
    for c in columns:
        col = rb.column(c)
        if pa.types.is_floating(col.type):  # -0.0 is 0.0, as Python keys compare
            col = pc.add(col, pa.scalar(0.0, col.type))
        enc = pc.dictionary_encode(col, null_encoding="encode")
        col = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        if ids is None:
            ids = col
        else:
            ids = np.unique(ids * len(enc.dictionary) + col, return_inverse=True)[1]
    assert ids is not None
    return ids.reshape(-1)


class BatchWindowAggregate(WindowOperator):
    """``key_by(cols).window(assigner).agg(...)`` on a batch stream (see the module
    docstring)."""

    def __init__(self, node: Node, subtask: int, parallelism: int, max_parallelism: int,
                 state_backend: str = "memory", storage: Any = None) -> None:
        super().__init__(node, subtask, parallelism, max_parallelism, state_backend, storage)
        spec: BatchWindowSpec = node.fn
        self.keys, self.column, self.shift = list(spec.keys), spec.ts_column, spec.ts_shift
        self.names = [name for name, _, _ in spec.aggs]
        self.partials = Partials(spec.aggs)
        self.kinds = [fn for _, _, fn in spec.aggs]
        a = self.assigner
        if type(a) is Session:
            self.gap = a.gap
        elif type(a) is Tumbling:
            self.size, self.slide, self.offset, self.copies = a.size, a.size, a.offset, 1
        else:  # sliding: a row is in up to ceil(size / slide) windows
            self.size, self.slide, self.offset = a.size, a.slide, a.offset  # type: ignore
            self.copies = int(np.ceil(self.size / self.slide))
        self.panes = spec.panes  # state per key and pane (one slide), windows merge panes
        if type(a) is not Session:  # what a window of the state spans: a pane, or a window
            self.length = self.slide if self.panes else self.size
        # two-phase (``spec.partial``): the partials a combine sends (and their row counts)
        self.combined = window_partials(spec) if spec.partial else None
        # tumbling windows: the parts each (key, window) holds, of rows or of partials
        self.vparts = self.combined or self.partials
        # open tumbling windows as columns (:meth:`_decide`: the memory backend, no
        # lateness, numeric aggregates), decided at the first batch after a (re)start
        self.memory = state_backend == "memory"
        self.open: ColumnarAggregates | None = None
        self.decided = False
        self.starts = np.zeros(0)  # per row of ``open``: its window's start (inf: fired)
        # the starts some row of ``open`` holds (a window's, or pane's, rows all fire or
        # go at once): a batch of partials of one start not among them holds only keys
        # ``open`` does not, added without a lookup
        self.open_starts: set[float] = set()
        self.saved = np.zeros(0, dtype=bool)  # per row: in the backend's table since a save
        self.gone = 0  # rows of ``open`` fired since it was last compacted

    # ------------------------------------------------------------------ records

    def process(self, batch: list) -> list:
        out: list = []
        for rb in batch:
            if rb.num_rows:
                try:
                    if self.combined is not None and is_partial(rb):
                        self._partial(rb)
                        continue
                    late = self._sessions(rb, out) if self.assigner.merging else \
                        self._panes(rb) if self.panes else self._fixed(rb, out)
                except UserFunctionError:
                    raise
                except (KeyError, ValueError, TypeError, pa.ArrowInvalid,
                        pa.ArrowNotImplementedError) as exc:
                    raise UserFunctionError(self.uid, "window", Described(rb), exc) from exc
                if len(late):
                    self.late_records += len(late)
                    if self.spec.emit_late:
                        out.append(LateRecord(rb.take(pa.array(late))))
                    else:
                        self._drop_late(rb, late)
        self.state.after_batch()
        return out

    def _partial(self, rb: pa.RecordBatch) -> None:
        """A combine's partials, one per key and tumbling window (``_START``): merged into
        the windows still open for the key (the watermark of its key group); a partial for
        a fired one holds rows that are all late (no allowed lateness: the planner combines
        only then), counted as that many dropped rows."""
        combined = self.combined
        assert combined is not None
        starts = rb.column(_START).to_numpy(zero_copy_only=False).astype(np.float64)
        ends = starts + self.size
        cur = self._marks(rb)
        fresh = ends > cur
        if self.fired:
            fresh &= ends > self.fired_until
        late = np.flatnonzero(~fresh)
        if len(late):
            n_col = combined.part_names[combined.reads[-1][1][0]]  # the rows of each
            counts = rb.column(n_col).to_numpy(zero_copy_only=False)[late]
            self.late_records += int(counts.sum())
            groups = key_groups(rb.take(pa.array(late)), self.keys, self.max_parallelism)
            self.late.add_groups(np.repeat(groups, counts).tolist(), float(starts[late[0]]),
                                 float(cur[late[0]]))
            if len(late) == rb.num_rows:
                return
            rb = rb.filter(pa.array(fresh))
        self._merge_windows(pa.Table.from_batches([rb]), partial=True)

    def _drop_late(self, rb: pa.RecordBatch, late: np.ndarray) -> None:
        """Rows ``late`` (indices) of ``rb`` came too late for all their windows: counted
        per key group, or the job fails on the first (``on_late="fail"``)."""
        first = int(late[0])
        ts = float(seconds(rb, self.column)[first]) + self.shift
        cur = float(self._marks(rb)[first])
        if self.spec.on_late == "fail":
            raise late_error(self.uid, rb.slice(first, 1).to_pylist()[0], ts, cur,
                             self.lateness)
        groups = key_groups(rb.take(pa.array(late)), self.keys, self.max_parallelism)
        self.late.add_groups(groups.tolist(), ts, cur)

    def _marks(self, rb: pa.RecordBatch) -> np.ndarray:
        """The watermark each row meets: the operator's, or its key group's (after a
        rescale)."""
        cur = np.full(rb.num_rows, self.wm)
        if self.ahead:
            marks = np.full(self.max_parallelism, -np.inf)
            for g, v in self.ahead.items():
                marks[g] = v
            cur = np.maximum(cur, marks[key_groups(rb, self.keys, self.max_parallelism)])
        return cur

    def _table(self, rb: pa.RecordBatch, rows: np.ndarray | None = None) -> pa.Table:
        """The key and partial-aggregate columns of ``rb`` (of ``rows`` of it)."""
        table = pa.table({**{k: rb.column(k) for k in self.keys},
                          **{c: rb.column(c) for c, _ in self.partials.parts if c}})
        return table if rows is None else table.take(pa.array(rows))

    def _key(self, kw: tuple, extra: int) -> Any:
        """The key of a group of ``keys + extra`` columns."""
        return kw[0] if len(kw) == extra + 1 else kw[:-extra]

    def _per_row(self, table: pa.Table, starts: np.ndarray, ends: np.ndarray,
                 cur: np.ndarray, out: list) -> np.ndarray:
        """Rows (of ``table``, each for window ``[starts[i], ends[i])``, meeting watermark
        ``cur[i]``) one at a time, in order, exactly as the per-record operator takes
        records: each row that lands in a fired window (within the lateness) emits it
        again.  Returns which rows were late for their window."""
        n = table.num_rows
        table = table.append_column(_ROW, pa.array(np.arange(n)))
        _, keys, _, part_cols = self.partials.group(table, [*self.keys, _ROW])
        order = np.argsort([kw[-1] for kw in keys], kind="stable")
        late = np.zeros(n, dtype=bool)
        again: list = []
        add = self._add_merging if self.assigner.merging else self._add_fixed
        of, key = self.partials.of, self._key
        for j in order:
            i = keys[j][-1]
            w = (_whole(float(starts[i])), _whole(float(ends[i])))
            if not add(key(keys[j], 1), w, of(part_cols, j), float(cur[i]), again.append):
                late[i] = True
        if again:
            out.append(self._rows(again))
        return late

    def _add_fixed(self, key: Any, w: tuple, parts: Any, cur: float,
                   emit: Any) -> bool:
        """One row's partial into a fired (tumbling or sliding) window, as the per-record
        operator adds a record; False if it is too late for it.  (After a restore of a
        final checkpoint also a row that may be for a window the end of input fired: one
        that was not is added as to an open window.)"""
        end = w[1]
        if end + self.lateness <= cur:
            return False
        done = end <= cur
        if not done and self.fired and w in self.fired.get(key, ()):
            return self._refire(key, w, parts, emit)
        m = self.windows.mutable(key, dict)
        acc = m.get(w)
        if acc is None:
            acc = self.agg.create()
            if not done:
                self._at(end, key)
            if self.lateness:
                self._at(end + self.lateness, key)
        m[w] = acc = self.agg.add(acc, parts)
        if done:
            self._fire(key, w, acc, emit)
        return True

    def _windows(self, ts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each row's windows: (row index, window start) pairs, by row and start."""
        if not self.assigner.exact:  # sizes binary floats do not hold (0.1): as per record
            bounds = self.assigner.bounds
            pairs = [(i, s) for i, t in enumerate(ts.tolist()) for s, _ in bounds(t)]
            return (np.array([i for i, _ in pairs], dtype=np.int64),
                    np.array([s for _, s in pairs], dtype=np.float64))
        last = latest_start(ts, self.offset, self.slide)
        if self.copies == 1:
            return np.arange(len(ts)), last
        rows, starts = [], []
        for i in range(self.copies - 1, -1, -1):
            s = last - i * self.slide
            keep = np.nonzero(s + self.size > ts)[0]
            rows.append(keep)
            starts.append(s[keep])
        r, s = np.concatenate(rows), np.concatenate(starts)
        order = np.argsort(r, kind="stable")
        return r[order], s[order]

    def _fixed(self, rb: pa.RecordBatch, out: list) -> np.ndarray:
        """Tumbling and sliding windows: the indices of the rows late for all theirs."""
        ts = seconds(rb, self.column) + self.shift
        rows, starts = self._windows(ts)
        cur = self._marks(rb)[rows]
        ends = starts + self.size if self.assigner.exact else np.array(
            [self.assigner.end_of(_whole(s)) for s in starts.tolist()], dtype=np.float64)
        fresh = ends > cur  # open windows: vectorised, nothing is emitted
        if self.fired:  # windows the end of input may have fired: row by row
            fresh &= ends > self.fired_until
        late = np.zeros(0, dtype=np.int64)
        if not fresh.all():  # fired ones: row by row, as the per-record operator does
            stale = np.flatnonzero(~fresh)
            dropped = self._per_row(self._table(rb, rows[stale]), starts[stale], ends[stale],
                                    cur[stale], out)
            live = np.bincount(rows[fresh], minlength=rb.num_rows) + np.bincount(
                rows[stale[~dropped]], minlength=rb.num_rows)
            late = np.flatnonzero(live == 0)
            rows, starts = rows[fresh], starts[fresh]
            if not len(rows):
                return late
        table = self._table(rb, None if len(rows) == rb.num_rows and self.copies == 1
                            else rows)
        self._merge_windows(table.append_column(_START, pa.array(starts)))
        return late

    def _merge_windows(self, table: pa.Table, partial: bool = False) -> None:
        """Tumbling and sliding windows (or panes): ``table``'s rows (``partial``: a
        combine's partials) grouped per key and window (pane) start (``_START``), merged
        into the key's windows: as columns (:attr:`open`), or key by key (a new pane is
        due at the first of its windows not fired yet)."""
        key_cols, part_arrays = self.vparts.arrow(table, [*self.keys, _START], partial)
        if not self.decided:
            self._decide(key_cols, part_arrays)
        if self.open is not None:
            starts = key_cols[-1].to_numpy()
            windows = _distinct(starts)
            unheld = len(windows) == 1 and float(windows[0]) not in self.open_starts
            rows = self.open.merge(key_cols, part_arrays, unheld)
            self._held(rows, starts, windows)
            return
        key_lists = [c.to_pylist() for c in key_cols]
        n = len(self.partials.reads)  # (a combine's partials count their rows last)
        parts = [t[:n] for t in self.vparts.tuples([a.to_pylist() for a in part_arrays])]
        self._add_groups(list(zip(*key_lists)), parts, self.length,
                         self._next_end(self.wm) if self.panes else -np.inf)

    # ------------------------------------------------------------------ open windows as columns

    def _decide(self, key_cols: list, part_arrays: list) -> None:
        """At the first batch after a (re)start: hold the open windows as columns
        (:class:`~cutline.state.columnar.ColumnarAggregates` keyed by (key, window start):
        a batch's partials merge without a Python call per key and window, and a watermark
        fires its windows as one record batch) when the windows are tumbling and exact,
        without allowed lateness, with numeric aggregates, on the memory backend, and the
        restore brought neither per-key-group watermarks (a rescale) nor windows the end
        of an earlier run's input fired.  Sliding windows held as panes
        (:attr:`BatchWindowSpec.panes`) the same way: a row per key and pane.  Otherwise
        key by key, as the per-record operator.  The backend's ``windows`` table keeps
        its format either way: the columns are written into it at each snapshot
        (:meth:`_save_open`), and what a restore brought is loaded from it here."""
        self.decided = True
        a = self.assigner
        if not (self.memory and (type(a) is Tumbling or self.panes) and a.exact
                and not self.lateness
                and self.agg.full is None and not self.fired and not self.ahead
                and all(numeric(p.type) for p in part_arrays)
                and not any(pa.types.is_null(c.type) for c in key_cols)):
            return
        # the restored windows (every key holding any is due: :meth:`restore`)
        keys: dict = {}
        for due in self._due.values():
            keys.update(due)
        found: dict = {}
        one = len(self.keys) == 1
        for k in keys:
            for w, acc in (self.windows.get(k) or {}).items():
                found[(k, float(w[0])) if one else (*k, float(w[0]))] = acc
        self._due.clear()
        self._times.clear()
        # the columns read what a restore brought (``found``) once, by its rows, and
        # nothing else: a new window's row starts empty, with no lookup
        self.open = ColumnarAggregates(
            [f for _, f in self.vparts.parts], [p.type for p in part_arrays],
            [c.type for c in key_cols], self.vparts.reads[:len(self.partials.reads)],
            table=found, track=False, fresh=not found)
        if found:
            rows = self.open.rows_of(list(found))
            self.open.table, self.open.held = {}, HeldKeys(True)
            self._held(rows, np.array([k[-1] for k in found], dtype=np.float64))
            self.saved[rows] = True

    def _held(self, rows: np.ndarray, starts: np.ndarray,
              windows: np.ndarray | None = None) -> None:
        """Rows ``rows`` of :attr:`open` hold windows starting at ``starts`` (``windows``:
        the distinct ones, when known)."""
        n = self.open.size  # type: ignore[union-attr]
        if len(self.starts) < n:
            cap = max(1024, 2 * n)
            grown = np.full(cap, np.inf)
            grown[:len(self.starts)] = self.starts
            saved = np.zeros(cap, dtype=bool)
            saved[:len(self.saved)] = self.saved
            self.starts, self.saved = grown, saved
        self.starts[rows] = starts
        self.open_starts.update((_distinct(starts) if windows is None else windows).tolist())

    def _window_of(self, key: tuple) -> tuple[Any, tuple]:
        """A row's (key, window or pane) from its key in :attr:`open`: (key columns...,
        start)."""
        s = float(key[-1])
        return (key[0] if len(key) == 2 else key[:-1],
                (_whole(s), _whole(float(s + self.length))))

    def _fire_open(self, ts: float) -> pa.RecordBatch | None:
        """:meth:`on_watermark` of columns: the windows whose end watermark ``ts`` reached,
        as one record batch (by end; in a tumbling window, its keys in the order they
        came).
        Tumbling: their rows are taken out of the columns; panes: each window ending after
        the last watermark and by ``ts`` fires as the merge of the panes it covers
        (:meth:`_merged_panes`), and the panes whose last window fired are taken out.  Rows
        taken out leave the backend's table too if a snapshot saved them.  At the end of
        input the windows fired are marked so (as :meth:`WindowOperator.on_watermark`
        marks them)."""
        if ts <= self.wm:
            return None
        final = ts == math.inf
        if final:  # the last real watermark stays, for a restore
            self._real = (self.wm, dict(self.ahead))
        prev, self.wm = self.wm, ts
        o = self.open
        assert o is not None
        starts = self.starts[:o.size]
        fired: list = []  # at the end of input: (row, window) of each window fired
        # the rows done with: windows that fire, panes whose last window fires (gone: inf)
        due = np.flatnonzero((starts + self.size <= ts) & (starts < math.inf))
        if self.panes:
            out = self._merged_panes(starts, prev, ts, fired if final else None)
        else:
            out = None
            if len(due):
                due = due[np.argsort(starts[due], kind="stable")]
                cols = o.rows(due)
                nk = len(self.keys)
                s = starts[due]
                out = self._fired_columns(cols[:nk], s, s + self.size, cols[nk + 1:])
                if final:
                    fired = [(r, None) for r in due.tolist()]
        if not len(due):
            return None if out is None else pa.RecordBatch.from_pydict(out)
        saved = due[self.saved[due]]
        table, window_of = self.windows, self._window_of
        for r in saved.tolist():
            k, w = window_of(o.keys[r])
            m = table.mutable(k, dict)
            m.pop(w, None)
            if not m:
                table.delete(k)
        for r, w in fired:
            k, own = window_of(o.keys[r])
            self._mark(k, own if w is None else w)
        self.open_starts.difference_update(_distinct(starts[due]).tolist())
        self.starts[due] = np.inf
        self.saved[due] = False
        o.unsaved[due] = False
        self.gone += len(due)
        if self.gone > max(4096, o.size // 2):
            keep = np.flatnonzero(np.isfinite(starts))
            o.compact(keep)
            self.starts, self.saved = self.starts[keep], self.saved[keep]  # (_held grows them)
            self.gone = 0
        self.state.after_batch()
        return None if out is None else pa.RecordBatch.from_pydict(out)

    def _fired_columns(self, keys: list, starts: np.ndarray, ends: np.ndarray,
                       values: list) -> dict[str, Any]:
        """Windows fired from columns: key columns, start, end, aggregates (as
        :meth:`_columns` types them)."""
        out: dict[str, Any] = {k: _as_inferred(a) for k, a in zip(self.keys, keys)}
        out["start"] = pa.array(starts, pa.float64())
        out["end"] = pa.array(ends, pa.float64())
        for name, arr in zip(self.names, values):
            out[name] = _as_inferred(arr)
        return out

    def _merged_panes(self, starts: np.ndarray, prev: float, ts: float,
                      fired: list | None) -> dict | None:
        """Panes held as columns (rows of :attr:`open` starting at ``starts``): every
        window ending after ``prev`` and by ``ts`` that covers one of them, as the merge of
        those panes (by end, then key; a window's panes merged by start, as the per-key
        path merges them); ``fired`` gets
        (a row of the key, window) of each.  None when no window ends then."""
        slide, size, o = self.slide, self.size, self.open
        assert o is not None
        live = np.flatnonzero((starts + slide <= ts) & (starts < math.inf))
        if not len(live):
            return None
        s = starts[live]
        with np.errstate(invalid="ignore"):
            lo = np.maximum(1.0, np.floor((prev - s) / slide) + 1)
            hi = np.minimum(float(self.copies), np.floor((ts - s) / slide))
        lo = lo + (s + lo * slide <= prev)  # (exact: a quotient may round)
        lo = lo - ((lo > 1) & (s + (lo - 1) * slide > prev))
        hi = hi - (s + hi * slide > ts)
        n = np.maximum(hi - lo + 1, 0).astype(np.int64)
        if not n.sum():
            return None
        at = np.repeat(np.arange(len(s)), n)
        first = np.repeat(np.cumsum(n) - n, n)
        jj = np.repeat(lo, n) + (np.arange(len(at)) - first)
        e = s[at] + jj * slide
        kid = _key_ids(pa.record_batch(o.key_arrays(live)[:-1], names=self.keys), self.keys)
        order = np.lexsort((s[at], kid[at], e))
        rows, e, k = live[at[order]], e[order], kid[at[order]]
        new = np.ones(len(rows), dtype=bool)
        new[1:] = (e[1:] != e[:-1]) | (k[1:] != k[:-1])
        heads = np.flatnonzero(new)
        firsts = rows[heads]
        end = e[heads]
        out = self._fired_columns(o.key_arrays(firsts)[:len(self.keys)], end - size, end,
                                  o.merged(rows, heads))
        if fired is not None:
            fired.extend((r, (_whole(float(x - size)), _whole(float(x))))
                         for r, x in zip(firsts.tolist(), end.tolist()))
        return out

    def _save_open(self) -> None:
        """The windows changed since the last save into the backend's table, in the
        per-key format (key -> {(start, end): accumulator}): a snapshot holds them as the
        per-record operator's."""
        o = self.open
        assert o is not None
        rows = np.flatnonzero(o.unsaved[:o.size])
        if not len(rows):
            return
        o.unsaved[rows] = False
        self.saved[rows] = True
        mutable, window_of, keys = self.windows.mutable, self._window_of, o.keys
        for r, acc in zip(rows.tolist(), o.accumulators(rows)):
            k, w = window_of(keys[r])
            mutable(k, dict)[w] = list(acc)

    def held_windows(self) -> int:
        held = super().held_windows()
        if self.open is not None:
            held += int(np.isfinite(self.starts[:self.open.size]).sum())
        return held

    def snapshot(self) -> Any:
        if self.open is not None:
            self._save_open()
        return super().snapshot()

    def restore(self, blobs: list[bytes]) -> None:
        super().restore(blobs)
        self.open, self.decided, self.gone = None, False, 0
        self.open_starts = set()
        self.starts, self.saved = np.zeros(0), np.zeros(0, dtype=bool)

    def _add_groups(self, keys: list, parts: list, length: float,
                    due: float = -np.inf) -> None:
        """Each group's partials (``parts``) into its key's window (or pane) starting at the
        group's last key column and ``length`` long; a new one is due at its end (``due``
        at the earliest), and again after the lateness."""
        mutable, fast, lateness = self.windows.mutable, self.windows.fast, self.lateness
        create, add, at, key = self.agg.create, self.agg.add, self._at, self._key
        end_of, exact = self.assigner.end_of, self.assigner.exact
        for i, kw in enumerate(keys):
            k = key(kw, 1)
            start = _whole(kw[-1])
            end = _whole(float(start + length)) if exact else end_of(start)
            w = (start, end)
            m = fast.get(k)
            if m is None:
                m = mutable(k, dict)
            acc = m.get(w)
            if acc is None:
                acc = create()
                at(end if end > due else due, k)
                if lateness:
                    at(end + lateness, k)
            m[w] = add(acc, parts[i])

    def _panes(self, rb: pa.RecordBatch) -> np.ndarray:
        """Sliding windows as panes: each row's partial goes into its pane (one group per
        key and pane, not per key and window); a row is late when its pane's last window
        fired.  The rows' windows that fired already are not updated (no lateness), as
        the per-record operator skips them."""
        ts = seconds(rb, self.column) + self.shift
        slide, size = self.slide, self.size
        pane = latest_start(ts, self.offset, slide)  # (exact: np.mod rounds)
        cur = self._marks(rb)
        fresh = pane + size > cur
        if self.fired:  # after a final checkpoint: rows whose windows the end of input fired
            fresh &= ~self._all_fired(rb, pane, cur)
        late = np.flatnonzero(~fresh)
        rows = None
        if len(late):
            rows = np.flatnonzero(fresh)
            if not len(rows):
                return late
            pane = pane[rows]
        self._merge_windows(self._table(rb, rows).append_column(_START, pa.array(pane)))
        return late

    def _all_fired(self, rb: pa.RecordBatch, pane: np.ndarray, cur: np.ndarray) -> np.ndarray:
        """Which rows of ``rb`` (in panes ``pane``, meeting watermarks ``cur``) are late
        because the end of an earlier run's input fired each of their windows that ends
        after the watermark (their key's marks, :attr:`fired`)."""
        out = np.zeros(rb.num_rows, dtype=bool)
        rows = np.flatnonzero(pane + self.slide <= self.fired_until)
        if not len(rows):
            return out
        names = self.keys
        keyed = pa.table({k: rb.column(k) for k in names}).take(pa.array(rows)).to_pylist()
        for i, r in zip(rows.tolist(), keyed):
            k = r[names[0]] if len(names) == 1 else tuple(r[c] for c in names)
            out[i] = self._pane_fired(k, float(pane[i]), float(cur[i]))
        return out

    def _fire_panes(self, ts: float) -> pa.RecordBatch | None:
        """:meth:`on_watermark` of panes held key by key (:meth:`_panes_due`), as one
        record batch."""
        fired = self._panes_due(ts)
        if not fired:
            return None
        result = self.agg.result
        return self._columns([f[3] for f in fired], [f[1] for f in fired],
                             [f[0] for f in fired], [result(f[4]) for f in fired])

    def _sessions(self, rb: pa.RecordBatch, out: list) -> np.ndarray:
        """Session windows: the indices of the rows too late for theirs.  A key whose rows
        all open windows past the watermark takes them merged into sessions first
        (vectorised; nothing fires, so their order does not matter); a key with a row at
        or behind the watermark takes its rows one at a time, in order, as the per-record
        operator does (a row may be late alone and not once another row bridged it to a
        later session)."""
        ts = seconds(rb, self.column) + self.shift
        gap = self.gap
        ends = ts + gap
        cur = self._marks(rb)
        stale = ends <= cur
        if self.fired:  # a row may merge into a session the end of input fired: in order
            stale |= ts <= self.fired_until
        kid = _key_ids(rb, self.keys)
        late = np.zeros(0, dtype=np.int64)
        rows = np.arange(rb.num_rows)
        if stale.any():
            slow = np.zeros(int(kid.max()) + 1, dtype=bool)
            slow[kid[stale]] = True
            exact = slow[kid]
            one = np.flatnonzero(exact)
            dropped = self._per_row(self._table(rb, one), ts[one], ends[one], cur[one], out)
            late = one[dropped]
            rows = np.flatnonzero(~exact)
            if not len(rows):
                return late
            kid = kid[rows]
        # the rest: per key, its rows' windows merged into sessions (sorted by key, time)
        t = ts[rows]
        order = np.lexsort((t, kid))
        t, k_sorted = t[order], kid[order]
        first = np.ones(len(t), dtype=bool)
        first[1:] = (k_sorted[1:] != k_sorted[:-1]) | (t[1:] > t[:-1] + gap)
        sid = np.cumsum(first) - 1
        heads = np.flatnonzero(first)
        tails = np.append(heads[1:], len(t)) - 1
        session_of = np.empty(len(t), dtype=np.int64)
        session_of[order] = sid
        table = self._table(rb, rows).append_column(_SESSION, pa.array(session_of))
        _, sids, _, part_cols = self.partials.group(table, [_SESSION])
        key_rows = pa.table({k: rb.column(k) for k in self.keys}).take(
            pa.array(rows[order[heads]])).to_pylist()
        of, add, keys = self.partials.of, self._add_merging, self.keys
        wm, ahead = self.wm, self.ahead
        for j, s in enumerate(sids):
            r = key_rows[s]
            k = r[keys[0]] if len(keys) == 1 else tuple(r[c] for c in keys)
            w = (_whole(float(t[heads[s]])), _whole(float(t[tails[s]] + gap)))
            add(k, w, of(part_cols, j), self._watermark_of(k) if ahead else wm, out.append)
        return late

    # ------------------------------------------------------------------ time

    def on_watermark(self, ts: float) -> list:
        if self.open is not None:
            try:
                rows = self._fire_open(ts)
            except SumOverflow as exc:  # (a sliding window's panes, merged)
                raise UserFunctionError(self.uid, "window", f"<the windows watermark {ts} "
                                        "fires>", exc) from exc
            return [rows] if rows is not None else []
        if self.panes:
            rows = self._fire_panes(ts)
            return [rows] if rows is not None else []
        fired = super().on_watermark(ts)
        return [self._rows(fired)] if fired else []

    def _rows(self, results: list) -> pa.RecordBatch:
        """Window results as one record batch: key columns, start, end, aggregates."""
        return self._columns([r.key for r in results], [r.start for r in results],
                             [r.end for r in results], [r.value for r in results])

    def _columns(self, keys: list, starts: list, ends: list, values: list) -> pa.RecordBatch:
        """Windows as one record batch: key columns, start, end, aggregates (``values``:
        a tuple per window, one value per aggregate)."""
        cols: dict[str, Any] = {}
        if len(self.keys) == 1:
            cols[self.keys[0]] = pa.array(keys)
        else:
            for j, k in enumerate(self.keys):
                cols[k] = pa.array([key[j] for key in keys])
        cols["start"] = pa.array(starts, pa.float64())
        cols["end"] = pa.array(ends, pa.float64())
        for j, (name, fn) in enumerate(zip(self.names, self.kinds)):
            cols[name] = pa.array([v[j] for v in values], pa.int64() if fn == "count" else
                                  pa.float64() if fn == "mean" else None)
        return pa.RecordBatch.from_pydict(cols)


def _as_inferred(arr: Any) -> Any:
    """A column of fired windows with the type :meth:`BatchWindowAggregate._columns`
    gives it from Python values: integers int64, floats float64."""
    t = arr.type
    if pa.types.is_integer(t) and t != pa.int64():
        return arr.cast(pa.int64())
    if pa.types.is_floating(t) and t != pa.float64():
        return arr.cast(pa.float64())
    return arr


def window_partials(spec: BatchWindowSpec) -> Partials:
    """The parts a window's combine sends per key and window: the aggregates' and, last,
    the row count (a partial for a fired window counts its rows as late)."""
    return Partials(tuple(spec.aggs) + (("__rows", None, "count"),))


class BatchWindowCombine(HeldPartials, Operator):
    """The local half of a tumbling-window aggregation of a batch stream (two-phase,
    planned by :func:`cutline.plan.plan` for windows without allowed lateness whose late
    rows are dropped): the rows of windows still open by the watermark this task has sent
    on (so by the aggregation's, which is never ahead of it while this task's output is
    active) are held per window as they came, grouped per key into partials once more
    than ``MAX_ROWS`` are held or their window is due, and sent before the watermark that
    reaches their window's end (:meth:`on_watermark`), a barrier, the task going idle, or
    the end of input; a row of a window the watermark reached goes on as it is, and the
    window operator decides on it as on any row.  No state."""

    flushes = True
    kind = "window"

    def __init__(self, node: Node) -> None:
        super().__init__(node)
        spec: BatchWindowSpec = node.fn
        self.keys, self.column, self.shift = list(spec.keys), spec.ts_column, spec.ts_shift
        a = spec.assigner
        assert isinstance(a, Tumbling)  # (the planner combines tumbling windows only)
        self.size, self.offset = a.size, a.offset
        self.partials = window_partials(spec)
        self.group = [*self.keys, _START]
        self.wm = NO_WATERMARK  # the watermark sent on after this operator
        self.held: list[pa.Table] = []
        self.rows = 0
        self.raw_rows = 0
        self.by_start: dict[float, list[pa.Table]] = {}  # window start -> rows held
        self.agg_uid = node.uid.rsplit(".", 1)[0]

    def process(self, batch: list) -> list:
        out: list = []
        for rb in batch:
            if not rb.num_rows:
                continue
            try:
                ts = seconds(rb, self.column) + self.shift
                starts = latest_start(ts, self.offset, self.size)  # (as the operator's)
                fresh = starts + self.size > self.wm
                if not fresh.all():
                    out.append(rb.filter(pa.array(~fresh)))
                    if not fresh.any():
                        continue
                    rb, starts = rb.filter(pa.array(fresh)), starts[fresh]
                cols = {k: rb.column(k) for k in self.keys}
                cols.update({c: rb.column(c) for c, _ in self.partials.parts if c})
                table = pa.table(cols)
                windows = _distinct(starts)
                if len(windows) > 8:  # many: grouped now, at once
                    self._held_part(self.partials.partial(
                        table.append_column(_START, pa.array(starts)), self.group))
                    continue
            except (KeyError, ValueError, TypeError, pa.ArrowInvalid,
                    pa.ArrowNotImplementedError) as exc:
                raise UserFunctionError(self.agg_uid, "window", Described(rb), exc) from exc
            for s, t in ([(float(windows[0]), table)] if len(windows) == 1 else
                         [(float(s), table.filter(pa.array(starts == s))) for s in windows]):
                self.by_start.setdefault(s, []).append(t)
                self.raw_rows += t.num_rows
        if self.raw_rows > self.MAX_ROWS:
            self._fold()
        out.extend(self._spill())
        return out

    def _windows(self, starts: list[float]) -> list[pa.Table]:
        """The rows held of the windows starting at ``starts``, grouped per key: one
        table of partials per window (its start as the ``_START`` column)."""
        n = len(self.keys)
        out = []
        for s in starts:
            tables = self.by_start.pop(s)
            self.raw_rows -= sum(t.num_rows for t in tables)
            for part in self._grouped(tables, self.keys):
                out.append(part.add_column(n, _START, pa.array(np.full(part.num_rows, s))))
        return out

    def _fold(self) -> None:
        for part in self._windows(list(self.by_start)):
            self._held_part(part)

    def on_watermark(self, ts: float) -> list:
        """The partials of the windows that watermark ``ts`` reaches (``end <= ts``) go on
        before it does: downstream no window operator's watermark passes a held partial's
        window (it is never ahead of what this task sends), so the others stay held and
        merge with later rows, until their window is due, a barrier or the end of input."""
        self.wm = ts
        due = self._windows([s for s in self.by_start if s + self.size <= ts])
        keep: list[pa.Table] = []
        for t in self.held:
            ends = t.column(_START).to_numpy(zero_copy_only=False) + self.size
            now = ends <= ts
            if now.all():
                due.append(t)
            elif now.any():
                mask = pa.array(now)
                due.append(t.filter(mask))
                keep.append(t.filter(pc.invert(mask)))
            else:
                keep.append(t)
        self.held, self.rows = keep, sum(t.num_rows for t in keep)
        if not due:
            return []
        return [b for t in self._merged(due) for b in t.combine_chunks().to_batches()
                if b.num_rows]
