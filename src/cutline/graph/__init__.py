"""Process graphs: user processes on any directed graph of FIFO channels, run on Spark (or
threads), with Chandy-Lamport snapshots, global and stable predicates, and restore.

Read docs/process-graphs.md.  The pieces, in the order a message meets them:

* :mod:`.api`: :class:`Process`, :class:`Context`, :class:`ProcessGraph` (the user's words);
* :mod:`.host`: a group of processes in one task, a ``SnapshotHandler`` per process;
* :mod:`cutline.spark.graph`: the driver's snapshot service and the Spark launcher;
* :mod:`.snapshot`: a global snapshot, its storage layout; :mod:`.predicates`;
* :mod:`.result`, :mod:`.pictures`, :mod:`.cli` (``cutline run``).
"""

from .api import Context, Process, ProcessGraph
from .predicates import (
    Predicate,
    at_most_one,
    conserved,
    deadlocked,
    invariant,
    stable,
    terminated,
)
from .result import RunResult
from .snapshot import Check, GraphSnapshot, list_snapshots, load_snapshot

__all__ = [
    "Check", "Context", "GraphSnapshot", "Predicate", "Process", "ProcessGraph", "RunResult",
    "at_most_one", "conserved", "deadlocked", "invariant", "list_snapshots", "load_snapshot",
    "stable", "terminated",
]
