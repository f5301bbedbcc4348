"""The keyed ``process`` operator: a user function per record, with keyed state (optionally
with a TTL), the record's event time, and timers that call back ``on_timer``.

What the user's functions get is a :class:`KeyedContext`:

* ``ctx.key``; ``ctx.value_state(name, default, ttl=None)``, ``ctx.list_state(name,
  ttl=None)``, ``ctx.map_state(name, ttl=None)`` (:mod:`cutline.state.ttl` for ``ttl``);
* ``ctx.timestamp``: the record's event time (the ``ts_fn`` of the nearest upstream
  ``assign_timestamps`` applied to the record; in ``on_timer`` the timer's time);
  ``ctx.watermark``: the operator's current event-time watermark;
* ``ctx.timers``: :class:`TimerService`, Flink's ``TimerService`` for the current key.

Timers (:mod:`cutline.state.timers`) are keyed state: event-time timers fire from
:meth:`Process.on_watermark` when the watermark reaches their time, processing-time timers
from the task's loop (:meth:`Process.on_processing_time`) when the wall clock does.  A timer
fires on the task's thread between batches, so its removal, the state changes ``on_timer``
makes and what it emits are all before or all after any checkpoint barrier: exactly once
across restores.

At the end of a bounded input the watermark goes to ``inf`` and every event-time timer
fires.  A job continued from that final checkpoint (``restore_from``, new input) restores
the last real watermark before it (:data:`WATERMARK_REAL`), not ``inf``: the timers fired
at the end of input stay fired (they are gone from the queue), and a timer the new input
registers fires when the new watermark reaches it (at once, with the next watermark, if it
is at or before the restored one).
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable
from typing import Any

from ..logical import ProcessNode
from ..protocol.watermarks import NO_WATERMARK, to_timestamp
from ..state import DeferredSnapshot, KeyedStateBackend, StateTable, ValueState
from ..state.timers import EVENT_TIMERS, PROCESSING_TIMERS, TimerQueue, timer_entry_key
from ..state.ttl import StateTtl, TtlList, TtlMap, TtlValueState, expired_fixer, to_ttl
from .operators import Keyed, UserFunctionError

__all__ = ["KeyedContext", "Process", "TimerService"]

#: The watermark a process operator acted on, kept per key group (a rescaled restore takes
#: the minimum of its groups': never later than any of the old subtasks').
WATERMARK_STATE = "__meta.watermark"
#: Beside it, once that is ``inf`` (the end of input): the last real watermark before it,
#: where a job continued from the final checkpoint goes on.
WATERMARK_REAL = "__meta.watermark-real"

_PREFIX = {"value": "", "list": "l:", "map": "m:"}


class _Timer:
    """What a failing ``on_timer`` call is reported with, in place of a record."""

    __slots__ = ("domain", "key", "when")

    def __init__(self, domain: str, key: Any, when: Any) -> None:
        self.domain, self.key, self.when = domain, key, when

    def __repr__(self) -> str:
        return f"<{self.domain.replace('_', '-')} timer at {self.when!r} of key {self.key!r}>"


class _Batch:
    """Timers popped from a queue and being fired (:meth:`Process._fire`)."""

    __slots__ = ("domain", "t", "heap", "live", "last")

    def __init__(self, domain: str, t: float, heap: list[tuple[bytes, Any, Any]]) -> None:
        self.domain, self.t, self.heap = domain, t, heap
        self.live = {o for o, _, _ in heap}  # not fired, not deleted
        self.last = heap[-1][0]


class TimerService:
    """``ctx.timers``: timers of the current key (Flink's ``TimerService``).

    A timer is ``(key, when)``; registering one that is pending does nothing, deleting one
    that is not pending does nothing.  ``when`` is seconds (int/float; a ``datetime`` is
    converted to epoch seconds).  An event-time timer fires when the watermark reaches
    ``>= when``, a processing-time timer when the wall clock (epoch seconds) does; a timer
    registered for a time already passed fires at the next watermark advance (event time)
    or at once (processing time).  ``on_timer(ctx, key, when)`` gets the call; what it
    returns is emitted downstream.
    """

    __slots__ = ("_op",)

    def __init__(self, op: Process) -> None:
        self._op = op

    def register_event_time(self, when: Any) -> None:
        self._op._timer_op("event_time", True, _when(when))

    def register_processing_time(self, when: Any) -> None:
        self._op._timer_op("processing_time", True, _when(when))

    def delete_event_time(self, when: Any) -> None:
        self._op._timer_op("event_time", False, _when(when))

    def delete_processing_time(self, when: Any) -> None:
        self._op._timer_op("processing_time", False, _when(when))

    def current_watermark(self) -> float:
        return self._op.watermark

    def current_processing_time(self) -> float:
        return self._op.ctx._now


def _when(when: Any) -> Any:
    try:
        return to_timestamp(when, finite=False)  # a timer at inf fires at the end of input
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"a timer's time: {exc}") from None


class KeyedContext:
    """What a ``process`` function (and ``on_timer``) sees: the current key, its state, the
    event time and timers."""

    __slots__ = ("key", "watermark", "time_domain", "timers", "_op", "_state", "_values",
                 "_lists", "_maps", "_kinds", "_ttl", "_ttl_args", "_record", "_firing", "_now")

    def __init__(self, state: KeyedStateBackend, op: Process | None = None) -> None:
        self._op = op
        self._state = state
        self.key: Any = None
        self.watermark: float = NO_WATERMARK
        # in on_timer: "event_time" or "processing_time" (Flink's ctx.timeDomain())
        self.time_domain: str | None = None
        self.timers = TimerService(op) if op is not None else None
        self._values: dict[str, StateTable] = {}  # user's state name -> its table
        self._lists: dict[str, StateTable] = {}
        self._maps: dict[str, StateTable] = {}
        self._kinds: dict[tuple[str, str], StateTtl | None] = {}  # (kind, name) -> its TTL
        self._ttl: dict[tuple[str, str], tuple[StateTable, StateTtl]] = {}
        self._ttl_args: dict[tuple[str, str], tuple[Any, StateTable, StateTtl]] = {}
        self._record: Any = None
        self._firing: Any = None  # the time of the timer being fired
        self._now: float = 0.0  # processing time of the batch (TTL, timers)

    def _uid(self) -> str:
        return "?" if self._op is None else self._op.uid

    @property
    def timestamp(self) -> Any:
        """The current record's event time (in ``on_timer``: the timer's time)."""
        if self._firing is not None:
            return self._firing
        ts_fn = None if self._op is None else self._op.node.timestamp_fn
        if ts_fn is None:
            raise RuntimeError(
                f"ctx.timestamp in process operator {self._uid()!r}: no event time here; add "
                f"assign_timestamps(ts_fn, ...) upstream (exactly one assigner must reach it)")
        return to_timestamp(ts_fn(self._record))

    def _table(self, kind: str, name: str, ttl: StateTtl | None) -> StateTable:
        if not isinstance(name, str) or not name:
            raise TypeError(f"a state name must be a non-empty string, got {name!r}")
        if name.startswith("__"):
            raise ValueError(f"state names starting with '__' are reserved, got {name!r}")
        was = self._kinds.setdefault((kind, name), ttl)
        if was != ttl:
            raise ValueError(f"{kind} state {name!r} is used with ttl={was!r} and with "
                             f"ttl={ttl!r} in operator {self._uid()!r}: one setting per state")
        t = self._state.table(_PREFIX[kind] + name)
        if ttl is not None:
            self._ttl[(kind, name)] = (t, ttl)
        return t

    def _ttl_table(self, kind: str, name: str, ttl: Any) -> tuple[StateTable, StateTtl]:
        hit = self._ttl_args.get((kind, name))
        if hit is not None and (hit[0] is ttl or hit[0] == ttl):
            return hit[1], hit[2]
        cfg = to_ttl(ttl)
        assert cfg is not None
        t = self._table(kind, name, cfg)
        self._ttl_args[(kind, name)] = (ttl, t, cfg)
        return t, cfg

    def value_state(self, name: str, default: Any = None, *,
                    ttl: Any = None) -> ValueState | TtlValueState:
        """One value per key: ``.value``, ``.update(v)``, ``.clear()``.  ``ttl`` (seconds,
        a ``timedelta`` or a ``StateTtl``): the value expires that long after its last
        write (processing time)."""
        if ttl is None:
            t = self._values.get(name)
            if t is None:
                t = self._values[name] = self._table("value", name, None)
            return ValueState(t, self.key, default)
        hit = self._ttl_args.get(("value", name))
        if hit is not None and (hit[0] is ttl or hit[0] == ttl):
            return TtlValueState(hit[1], self.key, default, hit[2], self._now)
        t, cfg = self._ttl_table("value", name, ttl)
        return TtlValueState(t, self.key, default, cfg, self._now)

    def list_state(self, name: str, *, ttl: Any = None) -> list | TtlList:
        """A list per key, changed in place.  With ``ttl``: each element expires that long
        after it was written (a list-like view of the live ones)."""
        if ttl is None:
            t = self._lists.get(name)
            if t is None:
                t = self._lists[name] = self._table("list", name, None)
            return t.mutable(self.key, list)
        t, cfg = self._ttl_table("list", name, ttl)
        return TtlList(t.mutable(self.key, list), cfg, self._now)

    def map_state(self, name: str, *, ttl: Any = None) -> dict | TtlMap:
        """A dict per key, changed in place.  With ``ttl``: each entry expires that long
        after it was written (a dict-like view of the live ones)."""
        if ttl is None:
            t = self._maps.get(name)
            if t is None:
                t = self._maps[name] = self._table("map", name, None)
            return t.mutable(self.key, dict)
        t, cfg = self._ttl_table("map", name, ttl)
        return TtlMap(t.mutable(self.key, dict), cfg, self._now)


class Process(Keyed):
    """``KeyedStream.process(fn, on_timer=...)``.

    ``clock`` (epoch seconds) is processing time: for TTL and processing-time timers
    (tests replace it)."""

    def __init__(self, node: ProcessNode, subtask: int, parallelism: int,
                 max_parallelism: int, state_backend: str = "memory", storage: Any = None):
        super().__init__(node, subtask, parallelism, max_parallelism, state_backend, storage)
        self.on_timer: Callable[..., Any] | None = node.on_timer
        self.watermark: float = NO_WATERMARK
        self.real: float = NO_WATERMARK  # the last watermark before the end of input
        self.clock: Callable[[], float] = time.time
        self.ctx = KeyedContext(self.state, self)
        self._queues: dict[str, TimerQueue] = {}
        self._batch: _Batch | None = None  # the timers being fired
        if self.on_timer is not None:
            self._queues = {"event_time": self.state.timers(EVENT_TIMERS),
                            "processing_time": self.state.timers(PROCESSING_TIMERS)}

    def _queue(self, domain: str) -> TimerQueue:
        q = self._queues.get(domain)
        if q is None:
            raise RuntimeError(f"timers in process operator {self.uid!r} need a callback: "
                               f"key_by(...).process(fn, on_timer=callback)")
        if domain == "event_time" and self.node.timestamps_from is None:
            raise RuntimeError(f"event-time timers in process operator {self.uid!r} need event "
                               f"time: add assign_timestamps(ts_fn, ...) upstream")
        return q

    def _timer_op(self, domain: str, register: bool, when: Any) -> None:
        q, key = self._queue(domain), self.ctx.key
        f = self._batch
        if f is not None and domain == f.domain and when <= f.t:
            o = timer_entry_key(when, key)
            if o <= f.last:  # within the batch being fired (the queue holds none of those)
                if not register:
                    f.live.discard(o)
                elif o not in f.live:
                    f.live.add(o)
                    heapq.heappush(f.heap, (o, when, key))
                return
        if register:
            q.register(key, when)
        else:
            q.delete(key, when)

    @property
    def has_processing_timers(self) -> bool:
        """The task polls :meth:`next_processing_time` (only for operators with a callback)."""
        return self.on_timer is not None

    def process(self, batch: list) -> list:
        fn, key_fn, ctx = self.node.fn, self.key_fn, self.ctx
        ctx._now = self.clock()
        out: list = []
        record = None
        try:
            if self.node.timestamp_fn is None:  # no event time: ctx.timestamp has no record
                for record in batch:
                    ctx.key = key_fn(record)
                    result = fn(ctx, record)
                    if result is not None:
                        out.extend(result)
            else:
                for record in batch:
                    ctx.key = key_fn(record)
                    ctx._record = record
                    result = fn(ctx, record)
                    if result is not None:
                        out.extend(result)
        except Exception as exc:
            raise UserFunctionError(self.uid, "process", record, exc) from exc
        self._after_batch()
        return out

    def _after_batch(self) -> None:
        ctx = self.ctx
        if ctx._ttl:  # incremental TTL cleanup
            now, state = ctx._now, self.state
            for (kind, _), (t, cfg) in ctx._ttl.items():
                if cfg.cleanup_per_batch:
                    state.clean_step(t.name, expired_fixer(kind, now), cfg.cleanup_per_batch)
        self.state.after_batch()

    # ------------------------------------------------------------------ timers

    def on_watermark(self, ts: float) -> list:
        """Fire the event-time timers due at ``ts`` (in time order, then key order)."""
        if ts <= self.watermark:
            return []
        if ts == math.inf:  # the end of input: every timer fires
            self.real = self.watermark
        self.watermark = self.ctx.watermark = ts
        q = self._queues.get("event_time")
        if q is None or q.next_time() > ts:
            return []
        return self._fire(q, ts, "event_time")

    def next_processing_time(self) -> float:
        """When the earliest processing-time timer is due (``inf``: none)."""
        q = self._queues.get("processing_time")
        return math.inf if q is None else q.next_time()

    def on_processing_time(self, now: float) -> list:
        """Fire the processing-time timers due at wall-clock time ``now``."""
        q = self._queues.get("processing_time")
        if q is None or q.next_time() > now:
            return []
        return self._fire(q, now, "processing_time")

    def _fire(self, q: TimerQueue, t: float, domain: str) -> list:
        """Fire the timers of ``q`` due at ``t``, strictly in (time, key) order.

        A batch popped from the queue fires from a heap; a timer ``on_timer`` registers or
        deletes that sorts within the batch goes into (or out of) that heap, not the queue,
        so it fires in its place (or not at all); one sorting after the batch goes to the
        queue and comes with a later batch."""
        ctx, on_timer = self.ctx, self.on_timer
        assert on_timer is not None
        ctx._now = self.clock()
        ctx.time_domain, ctx._record = domain, None
        out: list = []
        key = when = None
        pop = heapq.heappop
        try:
            while True:
                heap = q.pop_due_ordered(t)  # sorted: a heap
                if not heap:
                    break
                f = self._batch = _Batch(domain, t, heap)
                live = f.live
                while heap:
                    o, when, key = pop(heap)
                    if o not in live:
                        continue  # deleted by an earlier on_timer
                    live.discard(o)
                    ctx.key, ctx._firing = key, when
                    result = on_timer(ctx, key, when)
                    if result is not None:
                        out.extend(result)
        except Exception as exc:
            raise UserFunctionError(self.uid, "process", _Timer(domain, key, when),
                                    exc) from exc
        finally:
            ctx._firing = ctx.time_domain = None
            self._batch = None
        self._after_batch()
        return out

    def timer_count(self, limit: int | None = None) -> int:
        """Pending timers of both domains, up to ``limit`` (RocksDB reads them)."""
        n = 0
        for q in self._queues.values():
            n += q.count(None if limit is None else limit - n)
            if n == limit:
                break
        return n

    # ------------------------------------------------------------------ snapshots

    def snapshot(self) -> bytes | DeferredSnapshot:
        if self.watermark > NO_WATERMARK:
            self.state.put_group_value(WATERMARK_STATE, self.watermark)
            if self.watermark == math.inf:
                self.state.put_group_value(WATERMARK_REAL, self.real)
        return self.state.snapshot()

    def restore(self, blobs: list[bytes]) -> None:
        self.state.restore(blobs)
        marks = self.state.group_values(WATERMARK_STATE)
        wm = min(marks) if marks else NO_WATERMARK
        if wm == math.inf:  # a final checkpoint: go on from the last real watermark
            wm = min(self.state.group_values(WATERMARK_REAL), default=wm)
        self.watermark = self.ctx.watermark = wm
