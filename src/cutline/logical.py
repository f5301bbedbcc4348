"""The logical graph's vocabulary: a :class:`Node` per operator and how records reach it.

The user API (:mod:`cutline.api`) builds nodes, the planner (:mod:`cutline.plan`) chains
them, and the runtime's operators run them; this module sits below all three and imports
nothing else of cutline.  Users see :class:`Node` as ``cutline.api.Node``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

__all__ = ["AGGREGATES", "AggSpec", "BatchFunction", "BatchWindowSpec", "CountSpec", "FORWARD",
           "REBALANCE", "HASH", "BROADCAST", "ColumnKey", "ColumnTime", "Kind", "Node", "kind_of",
           "Partial",
           "PartialKey", "TimestampSpec", "WindowPartial", "check_updates", "timestamp_fn_of",
           "update_interval"]

# Partitioning of an edge into an operator.
FORWARD, REBALANCE, HASH, BROADCAST = "forward", "rebalance", "hash", "broadcast"


class Kind(StrEnum):
    """What a logical operator does: the vocabulary of :attr:`Node.kind`.  A member equals
    its string (``Kind.MAP == "map"``).  Which runtime operator runs each kind is
    :data:`cutline.runtime.registry.OPERATORS`'s business; what each kind's ``Node.fn`` holds
    is said per member."""

    SOURCE = "source"  # fn: the Source
    MAP = "map"  # fn: record -> record
    FLAT_MAP = "flat_map"  # fn: record -> iterable of records
    FILTER = "filter"  # fn: record -> bool
    UNION = "union"  # fn: None (records pass through)
    ITERATE = "iterate"  # fn: None (an iteration head; Node.feedback: its back edges)
    ASSIGN_TIMESTAMPS = "assign_timestamps"  # fn: TimestampSpec
    REDUCE = "reduce"  # fn: (acc, record) -> acc, per key
    PROCESS = "process"  # fn: (ctx, record) -> records; keyed state, timers (on_timer)
    COUNT = "count"  # fn: CountSpec
    WINDOW = "window"  # fn: the window spec (runtime/windows.py)
    WINDOW_RESULTS = "window_results"  # fn: its window's spec (the results as records)
    WINDOW_LATE = "window_late"  # fn: its window's spec (the late records)
    COMBINE = "combine"  # fn: CountSpec / AggSpec / BatchWindowSpec: the planner's local
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
                    Kind.WINDOW_AGG})
_BATCH = frozenset({Kind.MAP_BATCHES, Kind.FILTER_BATCHES, Kind.SELECT, Kind.WHERE,
                    Kind.WITH_COLUMN, Kind.TO_ROWS, Kind.TO_BATCHES, Kind.AGGREGATE,
                    Kind.WINDOW_AGG})


@dataclass
class Node:
    """One logical operator."""

    id: int
    uid: str
    kind: Kind  # (a str naming a Kind is taken: it becomes the member)
    fn: Any = None
    parallelism: int | None = None
    inputs: list[int] = field(default_factory=list)
    partitioning: str = FORWARD  # how records reach this node from its inputs
    key_fn: Callable[[Any], Any] | None = None  # hash partitioning / keyed operators
    on_timer: Callable[..., Any] | None = None  # process: the timers' callback
    on_error: str = "fail"  # map / flat_map / filter: "fail" or "dead_letter"
    # an iteration head: feedback input node id -> (partitioning, key_fn) of the back edge
    feedback: dict[int, tuple[str, Any]] = field(default_factory=dict)
    dead_letter: Any = None  # the pipeline's dead-letter sink, when on_error="dead_letter"
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
        self.kind = kind_of(self.kind, self.uid)

    @property
    def keyed(self) -> bool:
        return self.kind.keyed


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
        a = self.assigner
        return (type(a).__name__ == "Sliding" and a.exact and a.slide < a.size
                and not self.allowed_lateness and (a.size / a.slide).is_integer())

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
