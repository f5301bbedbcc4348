"""Timers per key, kept in keyed state: checkpointed and moved by key group like any state.

A :class:`TimerQueue` holds the pending timers ``(key, when)`` of one time domain (event
time or processing time) of one keyed operator subtask.  ``register(key, when)`` and
``delete(key, when)`` are deduplicated per ``(key, when)`` (as in Flink: registering the same
timer twice fires it once); :meth:`~TimerQueue.pop_due` removes and returns every timer due
at or before a time, in order.

Where timers live: a timer is a state entry of the reserved state name
(:data:`EVENT_TIMERS` / :data:`PROCESSING_TIMERS`) in the key group of its key, under the
key ``time_key(when) + encode_key(key)`` (bytes) with the value ``(when, key)``.  So a
snapshot holds them by key group, a rescaled restore moves them with their keys, and both
backends read each other's snapshots (the layout is the same entry in both).  The order of
the bytes is the order timers fire in: by time, then by encoded key (deterministic, the same
after any restore).

* In memory (:class:`MemoryTimerQueue`): the entries sit in the key-group dicts, and a heap
  of ``(entry key, key group)`` finds the next one (deleted timers leave stale heap items,
  skipped when popped and dropped when they outnumber the live ones).
* In RocksDB (:class:`RocksDBTimerQueue`): the entry key sorts by time within its key
  group, so the due timers of a group are one range scan from the group's start; a lower
  bound of each group's earliest timer (kept in memory, 8 bytes a group) skips groups with
  nothing due.  Nothing else is held in memory: timers larger than memory work.

Times are seconds (int or float); a timer fires when the time passes ``when`` (event
time: the watermark reaches ``>= when``).
"""

from __future__ import annotations

import heapq
import math
import pickle
import struct
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from .keys import encode_key

if TYPE_CHECKING:
    from .memory import MemoryStateBackend
    from .rocksdb import RocksDBStateBackend

__all__ = ["EVENT_TIMERS", "PROCESSING_TIMERS", "TIMER_STATES", "TimerQueue", "time_key",
           "timer_entry_key"]

#: The reserved state names of the two time domains' timers.
EVENT_TIMERS = "__timers.event"
PROCESSING_TIMERS = "__timers.processing"
TIMER_STATES = (EVENT_TIMERS, PROCESSING_TIMERS)

_D = struct.Struct(">d")
_Q = struct.Struct(">Q")
_SIGN = 1 << 63
_ALL = (1 << 64) - 1


def time_key(when: float, _pack: Any = _D.pack, _unpack: Any = _Q.unpack,
             _repack: Any = _Q.pack) -> bytes:
    """8 bytes that sort as the times do (IEEE 754 with the sign bit flipped, negatives
    inverted); ``1`` and ``1.0`` encode equally, ``-0.0`` as ``0.0``."""
    u = _unpack(_pack(when + 0.0))[0]
    return _repack(u ^ _ALL if u & _SIGN else u | _SIGN)


def timer_entry_key(when: float, key: Any) -> bytes:
    """The state key of timer ``(key, when)``: time first, so entries sort by time."""
    return time_key(when) + encode_key(key)


def check_time(when: Any) -> float:
    """``when`` as a number of seconds; NaN and non-numbers are refused."""
    if isinstance(when, bool) or not isinstance(when, (int, float)):
        raise TypeError(f"a timer's time must be a number of seconds, "
                        f"not {type(when).__name__} {when!r}")
    if when != when:
        raise ValueError("a timer's time must not be NaN")
    return when


def scan(db: Any, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
    """A RocksDB database's entries ``start <= key < end``, one at a time.

    ``end`` is the iterator's upper bound, so a scan that finds nothing more does not step
    over what lies after ``end``: the tombstones of fired timers (or deleted entries) of the
    next range would cost a slow seek each time (measured: ~80 ms over 200,000 tombstones,
    3 us with the bound).  (``Rdict.items()`` reads ahead in chunks, likewise.)"""
    from rocksdict import ReadOptions

    ro = ReadOptions()
    ro.set_iterate_upper_bound(end)
    it = db.iter(ro)
    it.seek(start)
    while it.valid():
        yield it.key(), it.value()
        it.next()


def range_end(prefix: bytes) -> bytes:
    """The first key after every key that starts with ``prefix`` (its last byte < 0xff)."""
    return prefix[:-1] + bytes([prefix[-1] + 1])


class TimerQueue(ABC):
    """The pending timers of one time domain of a keyed operator subtask."""

    def __init__(self, name: str) -> None:
        self.name = name

    @abstractmethod
    def register(self, key: Any, when: float) -> None:
        """Add timer ``(key, when)`` (nothing if it is already pending)."""

    @abstractmethod
    def delete(self, key: Any, when: float) -> None:
        """Remove timer ``(key, when)`` (nothing if it is not pending)."""

    def pop_due(self, t: float) -> list[tuple[Any, Any]]:
        """Remove and return timers with ``when <= t`` as ``(when, key)``, in firing order.

        May return fewer than all that are due (a bounded batch): call again until it returns
        an empty list.  Timers registered meanwhile with ``when <= t`` come in a later call."""
        return [(w, k) for _, w, k in self.pop_due_ordered(t)]

    @abstractmethod
    def pop_due_ordered(self, t: float) -> list[tuple[bytes, Any, Any]]:
        """:meth:`pop_due` as ``(timer_entry_key(when, key), when, key)`` (sorted)."""

    @abstractmethod
    def next_time(self) -> float:
        """A lower bound of the earliest pending timer's time (``inf`` if none is pending):
        nothing is due before it."""

    @abstractmethod
    def count(self, limit: int | None = None) -> int:
        """Pending timers, or ``limit`` if there are at least that many (the RocksDB queue
        reads them, up to ``limit``)."""

    @abstractmethod
    def flush(self) -> None:
        """Write what is held in front of the store (the backend spills)."""

    @abstractmethod
    def reload(self) -> None:
        """The backend's state was replaced (a restore): rebuild from it."""


class MemoryTimerQueue(TimerQueue):
    """Timers in the in-memory backend's key-group dicts, indexed by a heap."""

    def __init__(self, backend: MemoryStateBackend, name: str) -> None:
        super().__init__(name)
        self._b = backend
        self._heap: list[tuple[bytes, int]] = []
        self._live = 0
        self.reload()

    def reload(self) -> None:
        name = self.name
        heap = [(k, g) for g, d in self._b._groups.items() for (n, k) in d if n == name]
        heapq.heapify(heap)
        self._heap, self._live = heap, len(heap)
        self._where: dict[Any, tuple[dict, int, bytes]] = {}  # _place's memory

    def _place(self, key: Any) -> tuple[dict, int, bytes]:
        """``key``'s key-group dict, key group and encoding (remembered for hot keys)."""
        hit = self._where.get(key)
        if hit is None:
            b = self._b
            g = b.owned_group(key)
            d = b._groups.get(g)
            if d is None:
                d = b._groups[g] = {}
            if len(self._where) >= _PLACES:
                self._where.clear()
            hit = self._where[key] = (d, g, encode_key(key))
        return hit

    def register(self, key: Any, when: float) -> None:
        d, g, enc = self._place(key)
        k = time_key(when) + enc
        slot = (self.name, k)
        if slot not in d:
            d[slot] = (when, key)
            heapq.heappush(self._heap, (k, g))
            self._live += 1
            if self._b._logging:  # the changelog of incremental snapshots
                self._b._log_slots.add((g, slot))

    def delete(self, key: Any, when: float) -> None:
        d, g, enc = self._place(key)
        slot = (self.name, time_key(when) + enc)
        if d.pop(slot, None) is not None:
            self._live -= 1
            if self._b._logging:
                self._b._log_slots.add((g, slot))
            if len(self._heap) > 2 * self._live + 1024:  # mostly stale: rebuild
                self.reload()

    def pop_due_ordered(self, t: float) -> list[tuple[bytes, Any, Any]]:
        heap, groups, name = self._heap, self._b._groups, self.name
        bound = time_key(t)
        out = []
        pop = heapq.heappop
        log = self._b._log_slots if self._b._logging else None
        while heap and heap[0][0][:8] <= bound:
            k, g = pop(heap)
            d = groups.get(g)
            v = None if d is None else d.pop((name, k), None)
            if v is not None:  # else: deleted, or a duplicate heap item of a re-registered one
                self._live -= 1
                out.append((k, v[0], v[1]))
                if log is not None:
                    log.add((g, (name, k)))
        return out

    def next_time(self) -> float:
        heap, groups, name = self._heap, self._b._groups, self.name
        while heap:
            k, g = heap[0]
            v = groups.get(g, {}).get((name, k))
            if v is not None:
                return v[0]
            heapq.heappop(heap)  # stale
        return math.inf

    def count(self, limit: int | None = None) -> int:
        return self._live if limit is None else min(self._live, limit)

    def flush(self) -> None:
        pass  # written in place


_PLACES = 100_000  # keys whose placement a queue remembers
_BATCH = 1000  # RocksDB: writes held before one write batch; timers read per group per scan


class RocksDBTimerQueue(TimerQueue):
    """Timers in RocksDB, one sorted range per key group; in memory only a lower bound of
    each group's earliest timer, and the writes since the last flush."""

    def __init__(self, backend: RocksDBStateBackend, name: str) -> None:
        super().__init__(name)
        self._b = backend
        from .keys import encode_slot

        self._mid = encode_slot(0, name, b"")[2:]  # name part of an entry key, then b"B"
        self._wb: Any = None
        self.reload()

    def reload(self) -> None:
        self._wb = None
        self._where: dict[Any, tuple[bytes, int, bytes]] = {}  # key -> its entries' start
        self._bound = dict.fromkeys(self._b.key_groups, -math.inf)  # unknown: scan first
        self._next = -math.inf

    def _batch(self) -> Any:
        wb = self._wb
        if wb is None:
            wb = self._wb = self._b._r.WriteBatch(raw_mode=True)
        return wb

    def flush(self) -> None:
        wb = self._wb
        if wb is not None and len(wb):
            self._b._db.write(wb, self._b._wopt)
        self._wb = None

    def _entry(self, key: Any, when: float) -> tuple[bytes, int]:
        hit = self._where.get(key)
        if hit is None:
            b = self._b
            g = b.owned_group(key)
            if len(self._where) >= _PLACES:
                self._where.clear()
            hit = self._where[key] = (b._prefix[g] + self._mid, g, encode_key(key))
        start, g, enc = hit
        return start + time_key(when) + enc, g

    def register(self, key: Any, when: float) -> None:
        entry, g = self._entry(key, when)
        wb = self._batch()
        wb.put(entry, pickle.dumps((when, key), 5))  # a second put of one timer is one timer
        if when < self._bound[g]:
            self._bound[g] = when
            if when < self._next:
                self._next = when
        if len(wb) >= _BATCH:
            self.flush()

    def delete(self, key: Any, when: float) -> None:
        wb = self._batch()
        wb.delete(self._entry(key, when)[0])
        if len(wb) >= _BATCH:
            self.flush()

    def pop_due_ordered(self, t: float) -> list[tuple[bytes, Any, Any]]:
        if self._next > t:
            return []
        self.flush()
        b, bound = self._b, self._bound
        db, prefix, mid = b._db, b._prefix, self._mid
        found: list[tuple[bytes, bytes, Any]] = []  # (timer key, entry key, (when, key))
        cut: bytes | None = None  # a group hit the batch limit: return nothing after it
        for g, lo in bound.items():
            if lo > t:
                continue
            start = prefix[g] + mid
            n, rest = 0, math.inf
            # from the lower bound: the fired (deleted) timers before it are tombstones that
            # a seek from the group's start would have to step over
            seek = start if lo == -math.inf else start + time_key(lo)
            for entry, raw in scan(db, seek, range_end(start)):
                if not entry.startswith(start):
                    break
                when, key = v = pickle.loads(raw)
                if when > t:
                    rest = when
                    break
                if n == _BATCH:
                    rest = when
                    last = found[-1][0]
                    if cut is None or last < cut:
                        cut = last
                    break
                found.append((entry[len(start):], entry, v))
                n += 1
            bound[g] = rest
        if cut is not None:  # keep the order: timers after the cut wait for the next call
            keep = [f for f in found if f[0] <= cut]
            for k, _, (when, key) in found:
                if k > cut:
                    g = b.owned_group(key)
                    bound[g] = min(bound[g], when)
            found = keep
        self._next = min(bound.values(), default=math.inf)
        if not found:
            return []
        found.sort(key=lambda f: f[0])
        wb = self._batch()
        for _, entry, _ in found:
            wb.delete(entry)
        self.flush()
        return [(k, v[0], v[1]) for k, _, v in found]

    def next_time(self) -> float:
        if self._next == -math.inf:  # unknown (after a restore): find it
            self.flush()
            b, bound = self._b, self._bound
            for g in bound:
                start = b._prefix[g] + self._mid
                bound[g] = math.inf
                for entry, raw in scan(b._db, start, range_end(start)):
                    if entry.startswith(start):
                        bound[g] = pickle.loads(raw)[0]
                    break
            self._next = min(bound.values(), default=math.inf)
        return self._next

    def count(self, limit: int | None = None) -> int:
        self.flush()
        b, n = self._b, 0
        for g in b.key_groups:
            start = b._prefix[g] + self._mid
            for entry, _ in scan(b._db, start, range_end(start)):
                if not entry.startswith(start):
                    break
                n += 1
                if n == limit:
                    return n
        return n
