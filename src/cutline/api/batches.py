"""Batch streams (record batches of Arrow): ``BatchStream``, its keyed aggregations and windows."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..logical import (
    AGGREGATES,
    FORWARD,
    HASH,
    REBALANCE,
    AggSpec,
    BatchFunction,
    BatchWindowSpec,
    ColumnKey,
    ColumnTime,
    LatestSpec,
    Node,
    check_updates,
)
from ..protocol.windows import (
    WindowAssigner,
    columns,
    duration,
)
from .config import _check_batch_format, _check_callable, _column_key, _keep_late, _on_late
from .streams import Stream, _Operators

if TYPE_CHECKING:
    from .pipeline import Pipeline


# --------------------------------------------------------------------------- batch streams


RECORD_ONLY = {"map": "map_batches(fn)", "flat_map": "map_batches(fn)",
               "iterate": "rows() first", "batches": "nothing: it is one already"}
"""The operators of record streams a batch stream lacks, and what to use instead."""


class BatchStream(_Operators):
    """A stream of Arrow record batches (``FileSource(...).batches()``,
    ``GeneratorSource(batch_fn=...)``, ``stream.batches(schema)``): operators run a record
    batch at a time, vectorised, like Spark's ``mapInArrow`` / ``mapInPandas`` and
    DataFrame column expressions.  ``rows()`` turns it back into dict records.
    """

    carries = "record batches"

    def __getattr__(self, name: str) -> Any:
        """A record stream's operator asked of a batch stream: say what to use."""
        if name in RECORD_ONLY:
            raise AttributeError(
                f"{name}() works on records; this is a batch stream (Arrow record batches): "
                f"use {RECORD_ONLY[name]}, or .rows().{name}(...) for dict records")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def _then(self, kind: str, fn: Any, *, uid: str | None, parallelism: int | None,
              partitioning: str | None = None, key_fn: Callable | None = None) -> "BatchStream":
        """A columnar operator after this one."""
        node = self._add(kind, fn, uid=uid, parallelism=parallelism,
                         partitioning=partitioning, key_fn=key_fn)
        node.columnar = True
        return BatchStream(self.pipeline, node)

    def rebalance(self) -> "BatchStream":
        """Spread record batches round-robin over the next operator's subtasks."""
        out = BatchStream(self.pipeline, self.node)
        out._partitioning = REBALANCE
        return out

    def union(self, *others: "BatchStream", uid: str | None = None,
              parallelism: int | None = None) -> "BatchStream":
        """The record batches of this and ``others`` (batch streams too) as one stream;
        each keeps its schema (a sink after it takes one schema)."""
        node = self._union(others, uid, parallelism)
        node.columnar = True
        return BatchStream(self.pipeline, node)

    def assign_timestamps(self, column: Any, *, max_delay: Any = 0,
                          watermark: Any = None, idle_timeout: Any = None,
                          max_drift: Any = None, uid: str | None = None,
                          parallelism: int | None = None) -> "BatchStream":
        """Event time from ``column`` (seconds as int/float, or an Arrow timestamp), with
        watermarks as for records (``max_delay``, ``watermark=``, ``idle_timeout``,
        ``max_drift``; see
        :meth:`Stream.assign_timestamps`).  The generator sees each record batch's largest
        timestamp.  Windows follow: ``key_by(cols).window(tumbling(60)).agg(...)``."""
        if not isinstance(column, str) or not column:
            raise TypeError("assign_timestamps() on a batch stream takes the name of the "
                            f"event-time column, got {column!r}")
        spec, parallelism = self._timestamps(ColumnTime(column), max_delay, watermark,
                                             idle_timeout, max_drift, parallelism)
        node = self._add("assign_timestamps", spec, uid=uid, parallelism=parallelism)
        node.columnar = True
        return BatchStream(self.pipeline, node)

    def map_batches(self, fn: Callable[[Any], Any], *, batch_format: str = "arrow",
                    uid: str | None = None, parallelism: int | None = None) -> "BatchStream":
        """``fn(batch)`` per record batch: a ``pyarrow.RecordBatch`` (``batch_format=
        "arrow"``), ``pandas.DataFrame`` or ``polars.DataFrame``; it returns the same kind
        (or an Arrow ``Table``) with any number of rows and any schema."""
        _check_callable("map_batches", fn)
        _check_batch_format("map_batches", batch_format)
        return self._then("map_batches", BatchFunction(fn, batch_format), uid=uid,
                          parallelism=parallelism)

    def filter_batches(self, fn: Callable[[Any], Any], *, batch_format: str = "arrow",
                       uid: str | None = None,
                       parallelism: int | None = None) -> "BatchStream":
        """The rows where ``fn(batch)`` is true: it returns one boolean per row (a pyarrow
        boolean array, or a numpy / pandas / polars boolean vector)."""
        _check_callable("filter_batches", fn)
        _check_batch_format("filter_batches", batch_format)
        return self._then("filter_batches", BatchFunction(fn, batch_format), uid=uid,
                          parallelism=parallelism)

    def select(self, *columns: str, uid: str | None = None) -> "BatchStream":
        """Only these columns, in this order (``df.select``)."""
        if not columns or not all(isinstance(c, str) for c in columns):
            raise TypeError(f"select() takes column names, got {columns!r}")
        return self._then("select", list(columns), uid=uid, parallelism=None)

    def filter(self, expr: Any, *, uid: str | None = None) -> "BatchStream":
        """The rows where the boolean column expression holds (``df.filter``), e.g.
        ``pc.field("value") >= 10`` (``import pyarrow.compute as pc``)."""
        return self.where(expr, uid=uid)

    def where(self, expr: Any, *, uid: str | None = None) -> "BatchStream":
        """Alias of :meth:`filter` (``df.where``)."""
        import pyarrow.compute as pc

        if not isinstance(expr, pc.Expression):
            raise TypeError(f"filter()/where() on a batch stream takes a column expression "
                            f"(pyarrow.compute, e.g. pc.field('x') > 3), got "
                            f"{type(expr).__name__}; for a function of the batch use "
                            "filter_batches(fn)")
        return self._then("where", expr, uid=uid, parallelism=None)

    def with_column(self, name: str, expr: Any, *, uid: str | None = None) -> "BatchStream":
        """Add (or replace) column ``name``: a ``pyarrow.compute`` expression (e.g.
        ``pc.field("value") * 1.5``) or a function of the record batch returning an Arrow
        array (e.g. ``lambda b: pc.utf8_upper(b["page"])``) (``df.withColumn``)."""
        import pyarrow.compute as pc

        if not isinstance(name, str) or not name:
            raise TypeError(f"with_column() needs a column name, got {name!r}")
        if not isinstance(expr, pc.Expression) and not callable(expr):
            raise TypeError(f"with_column() takes a pyarrow.compute expression or a function "
                            f"of the batch, got {type(expr).__name__}: {expr!r}")
        return self._then("with_column", (name, expr), uid=uid, parallelism=None)

    def rows(self, *, uid: str | None = None) -> Stream:
        """Every row as a dict record (``RecordBatch.to_pylist``): the per-record
        operators follow.  Costs a Python dict per row (see docs/columnar.md)."""
        return Stream(self.pipeline, self._add("to_rows", None, uid=uid, parallelism=None))

    def key_by(self, columns: Any) -> "BatchKeyedStream":
        """Partition rows by column(s) (``df.groupBy``): ``"user"`` or ``["a", "b"]``.  A
        row goes to the key group the per-record ``key_by`` gives the same key (the value,
        or the tuple of values), so state can be rescaled and the two paths mixed."""
        if callable(columns) and not isinstance(columns, ColumnKey):
            raise TypeError("key_by() on a batch stream takes column names (e.g. "
                            "key_by('user')), not a function: rows are keyed vectorised")
        return BatchKeyedStream(self, _column_key("key_by", columns))


def _agg_specs(named: dict[str, Any], keys: tuple[str, ...]
               ) -> tuple[tuple[str, str | None, str], ...]:
    """``agg(...)``'s named aggregates as ``(name, column, function)``; bad ones raise."""
    if not named:
        raise ValueError("agg() needs at least one aggregate, e.g. agg(n='count')")
    aggs: list[tuple[str, str | None, str]] = []
    for out, spec in named.items():
        if spec == "count":
            aggs.append((out, None, "count"))
            continue
        if not (isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[0], str)
                and spec[1] in AGGREGATES and spec[1] != "count"):
            raise ValueError(f"agg({out}=...) takes 'count' or (column, function) with "
                             f"function one of sum, min, max, mean; got {spec!r}")
        aggs.append((out, spec[0], spec[1]))
    clash = set(keys) & set(named)
    if clash:
        raise ValueError(f"agg(): output names {sorted(clash)} are key columns")
    return tuple(aggs)


class _Aggregations:
    """``count()``, ``sum(col)``, ``min``, ``max``, ``mean``: shorthands of ``agg``."""

    def agg(self, *, uid: str | None = None, parallelism: int | None = None,
            updates: Any = None, **named: Any) -> BatchStream:
        raise NotImplementedError

    def count(self, *, uid: str | None = None, parallelism: int | None = None,
              updates: Any = None) -> BatchStream:
        """Rows per key, as column ``count``."""
        return self.agg(uid=uid, parallelism=parallelism, updates=updates, count="count")

    def sum(self, column: str, *, uid: str | None = None,
            parallelism: int | None = None, updates: Any = None) -> BatchStream:
        """The sum of ``column`` per key, as column ``<column>_sum``."""
        return self.agg(uid=uid, parallelism=parallelism, updates=updates,
                        **{f"{column}_sum": (column, "sum")})

    def min(self, column: str, *, uid: str | None = None,
            parallelism: int | None = None, updates: Any = None) -> BatchStream:
        """The smallest ``column`` per key, as ``<column>_min``."""
        return self.agg(uid=uid, parallelism=parallelism, updates=updates,
                        **{f"{column}_min": (column, "min")})

    def max(self, column: str, *, uid: str | None = None,
            parallelism: int | None = None, updates: Any = None) -> BatchStream:
        """The largest ``column`` per key, as ``<column>_max``."""
        return self.agg(uid=uid, parallelism=parallelism, updates=updates,
                        **{f"{column}_max": (column, "max")})

    def mean(self, column: str, *, uid: str | None = None,
             parallelism: int | None = None, updates: Any = None) -> BatchStream:
        """The mean of ``column`` per key (a float), as ``<column>_mean``."""
        return self.agg(uid=uid, parallelism=parallelism, updates=updates,
                        **{f"{column}_mean": (column, "mean")})


class BatchWindowedStream(_Aggregations):
    """A batch stream's keyed windows (:meth:`BatchKeyedStream.window`): choose the
    aggregates; the result is a batch stream of one row per key and window."""

    def __init__(self, keyed: "BatchKeyedStream", assigner: WindowAssigner, lateness: float,
                 time: ColumnTime) -> None:
        self.keyed, self.assigner, self.lateness, self.time = keyed, assigner, lateness, time
        self.on_late = "drop"

    def agg(self, *, uid: str | None = None, parallelism: int | None = None,
            updates: Any = None, **named: Any) -> BatchStream:
        """Named aggregates per key and window, as :meth:`BatchKeyedStream.agg`; the
        output names ``start`` and ``end`` are the window's."""
        if updates is not None:
            raise ValueError("window agg(updates=...): a window emits its row when the "
                             "watermark reaches its end; updates= sizes the update stream "
                             "of a keyed aggregation without windows")
        keys = self.keyed.key_fn.columns
        aggs = _agg_specs(named, keys)
        clash = {"start", "end"} & (set(named) | set(keys))
        if clash:
            raise ValueError(f"window agg(): {sorted(clash)} name the window's bounds; "
                             "name the aggregates (or keys) otherwise")
        spec = BatchWindowSpec(keys, aggs, self.assigner, self.lateness, self.time.column,
                               columns(aggs), ts_shift=self.time.shift, on_late=self.on_late)
        win = self.keyed.stream._then("window_agg", spec, uid=uid, parallelism=parallelism,
                                      partitioning=HASH, key_fn=self.keyed.key_fn)
        results = win._then("window_results", spec, uid=None, parallelism=parallelism)
        # a row's event time is its window's last instant, ``end`` less 1 µs (as a record
        # window's result): windows of windows follow, on batches or after rows()
        results.node.timestamp_fn = ColumnTime("end", shift=-1e-6)
        results.node.timestamps_from = win.node.uid
        return BatchWindowedResults(results.pipeline, results.node, win.node, spec)


class BatchWindowedResults(BatchStream):
    """The rows of a batch stream's windows, one per key and window (and again per row
    within ``allowed_lateness`` of a fired window); :meth:`late` is a second output."""

    def __init__(self, pipeline: Pipeline, node: Node, window_node: Node,
                 spec: BatchWindowSpec) -> None:
        super().__init__(pipeline, node)
        self.window_node, self.spec = window_node, spec

    def late(self, *, uid: str | None = None) -> BatchStream:
        """The rows that came later than ``allowed_lateness`` for all their windows, as
        they came (the input's columns): a batch stream to route to any sink, written
        exactly once like the windows' rows."""
        _keep_late(self.spec)
        self.spec.emit_late = True
        w = self.window_node
        node = self.pipeline._add("window_late", self.spec, [w.id], uid=uid,
                                  parallelism=w.parallelism, partitioning=FORWARD)
        node.columnar = True
        return BatchStream(self.pipeline, node)


class BatchKeyedStream(_Aggregations):
    """A batch stream partitioned by key columns: keyed aggregations follow (``count``,
    ``sum``, ``min``, ``max``, ``mean``, ``agg``), computed per record batch with
    ``Table.group_by`` and merged into keyed state.  Each emits an update stream, as
    Spark's update output mode: rows ``(key columns..., aggregates...)``, a key's latest
    row holding its aggregates so far; by default one row per key changed since the last
    checkpoint, at each checkpoint (``updates=``, see :meth:`agg`)."""

    def __init__(self, stream: BatchStream, key: ColumnKey) -> None:
        self.stream, self.key_fn = stream, key

    def agg(self, *, uid: str | None = None, parallelism: int | None = None,
            updates: Any = None, **named: Any) -> BatchStream:
        """Named aggregates: ``agg(n="count", total=("value", "sum"), avg=("value",
        "mean"))``; functions ``count`` (rows), ``sum``, ``min``, ``max``, ``mean``.

        ``updates``: when the update stream emits.  ``"checkpoint"`` (the default): one row
        per key changed since the last checkpoint, at each checkpoint (and the end of
        input); a number of seconds: every that often too; ``"batch"``: one row per key
        per input record batch, as it comes.  Sized by time, the aggregation runs in two
        phases: each upstream subtask merges its batches per key and sends one partial per
        key before each barrier (Spark's partial aggregation), so the exchange carries one
        row per key and checkpoint, not the input (docs/columnar.md)."""
        updates = check_updates("agg", "checkpoint" if updates is None else updates,
                                "batch")
        aggs = _agg_specs(named, self.key_fn.columns)
        stream = self.stream._then("aggregate", AggSpec(self.key_fn.columns, aggs, updates),
                                   uid=uid, parallelism=parallelism, partitioning=HASH,
                                   key_fn=self.key_fn)
        return stream

    def latest(self, by: Any, *, uid: str | None = None, parallelism: int | None = None,
               updates: Any = None) -> BatchStream:
        """Per key, the row with the largest ``by`` (a column, or columns compared in
        order, the later ones breaking ties; a null is smaller than any value): Flink's
        deduplication keeping the last row, Spark's ``max(struct(by..., ...))`` per key.
        An update stream of the input's rows, all its columns: a key's row whenever its
        best row changes; ``updates`` as for :meth:`agg` (by default once per key changed
        since the last checkpoint, at each checkpoint; ``"batch"``: per input batch).
        Each batch is cut to its best row per key with Arrow before the keyed state
        sees it (docs/columnar.md)."""
        updates = check_updates("latest", "checkpoint" if updates is None else updates,
                                "batch")
        order = _column_key("latest", by).columns
        keys = self.key_fn.columns
        both = sorted(set(order) & set(keys))
        if both:
            raise ValueError(f"latest(by=...) orders each key's rows by other columns: "
                             f"{', '.join(both)} {'is' if len(both) == 1 else 'are'} the key")
        return self.stream._then("latest", LatestSpec(keys, order, updates), uid=uid,
                                 parallelism=parallelism, partitioning=HASH,
                                 key_fn=self.key_fn)

    def window(self, assigner: WindowAssigner, *, allowed_lateness: Any = 0,
               on_late: str = "drop") -> "BatchWindowedStream":
        """Event-time windows per key, ``tumbling(size)``, ``sliding(size, slide)`` or
        ``session(gap)`` (sessions merge), fired by the watermark of the
        ``assign_timestamps(column)`` upstream; then ``agg(...)`` (or ``count()``,
        ``sum(col)``, ...).  Each window emits one row per key once, when the watermark
        reaches its end: ``(keys..., start, end, aggregates...)``, ``start`` / ``end`` in
        seconds.  ``allowed_lateness`` as for records: each row within it of a fired
        window updates it and emits its row again; later rows are dropped, or go to
        ``.late()`` of the result.  The output is the per-record window's, row for row.
        ``on_late="fail"`` fails the job on a late row instead of dropping (and counting)
        it, as for records."""
        if not isinstance(assigner, WindowAssigner):
            raise TypeError("window() takes tumbling(size), sliding(size, slide) or "
                            f"session(gap) (from cutline), got {assigner!r}")
        lateness = duration(allowed_lateness, "window(allowed_lateness=...)", positive=False)
        ts = self.stream.node.timestamp_fn
        if self.stream.node.timestamps_from is None or not isinstance(ts, ColumnTime):
            raise ValueError("window() needs event time: call .assign_timestamps(column, "
                             "max_delay=...) upstream (its watermarks fire the windows)")
        windowed = BatchWindowedStream(self, assigner, lateness, ts)
        windowed.on_late = _on_late(on_late)
        return windowed
