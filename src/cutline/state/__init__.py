"""State backends: keyed state by key group, snapshotted and restored per subtask.

* ``memory`` (:class:`~cutline.state.memory.MemoryStateBackend`): a dict per key group;
  the fastest, bounded by the task's memory; a checkpoint stores what changed since the
  last one (:mod:`cutline.state.changelog`), and a full snapshot now and then.
* ``rocksdb`` (:class:`~cutline.state.rocksdb.RocksDBStateBackend`): an embedded RocksDB on
  local disk behind a small write-back cache; state larger than memory, incremental
  checkpoints uploaded in the background.

Both hold entries ``(state name, key) -> value`` in key groups, and restore the key groups a
subtask owns from any number of snapshots of either kind.  Both implement
:class:`~cutline.state.backend.KeyedStateBackend`: operators use one table per state name
(a dict in front of the backend), the same on either.  Keys find their key group and
subtask with :mod:`cutline.state.keygroups`.

Timers (:mod:`cutline.state.timers`) and state with a time-to-live (:mod:`cutline.state.ttl`)
are entries of the same key groups, so they are checkpointed, restored and rescaled with the
rest of a key's state, on either backend.
"""

from __future__ import annotations

from typing import Any

from .backend import DeferredSnapshot, KeyedStateBackend, StateTable, ValueState

__all__ = ["STATE_BACKENDS", "DeferredSnapshot", "KeyedStateBackend", "StateTable",
           "ValueState", "create_backend", "read"]

STATE_BACKENDS = ("memory", "rocksdb")


def create_backend(kind: str, key_groups: range, max_parallelism: int, *,
                   name: str = "state", storage: Any = None) -> KeyedStateBackend:
    """The state backend ``kind`` for a keyed operator subtask owning ``key_groups``;
    ``name`` (``<operator uid>.<subtask>``) and ``storage`` (the job's checkpoint storage)
    name and hold the files of incremental snapshots (without storage, an in-memory
    backend's snapshots are whole)."""
    if kind == "memory":
        from .memory import MemoryStateBackend

        return MemoryStateBackend(key_groups, max_parallelism, name=name, storage=storage)
    if kind == "rocksdb":
        from .rocksdb import RocksDBStateBackend

        return RocksDBStateBackend(key_groups, max_parallelism, name=name, storage=storage)
    raise ValueError(f"state backend must be one of {', '.join(STATE_BACKENDS)}, got {kind!r}")


def read(spark: Any, path: str, operator_uid: str) -> Any:
    """The keyed state of ``operator_uid`` in the checkpoint/savepoint at ``path`` as a Spark
    DataFrame: one row per key (``key``, ``key_group``, a column per state name); a window
    operator's: one row per key and window (``key``, ``start``, ``end``, ``accumulator``,
    ``fired``)."""
    from ..spark.state_reader import read as _read

    return _read(spark, path, operator_uid)
