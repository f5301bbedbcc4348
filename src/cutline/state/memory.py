"""In-memory keyed state, organised by key group so it can move between subtasks.

Behind the tables' ``fast`` dicts (:mod:`cutline.state.backend`) the state is
``{key group: {(state name, key): value}}``, which is also the snapshot (pickled): a hot
key costs one dict lookup and one store per record, and its key group is looked up once
per spill, not per record.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Iterator
from typing import Any

from .backend import KeyedStateBackend, StateTable

__all__ = ["MemoryStateBackend"]


class MemoryStateBackend(KeyedStateBackend):
    """State of one keyed operator subtask: ``{key group: {(state name, key): value}}``
    behind one ``fast`` dict per state name.

    ``dirty_entries`` bounds what the ``fast`` dicts hold before they are merged into the
    key-group dicts (a snapshot merges what they hold in its synchronous part).
    """

    def __init__(self, key_groups: range, max_parallelism: int, *,
                 dirty_entries: int = 100_000) -> None:
        super().__init__(key_groups, max_parallelism, dirty_entries)
        self._groups: dict[int, dict[tuple[str, Any], Any]] = {}
        self._group_of: dict[Any, int] = {}  # recent keys' key groups: hashed once
        self._group_max = 2 * dirty_entries + 1024

    def _new_table(self, name: str) -> StateTable:
        return _MemoryTable(self, name)

    def _group(self, key: Any) -> int:
        """``key``'s key group, remembered (an error if this subtask does not own it)."""
        cache = self._group_of
        g = cache.get(key)
        if g is None:
            g = self.owned_group(key)
            if len(cache) >= self._group_max:
                cache.clear()
            cache[key] = g
        return g

    def _write(self, tables: list[StateTable]) -> None:
        groups, cache, group = self._groups, self._group_of, self._group
        for t in tables:
            name, fast = t.name, t.fast
            for k in t.deleted:
                if k not in fast:
                    g = cache.get(k)
                    table = groups.get(group(k) if g is None else g)
                    if table:
                        table.pop((name, k), None)
            for k, v in fast.items():
                g = cache.get(k)
                if g is None:
                    g = group(k)
                table = groups.get(g)
                if table is None:
                    table = groups[g] = {}
                table[(name, k)] = v
        cache.clear()  # what the next spill writes will be read (and cached) anew

    def keys(self) -> int:
        self.spill()
        return sum(len(t) for t in self._groups.values())

    def entries(self) -> Iterator[tuple[int, str, Any, Any]]:
        self.spill()
        for g, table in self._groups.items():
            for (name, key), value in table.items():
                yield g, name, key, value

    def snapshot(self) -> bytes:
        """All state as bytes, by key group (user objects are pickled)."""
        self.spill()
        return pickle.dumps({g: t for g, t in self._groups.items() if t}, protocol=5)

    def restore(self, blobs: Iterable[bytes]) -> None:
        """Load the key groups this subtask owns from any number of snapshots (rescaling),
        in-memory ones or RocksDB ones (a job may switch backends)."""
        self._reset()
        self._group_of.clear()
        for blob in blobs:
            if _is_rocksdb(blob):
                from .rocksdb import read_entries

                for g, slot, value in read_entries(blob, self.key_groups):
                    self._groups.setdefault(g, {})[slot] = value
                continue
            for g, table in pickle.loads(blob).items():
                if g in self.key_groups:
                    self._groups.setdefault(g, {}).update(table)

    def close(self) -> None:
        pass


class _MemoryTable(StateTable):
    __slots__ = ("_backend",)

    def __init__(self, backend: MemoryStateBackend, name: str) -> None:
        super().__init__(name)
        self._backend = backend

    def read(self, key: Any, default: Any = None) -> Any:
        if self.deleted and key in self.deleted:
            return default
        b = self._backend
        g = b._group_of.get(key)
        table = b._groups.get(b._group(key) if g is None else g)
        return default if table is None else table.get((self.name, key), default)


def _is_rocksdb(blob: bytes) -> bool:
    return bytes(blob[:16]) == b"cutline-rocksdb\x00"


def iter_memory_entries(blobs: Iterable[bytes]) -> Iterable[tuple[int, tuple[str, Any], Any]]:
    """``(key group, (state name, key), value)`` of in-memory snapshots."""
    for blob in blobs:
        for g, table in pickle.loads(blob).items():
            for slot, value in table.items():
                yield g, slot, value
