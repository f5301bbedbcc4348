"""In-memory keyed state, organised by key group so it can move between subtasks.

Behind the tables' ``fast`` dicts (:mod:`cutline.state.backend`) the state is
``{key group: {(state name, key): value}}``, which is also the snapshot (pickled): a hot
key costs one dict lookup and one store per record, and its key group is found once per
merge, not per record.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from .backend import MISSING, KeyedStateBackend, StateTable
from .keygroups import key_group
from .timers import MemoryTimerQueue

__all__ = ["MemoryStateBackend"]


class MemoryStateBackend(KeyedStateBackend):
    """State of one keyed operator subtask: ``{key group: {(state name, key): value}}``
    behind one ``fast`` dict per state name.

    ``dirty_entries`` bounds what the ``fast`` dicts hold before they are merged into the
    key-group dicts (a snapshot merges what they hold in its synchronous part).  A key read
    from behind ``fast`` remembers where it lives (its key group's dict and its
    ``(name, key)`` slot) until the next merge, so the merge, on the snapshot's synchronous
    path, neither hashes the key nor allocates.
    """

    def __init__(self, key_groups: range, max_parallelism: int, *,
                 dirty_entries: int = 100_000) -> None:
        super().__init__(key_groups, max_parallelism, dirty_entries)
        self._groups: dict[int, dict[tuple[str, Any], Any]] = {}
        self._slot_max = dirty_entries + 1024  # bounds each table's remembered slots

    def _new_table(self, name: str) -> StateTable:
        return _MemoryTable(self, name)

    def _new_timers(self, name: str) -> MemoryTimerQueue:
        return MemoryTimerQueue(self, name)

    def put_group_value(self, name: str, value: Any) -> None:
        for g in self.key_groups:
            d = self._groups.get(g)
            if d is None:
                d = self._groups[g] = {}
            d[(name, b"")] = value

    def group_values(self, name: str) -> list[Any]:
        slot = (name, b"")
        return [d[slot] for g, d in sorted(self._groups.items()) if slot in d]

    def clean_step(self, name: str, fix: Callable[[Any], Any], budget: int) -> None:
        t = self._tables.get(name)
        fast, deleted = (t.fast, t.deleted) if t is not None else ({}, set())
        cur = self._cursors.get(name)
        if cur is None:  # a new pass
            cur = self._cursors[name] = _Cursor(sorted(self._groups, reverse=True))
        while budget > 0:
            if not cur.slots:
                if not cur.groups:
                    del self._cursors[name]
                    return
                d = self._groups.get(cur.groups.pop())
                if d:
                    cur.slots = [s for s in d if s[0] == name]
                    cur.slots.reverse()
                    cur.group = d
                budget -= 1
                continue
            slot = cur.slots.pop()
            budget -= 1
            d = cur.group
            v = d.get(slot, MISSING)
            if v is MISSING or slot[1] in fast or slot[1] in deleted:
                continue
            new = fix(v)
            if new is MISSING:
                del d[slot]
            elif new is not v:
                d[slot] = new

    def _group_dict(self, key: Any) -> dict[tuple[str, Any], Any]:
        """The dict of ``key``'s key group (an error if this subtask does not own it)."""
        g = self.owned_group(key)
        table = self._groups.get(g)
        if table is None:
            table = self._groups[g] = {}
        return table

    def _write(self, tables: list[StateTable]) -> None:
        for t in tables:
            assert isinstance(t, _MemoryTable)
            name, fast, where, slots = t.name, t.fast, t.where, t.slots
            for k in t.deleted:
                if k not in fast:
                    self._group_dict(k).pop((name, k), None)
            for k, v in fast.items():
                table = where.get(k)
                if table is None:  # written without a read (or forgotten): find its place
                    self._group_dict(k)[(name, k)] = v
                else:
                    table[slots[k]] = v
            t.forget()  # the next merge writes what is read (and placed) anew

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
        for blob in blobs:
            if _is_rocksdb(blob):
                from .rocksdb import read_entries

                for g, slot, value in read_entries(blob, self.key_groups):
                    self._groups.setdefault(g, {})[slot] = value
                continue
            for g, table in pickle.loads(blob).items():
                if g in self.key_groups:
                    self._groups.setdefault(g, {}).update(table)
        self._restored()

    def close(self) -> None:
        pass


class _Cursor:
    """Where :meth:`MemoryStateBackend.clean_step` is in its pass over a state name: the
    key groups still to visit, and the slots of the current group's dict still to visit."""

    __slots__ = ("groups", "slots", "group")

    def __init__(self, groups: list[int]) -> None:
        self.groups = groups
        self.slots: list[tuple[str, Any]] = []
        self.group: dict[tuple[str, Any], Any] = {}


class _MemoryTable(StateTable):
    """For keys read since the last merge: ``where`` (key -> its key group's dict) and
    ``slots`` (key -> its ``(name, key)`` tuple).  Two dicts, not one of pairs: a pair
    holding a dict stays tracked by the garbage collector, and a hundred thousand of them
    make every full collection slower (measured: 0.6x records/s on 200,000 keys)."""

    __slots__ = ("_backend", "where", "slots")

    def __init__(self, backend: MemoryStateBackend, name: str) -> None:
        super().__init__(name)
        self._backend = backend
        self.where: dict[Any, dict[tuple[str, Any], Any]] = {}
        self.slots: dict[Any, tuple[str, Any]] = {}

    def read(self, key: Any, default: Any = None) -> Any:
        if self.deleted and key in self.deleted:
            return default
        table = self.where.get(key)
        if table is None:  # (_group_dict inlined: on a large key set most reads come here)
            b = self._backend
            table = b._groups.get(key_group(key, b.max_parallelism))
            if table is None:
                table = b._group_dict(key)
            if len(self.where) >= b._slot_max:
                self.forget()
            self.where[key] = table
            slot = self.slots[key] = (self.name, key)
        else:
            slot = self.slots[key]
        return table.get(slot, default)

    def forget(self) -> None:
        self.where.clear()
        self.slots.clear()

    def reset(self) -> None:
        super().reset()
        self.forget()


def _is_rocksdb(blob: bytes) -> bool:
    return bytes(blob[:16]) == b"cutline-rocksdb\x00"
