"""The operator registry: which runtime operator runs each :class:`~cutline.logical.Kind`.

:data:`OPERATORS` names, per kind, the module (under ``cutline.runtime``) and the class or
builder that runs it, imported when a node of that kind is first built: a batch stream's
operators import pyarrow, and the window and process operators build on the base classes
of :mod:`.operators`, so nothing here is imported before it is needed and no module of
operators imports another's factory.  A keyed kind's class is built with its subtask's
place and state backend, the others with the node alone; a builder (a function) takes the
node and a :class:`Build` and chooses.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from ..logical import AggSpec, CountSpec, Kind, Node
from ..protocol.windows import WindowSpec
from .operators import Operator

__all__ = ["Build", "OPERATORS", "build_operator"]

# kind -> "module:name" (module relative to cutline.runtime); a name starting with a lower
# case letter is a builder function(node, build), else an operator class
OPERATORS: dict[Kind, str] = {
    Kind.MAP: "operators:Map",
    Kind.FLAT_MAP: "operators:FlatMap",
    Kind.FILTER: "operators:Filter",
    Kind.UNION: "operators:Passthrough",
    Kind.ITERATE: "operators:Passthrough",
    Kind.ASSIGN_TIMESTAMPS: "registry:assign_timestamps",
    Kind.REDUCE: "operators:Reduce",
    Kind.PROCESS: "process:Process",
    Kind.COUNT: "operators:Count",
    Kind.WINDOW: "windows:WindowOperator",
    Kind.WINDOW_RESULTS: "windows:WindowResults",
    Kind.WINDOW_LATE: "windows:WindowLate",
    Kind.COMBINE: "registry:combine",
    Kind.OPERATOR: "registry:own_operator",
    Kind.MAP_BATCHES: "batches:MapBatches",
    Kind.FILTER_BATCHES: "batches:FilterBatches",
    Kind.SELECT: "batches:Select",
    Kind.WHERE: "batches:Where",
    Kind.WITH_COLUMN: "batches:WithColumn",
    Kind.TO_ROWS: "batches:ToRows",
    Kind.TO_BATCHES: "batches:ToBatches",
    Kind.AGGREGATE: "batches:BatchAggregate",
    Kind.WINDOW_AGG: "batch_windows:BatchWindowAggregate",
    Kind.LATEST: "batch_latest:BatchLatest",
}
# (sources and sinks are not operators: the task reads and writes them itself)
NOT_OPERATORS = frozenset({Kind.SOURCE, Kind.SINK})


@dataclass(frozen=True, slots=True)
class Build:
    """Where an operator runs: its subtask, the parallelism, the job's max parallelism (key
    groups), the state backend of keyed state ("memory" or "rocksdb") and the job's
    checkpoint storage (where a RocksDB backend fetches the shared files it restores)."""

    subtask: int
    parallelism: int
    max_parallelism: int
    state_backend: str = "memory"
    storage: Any = None


def _resolve(entry: str) -> Any:
    module, name = entry.split(":")
    return getattr(importlib.import_module(f"{__package__}.{module}"), name)


def build_operator(node: Node, subtask: int, parallelism: int, max_parallelism: int, *,
                   state_backend: str = "memory", storage: Any = None) -> Operator:
    """The operator of ``node`` for one subtask (:data:`OPERATORS`)."""
    entry = OPERATORS.get(node.kind)
    if entry is None:
        why = " (the task reads and writes it)" if node.kind in NOT_OPERATORS else ""
        raise ValueError(f"node {node.uid!r}: no operator runs kind {str(node.kind)!r}{why}")
    made = _resolve(entry)
    build = Build(subtask, parallelism, max_parallelism, state_backend, storage)
    if not isinstance(made, type):  # a builder
        op: Operator = made(node, build)
    elif node.kind.keyed:
        op = made(node, subtask, parallelism, max_parallelism, state_backend, storage)
    else:
        op = made(node)
    return op


# ------------------------------------------------------------------ builders


def assign_timestamps(node: Node, build: Build) -> Operator:
    """A batch stream's assigner reads a column; a record stream's calls ``ts_fn``."""
    if node.columnar:
        from .batch_windows import BatchAssignTimestamps

        return BatchAssignTimestamps(node)
    from .operators import AssignTimestamps

    return AssignTimestamps(node)


def combine(node: Node, build: Build) -> Operator:
    """The local half of a two-phase aggregation (the planner's): a count's or a tumbling
    window's per record, an aggregation's or a window's per record batch."""
    if isinstance(node.fn, CountSpec):
        from .operators import CountCombine

        return CountCombine(node)
    if isinstance(node.fn, AggSpec):
        from .batches import BatchCombine

        return BatchCombine(node)
    if isinstance(node.fn, WindowSpec):
        from .windows import WindowCombine

        return WindowCombine(node)
    from .batch_windows import BatchWindowCombine

    return BatchWindowCombine(node)


def own_operator(node: Node, build: Build) -> Operator:
    """``Kind.OPERATOR``: ``node.fn(node, subtask, parallelism, max_parallelism,
    state_backend=, storage=)`` builds it (tests; no user API)."""
    op: Operator = node.fn(node, build.subtask, build.parallelism, build.max_parallelism,
                           state_backend=build.state_backend, storage=build.storage)
    return op
