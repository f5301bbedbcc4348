"""In-memory keyed state, organised by key group so it can move between subtasks."""

from __future__ import annotations

import pickle
from collections.abc import Iterable
from typing import Any

from ..plan import key_group

__all__ = ["MemoryStateBackend", "ValueState"]

_MISSING = object()


class MemoryStateBackend:
    """State of one keyed operator subtask: ``{key group: {(state name, key): value}}``."""

    complete_tables = True  # table(key) holds all of the key's state: no load() needed

    def __init__(self, key_groups: range, max_parallelism: int) -> None:
        self.key_groups = key_groups
        self.max_parallelism = max_parallelism
        self._groups: dict[int, dict[tuple[str, Any], Any]] = {}
        self._recent: dict[Any, dict] = {}  # key -> its group's table: skips re-hashing

    def table(self, key: Any) -> dict:
        """The key-group table that holds ``key``'s state (recent keys cached)."""
        cache = self._recent
        try:
            return cache[key]
        except KeyError:
            pass
        except TypeError:  # unhashable key
            return self._table(key)
        if len(cache) >= 65_536:
            cache.clear()
        t = cache[key] = self._table(key)
        return t

    def _table(self, key: Any) -> dict:
        g = key_group(key, self.max_parallelism)
        table = self._groups.get(g)
        if table is None:
            if g not in self.key_groups:
                raise RuntimeError(f"key {key!r} (key group {g}) is not owned by this subtask "
                                   f"(groups {self.key_groups.start}..{self.key_groups.stop - 1})")
            table = self._groups[g] = {}
        return table

    def get(self, name: str, key: Any, default: Any = None) -> Any:
        return self._table(key).get((name, key), default)

    def put(self, name: str, key: Any, value: Any) -> None:
        self._table(key)[(name, key)] = value

    def delete(self, name: str, key: Any) -> None:
        self._table(key).pop((name, key), None)

    def keys(self) -> int:
        return sum(len(t) for t in self._groups.values())

    def snapshot(self) -> bytes:
        """All state as bytes, by key group (user objects are pickled)."""
        return pickle.dumps({g: t for g, t in self._groups.items() if t}, protocol=5)

    def restore(self, blobs: Iterable[bytes]) -> None:
        """Load the key groups this subtask owns from any number of snapshots (rescaling),
        in-memory ones or RocksDB ones (a job may switch backends)."""
        self._recent.clear()
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


def _is_rocksdb(blob: bytes) -> bool:
    return bytes(blob[:16]) == b"cutline-rocksdb\x00"


def iter_memory_entries(blobs: Iterable[bytes]) -> Iterable[tuple[int, tuple[str, Any], Any]]:
    """``(key group, (state name, key), value)`` of in-memory snapshots."""
    for blob in blobs:
        for g, table in pickle.loads(blob).items():
            for slot, value in table.items():
                yield g, slot, value


class ValueState:
    """One value per key: ``.value``, ``.update(v)``, ``.clear()``.

    Holds the key's key-group table, resolved once per record by the operator.
    """

    __slots__ = ("_table", "_slot", "_default")

    def __init__(self, table: dict, name: str, key: Any, default: Any) -> None:
        self._table, self._slot, self._default = table, (name, key), default

    @property
    def value(self) -> Any:
        return self._table.get(self._slot, self._default)

    def update(self, value: Any) -> None:
        self._table[self._slot] = value

    def clear(self) -> None:
        self._table.pop(self._slot, None)
