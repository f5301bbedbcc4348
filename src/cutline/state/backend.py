"""The keyed-state interface both backends implement, and what they share.

A backend holds the keyed state of one operator subtask: entries ``(state name, key) ->
value`` in the key groups the subtask owns.  Operators see it through one table per state
name (:meth:`KeyedStateBackend.table`), and every table has the same shape:

* ``table.fast``: a plain dict in front of the backend.  A key found there has that value;
  writes go there (``fast[key] = value``).  A hot loop does one dict lookup and one dict
  store per record, on either backend.
* ``table.read(key, default)``: the value of a key ``fast`` does not hold, from behind it
  (the in-memory key-group dicts, or RocksDB and its read cache).
* ``table.delete(key)``, ``table.mutable(key, factory)`` (list and map state, changed in
  place by the caller).

Besides tables: timers (:meth:`KeyedStateBackend.timers`, :mod:`cutline.state.timers`), a
value per owned key group (:meth:`~KeyedStateBackend.put_group_value`: an operator's
watermark), and a budgeted walk over one state name's stored entries that drops or rewrites
them (:meth:`~KeyedStateBackend.clean_step`: state TTL's incremental cleanup).  All of them
are entries in the key groups, so snapshots, restores and rescaling carry them.

``after_batch()`` bounds what the ``fast`` dicts hold: past ``dirty_entries`` the backend
writes them behind (:meth:`KeyedStateBackend.spill`) and empties them, in place.
:meth:`~KeyedStateBackend.snapshot` spills first, then snapshots by key group (bytes, or
for RocksDB a :class:`DeferredSnapshot` whose files upload on the task's upload thread);
:meth:`~KeyedStateBackend.restore` loads the key groups the subtask owns from any number of
snapshots of either backend (rescaling, or a job switching backends).

Why the in-memory backend has a ``fast`` dict too: its snapshot format is the key-group
dicts ``{group: {(name, key): value}}``, and writing there costs a key-group lookup and a
``(name, key)`` tuple per record; behind ``fast`` it costs them once per key per spill.
"""

from __future__ import annotations

import pickle
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from .keygroups import key_group

if TYPE_CHECKING:
    from .timers import TimerQueue

__all__ = ["DeferredSnapshot", "KeyedStateBackend", "StateTable", "ValueState"]

MISSING: Any = object()  # "no entry" where None is a value


class DeferredSnapshot(Protocol):
    """A snapshot whose synchronous part is taken; :meth:`finish` (on the task's upload
    thread) completes it and returns the state blob stored in the checkpoint."""

    def finish(self, storage: Any, checkpoint_id: int) -> bytes: ...


class StateTable(ABC):
    """The entries of one state name in one keyed operator subtask, by key.

    ``fast`` holds the entries written since the backend last spilled (a list or map handed
    out by :meth:`mutable` counts as written); ``deleted`` the keys deleted since, whose
    deletion is not behind ``fast`` yet.  A key in ``fast`` has that value even if it is in
    ``deleted`` too (written after its delete).
    """

    __slots__ = ("name", "fast", "deleted")

    def __init__(self, name: str) -> None:
        self.name = name
        self.fast: dict[Any, Any] = {}
        self.deleted: set[Any] = set()

    @abstractmethod
    def read(self, key: Any, default: Any = None) -> Any:
        """``key``'s value when ``fast`` does not hold it (``default`` if it has none)."""

    def get(self, key: Any, default: Any = None) -> Any:
        v = self.fast.get(key, MISSING)
        return self.read(key, default) if v is MISSING else v

    def put(self, key: Any, value: Any) -> None:
        self.fast[key] = value

    def delete(self, key: Any) -> None:
        self.fast.pop(key, None)
        self.deleted.add(key)

    def mutable(self, key: Any, factory: Callable[[], Any]) -> Any:
        """A list / dict state object: created if absent, and written back at the next spill
        (the caller may change it in place)."""
        fast = self.fast
        v = fast.get(key, MISSING)
        if v is MISSING:
            v = self.read(key, MISSING)
            fast[key] = v = factory() if v is MISSING else v
        return v

    def reset(self) -> None:
        """Forget what is held in front of the backend (a restore replaces the state)."""
        self.fast.clear()
        self.deleted.clear()


class KeyedStateBackend(ABC):
    """The state of one keyed operator subtask owning ``key_groups`` of ``max_parallelism``.

    A subclass makes its tables (:meth:`_new_table`), writes spilled tables behind them
    (:meth:`_write`), and snapshots, restores, lists and closes what is behind.
    """

    def __init__(self, key_groups: range, max_parallelism: int, dirty_entries: int) -> None:
        self.key_groups = key_groups
        self.max_parallelism = max_parallelism
        self._dirty_max = dirty_entries
        self._tables: dict[str, StateTable] = {}
        self._queues: dict[str, TimerQueue] = {}
        self._cursors: dict[str, Any] = {}  # clean_step's position per state name

    # ------------------------------------------------------------------ access

    def table(self, name: str) -> StateTable:
        """The table of state ``name`` (the same object for the backend's lifetime)."""
        t = self._tables.get(name)
        if t is None:
            t = self._tables[name] = self._new_table(name)
        return t

    def timers(self, name: str) -> TimerQueue:
        """The timer queue stored under state ``name`` (one of
        :data:`cutline.state.timers.TIMER_STATES`; the same object for the backend's
        lifetime, rebuilt in place by a restore)."""
        q = self._queues.get(name)
        if q is None:
            q = self._queues[name] = self._new_timers(name)
        return q

    def get(self, name: str, key: Any, default: Any = None) -> Any:
        return self.table(name).get(key, default)

    def put(self, name: str, key: Any, value: Any) -> None:
        self.table(name).fast[key] = value

    def delete(self, name: str, key: Any) -> None:
        self.table(name).delete(key)

    def owned_group(self, key: Any) -> int:
        """``key``'s key group; an error if this subtask does not own it (the records were
        routed by a different key, or a key function that is not deterministic)."""
        g = key_group(key, self.max_parallelism)
        if g not in self.key_groups:
            raise RuntimeError(f"key {key!r} (key group {g}) is not owned by this subtask "
                               f"(groups {self.key_groups.start}..{self.key_groups.stop - 1})")
        return g

    def pending(self) -> int:
        """Entries held in front of the backend (written or deleted since the last spill)."""
        return sum(len(t.fast) + len(t.deleted) for t in self._tables.values())

    def after_batch(self) -> None:
        """Called by the operator after each batch: spill past the bound."""
        if self.pending() > self._dirty_max:
            self.spill()

    def spill(self) -> None:
        """Write every table's ``fast`` entries and deletes behind it and empty them (and
        the timer queues' pending writes)."""
        for q in self._queues.values():
            q.flush()
        changed = [t for t in self._tables.values() if t.fast or t.deleted]
        if not changed:
            return
        self._write(changed)
        for t in changed:
            t.fast.clear()
            t.deleted.clear()

    def keys(self) -> int:
        """Number of entries (reads all the state: for tests and tools)."""
        return sum(1 for _ in self.entries())

    def _reset(self) -> None:
        for t in self._tables.values():
            t.reset()
        self._cursors.clear()

    def _restored(self) -> None:
        """The state was replaced (end of :meth:`restore`): timer queues rebuild."""
        for q in self._queues.values():
            q.reload()

    # ------------------------------------------------------------------ per backend

    @abstractmethod
    def _new_table(self, name: str) -> StateTable:
        """A table for state ``name`` (called once per name)."""

    @abstractmethod
    def _write(self, tables: list[StateTable]) -> None:
        """Write the tables' ``fast`` entries and the deletes of ``deleted`` keys not in
        ``fast`` behind them (they are emptied afterwards)."""

    @abstractmethod
    def _new_timers(self, name: str) -> TimerQueue:
        """A timer queue stored under state ``name`` (called once per name)."""

    @abstractmethod
    def put_group_value(self, name: str, value: Any) -> None:
        """Store ``value`` under state ``name`` in every key group this subtask owns."""

    @abstractmethod
    def group_values(self, name: str) -> list[Any]:
        """The values :meth:`put_group_value` stored under ``name`` in the owned key groups
        (after a rescaled restore: those of the snapshots the groups came from)."""

    @abstractmethod
    def clean_step(self, name: str, fix: Callable[[Any], Any], budget: int) -> None:
        """Visit up to ``budget`` stored entries of state ``name``, continuing where the last
        call stopped (and starting over after the last one): ``fix(value)`` returns
        :data:`MISSING` to delete the entry, another object to store instead, or ``value``
        to keep it.  Entries held in front (``fast`` / ``deleted``) are newer: skipped."""

    @abstractmethod
    def entries(self) -> Iterator[tuple[int, str, Any, Any]]:
        """Every ``(key group, state name, key, value)`` (spills first)."""

    @abstractmethod
    def snapshot(self) -> bytes | DeferredSnapshot:
        """The synchronous part of a checkpoint (spills first)."""

    @abstractmethod
    def restore(self, blobs: Iterable[bytes]) -> None:
        """Load the key groups this subtask owns from any number of snapshots."""

    @abstractmethod
    def close(self) -> None: ...


class ValueState:
    """One value per key: ``.value``, ``.update(v)``, ``.clear()`` (what
    ``ctx.value_state(name, default)`` returns to a ``process`` function)."""

    __slots__ = ("_table", "_fast", "_key", "_default")

    def __init__(self, table: StateTable, key: Any, default: Any) -> None:
        self._table, self._fast, self._key, self._default = table, table.fast, key, default

    @property
    def value(self) -> Any:
        v = self._fast.get(self._key, MISSING)
        return self._table.read(self._key, self._default) if v is MISSING else v

    def update(self, value: Any) -> None:
        self._fast[self._key] = value

    def clear(self) -> None:
        self._table.delete(self._key)


def iter_memory_entries(blobs: Iterable[bytes], key_groups: range | None = None,
                        storage: Any = None) -> Iterable[tuple[int, tuple[str, Any], Any]]:
    """``(key group, (state name, key), value)`` of in-memory snapshots, for the key groups
    in ``key_groups`` (``None``: all): the pickled ``{group: {(name, key): value}}`` of a
    backend without checkpoint storage, or the manifest of a chain of them
    (:mod:`cutline.state.changelog`, read from ``storage``).  A RocksDB backend restores
    them with it (here, not in :mod:`.memory`, so neither backend's module imports the
    other's but for the in-memory backend's restore of a RocksDB snapshot, when rocksdict
    is needed)."""
    from .changelog import is_changelog_snapshot, iter_entries

    for blob in blobs:
        if is_changelog_snapshot(blob):
            yield from iter_entries(blob, key_groups, storage)
            continue
        for g, table in pickle.loads(blob).items():
            if key_groups is None or g in key_groups:
                for slot, value in table.items():
                    yield g, slot, value
