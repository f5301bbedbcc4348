"""The logical graph's vocabulary: a :class:`Node` per operator and how records reach it.

The user API (:mod:`cutline.api`) builds nodes, the planner (:mod:`cutline.plan`) chains
them, and the runtime's operators run them; this module sits below all three and imports
nothing else of cutline.  Users see :class:`Node` as ``cutline.api.Node``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FORWARD", "REBALANCE", "HASH", "BROADCAST", "Node"]

# Partitioning of an edge into an operator.
FORWARD, REBALANCE, HASH, BROADCAST = "forward", "rebalance", "hash", "broadcast"


@dataclass
class Node:
    """One logical operator."""

    id: int
    uid: str
    kind: str  # source | map | flat_map | filter | reduce | process | count | union |
    #            iterate | sink
    fn: Any = None
    parallelism: int | None = None
    inputs: list[int] = field(default_factory=list)
    partitioning: str = FORWARD  # how records reach this node from its inputs
    key_fn: Callable[[Any], Any] | None = None  # hash partitioning / keyed operators
    on_error: str = "fail"  # map / flat_map / filter: "fail" or "dead_letter"
    # an iteration head: feedback input node id -> (partitioning, key_fn) of the back edge
    feedback: dict[int, tuple[str, Any]] = field(default_factory=dict)
    dead_letter: Any = None  # the pipeline's dead-letter sink, when on_error="dead_letter"

    @property
    def keyed(self) -> bool:
        return self.kind in ("reduce", "process", "count")
