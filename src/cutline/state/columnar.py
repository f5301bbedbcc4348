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
always.  Past ``max_keys`` rows, a save keeps the half most recently seen and forgets the
others (they come back from the backend when they are seen again): what memory holds is
bounded, and the keys a stream keeps seeing (a skewed stream's hot keys) stay.

A key seen for the first time is read from the backend only when the backend may hold it
(:class:`HeldKeys`): in a job that did not restore, the backend holds only keys the columns
emptied out, whose hashes are kept (8 bytes a key), and a new key is none of them; after a
restore, every new key is read.  (On RocksDB a read of a key that is not there costs
about as much as one that is: its database key is built in Python.)

:class:`ColumnarRows` holds one row per key of any Arrow schema the same way (numpy
columns, objects for what numpy has no type for): ``latest()``'s best row per key.
"""

from __future__ import annotations

from itertools import repeat
from typing import Any

import numpy as np
import pyarrow as pa

__all__ = ["ColumnarAggregates", "ColumnarRows", "HeldKeys", "KeyedColumns", "SumOverflow",
           "add_exact", "numeric", "sum_overflow"]


def numeric(t: pa.DataType) -> bool:
    """A partial Arrow type the columns hold: integers and floats."""
    return pa.types.is_integer(t) or pa.types.is_floating(t)


class SumOverflow(pa.ArrowInvalid):
    """An integer sum left its type's range (int64: beyond +-9.2e18).  numpy and Arrow
    would wrap it around without a word; the job fails instead, as Spark SQL's ANSI mode
    does (``ARITHMETIC_OVERFLOW``): a float column, or smaller values, sum without it."""


def sum_overflow(what: str, value: Any, dtype: Any) -> SumOverflow:
    """:class:`SumOverflow`: ``what`` came to ``value``, outside integer ``dtype``."""
    info = np.iinfo(dtype)
    return SumOverflow(f"{what} overflows {info.dtype}: {value} is outside [{info.min}, "
                       f"{info.max}] (use a float column, or sum smaller values)")


def add_exact(cur: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``cur + x`` for integer arrays, raising :class:`SumOverflow` where a sum leaves the
    type's range (two's complement: the result's sign differs from both operands')."""
    out = cur + x
    if out.dtype.kind == "i":
        bad = ((cur ^ out) & (x ^ out)) < 0
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise sum_overflow("a sum", f"{int(cur[i])} + {int(x[i])}", out.dtype)
    return out


class HeldKeys:
    """Which keys the backend behind a set of columns may hold that the columns do not.

    ``fresh``: the backend held nothing when the columns started (no restore): it then
    holds only the keys the columns emptied out (:meth:`evicted`), kept as their sorted
    Python hashes; a key whose hash is none of them is not there (a hash shared by two
    keys only costs a read).  Not fresh (after a restore), or past ``limit`` hashes: any
    key may be there.
    """

    def __init__(self, fresh: bool, limit: int = 16_000_000) -> None:
        self.hashes: np.ndarray | None = np.zeros(0, dtype=np.int64) if fresh else None
        self.limit = limit

    def restored(self) -> None:
        """The backend's content was replaced: any key may be there."""
        self.hashes = None

    def evicted(self, keys: list) -> None:
        """``keys`` left the columns (they are in the backend)."""
        if self.hashes is None or not keys:
            return
        h = np.unique(np.fromiter(map(hash, keys), dtype=np.int64, count=len(keys)))
        h = h[~self._held(h)]  # (a key emptied out again, after it was read back)
        # merged into the sorted ones without sorting them again (np.union1d did, at every
        # eviction: a tenth of q18's time at 10 M events)
        self.hashes = np.insert(self.hashes, np.searchsorted(self.hashes, h), h)
        if len(self.hashes) > self.limit:
            self.hashes = None

    def _held(self, h: np.ndarray) -> np.ndarray:
        """Per hash of ``h``, whether it is one of :attr:`hashes` (a binary search each:
        np.isin sorts them all)."""
        held = self.hashes
        assert held is not None
        if not len(held):
            return np.zeros(len(h), dtype=bool)
        at = np.minimum(np.searchsorted(held, h), len(held) - 1)
        return held[at] == h

    def maybe(self, keys: list) -> np.ndarray:
        """Per key (none of them in the columns), whether the backend may hold it."""
        if self.hashes is None:
            return np.ones(len(keys), dtype=bool)
        if not len(self.hashes):
            return np.zeros(len(keys), dtype=bool)
        return self._held(np.fromiter(map(hash, keys), dtype=np.int64, count=len(keys)))


class KeyedColumns:
    """What :class:`ColumnarAggregates` and :class:`ColumnarRows` share: a row per key
    (``index``: key -> row, ``keys`` by row), which rows changed since the last save
    (``unsaved``) and since the last :meth:`take_changed` (``changed``, when ``track``), the
    backend's ``table`` saved into and read from, and which keys it may hold
    (:class:`HeldKeys`).  A subclass holds its columns (:meth:`_empty`, :meth:`_resize`,
    :meth:`_take`).
    """

    def __init__(self, table: Any, max_keys: int, track: bool, fresh: bool,
                 max_parallelism: int = 0) -> None:
        self.table, self.max_keys = table, max_keys
        self.max_parallelism = max_parallelism  # (0: the table's keys built one by one)
        self.track = track  # keep the rows changed since take_changed
        self.held = HeldKeys(fresh)
        self.saves = 0  # saves so far: a row's ``seen`` is the count when it was last seen
        self.keys: list[Any] = []
        self.clear()

    def restored(self) -> None:
        """A restore replaced the state behind: every row is forgotten, and any key may be
        in the table."""
        self.held.restored()
        self.clear()

    def clear(self) -> None:
        """No rows (at the start, and after a restore: :meth:`restored`)."""
        self.index: dict[Any, int] = {}
        self.keys = []
        self.size = 0
        cap = 1024
        self.unsaved = np.zeros(cap, dtype=bool)  # changed since the last save
        self.changed = np.zeros(cap, dtype=bool)  # changed since the last take_changed
        self.seen = np.zeros(cap, dtype=np.int64)  # ``saves`` when the row was last seen
        self._empty(cap)

    def compact(self, keep: np.ndarray) -> None:
        """Keep rows ``keep`` (increasing) only, renumbered ``0 .. len(keep) - 1`` in that
        order; the other keys are forgotten (not written to the backend)."""
        keys = [self.keys[i] for i in keep.tolist()]
        self.index = dict(zip(keys, range(len(keys))))
        self.keys = keys
        cap = max(1024, 2 * len(keep))
        self._take(keep, cap)
        self.unsaved = _resized(self.unsaved[keep], cap)
        self.changed = _resized(self.changed[keep], cap)
        self.seen = _resized(self.seen[keep], cap)
        self.size = len(keep)

    def _take(self, keep: np.ndarray, cap: int) -> None:
        """The columns made rows ``keep`` only, ``cap`` rows long."""
        raise NotImplementedError

    def evict(self) -> None:
        """Past ``max_keys`` rows (every row saved): the half most recently seen are kept
        (and every row changed since :meth:`take_changed`), the others forgotten, their keys
        marked as in the backend (:class:`HeldKeys`)."""
        n = self.size
        keep = self.changed[:n].copy()
        newest = np.argsort(self.seen[:n], kind="stable")[n - self.max_keys // 2:]
        keep[newest] = True
        gone = np.flatnonzero(~keep)
        if len(gone):
            self.held.evicted([self.keys[i] for i in gone.tolist()])
            self.compact(np.flatnonzero(keep))

    def _empty(self, cap: int) -> None:
        """The columns, empty, ``cap`` rows long."""
        raise NotImplementedError

    def _resize(self, cap: int) -> None:
        """The columns made ``cap`` rows long (the rows held kept)."""
        raise NotImplementedError

    def _grow(self, need: int) -> None:
        cap = len(self.unsaved)
        if need <= cap:
            return
        while cap < need:
            cap *= 2
        self._resize(cap)
        self.unsaved = _resized(self.unsaved, cap)
        self.changed = _resized(self.changed, cap)
        self.seen = _resized(self.seen, cap)

    def _add(self, keys: list, unheld: bool = False
             ) -> tuple[np.ndarray, np.ndarray, list, np.ndarray]:
        """The rows of ``keys`` (``rows``), new rows made for those not held: their
        positions in ``keys`` (``new``), the keys (``fresh``) and their rows (``at``).
        ``unheld``: the caller knows that none of ``keys`` (distinct) is held: no
        lookup."""
        index = self.index
        if unheld:
            rows = np.full(len(keys), -1, dtype=np.int64)
        else:
            rows = np.fromiter(map(index.get, keys, repeat(-1)), dtype=np.int64,
                               count=len(keys))
        new = np.flatnonzero(rows < 0)
        if not len(new):
            self.seen[rows] = self.saves
            return rows, new, [], new
        start = self.size
        self._grow(start + len(new))
        fresh = keys if len(new) == len(keys) else [keys[i] for i in new.tolist()]
        index.update(zip(fresh, range(start, start + len(fresh))))
        self.keys.extend(fresh)
        self.size = start + len(fresh)
        at = np.arange(start, self.size)
        rows[new] = at
        self.seen[rows] = self.saves
        return rows, new, fresh, at

    def _touched(self, rows: np.ndarray) -> None:
        self.unsaved[rows] = True
        if self.track:
            self.changed[rows] = True

    def take_changed(self) -> np.ndarray:
        """The rows changed since the last call (in row order), marked unchanged."""
        rows = np.flatnonzero(self.changed[:self.size])
        self.changed[rows] = False
        return rows

    def _save_rows(self, rows: np.ndarray, keys: list) -> None:
        """Rows ``rows`` (their keys: ``keys``) into the table, in the per-key format."""
        raise NotImplementedError

    @property
    def _primes(self) -> bool:
        """The table builds database keys (RocksDB) and takes them built at once."""
        return bool(self.max_parallelism) and hasattr(self.table, "prime")

    def _prime(self, keys: list, key_arrays: list) -> None:
        """The table (:attr:`_primes`) gets the database keys of ``keys`` (their columns:
        ``key_arrays``) built at once (:mod:`cutline.state.arrow_keys`), when their types
        allow."""
        from .arrow_keys import encode_keys, key_groups

        encoded = encode_keys(key_arrays) if key_arrays else None
        if encoded is not None:
            names = [str(i) for i in range(len(key_arrays))]
            self.table.prime(keys, key_groups(pa.table(dict(zip(names, key_arrays))), names,
                                              self.max_parallelism), encoded)

    def save(self) -> None:
        """The rows changed since the last save into the backend table (per key, in the
        per-key format: :meth:`_save_rows`); past ``max_keys`` rows the least recently seen
        are forgotten (:meth:`evict`; read back when seen again)."""
        rows = np.flatnonzero(self.unsaved[:self.size])
        if len(rows):
            self.unsaved[rows] = False
            self._save_rows(rows, [self.keys[i] for i in rows.tolist()])
        self.saves += 1
        if self.size > self.max_keys:
            self.evict()


class ColumnarAggregates(KeyedColumns):
    """One keyed aggregation subtask's accumulators as numpy columns (see the module
    docstring).

    ``fns``: each part's function (``count_all``, ``count``, ``sum``, ``min``, ``max``),
    ``types``: its Arrow type, ``key_types``: the key columns' Arrow types, ``reads``: per
    aggregate ``(function, part indices)`` (``Partials.reads``), ``table``: the backend's
    table the state is saved into and read back from; ``track``: keep which rows changed
    since :meth:`take_changed` (a time-sized update stream emits those); ``fresh``: the
    table holds nothing yet (no restore: :class:`HeldKeys`).
    """

    def __init__(self, fns: list[str], types: list[pa.DataType], key_types: list[pa.DataType],
                 reads: list[tuple[str, list[int]]], table: Any,
                 max_keys: int = 1_000_000, track: bool = True, fresh: bool = False,
                 max_parallelism: int = 0) -> None:
        self.fns, self.types, self.key_types, self.reads = fns, types, key_types, reads
        self.dtypes = [np.float64 if pa.types.is_floating(t) else np.int64 for t in types]
        super().__init__(table, max_keys, track, fresh, max_parallelism)

    def _empty(self, cap: int) -> None:
        # the key columns as Arrow, by row (chunks, concatenated when read)
        self.key_chunks: list[list[pa.Array]] = [[] for _ in self.key_types]
        self.vals = [np.zeros(cap, dtype=d) for d in self.dtypes]
        self.valid = [np.zeros(cap, dtype=bool) for _ in self.fns]

    def _resize(self, cap: int) -> None:
        self.vals = [np.resize(v, cap) for v in self.vals]
        self.valid = [_resized(v, cap) for v in self.valid]

    # ------------------------------------------------------------------ merging

    def rows_of(self, keys: list, key_cols: list | None = None,
                unheld: bool = False) -> np.ndarray:
        """The rows of ``keys`` (Python values; tuples for several key columns; ``key_cols``:
        the same as Arrow columns), new ones added with what the backend holds for
        them (``unheld``: :meth:`_add`)."""
        rows, new, fresh, at = self._add(keys, unheld)
        if len(new):
            for v, m in zip(self.vals, self.valid):
                v[at] = 0
                m[at] = False
            maybe = self.held.maybe(fresh)
            if maybe.all():
                self._load(fresh, at)
            elif maybe.any():
                some = np.flatnonzero(maybe)
                self._load([fresh[i] for i in some.tolist()], at[some])
            taken = pa.array(new) if len(new) < len(keys) else None
            for j, chunks in enumerate(self.key_chunks):
                if key_cols is not None:
                    col = key_cols[j]
                    if isinstance(col, pa.ChunkedArray):
                        col = col.combine_chunks()
                    chunks.append((col if taken is None else col.take(taken)).cast(
                        self.key_types[j]))
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

    def merge(self, key_cols: list, part_arrays: list, unheld: bool = False) -> np.ndarray:
        """One partial per key (``key_cols``, ``part_arrays``: Arrow columns of one
        ``group_by``, keys unique) merged in; returns the keys' rows (``unheld``: none of
        the keys is held, :meth:`_add`)."""
        lists = [c.to_pylist() for c in key_cols]
        keys = lists[0] if len(lists) == 1 else list(zip(*lists))
        rows = self.rows_of(keys, key_cols, unheld)
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
                v[rows] = add_exact(v[rows], x) if v.dtype.kind == "i" else v[rows] + x
            else:
                had = m[rows]
                cur = v[rows]
                best = np.minimum(cur, x) if fn == "min" else np.maximum(cur, x)
                new = np.where(had, best, x)
                if ok is not None:
                    new = np.where(ok, new, cur)
                v[rows] = new
            m[rows] |= True if ok is None else ok
        self._touched(rows)
        return rows

    # ------------------------------------------------------------------ reading

    def rows(self, rows: np.ndarray) -> list[pa.Array]:
        """Rows ``rows`` as Arrow columns: the key columns, then each aggregate's value
        (mean: sum / count, a float; null where nothing was aggregated)."""
        return self.key_arrays(rows) + self._results([v[rows] for v in self.vals],
                                                      [m[rows] for m in self.valid])

    def merged(self, rows: np.ndarray, heads: np.ndarray) -> list[pa.Array]:
        """Rows ``rows`` merged in runs (``heads``: where each run starts in ``rows``,
        increasing from 0), each run in its order, as the per-key path merges accumulators
        one after another: per run, each aggregate's value as :meth:`rows` gives it (a
        sliding window fired as the merge of its panes)."""
        lengths = np.diff(heads, append=len(rows))
        vals, valid = [], []
        for fn, v, m in zip(self.fns, self.vals, self.valid):
            x, has = v[rows], m[rows]
            if fn in ("min", "max") or x.dtype.kind != "f":  # exact in any order: at once
                ufunc: Any = np.add
                if fn == "min" or fn == "max":  # (a part with no value never wins)
                    if x.dtype.kind == "f":
                        fill: Any = np.inf if fn == "min" else -np.inf
                    else:
                        fill = np.iinfo(x.dtype).max if fn == "min" else np.iinfo(x.dtype).min
                    ufunc = np.minimum if fn == "min" else np.maximum
                    x = np.where(has, x, fill)
                else:
                    x = np.where(has, x, 0)
                    if x.dtype.kind == "i" and len(x) and max(int(x.max()), -int(x.min())) \
                            > np.iinfo(x.dtype).max // max(1, int(lengths.max())):
                        # a run's sum may leave the type: summed exactly, then checked
                        info = np.iinfo(x.dtype)
                        for total in np.add.reduceat(x.astype(object), heads).tolist():
                            if not info.min <= total <= info.max:
                                raise sum_overflow("a sum", total, x.dtype)
                vals.append(ufunc.reduceat(x, heads))
                valid.append(np.logical_or.reduceat(has, heads))
                continue
            # float sums: one pane after another, as the per-key path adds them
            acc, ok = v[rows[heads]], m[rows[heads]].copy()
            for j in range(1, int(lengths.max(initial=1))):
                runs = np.flatnonzero(lengths > j)
                at = rows[heads[runs] + j]
                x, has = v[at], m[at]
                cur, had = acc[runs], ok[runs]
                acc[runs] = np.where(has, np.where(had, cur + x, x), cur)
                ok[runs] = had | has
            vals.append(acc)
            valid.append(ok)
        return self._results(vals, valid)

    def _results(self, vals: list[np.ndarray], valid: list[np.ndarray]) -> list[pa.Array]:
        """Each aggregate's value from its parts' values and validity (mean: sum / count,
        a float; null where nothing was aggregated)."""
        out: list[pa.Array] = []
        for fn, parts in self.reads:
            if fn == "mean":
                s, c = parts
                total, n = vals[s].astype(np.float64), vals[c]
                ok = valid[s] & (n > 0)
                mean = np.divide(total, n, out=np.zeros(len(n)), where=ok)
                out.append(pa.array(mean, mask=~ok, type=pa.float64()))
            else:
                p = parts[0]
                out.append(pa.array(vals[p], mask=~valid[p], type=self.types[p]))
        return out

    def key_arrays(self, rows: np.ndarray) -> list[pa.Array]:
        """The key columns of rows ``rows`` (Arrow), in the order of ``rows``."""
        taken = pa.array(rows, type=pa.int64())
        out: list[pa.Array] = []
        for chunks, t in zip(self.key_chunks, self.key_types):
            if len(chunks) > 1:
                chunks[:] = [pa.concat_arrays(chunks)]
            out.append(chunks[0].take(taken) if chunks else pa.array([], type=t))
        return out

    def _take(self, keep: np.ndarray, cap: int) -> None:
        taken = pa.array(keep, type=pa.int64())
        for chunks in self.key_chunks:
            if chunks:
                whole = chunks[0] if len(chunks) == 1 else pa.concat_arrays(chunks)
                chunks[:] = [whole.take(taken)]
        self.vals = [_resized(v[keep], cap) for v in self.vals]
        self.valid = [_resized(m[keep], cap) for m in self.valid]

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

    def _save_rows(self, rows: np.ndarray, keys: list) -> None:
        if self._primes:
            self._prime(keys, self.key_arrays(rows))
        self.table.fast.update(zip(keys, self.accumulators(rows)))


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

    if pa.types.is_null(arr.type):  # (a batch whose column holds nulls only)
        return pa.nulls(len(arr), t)
    out = arr.cast(t)
    same = pc.equal(arr, out.cast(arr.type))
    if pa.types.is_floating(arr.type):
        same = pc.or_kleene(same, pc.is_nan(arr))
    if pc.all(same).as_py() is False:
        bad = arr.filter(pc.invert(pc.fill_null(same, True)))[0].as_py()
        raise pa.ArrowInvalid(f"{bad!r} is not exactly a {t} value")
    return out


# ------------------------------------------------------------------ rows of any schema

_TEMPORAL_INT = {32: pa.int32(), 64: pa.int64()}


def _storage(t: pa.DataType) -> pa.DataType | None:
    """The numpy-held type of an Arrow column type: itself for numbers and booleans, the
    integer of its width for a time (timestamp, date, time, duration: compared as such
    within a column of one unit), None for what numpy holds as objects."""
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
        return t
    if (pa.types.is_timestamp(t) or pa.types.is_date(t) or pa.types.is_time(t)
            or pa.types.is_duration(t)):
        return _TEMPORAL_INT[t.bit_width]
    return None


def _to_numpy(arr: Any, storage: pa.DataType | None, view: bool
              ) -> tuple[np.ndarray, np.ndarray | None]:
    """A column as numpy (values, validity or None when it has no nulls); ``view``: its
    values read as ``storage``."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    ok = arr.is_valid().to_numpy(zero_copy_only=False) if arr.null_count else None
    if storage is None:
        vals = arr.to_pylist()
        return np.fromiter(vals, dtype=object, count=len(vals)), ok
    if view:
        arr = arr.view(storage)
    if ok is not None:
        arr = arr.fill_null(False if pa.types.is_boolean(storage) else 0)
    return arr.to_numpy(zero_copy_only=False), ok


class ColumnarRows(KeyedColumns):
    """One row per key, of a fixed Arrow ``schema``, held as columns (numpy: numbers,
    booleans and times as such, anything else as Python objects) with a validity mask
    each: ``latest()``'s best row per key (:meth:`offer`).

    As :class:`ColumnarAggregates`: a key's row is one ``dict.get`` mapped over a batch's
    keys, a key seen for the first time is read from ``table`` (the backend's) when it may
    be there (:class:`HeldKeys`), :meth:`save` writes the rows changed since the last save
    into ``table`` in the per-key format (a tuple of the row's Python values, as
    ``to_pylist`` gives them, in the schema's order), and past ``max_keys`` rows a save
    forgets the least recently seen (:meth:`KeyedColumns.evict`).
    """

    def __init__(self, schema: pa.Schema, by: list[str], table: Any,
                 max_keys: int = 1_000_000, track: bool = True, fresh: bool = False,
                 key_columns: list[str] | None = None, max_parallelism: int = 0) -> None:
        self.schema = schema
        self.key_columns = key_columns  # (to build the backend's keys of a save at once)
        self.by = [schema.get_field_index(c) for c in by]
        self.storage = [_storage(f.type) for f in schema]
        self.view = [s is not None and not s.equals(f.type)
                     for s, f in zip(self.storage, schema)]
        self.dtypes = [object if s is None else s.to_pandas_dtype() for s in self.storage]
        super().__init__(table, max_keys, track, fresh, max_parallelism)

    def _empty(self, cap: int) -> None:
        self.vals = [np.zeros(cap, dtype=d) if d is not object else np.full(cap, None)
                     for d in self.dtypes]
        self.valid = [np.zeros(cap, dtype=bool) for _ in self.dtypes]
        self.has = np.zeros(cap, dtype=bool)  # a row holds a value

    def _resize(self, cap: int) -> None:
        self.vals = [_resized(v, cap) for v in self.vals]
        self.valid = [_resized(v, cap) for v in self.valid]
        self.has = _resized(self.has, cap)

    def _take(self, keep: np.ndarray, cap: int) -> None:
        self.vals = [_resized(v[keep], cap) for v in self.vals]
        self.valid = [_resized(m[keep], cap) for m in self.valid]
        self.has = _resized(self.has[keep], cap)

    def columns(self, table: pa.Table) -> list[tuple[np.ndarray, np.ndarray | None]]:
        """``table``'s columns (of the schema) as numpy, as the rows hold them."""
        return [_to_numpy(c, s, v) for c, s, v in zip(table.columns, self.storage,
                                                        self.view)]

    def _put(self, rows: np.ndarray, cols: list, at: np.ndarray | None = None) -> None:
        """Rows ``rows`` become ``cols``' rows ``at`` (all of them when None)."""
        for v, m, (x, ok) in zip(self.vals, self.valid, cols):
            v[rows] = x if at is None else x[at]
            m[rows] = True if ok is None else (ok if at is None else ok[at])
        self.has[rows] = True

    def rows_of(self, keys: list) -> np.ndarray:
        """The rows of ``keys`` (tuples for several key columns), new ones added with what
        the table holds for them (``has`` false where it holds nothing)."""
        rows, new, fresh, at = self._add(keys)
        if not len(new):
            return rows
        self.has[at] = False
        maybe = np.flatnonzero(self.held.maybe(fresh))
        if len(maybe):
            get = self.table.get
            found = [(r, row) for r, row in ((int(at[i]), get(fresh[i], None))
                                             for i in maybe.tolist()) if row is not None]
            if found:
                held = self._held_rows([row for _, row in found])
                self._put(np.array([r for r, _ in found], dtype=np.int64),
                          self.columns(held))
        return rows

    def _held_rows(self, found: list[tuple]) -> pa.Table:
        """Rows read from the table (tuples) as a table of the schema; a clear error when
        they do not fit it (state written by a pipeline whose rows differed)."""
        width = len(self.schema)
        try:
            bad = next((r for r in found if not isinstance(r, tuple) or len(r) != width), None)
            if bad is not None:
                raise ValueError(f"a held row has {len(bad) if isinstance(bad, tuple) else 1} "
                                 f"values")
            return pa.Table.from_arrays(
                [pa.array([r[j] for r in found], type=f.type)
                 for j, f in enumerate(self.schema)], schema=self.schema)
        except (ValueError, TypeError, pa.ArrowException) as exc:
            raise TypeError(
                f"the state restored does not fit the rows ({width} columns: "
                f"{', '.join(f'{f.name} {f.type}' for f in self.schema)}): {exc}; was it written "
                f"by a pipeline whose rows were different?") from exc

    def _newer(self, cols: list, rows: np.ndarray) -> np.ndarray:
        """Per row of ``cols``, whether it orders after rows ``rows``' values in ``by``
        (compared in order, nulls smallest; rows holding nothing are always older)."""
        newer = ~self.has[rows]
        undecided = np.flatnonzero(~newer)
        for j in self.by:
            if not len(undecided):
                break
            x, ok = cols[j]
            a = x[undecided]
            va = np.ones(len(undecided), dtype=bool) if ok is None else ok[undecided]
            r = rows[undecided]
            b, vb = self.vals[j][r], self.valid[j][r]
            both = va & vb
            gt = va & ~vb
            eq = ~va & ~vb
            if both.any():
                i = np.flatnonzero(both)
                gt[i] = np.greater(a[i], b[i])
                eq[i] = np.equal(a[i], b[i])
            newer[undecided[gt]] = True
            undecided = undecided[eq]
        return newer

    def offer(self, keys: list, table: pa.Table) -> np.ndarray:
        """``table``'s rows (one per key, ``keys`` theirs) replace their keys' rows where
        they order after them (:meth:`_newer`): returns the indices of those that did."""
        rows = self.rows_of(keys)
        cols = self.columns(table)
        won = np.flatnonzero(self._newer(cols, rows))
        if len(won):
            self._put(rows[won], cols, won)
            self._touched(rows[won])
        return won

    def batch(self, rows: np.ndarray) -> pa.RecordBatch:
        """Rows ``rows`` as a record batch of the schema."""
        arrays = []
        for v, m, s, view, f in zip(self.vals, self.valid, self.storage, self.view,
                                    self.schema):
            mask = ~m[rows]
            a = pa.array(v[rows], type=f.type if s is None else s,
                         mask=mask if mask.any() else None)
            arrays.append(a.view(f.type) if view else a)
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    def _save_rows(self, rows: np.ndarray, keys: list) -> None:
        """A tuple of the row's values per key."""
        batch = self.batch(rows)
        if self._primes and self.key_columns:
            self._prime(keys, [batch.column(c) for c in self.key_columns])
        self.table.fast.update(zip(keys, zip(*(c.to_pylist() for c in batch.columns))))
