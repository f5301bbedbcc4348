"""The logical graph's vocabulary: a :class:`Node` per operator and how records reach it.

Each :class:`Kind` of operator has its node class (:data:`NODE_CLASSES`: ``MapNode``,
``WindowNode``, ...), whose ``fn`` is typed for what that kind runs and checked when the node
is made; :func:`make_node` builds one by kind.  The user API (:mod:`cutline.api`) builds
nodes, the planner (:mod:`cutline.plan`) chains them, and the runtime's operators run them;
this module sits below all three and imports nothing else of cutline but the window spec
(:mod:`cutline.protocol.windows`).  Users see :class:`Node` as ``cutline.api.Node``.
"""

from __future__ import annotations

import reprlib
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar, Protocol, runtime_checkable

from .protocol.windows import WindowSpec, sliceable

__all__ = ["AGGREGATES", "AggSpec", "BatchFunction", "BatchWindowSpec", "CountSpec", "FORWARD",
           "LatestSpec",
           "REBALANCE", "HASH", "BROADCAST", "ColumnKey", "ColumnTime", "Kind", "Node", "kind_of",
           "Partial",
           "PartialKey", "TimestampSpec", "WindowPartial", "check_updates", "timestamp_fn_of",
           "update_interval",
           # a node class per kind
           "NODE_CLASSES", "ON_ERROR", "make_node", "node_class", "Readable", "Writable",
           "FallibleNode", "AggregateNode", "AssignTimestampsNode", "CombineNode", "CountNode",
           "FilterBatchesNode", "FilterNode", "FlatMapNode", "IterateNode", "LatestNode",
           "MapBatchesNode",
           "MapNode", "OperatorNode", "ProcessNode", "ReduceNode", "SelectNode", "SinkNode",
           "SourceNode", "ToBatchesNode", "ToRowsNode", "UnionNode", "WhereNode",
           "WindowAggNode", "WindowLateNode", "WindowNode", "WindowResultsNode",
           "WithColumnNode"]

# Partitioning of an edge into an operator.
FORWARD, REBALANCE, HASH, BROADCAST = "forward", "rebalance", "hash", "broadcast"


class Kind(StrEnum):
    """What a logical operator does: the vocabulary of :attr:`Node.kind`.  A member equals
    its string (``Kind.MAP == "map"``).  Each has its node class (:data:`NODE_CLASSES`),
    whose ``fn`` holds what is said per member (and is checked: ``payload`` / ``takes``);
    which runtime operator runs each kind is
    :data:`cutline.runtime.registry.OPERATORS`'s business."""

    SOURCE = "source"  # fn: the Source
    MAP = "map"  # fn: record -> record
    FLAT_MAP = "flat_map"  # fn: record -> iterable of records
    FILTER = "filter"  # fn: record -> bool
    UNION = "union"  # fn: None (records pass through)
    ITERATE = "iterate"  # fn: None (an iteration head; IterateNode.feedback: its back edges)
    ASSIGN_TIMESTAMPS = "assign_timestamps"  # fn: TimestampSpec
    REDUCE = "reduce"  # fn: (acc, record) -> acc, per key
    PROCESS = "process"  # fn: (ctx, record) -> records; keyed state, timers (ProcessNode.on_timer)
    COUNT = "count"  # fn: CountSpec
    WINDOW = "window"  # fn: the WindowSpec (protocol/windows.py)
    WINDOW_RESULTS = "window_results"  # fn: its window's spec (the results as records)
    WINDOW_LATE = "window_late"  # fn: its window's spec (the late records)
    COMBINE = "combine"  # fn: Count/Agg/Window/BatchWindowSpec: the planner's local
    #                      half of a two-phase aggregation (:func:`cutline.plan.plan`)
    SINK = "sink"  # fn: the Sink
    OPERATOR = "operator"  # fn: builds an operator of its own (tests; no user API)
    # a batch stream's (record batches of Arrow; runtime/batches.py)
    MAP_BATCHES = "map_batches"  # fn: BatchFunction
    FILTER_BATCHES = "filter_batches"  # fn: BatchFunction
    SELECT = "select"  # fn: column names
    WHERE = "where"  # fn: a pyarrow expression
    WITH_COLUMN = "with_column"  # fn: (name, expression)
    TO_ROWS = "to_rows"  # fn: None
    TO_BATCHES = "to_batches"  # fn: the schema
    AGGREGATE = "aggregate"  # fn: AggSpec
    WINDOW_AGG = "window_agg"  # fn: BatchWindowSpec
    LATEST = "latest"  # fn: LatestSpec

    @property
    def keyed(self) -> bool:
        """It keeps keyed state: its input is partitioned by key, its state by key group."""
        return self in _KEYED

    @property
    def batch(self) -> bool:
        """It runs on a batch stream (its input items are Arrow record batches)."""
        return self in _BATCH


def kind_of(kind: Kind | str, uid: str | None = None) -> Kind:
    """``kind`` as a :class:`Kind`; an unknown one raises naming it, the node and the known
    kinds."""
    if isinstance(kind, Kind):
        return kind
    try:
        return Kind(kind)
    except ValueError:
        raise ValueError(f"node {uid!r}: unknown kind {kind!r} (one of "
                         f"{', '.join(k.value for k in Kind)})") from None


_KEYED = frozenset({Kind.REDUCE, Kind.PROCESS, Kind.COUNT, Kind.WINDOW, Kind.AGGREGATE,
                    Kind.WINDOW_AGG, Kind.LATEST})
_BATCH = frozenset({Kind.MAP_BATCHES, Kind.FILTER_BATCHES, Kind.SELECT, Kind.WHERE,
                    Kind.WITH_COLUMN, Kind.TO_ROWS, Kind.TO_BATCHES, Kind.AGGREGATE,
                    Kind.WINDOW_AGG, Kind.LATEST})


@dataclass
class Node:
    """One logical operator: a vertex of the logical graph.  Every kind has its own subclass
    (:data:`NODE_CLASSES`), whose ``kind`` is a class attribute and whose ``fn`` (what the
    operator runs) is typed for that kind and checked when the node is made: a payload of
    another type raises naming the node, its kind and what it needs.  Build one with
    :func:`make_node` (by kind) or its class.  The fields only one kind uses are that kind's:
    ``on_error`` / ``dead_letter`` (:class:`FallibleNode`), ``on_timer``
    (:class:`ProcessNode`), ``feedback`` (:class:`IterateNode`)."""

    kind: ClassVar[Kind]  # each subclass's own
    payload: ClassVar[str] = "None"  # what ``fn`` holds, as an error message says it
    takes: ClassVar[tuple[Any, ...]] = (type(None),)  # ``fn``'s types (isinstance)

    id: int
    uid: str
    fn: Any = None
    parallelism: int | None = None
    inputs: list[int] = field(default_factory=list)
    partitioning: str = FORWARD  # how records reach this node from its inputs
    key_fn: Callable[[Any], Any] | None = None  # hash partitioning / keyed operators
    # Event time: the ``ts_fn`` of the nearest upstream ``assign_timestamps`` (its own for
    # an assigner), filled in when the node is added (:func:`timestamp_fn_of`); ``None``
    # when no assigner is upstream, or the inputs' assigners differ.
    timestamp_fn: Callable[[Any], Any] | None = None
    # the uid of that assigner (or, when inputs' assigners differ, "" : ambiguous)
    timestamps_from: str | None = None
    # a batch stream's operator: its output items are Arrow record batches
    columnar: bool = False
    # ``uid`` is the default one, ``{kind}-{position}``: a restore checks that the operator
    # at that position is the one whose state the checkpoint holds (runtime/restore.py)
    auto_uid: bool = False

    def __post_init__(self) -> None:
        if getattr(type(self), "kind", None) is None:
            raise TypeError(f"node {self.uid!r}: {type(self).__name__} is no kind's node: "
                            f"make_node(id, uid, kind, fn) or a kind's class "
                            f"({', '.join(c.__name__ for c in NODE_CLASSES.values())})")
        if not self.accepts(self.fn):
            raise TypeError(f"node {self.uid!r} ({self.kind}): fn must be {self.payload}, "
                            f"got {_shown(self.fn)}")

    @classmethod
    def accepts(cls, fn: Any) -> bool:
        """``fn`` is a payload of this kind: one of :attr:`takes`."""
        return isinstance(fn, cls.takes)

    @property
    def keyed(self) -> bool:
        return self.kind.keyed


def _shown(value: Any) -> str:
    """A payload as an error message names it: its type and a short repr."""
    return "None" if value is None else f"{type(value).__name__} {reprlib.repr(value)}"


class ColumnKey:
    """``key_by("col")`` / ``key_by(["a", "b"])``: a record's key is its column's value
    (``record["col"]``), or the tuple of its columns' values.  On a batch stream the rows
    of a record batch are routed by these columns vectorised
    (:mod:`cutline.state.arrow_keys`), to the key groups this function gives per record."""

    __slots__ = ("columns",)

    def __init__(self, columns: tuple[str, ...]) -> None:
        self.columns = columns

    def __call__(self, record: Any) -> Any:
        cols = self.columns
        if len(cols) == 1:
            return record[cols[0]]
        return tuple(record[c] for c in cols)

    def __getstate__(self) -> tuple[str, ...]:
        return self.columns

    def __setstate__(self, state: tuple[str, ...]) -> None:
        self.columns = state

    def __repr__(self) -> str:
        return f"ColumnKey({list(self.columns)!r})"


class ColumnTime:
    """``assign_timestamps("col")`` on a batch stream: event time is the column ``col``
    (seconds as numbers, or an Arrow timestamp), plus ``shift`` seconds (the rows of a batch
    stream's windows: ``end`` less 1 µs, their window's last instant).  Called on a dict
    record (after ``rows()``) it reads ``record["col"]``, so per-record timed operators
    downstream read the same time."""

    __slots__ = ("column", "shift")

    def __init__(self, column: str, shift: float = 0.0) -> None:
        self.column, self.shift = column, shift

    def __call__(self, record: Any) -> Any:
        t = record[self.column]
        return t + self.shift if self.shift else t

    def __getstate__(self) -> tuple:
        return (self.column, self.shift)

    def __setstate__(self, state: Any) -> None:
        self.column, self.shift = (state, 0.0) if isinstance(state, str) else state

    def __repr__(self) -> str:
        return f"ColumnTime({self.column!r}{f', shift={self.shift!r}' if self.shift else ''})"


@dataclass(frozen=True)
class BatchFunction:
    """``map_batches`` / ``filter_batches``: the user's function and the format it takes."""

    fn: Callable[[Any], Any]
    batch_format: str = "arrow"


AGGREGATES = ("count", "sum", "min", "max", "mean")

# How often a keyed aggregation's update stream emits (``updates=``): at every checkpoint
# (and the end of input), every N seconds (a number; and at every checkpoint), or for every
# input record (``count()``) / input batch (``agg()``) as it comes.
UPDATES_EACH = ("record", "batch")


def check_updates(what: str, updates: Any, each: str) -> Any:
    """``updates=`` of a keyed aggregation: ``"checkpoint"``, a number of seconds > 0, or
    ``each`` (``"record"`` / ``"batch"``); anything else raises naming ``what``."""
    if updates == "checkpoint" or updates == each:
        return updates
    if isinstance(updates, (int, float)) and not isinstance(updates, bool) \
            and 0 < updates < float("inf"):
        return float(updates)
    raise ValueError(f"{what}(updates=...) is 'checkpoint' (one row per changed key at each "
                     f"checkpoint), a number of seconds > 0 (every that often, and at each "
                     f"checkpoint) or {each!r} (one row per key per input {each}), got "
                     f"{updates!r}")


def update_interval(updates: Any) -> float | None:
    """The seconds between a time-sized update stream's emissions (``None``: at checkpoints
    only, or per input)."""
    return updates if isinstance(updates, float) else None


@dataclass(frozen=True)
class AggSpec:
    """A keyed aggregation of a batch stream: the key columns and ``(output name, column,
    function)`` per aggregate (``count`` counts rows; its column is ``None``).

    ``updates``: when the update stream emits (:func:`check_updates`).  ``partial``: the
    planner put a ``combine`` before the exchange (two-phase aggregation), so the input
    holds partial aggregates per key (and, from an older checkpoint's channels, rows)."""

    keys: tuple[str, ...]
    aggs: tuple[tuple[str, str | None, str], ...]
    updates: Any = "checkpoint"
    partial: bool = False


@dataclass(frozen=True)
class LatestSpec:
    """``key_by(cols).latest(by)`` on a batch stream: the key columns, the columns ``by``
    whose values order a key's rows (compared in order, the later ones breaking ties; a
    null is smaller than any value), and when its update stream emits
    (:func:`check_updates`)."""

    keys: tuple[str, ...]
    by: tuple[str, ...]
    updates: Any = "checkpoint"


@dataclass(frozen=True)
class CountSpec:
    """``KeyedStream.count(updates=...)``: when its update stream emits; ``partial``: the
    planner put a ``combine`` before the exchange (its input holds :class:`Partial` counts,
    and, from an older checkpoint's channels, records)."""

    updates: Any = "record"
    partial: bool = False


class Partial:
    """A key's partial aggregate on its way from a ``combine`` to the keyed aggregation
    after the exchange (the per-record path's two-phase aggregation): ``key`` and
    ``value`` (a count)."""

    __slots__ = ("key", "value")

    def __init__(self, key: Any, value: Any) -> None:
        self.key, self.value = key, value

    def __eq__(self, other: object) -> bool:
        return type(other) is Partial and (other.key, other.value) == (self.key, self.value)

    def __hash__(self) -> int:
        return hash(("partial", self.key, self.value))

    def __repr__(self) -> str:
        return f"Partial({self.key!r}, {self.value!r})"

    def __reduce__(self) -> tuple:
        return (Partial, (self.key, self.value))


class WindowPartial:
    """A key's partial aggregate of one tumbling window on its way from a ``combine`` to
    the window operator after the exchange (the per-record path's two-phase window
    aggregation): ``key``, the window ``[start, end)``, the accumulator ``acc`` of ``n``
    records, and ``ts``, the latest of their times (a late partial's drop reports it)."""

    __slots__ = ("key", "start", "end", "acc", "n", "ts")

    def __init__(self, key: Any, start: Any, end: Any, acc: Any, n: int, ts: float) -> None:
        self.key, self.start, self.end, self.acc, self.n, self.ts = key, start, end, acc, n, ts

    def __eq__(self, other: object) -> bool:
        return type(other) is WindowPartial and self.__reduce__() == other.__reduce__()

    def __hash__(self) -> int:
        return hash(("window-partial", self.key, self.start, self.end))

    def __repr__(self) -> str:
        return (f"WindowPartial({self.key!r}, [{self.start!r}, {self.end!r}), acc={self.acc!r}, "
                f"n={self.n})")

    def __reduce__(self) -> tuple:
        return (WindowPartial, (self.key, self.start, self.end, self.acc, self.n, self.ts))


class PartialKey:
    """The key function of an exchange after a ``combine``: a :class:`Partial`'s or
    :class:`WindowPartial`'s key, else (a record the combine sent on as it was, or one
    from an older checkpoint's channels) the user's key function's."""

    __slots__ = ("key_fn",)

    def __init__(self, key_fn: Callable[[Any], Any]) -> None:
        self.key_fn = key_fn

    def __call__(self, record: Any) -> Any:
        t = type(record)
        return record.key if t is Partial or t is WindowPartial else self.key_fn(record)

    def __getstate__(self) -> Any:
        return self.key_fn

    def __setstate__(self, state: Any) -> None:
        self.key_fn = state


@dataclass
class BatchWindowSpec:
    """``key_by(cols).window(assigner).agg(...)`` on a batch stream: the key columns, the
    named aggregates (as :class:`AggSpec`), the windows, the event-time column and
    ``allowed_lateness``; ``aggregate`` is what the window operator merges per key and
    window (``cutline.protocol.windows.columns(aggs)``).  The attributes the per-record
    window operator reads (``assigner``, ``allowed_lateness``, ``ts_fn``, ``aggregate``,
    ``emit_late``, ``on_late``) have its meaning."""

    keys: tuple[str, ...]
    aggs: tuple[tuple[str, str | None, str], ...]
    assigner: Any
    allowed_lateness: float
    ts_column: str
    aggregate: Any
    emit_late: bool = False
    ts_shift: float = 0.0
    on_late: str = "drop"
    # the planner put a ``combine`` before the exchange: the input holds partial aggregates
    # per key and window (and rows the combine did not pre-aggregate)
    partial: bool = False

    @property
    def ts_fn(self) -> ColumnTime:
        return ColumnTime(self.ts_column, self.ts_shift)

    @property
    def panes(self) -> bool:
        """Sliding windows kept as panes (slices of one slide; a window is the merge of the
        ``size / slide`` panes it covers, as Flink SQL slices hopping windows): exact
        sliding windows whose size is a whole number of slides, without allowed lateness."""
        return sliceable(self.assigner, self.allowed_lateness)

    def state_signature(self) -> str:
        """A restore into other windows or aggregates is refused (panes too: their state
        holds panes, not windows)."""
        panes = ".panes" if self.panes else ""
        return f"{self.assigner.signature()}.{self.aggregate.name}{panes}"


@dataclass
class TimestampSpec:
    """What an ``assign_timestamps`` node runs (its ``Node.fn``): the user's ``ts_fn``, the
    watermark generator (a prototype, copied per subtask), ``idle_timeout`` seconds
    (``None``: never idle), and ``max_drift`` seconds (``None``: the source's subtasks are
    not aligned with each other; else a subtask pauses while its watermark is further
    than that ahead of the slowest's)."""

    ts_fn: Callable[[Any], Any]
    generator: Any
    idle_timeout: float | None = None
    max_drift: float | None = None


def timestamp_fn_of(inputs: list[Node]) -> tuple[Callable[[Any], Any] | None, str | None]:
    """``(ts_fn, assigner uid)`` of the nearest upstream ``assign_timestamps`` of a node with
    ``inputs``: the same for every input that has one; ``(None, "")`` when inputs reach
    different assigners, ``(None, None)`` when none does."""
    found = {(n.timestamps_from, id(n.timestamp_fn)): n for n in inputs
             if n.timestamps_from is not None}
    if not found:
        return None, None
    if len(found) > 1:
        return None, ""
    n = next(iter(found.values()))
    return n.timestamp_fn, n.timestamps_from



# ------------------------------------------------------------------ a node class per kind
#
# Each class's ``fn`` is what its kind's operator runs (``payload`` says it in words,
# ``takes`` by type); ``None`` where the kind runs nothing of the user's.


@runtime_checkable
class Readable(Protocol):
    """What a ``source`` node reads (a ``cutline.connectors.base.Source``)."""

    def create_reader(self) -> Any: ...


@runtime_checkable
class Writable(Protocol):
    """What a ``sink`` node writes to (a ``cutline.connectors.base.Sink``)."""

    def create_writer(self) -> Any: ...


ON_ERROR = ("fail", "dead_letter")
_FUNCTION: tuple[Any, ...] = (Callable,)  # (collections.abc.Callable: isinstance tells)


@dataclass
class SourceNode(Node):
    kind = Kind.SOURCE
    payload = "a source (with create_reader())"
    takes = (Readable,)
    fn: Readable


@dataclass
class SinkNode(Node):
    kind = Kind.SINK
    payload = "a sink (with create_writer())"
    takes = (Writable,)
    fn: Writable


@dataclass
class FallibleNode(Node):
    """A node whose user function runs per record and may raise on one: ``on_error`` says
    what happens then: ``"fail"`` the job, or ``"dead_letter"``: the record goes to the
    pipeline's dead-letter sink (``dead_letter``, set when the pipeline is validated).  The
    base of :class:`MapNode`, :class:`FlatMapNode`, :class:`FilterNode` and
    :class:`AssignTimestampsNode`; no kind's class itself."""

    on_error: str = field(default="fail", kw_only=True)
    dead_letter: Any = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.on_error not in ON_ERROR:
            raise ValueError(f"node {self.uid!r} ({self.kind}): on_error must be 'fail' or "
                             f"'dead_letter', got {self.on_error!r}")


@dataclass
class MapNode(FallibleNode):
    kind = Kind.MAP
    payload = "a function record -> record"
    takes = _FUNCTION
    fn: Callable[[Any], Any]


@dataclass
class FlatMapNode(FallibleNode):
    kind = Kind.FLAT_MAP
    payload = "a function record -> iterable of records"
    takes = _FUNCTION
    fn: Callable[[Any], Any]


@dataclass
class FilterNode(FallibleNode):
    kind = Kind.FILTER
    payload = "a function record -> bool"
    takes = _FUNCTION
    fn: Callable[[Any], Any]


@dataclass
class AssignTimestampsNode(FallibleNode):
    kind = Kind.ASSIGN_TIMESTAMPS
    payload = "a TimestampSpec"
    takes = (TimestampSpec,)
    fn: TimestampSpec


@dataclass
class UnionNode(Node):
    kind = Kind.UNION  # (records pass through)


@dataclass
class IterateNode(Node):
    """An iteration's head: records pass through; ``feedback``: its back edges, by the
    feedback input's node id: ``(partitioning, key_fn)``."""

    kind = Kind.ITERATE
    feedback: dict[int, tuple[str, Any]] = field(default_factory=dict, kw_only=True)


@dataclass
class ReduceNode(Node):
    kind = Kind.REDUCE
    payload = "a function (acc, record) -> acc"
    takes = _FUNCTION
    fn: Callable[[Any, Any], Any]


@dataclass
class ProcessNode(Node):
    """``process(fn, on_timer=...)``: ``fn(ctx, record)`` with keyed state; ``on_timer(ctx,
    key, when)`` when a timer fires."""

    kind = Kind.PROCESS
    payload = "a function (ctx, record) -> records"
    takes = _FUNCTION
    fn: Callable[[Any, Any], Any]
    on_timer: Callable[..., Any] | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.on_timer is not None and not callable(self.on_timer):
            raise TypeError(f"node {self.uid!r} ({self.kind}): on_timer must be a function "
                            f"(ctx, key, when) or None, got {_shown(self.on_timer)}")


@dataclass
class CountNode(Node):
    kind = Kind.COUNT
    payload = "a CountSpec (None: CountSpec(), an update per record)"
    takes = (CountSpec,)
    fn: CountSpec = field(default_factory=CountSpec)

    def __post_init__(self) -> None:
        if self.fn is None:
            self.fn = CountSpec()
        super().__post_init__()


@dataclass
class WindowNode(Node):
    kind = Kind.WINDOW
    payload = "a WindowSpec"
    takes = (WindowSpec,)
    fn: WindowSpec


@dataclass
class WindowResultsNode(Node):
    """A window's results as records: ``fn`` is its window's spec."""

    kind = Kind.WINDOW_RESULTS
    payload = "its window's WindowSpec or BatchWindowSpec"
    takes = (WindowSpec, BatchWindowSpec)
    fn: WindowSpec | BatchWindowSpec


@dataclass
class WindowLateNode(Node):
    """A window's late records: ``fn`` is its window's spec."""

    kind = Kind.WINDOW_LATE
    payload = "its window's WindowSpec or BatchWindowSpec"
    takes = (WindowSpec, BatchWindowSpec)
    fn: WindowSpec | BatchWindowSpec


@dataclass
class CombineNode(Node):
    """The planner's local half of a two-phase aggregation (:func:`cutline.plan.plan`):
    ``fn`` is the spec of the aggregation after the exchange."""

    kind = Kind.COMBINE
    payload = "a CountSpec, AggSpec, WindowSpec or BatchWindowSpec"
    takes = (CountSpec, AggSpec, WindowSpec, BatchWindowSpec)
    fn: CountSpec | AggSpec | WindowSpec | BatchWindowSpec


@dataclass
class OperatorNode(Node):
    """An operator of its own (tests; no user API): ``fn(node, subtask, parallelism,
    max_parallelism, state_backend=, storage=)`` builds it."""

    kind = Kind.OPERATOR
    payload = "a function building the operator"
    takes = _FUNCTION
    fn: Callable[..., Any]


@dataclass
class MapBatchesNode(Node):
    kind = Kind.MAP_BATCHES
    payload = "a BatchFunction"
    takes = (BatchFunction,)
    fn: BatchFunction


@dataclass
class FilterBatchesNode(Node):
    kind = Kind.FILTER_BATCHES
    payload = "a BatchFunction"
    takes = (BatchFunction,)
    fn: BatchFunction


@dataclass
class SelectNode(Node):
    kind = Kind.SELECT
    payload = "a list of column names"
    fn: list[str]

    @classmethod
    def accepts(cls, fn: Any) -> bool:
        return isinstance(fn, list) and bool(fn) and all(isinstance(c, str) for c in fn)


def _expression(value: Any) -> bool:
    """``value`` is a ``pyarrow.compute.Expression`` (pyarrow imported only to tell)."""
    import pyarrow.compute as pc

    return isinstance(value, pc.Expression)


@dataclass
class WhereNode(Node):
    kind = Kind.WHERE
    payload = "a pyarrow.compute expression"
    fn: Any  # a pyarrow.compute.Expression

    @classmethod
    def accepts(cls, fn: Any) -> bool:
        return _expression(fn)


@dataclass
class WithColumnNode(Node):
    kind = Kind.WITH_COLUMN
    payload = ("(name, expression): a column name and a pyarrow.compute expression or a "
               "function of the batch")
    fn: tuple[str, Any]

    @classmethod
    def accepts(cls, fn: Any) -> bool:
        return (isinstance(fn, tuple) and len(fn) == 2 and isinstance(fn[0], str)
                and bool(fn[0]) and (callable(fn[1]) or _expression(fn[1])))


@dataclass
class ToRowsNode(Node):
    kind = Kind.TO_ROWS


@dataclass
class ToBatchesNode(Node):
    kind = Kind.TO_BATCHES
    payload = "a pyarrow.Schema or None (inferred)"
    fn: Any = None  # a pyarrow.Schema

    @classmethod
    def accepts(cls, fn: Any) -> bool:
        if fn is None:
            return True
        import pyarrow as pa

        return isinstance(fn, pa.Schema)


@dataclass
class AggregateNode(Node):
    kind = Kind.AGGREGATE
    payload = "an AggSpec"
    takes = (AggSpec,)
    fn: AggSpec


@dataclass
class LatestNode(Node):
    kind = Kind.LATEST
    payload = "a LatestSpec"
    takes = (LatestSpec,)
    fn: LatestSpec


@dataclass
class WindowAggNode(Node):
    kind = Kind.WINDOW_AGG
    payload = "a BatchWindowSpec"
    takes = (BatchWindowSpec,)
    fn: BatchWindowSpec


NODE_CLASSES: dict[Kind, type[Node]] = {c.kind: c for c in (
    SourceNode, MapNode, FlatMapNode, FilterNode, UnionNode, IterateNode,
    AssignTimestampsNode, ReduceNode, ProcessNode, CountNode, WindowNode, WindowResultsNode,
    WindowLateNode, CombineNode, SinkNode, OperatorNode, MapBatchesNode, FilterBatchesNode,
    SelectNode, WhereNode, WithColumnNode, ToRowsNode, ToBatchesNode, AggregateNode,
    WindowAggNode, LatestNode)}
"""The node class of each :class:`Kind`."""


def node_class(kind: Kind | str, uid: str | None = None) -> type[Node]:
    """The node class of ``kind`` (:data:`NODE_CLASSES`); an unknown kind raises naming it,
    the node and the known kinds."""
    return NODE_CLASSES[kind_of(kind, uid)]


def make_node(id: int, uid: str, kind: Kind | str, fn: Any = None, *args: Any,
              **fields: Any) -> Node:
    """A node of ``kind`` (a :class:`Kind` or its string): its class
    (:data:`NODE_CLASSES`) with ``id``, ``uid``, ``fn`` and the other fields in
    :class:`Node`'s order, or by name (a kind's own too: ``on_timer=`` of a ``process``).
    A field another kind's (``on_timer`` of a ``map``) raises naming the node."""
    cls = node_class(kind, uid)
    try:
        return cls(id, uid, fn, *args, **fields)
    except TypeError as exc:
        if "unexpected keyword argument" not in str(exc):
            raise
        names = {f for c in cls.__mro__ for f in getattr(c, "__dataclass_fields__", ())}
        wrong = sorted(set(fields) - names)
        raise TypeError(f"node {uid!r} ({cls.kind}): a {cls.kind} node has no "
                        f"{', '.join(wrong)} (its fields: {', '.join(sorted(names))})"
                        ) from None
