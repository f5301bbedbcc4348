"""The logical graph's vocabulary: a :class:`Node` per operator and how records reach it.

The user API (:mod:`cutline.api`) builds nodes, the planner (:mod:`cutline.plan`) chains
them, and the runtime's operators run them; this module sits below all three and imports
nothing else of cutline.  Users see :class:`Node` as ``cutline.api.Node``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["AGGREGATES", "AggSpec", "BatchFunction", "BatchWindowSpec", "FORWARD", "REBALANCE",
           "HASH", "BROADCAST", "ColumnKey", "ColumnTime", "Node", "TimestampSpec",
           "timestamp_fn_of"]

# Partitioning of an edge into an operator.
FORWARD, REBALANCE, HASH, BROADCAST = "forward", "rebalance", "hash", "broadcast"


@dataclass
class Node:
    """One logical operator."""

    id: int
    uid: str
    kind: str  # source | map | flat_map | filter | reduce | process | count | union |
    #            iterate | assign_timestamps | window | window_results | window_late |
    #            operator (tests: node.fn builds it) | sink
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

    @property
    def keyed(self) -> bool:
        return self.kind in ("reduce", "process", "count", "window", "aggregate", "window_agg")


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


@dataclass(frozen=True)
class AggSpec:
    """A keyed aggregation of a batch stream: the key columns and ``(output name, column,
    function)`` per aggregate (``count`` counts rows; its column is ``None``)."""

    keys: tuple[str, ...]
    aggs: tuple[tuple[str, str | None, str], ...]


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
