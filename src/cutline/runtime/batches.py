"""The columnar path: operators on batch streams, their routing by key, their wire format.

A *batch stream*'s items are Arrow record batches (a task's batch is a list of them), so
channels, credits, barriers, unaligned overtaking and channel state carry them exactly as
they carry records.  What differs:

* operators work a record batch at a time with pyarrow (``map_batches`` and
  ``filter_batches`` call the user's function once per record batch, in Arrow, pandas or
  polars; ``select`` / ``where`` / ``with_column`` evaluate column expressions; keyed
  aggregations group a batch with ``Table.group_by`` and merge one partial aggregate per
  key into keyed state);
* ``key_by("col")`` splits a record batch by key group, with the hashes of
  :mod:`cutline.state.arrow_keys` (the key groups of the per-record path);
* over TCP a list of record batches travels as one Arrow IPC stream
  (:func:`encode_batches`), not pickled; buffers are flushed by bytes.

Nothing here runs for a per-record stream: the per-record path pays nothing for it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..logical import AggSpec, BatchFunction, Node
from ..logical import update_interval
from ..protocol.windows import merge_partial
from ..state.arrow_keys import key_groups
from ..state.columnar import (ColumnarAggregates, KeyedColumns, SumOverflow, numeric,
                              sum_overflow)
from ..state.keygroups import subtask_for_key_group
from .operators import Keyed, Operator, UserFunctionError

__all__ = ["AggSpec", "BatchAggregate", "BatchCombine", "BatchFunction", "ColumnarKeyed",
           "decode_batches", "encode_batches", "is_batch_list", "is_partial", "split_by_key"]

FORMATS = ("arrow", "pandas", "polars")


class Described:
    """A record batch as an error message shows it: its rows and schema, not its data."""

    def __init__(self, batch: Any) -> None:
        self.batch = batch

    def __repr__(self) -> str:
        b = self.batch
        if isinstance(b, (pa.RecordBatch, pa.Table)):
            cols = ", ".join(f"{f.name}: {f.type}" for f in b.schema)
            return f"<record batch of {b.num_rows} rows: {cols}>"
        return f"<{type(b).__name__}>"


def describe_type(obj: Any) -> str:
    t = type(obj)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def is_batch_list(batch: list) -> bool:
    """A task batch of record batches (a batch stream's), checked on its first item."""
    return bool(batch) and type(batch[0]) is pa.RecordBatch


def row_count(batch: list) -> int:
    """Records in a task batch: rows for a batch stream's."""
    if batch and type(batch[0]) is pa.RecordBatch:
        return sum(b.num_rows for b in batch)
    return len(batch)


# --------------------------------------------------------------------------- formats

def _from_arrow(rb: pa.RecordBatch, fmt: str) -> Any:
    if fmt == "arrow":
        return rb
    if fmt == "pandas":
        return rb.to_pandas()
    import polars as pl  # type: ignore[import-not-found, unused-ignore]  # checked for when built

    return pl.from_arrow(rb)


def _to_arrow(obj: Any, fmt: str, uid: str, kind: str, given: pa.RecordBatch) -> list:
    """What a batch function returned, as record batches; any other type fails the job
    naming the operator and the type."""
    if isinstance(obj, pa.RecordBatch):
        return [obj] if obj.num_rows else []
    if isinstance(obj, pa.Table):
        return [b for b in obj.to_batches() if b.num_rows]
    mod = type(obj).__module__.split(".", 1)[0]
    if mod == "pandas" and type(obj).__name__ == "DataFrame":
        return [b for b in pa.Table.from_pandas(obj, preserve_index=False).to_batches()
                if b.num_rows]
    if mod == "polars" and type(obj).__name__ == "DataFrame":
        return [b for b in obj.to_arrow().to_batches() if b.num_rows]
    want = {"arrow": "a pyarrow.RecordBatch or Table", "pandas": "a pandas.DataFrame",
            "polars": "a polars.DataFrame"}[fmt]
    raise UserFunctionError(uid, kind, Described(given), TypeError(
        f"the function returned a {describe_type(obj)}; with batch_format={fmt!r} it must "
        f"return {want}"))


def _to_mask(obj: Any, n: int, uid: str, given: pa.RecordBatch) -> Any:
    """A ``filter_batches`` function's result as a boolean Arrow array of ``n`` values."""
    try:
        if isinstance(obj, (pa.Array, pa.ChunkedArray)):
            mask = obj
        else:
            mod = type(obj).__module__.split(".", 1)[0]
            if mod not in ("numpy", "pandas", "polars"):
                raise TypeError
            mask = pa.array(obj.to_numpy() if mod != "numpy" else obj)
        if not pa.types.is_boolean(mask.type) or len(mask) != n:
            raise TypeError
        return mask
    except (TypeError, pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise UserFunctionError(uid, "filter_batches", Described(given), TypeError(
            f"the function returned a {describe_type(obj)}; it must return {n} booleans (a "
            "pyarrow boolean Array, or a numpy / pandas / polars boolean vector), one per "
            "row")) from exc


# --------------------------------------------------------------------------- operators

class _PerBatch(Operator):
    """Runs :meth:`one` on every record batch of a task batch; a user error names the
    operator and the batch (its rows and schema)."""

    def process(self, batch: list) -> list:
        out: list = []
        one = self.one
        for rb in batch:
            try:
                out.extend(one(rb))
            except UserFunctionError:
                raise
            except Exception as exc:  # noqa: BLE001 - reported with the batch
                raise UserFunctionError(self.uid, self.node.kind, Described(rb),
                                        exc) from exc
        return out

    def one(self, rb: pa.RecordBatch) -> list:
        raise NotImplementedError


class MapBatches(_PerBatch):
    def __init__(self, node: Node) -> None:
        super().__init__(node)
        self.fn, self.fmt = node.fn.fn, node.fn.batch_format

    def one(self, rb: pa.RecordBatch) -> list:
        return _to_arrow(self.fn(_from_arrow(rb, self.fmt)), self.fmt, self.uid,
                         "map_batches", rb)


class FilterBatches(MapBatches):
    def one(self, rb: pa.RecordBatch) -> list:
        mask = _to_mask(self.fn(_from_arrow(rb, self.fmt)), rb.num_rows, self.uid, rb)
        out = rb.filter(mask)
        return [out] if out.num_rows else []


class Select(_PerBatch):
    """``select(*columns)``: those columns, in that order."""

    def one(self, rb: pa.RecordBatch) -> list:
        return [rb.select(self.node.fn)]


class Where(_PerBatch):
    """``where(expr)``: the rows where the boolean expression (``pyarrow.compute``) holds."""

    def one(self, rb: pa.RecordBatch) -> list:
        out = rb.filter(self.node.fn)
        return [out] if out.num_rows else []


def evaluate(expr: Any, rb: pa.RecordBatch) -> Any:
    """A column expression on a record batch: a ``pyarrow.compute.Expression`` (evaluated
    by Acero, no Python per row), or a function of the batch returning an array."""
    if isinstance(expr, pc.Expression):
        import pyarrow.acero as ac

        decl = ac.Declaration.from_sequence([
            ac.Declaration("table_source", ac.TableSourceNodeOptions(
                pa.Table.from_batches([rb]))),
            ac.Declaration("project", ac.ProjectNodeOptions([expr], ["v"]))])
        return decl.to_table(use_threads=False).column(0).combine_chunks()
    return expr(rb)


class WithColumn(_PerBatch):
    """``with_column(name, expr)``: the column ``name`` added (or replaced) with ``expr``."""

    def one(self, rb: pa.RecordBatch) -> list:
        name, expr = self.node.fn
        value = evaluate(expr, rb)
        if isinstance(value, pa.ChunkedArray):
            value = value.combine_chunks()
        if not isinstance(value, pa.Array) or len(value) != rb.num_rows:
            size = f" of length {len(value)}" if hasattr(value, "__len__") else ""
            raise TypeError(f"the column expression gave a {describe_type(value)}{size}: "
                            f"it must give a pyarrow Array of {rb.num_rows} values")
        i = rb.schema.get_field_index(name)
        if i >= 0:
            return [rb.set_column(i, name, value)]
        return [rb.append_column(name, value)]


class ToRows(Operator):
    """``rows()``: every row as a dict (``RecordBatch.to_pylist``)."""

    def process(self, batch: list) -> list:
        return [r for rb in batch for r in rb.to_pylist()]


class ToBatches(Operator):
    """``batches(schema)``: a task batch of dict records as one record batch."""

    def process(self, batch: list) -> list:
        schema = self.node.fn
        try:
            rb = pa.RecordBatch.from_pylist(batch, schema=schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, AttributeError) as exc:
            bad = next((r for r in batch if not isinstance(r, dict)), batch[0])
            raise UserFunctionError(self.uid, "batches", bad, TypeError(
                f"records do not convert to {'schema ' + str(schema) if schema else 'Arrow'}"
                f": {exc} (batches() takes dict records)")) from exc
        return [rb]


# --------------------------------------------------------------------------- aggregation

PART = "__cutline_p"  # a combine's partial columns: PART + index into Partials.parts
# how two partials of each part merge (``Table.group_by`` aggregate functions)
_MERGE = {"count_all": "sum", "count": "sum", "sum": "sum", "min": "min", "max": "max"}


class Partials:
    """The partial aggregates ``Table.group_by`` computes for named aggregates ``(name,
    column, function)``: ``parts`` (column, pyarrow function), each computed once, and per
    aggregate ``reads`` (function, indices into ``parts``; mean reads a sum and a count)."""

    def __init__(self, aggs: tuple[tuple[str, str | None, str], ...]) -> None:
        self.parts: list[tuple[str, str]] = []
        self.reads: list[tuple[str, list[int]]] = []
        for _, column, fn in aggs:
            col = column or ""
            if fn == "count":
                idx = [self._part(("", "count_all"))]
            elif fn == "mean":
                idx = [self._part((col, "sum")), self._part((col, "count"))]
            else:
                idx = [self._part((col, fn))]
            self.reads.append((fn, idx))
        self.names = [f if c == "" else f"{c}_{f}" for c, f in self.parts]
        self.part_names = [f"{PART}{j}" for j in range(len(self.parts))]
        self.merge = [(n, _MERGE[f]) for n, (_, f) in zip(self.part_names, self.parts)]
        self.merged_names = [f"{n}_{f}" for n, f in self.merge]

    def _part(self, p: tuple[str, str]) -> int:
        if p not in self.parts:
            self.parts.append(p)
        return self.parts.index(p)

    def group(self, table: pa.Table, keys: tuple[str, ...] | list[str],
              partial: bool = False) -> tuple[list, list, list, list]:
        """``table`` grouped by ``keys``: the key columns (Arrow), the keys (a value, or a
        tuple of values, per group), the partial columns (Arrow) and as lists
        (``partial``: see :meth:`arrow`)."""
        key_cols, part_arrays = self.arrow(table, keys, partial)
        key_lists = [c.to_pylist() for c in key_cols]
        values = key_lists[0] if len(key_lists) == 1 else list(zip(*key_lists))
        return key_cols, values, part_arrays, [a.to_pylist() for a in part_arrays]

    def arrow(self, table: pa.Table, keys: tuple[str, ...] | list[str],
              partial: bool = False) -> tuple[list, list]:
        """``table`` grouped by ``keys``: the key columns and the partial columns (Arrow).
        ``partial``: ``table`` holds partials already (:meth:`partial`'s columns): they
        are merged."""
        keys = list(keys)
        # a key column holding one value (a window start, in most batches) is left out of
        # the grouping and put back: hashing one column less (a third of a window
        # combine's ``group_by``)
        same = _constant_key(table, keys)
        by = keys if same is None else [k for k in keys if k != same]
        if partial:
            _check_sums(table, [n for (n, f), (_, g) in zip(self.merge, self.parts)
                                if f == "sum" and g == "sum"], by)
            grouped = table.group_by(by, use_threads=False).aggregate(self.merge)
            names, wanted = grouped.column_names, self.merged_names
        else:
            _check_sums(table, [c for c, f in self.parts if f == "sum"], by)
            grouped = table.group_by(by, use_threads=False).aggregate(
                [([] if c == "" else c, f) for c, f in self.parts])
            names, wanted = grouped.column_names, self.names
        return ([pa.repeat(table.column(k)[0], grouped.num_rows) if k == same
                 else grouped.column(names.index(k)) for k in keys],
                [grouped.column(names.index(n)) for n in wanted])

    def partial(self, table: pa.Table, keys: tuple[str, ...] | list[str],
                partial: bool = False) -> pa.Table:
        """``table`` (rows, or with ``partial`` partials) as one partial per key: the key
        columns and the parts as columns :attr:`part_names` (what a combine sends)."""
        key_cols, part_arrays = self.arrow(table, keys, partial)
        return pa.table([*key_cols, *part_arrays], names=[*keys, *self.part_names])

    def tuples(self, part_cols: list) -> list[tuple]:
        """Every group's partials (:meth:`of` of each), built at once."""
        cols = [list(zip(part_cols[idx[0]], part_cols[idx[1]])) if fn == "mean"
                else part_cols[idx[0]] for fn, idx in self.reads]
        return list(zip(*cols))

    def of(self, part_cols: list, i: int) -> tuple:
        """Group ``i``'s partial per aggregate (mean: ``(sum, count)``)."""
        return tuple((part_cols[idx[0]][i], part_cols[idx[1]][i]) if fn == "mean"
                     else part_cols[idx[0]][i] for fn, idx in self.reads)


def _check_sums(table: pa.Table, columns: list[str], by: list[str]) -> None:
    """Integer columns ``columns`` of ``table`` summed per key of ``by`` within their type,
    or :class:`~cutline.state.columnar.SumOverflow`: Arrow's grouped sum wraps around
    (modulo 2**64: a total in range comes out right, whatever it passed on the way).  No
    sum can leave the type when the largest magnitude times the rows fits (every batch of
    ordinary numbers: one ``min_max`` a column); otherwise the keys' sums are taken again
    exactly (as decimals) and checked."""
    for c in columns:
        col = table.column(c)
        t = col.type
        if not pa.types.is_integer(t) or not table.num_rows:
            continue
        mm = pc.min_max(col)
        lo, hi = mm["min"].as_py(), mm["max"].as_py()
        if lo is None:
            continue
        # (Arrow sums integers as 64 bits: int64, uint64 for unsigned)
        info = np.iinfo(np.uint64 if pa.types.is_unsigned_integer(t) else np.int64)
        if max(hi, -lo) <= info.max // table.num_rows:
            continue
        exact = pa.table({**{k: table.column(k) for k in by},
                          c: pc.cast(col, pa.decimal128(38, 0))}).group_by(
            by, use_threads=False).aggregate([(c, "sum")]).column(f"{c}_sum")
        got = pc.min_max(exact)
        low, high = got["min"].as_py(), got["max"].as_py()
        if low is not None and (low < info.min or high > info.max):
            raise sum_overflow(f"the sum of column {c!r}", f"a key's sum of "
                               f"{high if high > info.max else low}", info.dtype)


def _constant_key(table: pa.Table, keys: list[str]) -> str | None:
    """The last of several ``keys`` whose column in ``table`` (rows > 1) holds one value
    bit for bit (64-bit numbers without nulls, as window starts are), or ``None``."""
    if len(keys) < 2 or table.num_rows < 2:
        return None
    for k in reversed(keys):
        col = table.column(k)
        if col.type not in _WORDS or col.null_count:
            continue
        a = (col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col).to_numpy(
            zero_copy_only=False).view(np.int64)
        if (a == a[0]).all():
            return k
    return None


_WORDS = (pa.float64(), pa.int64())


def is_partial(rb: pa.RecordBatch) -> bool:
    """A combine's record batch (partials per key), not rows."""
    return rb.schema.get_field_index(f"{PART}0") >= 0


class HeldPartials:
    """What a combine holds (:class:`BatchCombine`, the window combine in
    :mod:`cutline.runtime.batch_windows`): the rows it was given, as they came (only the
    columns the aggregates read), grouped into partials once more than ``MAX_ROWS`` of them
    are held (:meth:`_fold`: one ``Table.group_by`` over many batches costs a fifth of one
    per batch, whose keys repeat little), and the partial aggregates grouped by ``group``,
    merged once more than ``MAX_ROWS`` are held, sent on at :meth:`flush` (or past 4x
    that)."""

    MAX_ROWS = 1 << 17  # held rows grouped, held partials merged past this many; sent past 4x
    held: list[pa.Table]
    rows: int
    partials: Partials
    group: list[str]
    agg_uid: str
    kind = "aggregate"  # what an error names
    raw: list[pa.Table]  # rows not grouped yet (:meth:`_hold`)
    raw_rows: int

    def _hold(self, table: pa.Table) -> list:
        """Rows ``table`` held; what must go now."""
        self.raw.append(table)
        self.raw_rows += table.num_rows
        if self.raw_rows > self.MAX_ROWS:
            self._fold()
            return self._spill()
        return []

    def _fold(self) -> None:
        """The rows held, grouped into partials (held with the others)."""
        if not self.raw:
            return
        raw, self.raw, self.raw_rows = self.raw, [], 0
        for part in self._grouped(raw, self.group):
            self._held_part(part)

    def _grouped(self, tables: list[pa.Table], group: list[str]) -> list[pa.Table]:
        """Rows ``tables`` as one partial per key of ``group`` (tables of other column
        types grouped each alone: the aggregation converts them, or fails naming them);
        a table the aggregates cannot take fails naming its first batch."""
        try:
            table = pa.concat_tables(tables, promote_options="default")
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            return [self._grouped_one(t, group) for t in tables]
        try:
            return [self.partials.partial(table, group)]
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError,
                KeyError) as exc:
            for t in tables:  # (which one: each alone)
                self._grouped_one(t, group)
            raise self._failed(table, exc) from exc  # (only together: a sum's overflow)

    def _failed(self, table: pa.Table, exc: Exception) -> UserFunctionError:
        """The aggregation failed on ``table`` (named by its first batch)."""
        rb = next((b for b in table.to_batches() if b.num_rows), None)
        return UserFunctionError(self.agg_uid, self.kind, Described(
            rb if rb is not None else table), exc)

    def _grouped_one(self, table: pa.Table, group: list[str]) -> pa.Table:
        try:
            return self.partials.partial(table, group)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError,
                KeyError) as exc:
            raise self._failed(table, exc) from exc

    def _held_part(self, part: pa.Table) -> None:
        self.held.append(part)
        self.rows += part.num_rows

    def _spill(self) -> list:
        """After holding more: merge what is held past ``MAX_ROWS``; what must go now."""
        if self.rows > self.MAX_ROWS:
            self._compact()
            if self.rows > 4 * self.MAX_ROWS:
                return self.flush()
        return []

    def _compact(self) -> None:
        """The partials held merged into one table (those of other column types stay
        beside it, sent as they are: the aggregation converts them, or fails naming
        them)."""
        if len(self.held) > 1:
            self.held = self._merged(self.held)
            self.rows = sum(t.num_rows for t in self.held)

    def _merged(self, parts: list[pa.Table]) -> list[pa.Table]:
        """Partials ``parts`` merged into one table (or, of other column types, as they
        are)."""
        if len(parts) < 2:
            return parts
        try:
            table = pa.concat_tables(parts, promote_options="default")
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            return parts
        try:
            return [self.partials.partial(table, self.group, True)]
        except SumOverflow as exc:  # (partials that each fit, merged)
            raise self._failed(table, exc) from exc

    def flush(self) -> list:
        self._fold()
        if not self.held:
            return []
        self._compact()
        out = [b for t in self.held for b in t.combine_chunks().to_batches() if b.num_rows]
        self.held, self.rows = [], 0
        return out


class BatchCombine(HeldPartials, Operator):
    """The local half of a keyed aggregation of a batch stream (two-phase aggregation,
    planned by :func:`cutline.plan.plan`): the rows of its record batches held, grouped by
    key into partial aggregates (``Table.group_by``) once more than ``MAX_ROWS`` are held
    (:class:`HeldPartials`), merged with those before, and sent on as one partial per key
    at each :meth:`flush` (before every barrier, at the end of input, every ``updates``
    seconds), or when more than ``MAX_ROWS`` partials are held after merging.  No state: a
    snapshot never finds anything held."""

    flushes = True

    def __init__(self, node: Node) -> None:
        super().__init__(node)
        spec = node.fn
        self.keys = tuple(spec.keys)
        self.group = list(self.keys)
        self.partials = Partials(spec.aggs)
        self.interval = update_interval(getattr(spec, "updates", None))
        self.held: list[pa.Table] = []
        self.rows = 0
        self.raw: list[pa.Table] = []
        self.raw_rows = 0
        self.columns = list(dict.fromkeys([*self.keys, *(c for c, _ in self.partials.parts
                                                         if c)]))
        self.agg_uid = node.uid.rsplit(".", 1)[0]  # errors name the aggregation

    def process(self, batch: list) -> list:
        try:  # (the columns read, there: a missing one fails with its batch)
            table = pa.Table.from_batches(batch).select(self.columns)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError,
                KeyError) as exc:
            raise UserFunctionError(self.agg_uid, "aggregate", Described(batch[0]),
                                    exc) from exc
        return self._hold(table)


class ColumnarKeyed(Keyed):
    """A keyed batch operator whose state is held as columns in front of its backend
    (:class:`~cutline.state.columnar.KeyedColumns`, made with the first batch it can hold,
    as ``columns``): written into the backend at each snapshot's synchronous part, forgotten
    at a restore (the keys are read back from the restored backend when seen again)."""

    columns: KeyedColumns | None = None
    restored = False  # state came from a snapshot: the backend may hold any key

    def snapshot(self) -> Any:
        if self.columns is not None:
            self.columns.save()
        return super().snapshot()

    def restore(self, blobs: list[bytes]) -> None:
        super().restore(blobs)
        self.restored = True
        if self.columns is not None:
            self.columns.restored()


class BatchAggregate(ColumnarKeyed):
    """``key_by(cols).agg(...)`` on a batch stream: per record batch, ``Table.group_by``
    computes one partial aggregate per key (vectorised), merged into the key's state (one
    tuple of accumulators, on either backend), an update stream, like Spark's update output
    mode.  ``updates="batch"``: the batch's keys are emitted with their aggregates so far
    (one row per key and batch); time-sized (``"checkpoint"``, seconds): the keys changed
    since the last :meth:`flush`, once each (the latest row of a key holds its total).

    The input holds rows, or (two-phase, ``AggSpec.partial``) a combine's partials per key
    (:func:`is_partial`), merged the same way.  Numeric aggregates merge into
    :class:`~cutline.state.columnar.ColumnarAggregates` (numpy, no Python call per key;
    written into the backend's table at each snapshot); others key by key."""

    def __init__(self, node: Node, subtask: int, parallelism: int, max_parallelism: int,
                 state_backend: str = "memory", storage: Any = None) -> None:
        super().__init__(node, subtask, parallelism, max_parallelism, state_backend, storage)
        spec: AggSpec = node.fn
        self.spec = spec
        self.partials = Partials(spec.aggs)
        self.reads = self.partials.reads
        self.each = spec.updates == "batch"
        self.flushes = not self.each
        self.interval = update_interval(spec.updates)
        self.names = [*spec.keys, *(name for name, _, _ in spec.aggs)]
        self.columns: ColumnarAggregates | None = None  # numeric: vectorised state
        self.vectorised: bool | None = None  # decided on the first batch (its types)
        self.changed: dict[Any, None] = {}  # key by key: keys changed since the last flush
        self.out_types: list | None = None  # key by key: key and aggregate column types

    def _grouped(self, batch: list) -> tuple[list, list]:
        """The batch (rows and / or partials) as one partial per key: key and part columns."""
        keys = self.spec.keys
        try:
            rows = [b for b in batch if not is_partial(b)]
            if len(rows) == len(batch):
                return self.partials.arrow(pa.Table.from_batches(batch), keys)
            tables = [self.partials.partial(pa.Table.from_batches(rows), keys)] if rows \
                else []
            tables += [pa.Table.from_batches([b]) for b in batch if is_partial(b)]
            return self.partials.arrow(pa.concat_tables(tables), keys, partial=True)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError,
                KeyError) as exc:
            raise UserFunctionError(self.uid, "aggregate", Described(batch[0]),
                                    exc) from exc

    def process(self, batch: list) -> list:
        if not batch:
            return batch
        first = batch[0].schema
        if any(not b.schema.equals(first) for b in batch[1:]):  # (columns of other types:
            return [r for b in batch for r in self.process([b])]  # one batch at a time)
        key_cols, part_arrays = self._grouped(batch)
        if self.vectorised is None:
            self.vectorised = all(numeric(a.type) for a in part_arrays)
            if self.vectorised:
                self.columns = ColumnarAggregates(
                    [f for _, f in self.partials.parts], [a.type for a in part_arrays],
                    [c.type for c in key_cols], self.reads,
                    self.state.table("aggregate"), track=not self.each,
                    fresh=not self.restored, max_parallelism=self.state.max_parallelism)
        if self.columns is not None:
            try:
                rows = self.columns.merge(key_cols, part_arrays)
            except SumOverflow as exc:  # (a key's total and this batch's partial)
                raise UserFunctionError(self.uid, "aggregate", Described(batch[0]),
                                        exc) from exc
            except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
                raise UserFunctionError(self.uid, "aggregate", Described(batch[0]), TypeError(
                    f"a column's aggregate is {[str(a.type) for a in part_arrays]} in this "
                    f"batch, {[str(t) for t in self.columns.types]} before, and does not "
                    f"convert: {exc}")) from exc
            return [self._batch(self.columns.rows(rows))] if self.each else []
        return self._merge_keys(key_cols, part_arrays)

    def _merge_keys(self, key_cols: list, part_arrays: list) -> list:
        """Key by key (aggregates Arrow holds as other than numbers: strings, timestamps):
        each key's partials merged into its state with :func:`merge_partial`."""
        key_lists = [c.to_pylist() for c in key_cols]
        keys = key_lists[0] if len(key_lists) == 1 else list(zip(*key_lists))
        part_cols = [a.to_pylist() for a in part_arrays]
        table_state = self.state.table("aggregate")
        fast, read = table_state.fast, table_state.read
        reads = self.reads
        outs: list[list] = [[] for _ in reads]
        for i, k in enumerate(keys):
            cur = fast.get(k)
            if cur is None:
                cur = read(k, None)
            new = []
            for j, (fn, idx) in enumerate(reads):
                part = (part_cols[idx[0]][i], part_cols[idx[1]][i]) if fn == "mean" \
                    else part_cols[idx[0]][i]
                acc = merge_partial(fn, cur[j] if cur is not None else None, part)
                new.append(acc)
                outs[j].append(acc if fn != "mean" else (
                    acc[0] / acc[1] if acc[1] else None))
            fast[k] = new
        self.state.after_batch()
        types = [c.type for c in key_cols] + [
            pa.float64() if fn == "mean" else part_arrays[idx[0]].type for fn, idx in reads]
        if self.out_types is None:
            self.out_types = types
        if not self.each:
            self.changed.update(dict.fromkeys(keys))
            return []
        return [self._batch([*key_cols, *(pa.array(v, type=t) for v, t in
                                          zip(outs, types[len(key_cols):]))])]

    def _batch(self, arrays: list) -> pa.RecordBatch:
        return pa.RecordBatch.from_arrays(
            [a.combine_chunks() if isinstance(a, pa.ChunkedArray) else a for a in arrays],
            names=self.names)

    def flush(self) -> list:
        if self.columns is not None:
            arrays = self.columns.rows(self.columns.take_changed())
            return [self._batch(arrays)] if len(arrays[0]) else []
        if not self.changed or self.out_types is None:
            return []
        keys, self.changed = list(self.changed), {}
        get, reads = self.state.table("aggregate").get, self.reads
        accs = [get(k) for k in keys]
        nk = len(self.spec.keys)
        key_arrays = [pa.array(keys, type=self.out_types[0])] if nk == 1 else [
            pa.array([k[j] for k in keys], type=self.out_types[j]) for j in range(nk)]
        values = [pa.array([(a[j][0] / a[j][1] if a[j][1] else None) if fn == "mean"
                            else a[j] for a in accs], type=t)
                  for j, ((fn, _), t) in enumerate(zip(reads, self.out_types[nk:]))]
        return [self._batch([*key_arrays, *values])]


# --------------------------------------------------------------------------- routing

BATCH_BYTES = 1 << 20  # a channel's buffer of record batches is sent once it holds this


class BatchRouting:
    """The output edges of a batch stream's task (the :class:`~.routing.Router` hands them
    here): ``key_by`` edges split each record batch by key group, forward / rebalance send
    whole batches round robin, broadcast to all; buffers count bytes, and :meth:`full`
    names those past :data:`BATCH_BYTES`."""

    def __init__(self, outputs: list[tuple[Any, list[str], int, str]], max_parallelism: int,
                 buffers: dict[str, list]) -> None:
        self.edges = [(e, chans, dst_p, dst_uid, getattr(e.key_fn, "columns", None))
                      for e, chans, dst_p, dst_uid in outputs]
        self.max_parallelism, self.buffers = max_parallelism, buffers
        self.bytes = {ch: 0 for _, chans, _, _, _ in self.edges for ch in chans}
        self.rr = 0

    def _add(self, ch: str, part: list) -> None:
        self.buffers[ch].extend(part)
        # (a window's late rows travel wrapped, as a LateRecord of a record batch)
        self.bytes[ch] += sum(b.nbytes if type(b) is pa.RecordBatch else b.record.nbytes
                              for b in part)

    def emit(self, batch: list) -> None:
        for edge, chans, dst_p, dst_uid, cols in self.edges:
            if cols is not None:
                try:
                    parts = split_by_key(batch, cols, self.max_parallelism, dst_p)
                except KeyError as exc:
                    raise UserFunctionError(dst_uid, "key_by", Described(batch[0]), KeyError(
                        f"no column {exc.args[0]!r} to key by")) from None
                for s, part in enumerate(parts):
                    if part:
                        self._add(chans[s], part)
            elif edge.partitioning == "broadcast":
                for ch in chans:
                    self._add(ch, batch)
            else:
                self._add(chans[self.rr % len(chans)], batch)
                self.rr += 1

    def sent(self, ch: str) -> None:
        self.bytes[ch] = 0

    def full(self) -> list[str]:
        return [ch for ch, n in self.bytes.items() if n >= BATCH_BYTES]


def split_by_key(batch: list, columns: tuple[str, ...], max_parallelism: int,
                 parallelism: int) -> list[list[pa.RecordBatch]]:
    """Per downstream subtask, the rows of ``batch`` (record batches) whose key (the
    ``columns``) is in its key groups: one ``take`` per batch and subtask."""
    out: list[list[pa.RecordBatch]] = [[] for _ in range(parallelism)]
    # key group -> subtask, the per-record formula for every group at once
    owner = np.arange(max_parallelism, dtype=np.int64) * parallelism // max_parallelism
    for rb in batch:
        if not rb.num_rows:
            continue
        dst = owner[key_groups(rb, columns, max_parallelism)]
        if parallelism == 1:
            out[0].append(rb)
            continue
        order = np.argsort(dst, kind="stable")
        bounds = np.searchsorted(dst[order], np.arange(parallelism + 1))
        for s in range(parallelism):
            lo, hi = int(bounds[s]), int(bounds[s + 1])
            if hi == lo:
                continue
            out[s].append(rb if hi - lo == rb.num_rows else rb.take(pa.array(order[lo:hi])))
    return out


def rows_for_subtask(records: list, columns: tuple[str, ...], index: int, parallelism: int,
                     max_parallelism: int) -> list:
    """In-flight record batches re-routed on a rescaled restore: the rows subtask
    ``index`` of ``parallelism`` owns."""
    assert subtask_for_key_group(0, parallelism, max_parallelism) == 0
    return split_by_key(records, columns, max_parallelism, parallelism)[index]


# --------------------------------------------------------------------------- wire format

def encode_batches(batch: list) -> Any:
    """A list of record batches as one Arrow IPC stream (one schema), or ``None`` when they
    differ in schema (then they are pickled)."""
    schema = batch[0].schema
    if any(type(b) is not pa.RecordBatch or (b.schema is not schema and
                                             not b.schema.equals(schema)) for b in batch[1:]):
        return None  # two schemas, or a watermark among them
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as w:
        for b in batch:
            w.write_batch(b)
    return memoryview(sink.getvalue())


def decode_batches(payload: Any) -> list:
    return list(pa.ipc.open_stream(pa.py_buffer(payload)))
