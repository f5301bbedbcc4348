"""State time-to-live: value, list and map state whose entries expire (Flink's
``StateTtlConfig``).

``ctx.value_state(name, ttl=...)`` (and ``list_state`` / ``map_state``) takes seconds, a
``timedelta`` or a :class:`StateTtl`.  Time is **processing time** (the task's wall clock,
epoch seconds), as in Flink: an entry written at ``t`` expires at ``t + ttl``, and with
``update="on_read_and_write"`` a read extends it too.  Expired entries are never returned,
and are cleaned up

* lazily: a read that finds an expired entry deletes it, and
* incrementally: after every batch the operator visits ``cleanup_per_batch`` stored entries
  of each state with a TTL (a cursor that goes round all of them, in either backend) and
  deletes the expired ones (list elements and map entries one by one; a list or map left
  with nothing is deleted).

The granularity is Flink's: the value of a value state, each element of a list state, each
entry of a map state.  What is stored is an :class:`Expiring` (value and expiry time) in
place of each; snapshots hold them as they are, so an entry expires at the same time after
a restore.  A state name keeps the TTL setting it was first used with in an operator; adding
or removing a TTL on an existing state name across a restore is not supported (values stored
without a TTL never expire; a TTL-less state reads the :class:`Expiring` wrappers).
"""

from __future__ import annotations

import datetime as _dt
import math
from collections.abc import Iterator, MutableMapping, MutableSequence
from dataclasses import dataclass, field
from typing import Any

from .backend import MISSING, StateTable

__all__ = ["Expiring", "StateTtl", "TtlList", "TtlMap", "TtlValueState", "expired_fixer",
           "to_ttl"]

UPDATES = ("on_write", "on_read_and_write")


@dataclass(frozen=True)
class StateTtl:
    """How state entries expire.

    ``ttl``: seconds (or a ``timedelta``) after the last write (``update="on_write"``,
    Flink's ``OnCreateAndWrite``, the default) or the last read or write
    (``"on_read_and_write"``).  ``cleanup_per_batch``: stored entries the incremental cleanup
    visits after each batch (0: only reads clean up).
    """

    ttl: Any
    update: str = "on_write"
    cleanup_per_batch: int = 100
    on_read: bool = field(init=False, repr=False, compare=False, default=False)

    def __post_init__(self) -> None:
        ttl = self.ttl
        if isinstance(ttl, _dt.timedelta):
            ttl = ttl.total_seconds()
        if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not ttl > 0 \
                or math.isinf(ttl):
            raise ValueError(f"state ttl must be a positive, finite number of seconds or a "
                             f"timedelta, got {self.ttl!r}")
        object.__setattr__(self, "ttl", float(ttl))
        if self.update not in UPDATES:
            raise ValueError(f"StateTtl.update must be one of {', '.join(UPDATES)}, "
                             f"got {self.update!r}")
        object.__setattr__(self, "on_read", self.update == "on_read_and_write")
        n = self.cleanup_per_batch
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"StateTtl.cleanup_per_batch must be a whole number >= 0, "
                             f"got {n!r}")


def to_ttl(ttl: Any) -> StateTtl | None:
    """``None``, seconds, a ``timedelta`` or a :class:`StateTtl` as a :class:`StateTtl`."""
    if ttl is None or isinstance(ttl, StateTtl):
        return ttl
    return StateTtl(ttl)


class Expiring:
    """A stored value and the (processing) time it expires at."""

    __slots__ = ("value", "expires")

    def __init__(self, value: Any, expires: float) -> None:
        self.value, self.expires = value, expires

    def __getstate__(self) -> tuple[Any, float]:
        return self.value, self.expires

    def __setstate__(self, state: tuple[Any, float]) -> None:
        self.value, self.expires = state

    def __eq__(self, other: object) -> bool:
        return (type(other) is Expiring and self.value == other.value
                and self.expires == other.expires)

    def __repr__(self) -> str:
        return f"Expiring({self.value!r}, expires={self.expires!r})"


def _alive(v: Any, now: float) -> bool:
    return type(v) is not Expiring or v.expires > now


class TtlValueState:
    """A value state with a TTL (``.value``, ``.update(v)``, ``.clear()``)."""

    __slots__ = ("_table", "_fast", "_key", "_default", "_on_read", "_now", "_expires")

    def __init__(self, table: StateTable, key: Any, default: Any, ttl: StateTtl,
                 now: float) -> None:
        self._table, self._fast, self._key, self._default = table, table.fast, key, default
        self._on_read, self._now, self._expires = ttl.on_read, now, now + ttl.ttl

    @property
    def value(self) -> Any:
        key = self._key
        v = self._fast.get(key, MISSING)
        if v is MISSING:
            v = self._table.read(key, MISSING)
            if v is MISSING:
                return self._default
        if type(v) is not Expiring:  # stored before the state had a TTL
            return v
        if v.expires <= self._now:
            self._table.delete(key)
            return self._default
        if self._on_read:
            self._fast[key] = Expiring(v.value, self._expires)
        return v.value

    def update(self, value: Any) -> None:
        self._fast[self._key] = Expiring(value, self._expires)

    def clear(self) -> None:
        self._table.delete(self._key)


class TtlList(MutableSequence):
    """A list state with a TTL per element: a list-like view of the live elements (the
    stored list holds :class:`Expiring` elements; expired ones are dropped when seen)."""

    __slots__ = ("_items", "_ttl", "_now")

    def __init__(self, items: list, ttl: StateTtl, now: float) -> None:
        if any(not _alive(v, now) for v in items):
            items[:] = [v for v in items if _alive(v, now)]
        if ttl.on_read:
            exp = now + ttl.ttl
            items[:] = [Expiring(v.value if type(v) is Expiring else v, exp) for v in items]
        self._items, self._ttl, self._now = items, ttl, now

    def _wrap(self, value: Any) -> Expiring:
        return Expiring(value, self._now + self._ttl.ttl)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [_unwrap(v) for v in self._items[i]]
        return _unwrap(self._items[i])

    def __setitem__(self, i: Any, value: Any) -> None:
        if isinstance(i, slice):
            self._items[i] = [self._wrap(v) for v in value]
        else:
            self._items[i] = self._wrap(value)

    def __delitem__(self, i: Any) -> None:
        del self._items[i]

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Any]:
        return (_unwrap(v) for v in self._items)

    def insert(self, index: int, value: Any) -> None:
        self._items.insert(index, self._wrap(value))

    def append(self, value: Any) -> None:
        self._items.append(self._wrap(value))

    def clear(self) -> None:
        self._items.clear()

    def __eq__(self, other: object) -> bool:
        return list(self) == (list(other) if isinstance(other, (list, TtlList)) else other)

    def __repr__(self) -> str:
        return f"TtlList({list(self)!r})"


class TtlMap(MutableMapping):
    """A map state with a TTL per entry: a dict-like view of the live entries."""

    __slots__ = ("_items", "_ttl", "_now")

    def __init__(self, items: dict, ttl: StateTtl, now: float) -> None:
        self._items, self._ttl, self._now = items, ttl, now

    def __getitem__(self, k: Any) -> Any:
        v = self._items[k]
        if type(v) is not Expiring:
            return v
        if v.expires <= self._now:
            del self._items[k]
            raise KeyError(k)
        if self._ttl.on_read:
            self._items[k] = Expiring(v.value, self._now + self._ttl.ttl)
        return v.value

    def __setitem__(self, k: Any, value: Any) -> None:
        self._items[k] = Expiring(value, self._now + self._ttl.ttl)

    def __delitem__(self, k: Any) -> None:
        v = self._items.pop(k)
        if not _alive(v, self._now):
            raise KeyError(k)

    def _purge(self) -> None:
        now, items = self._now, self._items
        dead = [k for k, v in items.items() if not _alive(v, now)]
        for k in dead:
            del items[k]

    def __iter__(self) -> Iterator[Any]:
        self._purge()
        return iter(list(self._items))

    def __len__(self) -> int:
        self._purge()
        return len(self._items)

    def __contains__(self, k: object) -> bool:
        v = self._items.get(k, MISSING)
        if v is MISSING:
            return False
        if not _alive(v, self._now):
            del self._items[k]
            return False
        return True

    def __repr__(self) -> str:
        return f"TtlMap({dict(self.items())!r})"


def _unwrap(v: Any) -> Any:
    return v.value if type(v) is Expiring else v


def expired_fixer(kind: str, now: float) -> Any:
    """For :meth:`KeyedStateBackend.clean_step`: what to store instead of a stored entry of
    a ``"value"`` / ``"list"`` / ``"map"`` state with a TTL at time ``now``."""
    if kind == "value":
        def fix(v: Any) -> Any:
            return MISSING if type(v) is Expiring and v.expires <= now else v
    elif kind == "list":
        def fix(v: Any) -> Any:
            if not isinstance(v, list) or all(_alive(x, now) for x in v):
                return v
            alive = [x for x in v if _alive(x, now)]
            return alive if alive else MISSING
    elif kind == "map":
        def fix(v: Any) -> Any:
            if not isinstance(v, dict) or all(_alive(x, now) for x in v.values()):
                return v
            alive = {k: x for k, x in v.items() if _alive(x, now)}
            return alive if alive else MISSING
    else:
        raise ValueError(f"no state kind {kind!r}")
    return fix
