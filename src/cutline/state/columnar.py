"""Keyed aggregates held as columns: a batch's partials merge without a Python call per key.

A keyed aggregation of a batch stream (``key_by(cols).agg(...)``) gets, per record batch,
one partial aggregate per key from ``Table.group_by`` (or from the combine before the
exchange).  :class:`ColumnarAggregates` keeps every key it has seen in a row of numpy
arrays, one per partial (count, sum, min, max: the parts of
``cutline.runtime.batches.Partials``), with a validity mask each (a sum or min of nulls
only is null).  Merging a batch is:

* the keys' rows: one ``dict.get`` per key mapped at C speed over the batch's keys
  (``map``), keys seen for the first time read once from the backend table behind it
  (a restored key's state, or none);
* per part, one numpy operation over the batch (``+=``, ``np.minimum``, ``np.maximum`` at
  the rows: the group_by keys are unique, so fancy indexing is exact).

The keyed-state backend (memory or RocksDB) stays where state lives for checkpoints and
rescaling: :meth:`ColumnarAggregates.save` (the operator calls it in a snapshot's
synchronous part) writes the rows changed since the last save into the backend table, as
the per-key path stores them (a tuple of accumulators per key, mean as ``(sum, count)``),
so a checkpoint, a restore at another parallelism and ``cutline state`` read them as
always.  Past ``max_keys`` rows the columns are emptied after a save (keys come back from
the backend when they are seen again), so what memory holds is bounded on RocksDB.
"""

from __future__ import annotations

from itertools import repeat
from typing import Any

import numpy as np
import pyarrow as pa

__all__ = ["ColumnarAggregates", "numeric"]


def numeric(t: pa.DataType) -> bool:
    """A partial Arrow type the columns hold: integers and floats."""
    return pa.types.is_integer(t) or pa.types.is_floating(t)


class ColumnarAggregates:
    """One keyed aggregation subtask's accumulators as numpy columns (see the module
    docstring).

    ``fns``: each part's function (``count_all``, ``count``, ``sum``, ``min``, ``max``),
    ``types``: its Arrow type, ``key_types``: the key columns' Arrow types, ``reads``: per
    aggregate ``(function, part indices)`` (``Partials.reads``), ``table``: the backend's
    table the state is saved into and read back from; ``track``: keep which rows changed
    since :meth:`take_changed` (a time-sized update stream emits those).
    """

    def __init__(self, fns: list[str], types: list[pa.DataType], key_types: list[pa.DataType],
                 reads: list[tuple[str, list[int]]], table: Any,
                 max_keys: int = 1_000_000, track: bool = True) -> None:
        self.fns, self.types, self.key_types, self.reads = fns, types, key_types, reads
        self.table, self.max_keys = table, max_keys
        self.track = track  # keep the rows changed since take_changed
        self.dtypes = [np.float64 if pa.types.is_floating(t) else np.int64 for t in types]
        self.clear()

    def clear(self) -> None:
        """Forget every row (after a save, or a restore replaced the state behind)."""
        self.index: dict[Any, int] = {}
        self.keys: list[Any] = []
        self.size = 0
        # the key columns as Arrow, by row (chunks, concatenated when read)
        self.key_chunks: list[list[pa.Array]] = [[] for _ in self.key_types]
        cap = 1024
        self.vals = [np.zeros(cap, dtype=d) for d in self.dtypes]
        self.valid = [np.zeros(cap, dtype=bool) for _ in self.fns]
        self.unsaved = np.zeros(cap, dtype=bool)  # changed since the last save
        self.changed = np.zeros(cap, dtype=bool)  # changed since the last take_changed

    # ------------------------------------------------------------------ merging

    def _grow(self, need: int) -> None:
        cap = len(self.unsaved)
        if need <= cap:
            return
        while cap < need:
            cap *= 2
        self.vals = [np.resize(v, cap) for v in self.vals]
        self.valid = [_resized(v, cap) for v in self.valid]
        self.unsaved = _resized(self.unsaved, cap)
        self.changed = _resized(self.changed, cap)

    def rows_of(self, keys: list, key_cols: list | None = None) -> np.ndarray:
        """The rows of ``keys`` (Python values; tuples for several key columns; ``key_cols``:
        the same as Arrow columns), new ones added with what the backend holds for
        them."""
        index = self.index
        rows = np.fromiter(map(index.get, keys, repeat(-1)), dtype=np.int64, count=len(keys))
        new = np.flatnonzero(rows < 0)
        if len(new):
            start = self.size
            self._grow(start + len(new))
            fresh = [keys[i] for i in new.tolist()]
            for r, k in enumerate(fresh, start):
                index[k] = r
            self.keys.extend(fresh)
            self.size = start + len(fresh)
            at = np.arange(start, self.size)
            for v, m in zip(self.vals, self.valid):
                v[at] = 0
                m[at] = False
            rows[new] = at
            self._load(fresh, at)
            taken = pa.array(new)
            for j, chunks in enumerate(self.key_chunks):
                if key_cols is not None:
                    col = key_cols[j]
                    if isinstance(col, pa.ChunkedArray):
                        col = col.combine_chunks()
                    chunks.append(col.take(taken).cast(self.key_types[j]))
                else:
                    vals = fresh if len(self.key_chunks) == 1 else [k[j] for k in fresh]
                    chunks.append(pa.array(vals, type=self.key_types[j]))
                if len(chunks) > 64:
                    chunks[:] = [pa.concat_arrays(chunks)]
        return rows

    def _load(self, keys: list, rows: np.ndarray) -> None:
        """What the backend holds of ``keys`` (each key's tuple of accumulators) into
        ``rows``: key by key, once per key seen for the first time."""
        get = self.table.get
        for k, r in zip(keys, rows.tolist()):
            acc = get(k, None)
            if acc is None:
                continue
            for j, (fn, idx) in enumerate(self.reads):
                parts = acc[j] if fn == "mean" else (acc[j],)
                for p, value in zip(idx, parts):
                    if value is not None:
                        self.vals[p][r] = value
                        self.valid[p][r] = True

    def merge(self, key_cols: list, part_arrays: list) -> np.ndarray:
        """One partial per key (``key_cols``, ``part_arrays``: Arrow columns of one
        ``group_by``, keys unique) merged in; returns the keys' rows."""
        lists = [c.to_pylist() for c in key_cols]
        keys = lists[0] if len(lists) == 1 else list(zip(*lists))
        rows = self.rows_of(keys, key_cols)
        for fn, v, m, arr, t in zip(self.fns, self.vals, self.valid, part_arrays, self.types):
            if isinstance(arr, pa.ChunkedArray):
                arr = arr.combine_chunks()
            if not arr.type.equals(t):  # (a batch of another type: as the first, if exact)
                arr = _cast_exact(arr, t)
            ok = None
            if arr.null_count:
                ok = arr.is_valid().to_numpy(zero_copy_only=False)
                arr = arr.fill_null(0)
            x = arr.to_numpy(zero_copy_only=False)
            if fn in ("count_all", "count", "sum"):
                v[rows] += x
            else:
                had = m[rows]
                cur = v[rows]
                best = np.minimum(cur, x) if fn == "min" else np.maximum(cur, x)
                new = np.where(had, best, x)
                if ok is not None:
                    new = np.where(ok, new, cur)
                v[rows] = new
            m[rows] |= True if ok is None else ok
        self.unsaved[rows] = True
        if self.track:
            self.changed[rows] = True
        return rows

    # ------------------------------------------------------------------ reading

    def take_changed(self) -> np.ndarray:
        """The rows changed since the last call (in row order), marked unchanged."""
        rows = np.flatnonzero(self.changed[:self.size])
        self.changed[rows] = False
        return rows

    def rows(self, rows: np.ndarray) -> list[pa.Array]:
        """Rows ``rows`` as Arrow columns: the key columns, then each aggregate's value
        (mean: sum / count, a float; null where nothing was aggregated)."""
        taken = pa.array(rows, type=pa.int64())
        out: list[pa.Array] = []
        for chunks, t in zip(self.key_chunks, self.key_types):
            if len(chunks) > 1:
                chunks[:] = [pa.concat_arrays(chunks)]
            out.append(chunks[0].take(taken) if chunks else pa.array([], type=t))
        for fn, parts in self.reads:
            if fn == "mean":
                s, c = parts
                total, n = self.vals[s][rows].astype(np.float64), self.vals[c][rows]
                ok = self.valid[s][rows] & (n > 0)
                mean = np.divide(total, n, out=np.zeros(len(rows)), where=ok)
                out.append(pa.array(mean, mask=~ok, type=pa.float64()))
            else:
                p = parts[0]
                out.append(pa.array(self.vals[p][rows], mask=~self.valid[p][rows],
                                    type=self.types[p]))
        return out

    def compact(self, keep: np.ndarray) -> None:
        """Keep rows ``keep`` (increasing) only, renumbered ``0 .. len(keep) - 1`` in that
        order; the other keys are forgotten (not written to the backend)."""
        keys = [self.keys[i] for i in keep.tolist()]
        self.index = dict(zip(keys, range(len(keys))))
        self.keys = keys
        taken = pa.array(keep, type=pa.int64())
        for chunks in self.key_chunks:
            if chunks:
                whole = chunks[0] if len(chunks) == 1 else pa.concat_arrays(chunks)
                chunks[:] = [whole.take(taken)]
        cap = max(1024, 2 * len(keep))
        self.vals = [_resized(v[keep], cap) for v in self.vals]
        self.valid = [_resized(m[keep], cap) for m in self.valid]
        self.unsaved = _resized(self.unsaved[keep], cap)
        self.changed = _resized(self.changed[keep], cap)
        self.size = len(keep)

    # ------------------------------------------------------------------ the backend

    def accumulators(self, rows: np.ndarray) -> list[tuple]:
        """Rows ``rows`` in the per-key format: a tuple of accumulators each, mean ``(sum,
        count)``, ``None`` for nothing yet."""
        parts = []
        for v, m in zip(self.vals, self.valid):
            vals = v[rows].tolist()
            if not m[rows].all():
                vals = [x if ok else None for x, ok in zip(vals, m[rows].tolist())]
            parts.append(vals)
        cols = [list(zip(parts[idx[0]], parts[idx[1]])) if fn == "mean" else parts[idx[0]]
                for fn, idx in self.reads]
        return list(zip(*cols))

    def save(self) -> None:
        """The rows changed since the last save into the backend table (the per-key
        format: a tuple of accumulators, mean ``(sum, count)``, ``None`` for nothing yet);
        past ``max_keys`` rows the columns are emptied (read back when seen again)."""
        rows = np.flatnonzero(self.unsaved[:self.size])
        if len(rows):
            self.unsaved[rows] = False
            keys = [self.keys[i] for i in rows.tolist()]
            self.table.fast.update(zip(keys, self.accumulators(rows)))
        if self.size > self.max_keys and not self.changed[:self.size].any():
            self.clear()


def _resized(a: np.ndarray, cap: int) -> np.ndarray:
    out = np.zeros(cap, dtype=a.dtype)
    out[:len(a)] = a
    return out


def _cast_exact(arr: Any, t: Any) -> Any:
    """``arr`` as type ``t``, or :class:`pyarrow.ArrowInvalid` when a value does not convert
    exactly.  (Arrow's safe cast refuses an integer out of range or a truncated float, but
    rounds a float to a narrower one: 0.1 became 0.10000000149011612 as float32, 1e300
    became inf.)"""
    import pyarrow.compute as pc

    out = arr.cast(t)
    same = pc.equal(arr, out.cast(arr.type))
    if pa.types.is_floating(arr.type):
        same = pc.or_kleene(same, pc.is_nan(arr))
    if pc.all(same).as_py() is False:
        bad = arr.filter(pc.invert(pc.fill_null(same, True)))[0].as_py()
        raise pa.ArrowInvalid(f"{bad!r} is not exactly a {t} value")
    return out
