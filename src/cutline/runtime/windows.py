"""The window operator: event-time windows per key, on the keyed-state backend.

State (one backend per subtask, memory or RocksDB, checkpointed and moved by key group like
every keyed operator):

* table ``windows``: key -> ``{(start, end): accumulator}``, the key's open windows (and,
  with ``allowed_lateness``, its fired windows until the watermark passes ``end +
  allowed_lateness``).  Sliding windows whose size is a whole number of slides, without
  allowed lateness, counting or summarizing (``WindowSpec.panes``), hold *panes*
  there instead, one slide each: a record is added to its one pane, not to ``size /
  slide`` windows, and a window fires as the merge of the panes it covers (Flink SQL's
  slicing of hopping windows); a pane goes when its last window fired.  Whole windows
  from a checkpoint taken before panes stay beside them and fire merged with their
  panes;
* table ``window-watermark``: per key group, the watermark the operator acted on, under a
  key that falls in that group (:func:`group_keys`).  After a rescale a subtask's
  watermark starts at the lowest of its inputs' old watermarks; a key group keeps its
  own, so a window that fired before the checkpoint neither fires again nor takes records
  that were late for it.  At the end of input (watermark ``inf``) it holds the last real
  watermark before it, where a job continued from the final checkpoint goes on;
* table ``window-fired``: key -> ``{(start, end): None}``, the key's windows that the end
  of input fired although their end is above that last real watermark (a few: those of the
  time span in flight).  After such a restore a record for one of them is late, or with
  ``allowed_lateness`` updates it and emits it again (its accumulator stays in
  ``windows``, as does any fired window's whose ``end + allowed_lateness`` the last real
  watermark has not passed); the watermark passing its end does not fire it again; the
  mark goes when the watermark passes ``end + allowed_lateness``.  A session that a new
  record would merge into one of them is such a window too.  Checked per record only while
  there are any (:attr:`WindowOperator.fired` is empty otherwise).

The operator fires on :meth:`WindowOperator.on_watermark` (Spark's rule: a window
``[start, end)`` fires when the watermark reaches ``end``).  Which keys have something due
at which time is an index in memory (a heap of times, the keys due at each), rebuilt from
the state on restore; a key's entry there may be stale (its window merged or fired), and
is then skipped.

Output: a :class:`~cutline.protocol.windows.WindowResult` ``(key, start, end, value)``
per key and window (``apply``: whatever the user's function yields), and, when the
pipeline reads ``late()``, a :class:`LateRecord` per record that came after
``end + allowed_lateness`` of all its windows.  Late records are ordinary output of the
operator, so they travel through the same channels and checkpoints as results (exactly
once); :class:`WindowResults` and :class:`WindowLate`, chained after it, split the two.
"""

from __future__ import annotations

import functools
import heapq
import math
from collections.abc import Callable
from typing import Any

from ..logical import Node, WindowPartial
from ..protocol.watermarks import NO_WATERMARK, to_timestamp
from ..protocol.windows import (Sliding, TimeWindow, Tumbling, WindowResult, WindowSpec,
                                merge_into)
from ..state import DeferredSnapshot
from ..state.keygroups import key_group
from .late import LATE_STATE, LateDrops, late_error
from .keys import fast_key
from .operators import Keyed, Operator, UserFunctionError

__all__ = ["LateRecord", "WindowCombine", "WindowLate", "WindowOperator", "WindowResults",
           "group_keys"]

_MISSING: Any = object()
_INF = math.inf
WINDOWS = "windows"
MARKS = "window-watermark"
FIRED = "window-fired"


class LateRecord:
    """A record later than ``allowed_lateness`` for all its windows, on its way to the late
    side output (``windowed.late()``)."""

    __slots__ = ("record",)

    def __init__(self, record: Any) -> None:
        self.record = record

    def __eq__(self, other: object) -> bool:
        return type(other) is LateRecord and other.record == self.record

    def __hash__(self) -> int:
        return hash(("late", self.record))

    def __repr__(self) -> str:
        return f"LateRecord({self.record!r})"

    def __reduce__(self) -> tuple:
        return (LateRecord, (self.record,))


@functools.lru_cache(maxsize=8)
def group_keys(max_parallelism: int) -> tuple[int, ...]:
    """For each key group, the smallest int key that hashes to it: where per-key-group
    values go through the (per key) state interface."""
    found: dict[int, int] = {}
    i = 0
    while len(found) < max_parallelism:
        found.setdefault(key_group(i, max_parallelism), i)
        i += 1
    return tuple(found[g] for g in range(max_parallelism))


def _fired_order(f: tuple) -> tuple:
    return f[0]


def _by_window(f: tuple) -> tuple:
    return f[:3]


def _whole(x: float) -> Any:
    return int(x) if x.is_integer() else x


def _grid(t: float) -> float:
    """A window end, to compare ends computed in different ways (stepping, multiplying)."""
    return round(float(t), 9)


_NO_WINDOW = (0, 0)  # (no timestamp is in it: the first record computes its window)


def window_of(ts: Any, offset: Any, size: Any, floor: Callable[[float], int] = math.floor
              ) -> tuple[Any, Any]:
    """The tumbling window ``(start, end)`` of ``ts`` as :meth:`Tumbling.bounds` names it:
    the latest ``offset + j * size <= ts`` (exact for the whole or dyadic sizes and offsets
    of an exact assigner), whole floats as ints.  (``ts - (ts - offset) % size`` rounds:
    1.957 in ``tumbling(10, offset=3)`` started at -7.000000000000001 where 2.5 started at
    -7, one window under two names.)"""
    start = offset + floor((ts - offset) / size) * size
    if start > ts:
        start -= size
    elif start + size <= ts:
        start += size
    end = start + size
    if type(start) is float and start.is_integer():
        start = int(start)
    if type(end) is float and end.is_integer():
        end = int(end)
    return start, end


class WindowOperator(Keyed):
    """``KeyedStream.window(assigner, ...).<aggregate>()``: one accumulator per key and
    window, fired by the watermark (see the module docstring)."""

    def __init__(self, node: Node, subtask: int, parallelism: int, max_parallelism: int,
                 state_backend: str = "memory", storage: Any = None) -> None:
        super().__init__(node, subtask, parallelism, max_parallelism, state_backend, storage)
        spec: WindowSpec = node.fn
        self.spec = spec
        self.assigner = spec.assigner
        self.lateness: float = spec.allowed_lateness
        self.ts_fn: Callable[[Any], Any] = spec.ts_fn
        self.agg = spec.aggregate
        self.max_parallelism = max_parallelism
        self.windows = self.state.table(WINDOWS)
        self.marks = self.state.table(MARKS)
        keys = group_keys(max_parallelism)
        self.mark_keys = {g: keys[g] for g in self.state.key_groups}
        self.wm: float = NO_WATERMARK  # the watermark acted on
        # key group -> the watermark it acted on before a restore, where above ``wm``
        self.ahead: dict[int, float] = {}
        self._due: dict[float, dict[Any, None]] = {}  # time -> keys with something due
        # key -> windows the end of input fired above the last real watermark (a restored
        # final checkpoint's, table ``window-fired``); empty nearly always
        self.fired_table = self.state.table(FIRED)
        self.fired: dict[Any, dict[tuple, None]] = {}
        self.fired_until: float = NO_WATERMARK  # at least the largest end in ``fired``
        self._real: tuple[float, dict[int, float]] | None = None  # wm, ahead before inf
        self._times: list[float] = []  # heap of the times in _due
        self.late_records = 0  # dropped or sent to the late output
        # the dropped ones, per key group: keyed state, so counted exactly once
        self.late = LateDrops(self.state.table(LATE_STATE), self.mark_keys, max_parallelism)
        # sliding windows as panes (one slide each; a window fires as the merge of its
        # panes): state per key and pane, not per key and window
        self.panes = spec.panes
        self.whole = False  # panes, and whole windows restored from before panes
        a = self.assigner
        if self.panes:
            self.size, self.slide, self.offset = a.size, a.slide, a.offset  # type: ignore
            self.copies = round(a.size / a.slide)  # type: ignore[attr-defined]

    # ------------------------------------------------------------------ records

    def _watermark_of(self, key: Any) -> float:
        wm = self.wm
        g = self.ahead.get(key_group(key, self.max_parallelism))
        return wm if g is None or g < wm else g

    def _at(self, t: float, key: Any) -> None:
        keys = self._due.get(t)
        if keys is None:
            self._due[t] = {key: None}
            heapq.heappush(self._times, t)
        else:
            keys[key] = None

    def _mark(self, key: Any, w: tuple) -> None:
        """Window ``w`` of ``key`` fired at the end of input (its end above the last real
        watermark): remembered, for a job continued from the final checkpoint."""
        marked = self.fired.get(key)
        if marked is None:
            marked = self.fired[key] = {}
        marked[w] = None
        self.fired_table.put(key, marked)
        if w[1] > self.fired_until:
            self.fired_until = w[1]

    def _unmark_passed(self, key: Any, marked: dict[tuple, None], ts: float) -> None:
        """Drop ``key``'s marks whose ``end + allowed_lateness`` watermark ``ts`` passed."""
        lateness = self.lateness
        for w in [w for w in marked if w[1] + lateness <= ts]:
            del marked[w]
        if marked:
            self.fired_table.put(key, marked)
            return
        del self.fired[key]
        self.fired_table.delete(key)
        if not self.fired:
            self.fired_until = NO_WATERMARK

    def _refire(self, key: Any, w: tuple, value: Any, emit: Callable[[Any], None]) -> bool:
        """A record for window ``w``, which the end of an earlier run's input fired: late
        (False), or with ``allowed_lateness`` added to it and the window emitted again."""
        if not self.lateness:
            return False
        m = self.windows.mutable(key, dict)
        acc = m.get(w, _MISSING)
        m[w] = acc = self.agg.add(self.agg.create() if acc is _MISSING else acc, value)
        self._fire(key, w, acc, emit)
        return True

    def _fire(self, key: Any, w: tuple, acc: Any, emit: Callable[[Any], None]) -> None:
        agg = self.agg
        if agg.full is not None:
            out = agg.full(key, TimeWindow(*w), acc)
            if out is not None:
                for item in out:
                    emit(item)
        else:
            emit(WindowResult(key, w[0], w[1], agg.result(acc)))

    def process(self, batch: list) -> list:
        out: list = []
        if type(self.assigner) is Tumbling and self.assigner.exact:
            self._process_tumbling(batch, out)
        elif self.panes:
            self._process_panes(batch, out)
        else:
            self._process_any(batch, out)
        self.state.after_batch()
        return out

    def _failed(self, record: Any, exc: Exception, i: int, n: int) -> None:
        """A record a user function (or its timestamp) failed on: fail the job naming it,
        or hand it to the dead-letter sink."""
        if isinstance(exc, UserFunctionError):
            raise exc
        if self.on_bad_record is None:
            raise UserFunctionError(self.uid, "window", record, exc, index=i,
                                    batch_size=n) from exc
        self.on_bad_record(self, record, exc, i, n)

    def _late(self, record: Any, emit: Callable[[Any], None], key: Any, ts: float,
              cur: float) -> None:
        self.late_records += 1
        if self.spec.emit_late:
            emit(LateRecord(record))
        elif self.spec.on_late == "fail":
            raise late_error(self.uid, record, ts, cur, self.lateness)
        else:
            self.late.add(key, ts, cur)

    def _process_tumbling(self, batch: list, out: list) -> None:
        """The common case, inlined: one window per record, no merging."""
        emit = out.append
        key_fn, ts_fn, agg = self.key_fn, self.ts_fn, self.agg
        value_fn, create, add = agg.value, agg.create, agg.add
        counting = agg.name == "count"
        table = self.windows
        fast, mutable, lateness = table.fast, table.mutable, self.lateness
        size, offset = self.assigner.size, self.assigner.offset  # type: ignore[attr-defined]
        wm, ahead, due, at = self.wm, self.ahead, self._due, self._at
        floor, w = math.floor, _NO_WINDOW
        fired = self.fired  # (empty unless continuing a finished run)
        n = len(batch)
        for i, record in enumerate(batch):
            try:
                if type(record) is WindowPartial:  # a combine's (two-phase aggregation)
                    self._merge_partial(record, emit)
                    continue
                k = key_fn(record)
                ts = ts_fn(record)
                t = type(ts)
                if t is not int and (t is not float or ts != ts or ts == _INF or ts == -_INF):
                    ts = to_timestamp(ts)
                cur = self._watermark_of(k) if ahead else wm
                if not w[0] <= ts < w[1]:  # not the previous record's window
                    w = window_of(ts, offset, size, floor)
                start, end = w
                if end + lateness <= cur:
                    self._late(record, emit, k, ts, cur)
                    continue
                if fired and end > cur and w in fired.get(k, ()):
                    if not self._refire(k, w, record if value_fn is None else value_fn(record),
                                        emit):
                        self._late(record, emit, k, ts, cur)
                    continue
                m = fast.get(k)
                if m is None:
                    m = mutable(k, dict)
                acc = m.get(w, _MISSING)
                if acc is _MISSING:
                    acc = create()
                    if end > cur:
                        keys = due.get(end)
                        if keys is None:
                            at(end, k)
                        else:
                            keys[k] = None
                    if lateness:
                        at(end + lateness, k)
                if counting:
                    m[w] = acc = acc + 1
                else:
                    m[w] = acc = add(acc, record if value_fn is None else value_fn(record))
                if end <= cur:  # a fired window, within the lateness: emit it again
                    self._fire(k, w, acc, emit)
            except Exception as exc:  # noqa: BLE001 - reported with the record
                self._failed(record, exc, i, n)

    def _merge_partial(self, p: WindowPartial, emit: Callable[[Any], None]) -> None:
        """A combine's partial aggregate of ``p.n`` records of key ``p.key`` in one tumbling
        window: merged into the window's accumulator, as its records would have been added
        one by one; late (all ``p.n`` records counted) where they would have been."""
        k, w = p.key, (p.start, p.end)
        cur = self._watermark_of(k) if self.ahead else self.wm
        end, lateness = p.end, self.lateness
        fired = self.fired
        if end + lateness <= cur or (fired and end > cur and w in fired.get(k, ())):
            # (a pipeline that combines drops late records; one restored from its in-flight
            # data into a window that fails on them fails on the partial)
            if self.spec.on_late == "fail":
                raise late_error(self.uid, p, p.ts, cur, lateness)
            self.late_records += p.n
            self.late.add(k, p.ts, cur, p.n)
            return
        table = self.windows
        m = table.fast.get(k)
        if m is None:
            m = table.mutable(k, dict)
        acc = m.get(w, _MISSING)
        agg = self.agg
        if acc is _MISSING:
            m[w] = p.acc
            if end > cur:
                self._at(end, k)
            if lateness:
                self._at(end + lateness, k)
        else:
            m[w] = acc + p.acc if agg.name == "count" else agg.merge(acc, p.acc)  # type: ignore[misc]
        if end <= cur:  # a fired window, within the lateness: emit it again
            self._fire(k, w, m[w], emit)

    def _not_tumbling(self, record: WindowPartial) -> None:
        raise RuntimeError(
            f"window operator {self.uid!r} got a tumbling window's partial aggregate "
            f"{record!r} (from a checkpoint's in-flight data of a tumbling window), "
            f"but its windows are {self.assigner!r}: restore it with the windows "
            f"the checkpoint was taken with")

    def _process_any(self, batch: list, out: list) -> None:
        """Sliding and session windows (any assigner)."""
        emit = out.append
        key_fn, ts_fn, agg = self.key_fn, self.ts_fn, self.agg
        value_fn, create, add = agg.value, agg.create, agg.add
        mutable, lateness = self.windows.mutable, self.lateness
        assign, merging = self.assigner.bounds, self.assigner.merging
        at, n, fired = self._at, len(batch), self.fired
        for i, record in enumerate(batch):
            if type(record) is WindowPartial:
                self._not_tumbling(record)
            try:
                k = key_fn(record)
                ts = to_timestamp(ts_fn(record))
                cur = self._watermark_of(k) if self.ahead else self.wm
                v = record if value_fn is None else value_fn(record)
                late = True
                if merging:
                    for w in assign(ts):
                        if self._add_merging(k, w, v, cur, emit):
                            late = False
                else:
                    m = None
                    for w in assign(ts):
                        end = w[1]
                        if end + lateness <= cur:
                            continue  # late for this window
                        if fired and end > cur and w in fired.get(k, ()):
                            if self._refire(k, w, v, emit):  # (fired at an end of input)
                                late = False
                            continue
                        late = False
                        if m is None:
                            m = mutable(k, dict)
                        acc = m.get(w, _MISSING)
                        if acc is _MISSING:
                            acc = create()
                            if end > cur:
                                at(end, k)
                            if lateness:
                                at(end + lateness, k)
                        m[w] = acc = add(acc, v)
                        if end <= cur:  # a fired window, within the lateness: emit it again
                            self._fire(k, w, acc, emit)
                if late:
                    self._late(record, emit, k, ts, cur)
            except Exception as exc:  # noqa: BLE001 - reported with the record
                self._failed(record, exc, i, n)

    def _next_end(self, t: float) -> float:
        """The first window end after ``t``."""
        if math.isinf(t):
            return t
        return _whole(float(t - (t - self.offset) % self.slide + self.slide))

    def _panes_due(self, ts: float) -> list | None:
        """:meth:`on_watermark` of panes held key by key: per due key, every window ending
        after the watermark acted on (the key group's, after a rescale) and by ``ts`` that
        covers one of its panes fires with the merge of those panes; panes whose last window fired
        are dropped; the key is due again at its next window end.  A window the end of an
        earlier run's input fired (:attr:`fired`) does not fire again; at the end of input,
        the windows fired are marked so (as :meth:`on_watermark` does).  Returns the
        windows fired, ``(end, start, seq, key, accumulator)`` by end, start and the order
        the keys came in, or None."""
        prev = self.wm
        keys = self._due_keys(ts)
        if keys is None:
            return None
        marks, final = self.fired, ts == _INF
        table, ahead, maxp = self.windows, self.ahead, self.max_parallelism
        fast, read, delete, at = table.fast, table.read, table.delete, self._at
        slide, size, copies = self.slide, self.size, self.copies
        merge, whole = self.agg.merge, self.whole
        assert merge is not None  # (panes only where the aggregate merges)
        nxt = self._next_end(ts)
        fired: list = []
        for seq, k in enumerate(keys):
            marked = marks.get(k) if marks else None
            done = None
            if marked is not None:
                done = {_grid(w[1]) for w in marked}
                if not final:
                    self._unmark_passed(k, marked, ts)
            m = fast.get(k)
            if m is None:
                m = read(k, None)
                if not m:
                    continue
                fast[k] = m
            p = prev
            if ahead:
                g = ahead.get(key_group(k, maxp))
                if g is not None and g > p:
                    p = g
            # the window ends after p and by ts that cover a pane: stepping one slide from
            # the first (panes and ends are on the grid: exact floats, equal as dict keys)
            starts = [w[0] for w in m]
            e = min(starts) + slide
            if e <= p:
                e += (math.floor((p - e) / slide) + 1) * slide
                while e <= p:
                    e += slide
            last = min(ts, max(starts) + size)
            while e <= last:
                if done is not None and _grid(e) in done:  # fired at an end of input
                    e += slide
                    continue
                s = e - size
                # a whole window from a checkpoint taken before panes: its records so far
                acc = m.get((s, e)) if whole else None
                for _ in range(copies):
                    a = m.get((s, s + slide))
                    if a is not None:
                        acc = a if acc is None else merge(acc, a)
                    s += slide
                if acc is not None:
                    fired.append((e, e - size, seq, k, acc))
                    if final:
                        self._mark(k, (_whole(float(e - size)), _whole(float(e))))
                e += slide
            gone = ts - size  # panes starting by then: their last window fired
            dead = [w for w in m if w[0] <= gone]
            if len(dead) == len(m):
                delete(k)
                continue
            for w in dead:
                del m[w]
            at(max(nxt, min(x for x in starts if x > gone) + slide), k)
        if ahead:
            self.ahead = {g: v for g, v in ahead.items() if v > ts}
        self.state.after_batch()
        if not fired:
            return None
        fired.sort(key=_by_window)  # by end, start; keys in the order they came
        return fired

    def _pane_fired(self, key: Any, pane: float, cur: float) -> bool:
        """Whether every window of pane ``pane`` of ``key`` that ends after watermark
        ``cur`` is one the end of an earlier run's input fired (:attr:`fired`): a value
        for it is late."""
        marked = self.fired.get(key)
        if not marked:
            return False
        ends = {_grid(w[1]) for w in marked}
        slide = self.slide
        return all(pane + j * slide <= cur or _grid(pane + j * slide) in ends
                   for j in range(1, self.copies + 1))

    def _process_panes(self, batch: list, out: list) -> None:
        """Sliding windows as panes (:attr:`WindowSpec.panes`), record by record: a
        record's value goes into its one pane (its slide) instead of ``size / slide``
        windows; it is late when its pane's last window fired (all its windows did).  A
        new pane is due at the first of its windows not fired yet."""
        emit = out.append
        key_fn, ts_fn, agg = self.key_fn, self.ts_fn, self.agg
        value_fn, create, add = agg.value, agg.create, agg.add
        table = self.windows
        fast, mutable = table.fast, table.mutable
        slide, size, offset = self.slide, self.size, self.offset
        wm, ahead, at, fired = self.wm, self.ahead, self._at, self.fired
        nxt = self._next_end(wm)
        floor, w = math.floor, _NO_WINDOW
        n = len(batch)
        for i, record in enumerate(batch):
            if type(record) is WindowPartial:
                self._not_tumbling(record)
            try:
                k = key_fn(record)
                ts = ts_fn(record)
                t = type(ts)
                if t is not int and (t is not float or ts != ts or ts == _INF or ts == -_INF):
                    ts = to_timestamp(ts)
                cur = self._watermark_of(k) if ahead else wm
                if not w[0] <= ts < w[1]:  # not the previous record's pane
                    w = window_of(ts, offset, slide, floor)
                if w[0] + size <= cur or (fired and self._pane_fired(k, w[0], cur)):
                    self._late(record, emit, k, ts, cur)
                    continue
                m = fast.get(k)
                if m is None:
                    m = mutable(k, dict)
                acc = m.get(w, _MISSING)
                if acc is _MISSING:
                    acc = create()
                    end = w[1]
                    at(end if end > nxt else nxt, k)
                m[w] = add(acc, record if value_fn is None else value_fn(record))
            except Exception as exc:  # noqa: BLE001 - reported with the record
                self._failed(record, exc, i, n)

    def _add_merging(self, key: Any, new: tuple, value: Any, cur: float,
                     emit: Callable[[Any], None]) -> bool:
        """Sessions: add a record's window ``new`` to the key's windows, merging those it
        overlaps or touches (their accumulators merge, by start), as Flink does: the merged
        window decides whether the record is late.  False if it is."""
        table, agg, lateness = self.windows, self.agg, self.lateness
        m = table.fast.get(key)
        if m is None:
            m = table.read(key, None)
        result, merged = merge_into(m or (), new)
        end = result[1]
        if end + lateness <= cur:
            return False
        marked = self.fired.get(key) if self.fired else None
        if marked:  # it would merge into a session the end of an earlier run's input fired:
            hit = [w for w in marked if w[0] <= end and result[0] <= w[1]]
            if hit:  # late, or with the lateness (its accumulator kept) emitted again
                if not lateness or any(w not in merged for w in hit):
                    return False
                for w in hit:
                    del marked[w]
                marked[result] = None  # (put back in its table by _mark below)
            else:
                marked = None
        if m is None:
            m = {}
        table.fast[key] = m  # (changed below: written back at the next spill)
        if merged == [result]:  # inside a session the key has
            acc = m[result]
        elif merged:  # sessions merged into a longer one: the key is due when the first
            # of them was (on_watermark then finds the new end and makes it due then)
            merge = agg.merge
            assert merge is not None  # refused up front for merging windows
            acc = m.pop(merged[0])
            for w in merged[1:]:
                acc = merge(acc, m.pop(w))
        else:  # a new session
            acc = agg.create()
            if end > cur:
                self._at(end, key)
            if lateness:
                self._at(end + lateness, key)
        m[result] = acc = agg.add(acc, value)
        if marked:
            self._mark(key, result)
        if end <= cur or marked:  # the session had fired (or is late, within the lateness)
            self._fire(key, result, acc, emit)
        return True

    # ------------------------------------------------------------------ time

    def _due_keys(self, ts: float) -> dict[Any, None] | None:
        """Watermark ``ts`` acted on: the keys with something due by then, in the order
        they became due; None when ``ts`` is no advance or nothing is due."""
        if ts <= self.wm:
            return None
        if ts == _INF:  # the end of input: the last real watermark stays, for a restore
            self._real = (self.wm, dict(self.ahead))
        self.wm = ts
        times, due = self._times, self._due
        if not times or times[0] > ts:
            if self.ahead:
                self.ahead = {g: v for g, v in self.ahead.items() if v > ts}
            return None
        keys: dict[Any, None] = {}
        while times and times[0] <= ts:
            keys.update(due.pop(heapq.heappop(times)))
        return keys

    def on_watermark(self, ts: float) -> list:
        """Fire the windows whose end the watermark passed since the last call, and drop
        those past ``end + allowed_lateness``.  At the end of input (``inf``) the windows it
        fires above the last real watermark are marked fired, and the accumulators the
        lateness still covers (from that watermark) are kept: see the module docstring."""
        if self.panes:
            return self._pane_results(ts)
        prev = self.wm
        keys = self._due_keys(ts)
        if keys is None:
            return []
        fired: list[tuple[tuple, Any, tuple, Any]] = []
        add_fired = fired.append
        table, lateness, ahead = self.windows, self.lateness, self.ahead
        fast, read, delete = table.fast, table.read, table.delete
        maxp, at, merging = self.max_parallelism, self._at, self.assigner.merging
        marks, final = self.fired, ts == _INF
        for seq, k in enumerate(keys):
            marked = marks.get(k) if marks else None
            m = fast.get(k)
            if m is None:
                m = read(k, None)
                if not m:
                    if marked is not None and not final:
                        self._unmark_passed(k, marked, ts)
                    continue  # (stale: fired and gone)
                fast[k] = m  # changed below: written back at the next spill
            p = prev
            if ahead:
                g = ahead.get(key_group(k, maxp))
                if g is not None and g > p:
                    p = g
            dead = None
            for w, acc in m.items():
                e = w[1]
                if e <= ts:
                    if e > p and (marked is None or w not in marked):
                        add_fired(((e, w[0], seq), k, w, acc))
                        if final:
                            self._mark(k, w)
                    if e + lateness <= ts and not (final and lateness and e + lateness > p):
                        if dead is None:
                            dead = [w]
                        else:
                            dead.append(w)
                    elif not final:
                        at(e + lateness, k)
                elif merging:  # a session that grew since it was made due: due at its end
                    at(e, k)
            if dead is not None:
                if len(dead) == len(m):
                    delete(k)
                else:
                    for w in dead:
                        del m[w]
            if marked is not None and not final:
                self._unmark_passed(k, marked, ts)
        out: list = []
        if not fired:
            if ahead:
                self.ahead = {g: v for g, v in ahead.items() if v > ts}
            return out
        fired.sort(key=_fired_order)  # by window end, start; keys in the order they came
        agg = self.agg
        emit = out.append
        k = w = None
        try:
            if agg.full is None:
                result, new = agg.result, tuple.__new__
                for _, k, w, acc in fired:
                    emit(new(WindowResult, (k, w[0], w[1], result(acc))))
            else:
                for _, k, w, acc in fired:
                    self._fire(k, w, acc, emit)
        except Exception as exc:
            raise UserFunctionError(self.uid, "window", f"window {w!r} of key {k!r}",
                                    exc) from exc
        if ahead:
            self.ahead = {g: v for g, v in ahead.items() if v > ts}
        self.state.after_batch()
        return out

    def _pane_results(self, ts: float) -> list:
        """:meth:`on_watermark` of panes: a result per key and window fired."""
        fired = self._panes_due(ts)
        if not fired:
            return []
        result, new = self.agg.result, tuple.__new__
        e = k = None
        try:
            out = []
            for e, s, _, k, acc in fired:
                out.append(new(WindowResult, (k, _whole(float(s)), _whole(float(e)),
                                              result(acc))))
        except Exception as exc:
            raise UserFunctionError(self.uid, "window", f"window ending {e!r} of key {k!r}",
                                    exc) from exc
        return out

    def held_windows(self) -> int:
        """How many (key, window) pairs are due to fire or be dropped (an upper bound on
        the windows open: an entry may be stale)."""
        return sum(len(keys) for keys in self._due.values())

    # ------------------------------------------------------------------ checkpoints

    def snapshot(self) -> bytes | DeferredSnapshot:
        wm, ahead, put = self.wm, self.ahead, self.marks.fast
        if wm == _INF and self._real is not None:  # the end of input: the last real one
            wm, ahead = self._real  # (what the end of input fired above it is marked)
        for g, key in self.mark_keys.items():
            a = ahead.get(g)
            put[key] = a if a is not None and a > wm else wm
        self.late.snapshot()
        return self.state.snapshot()

    def restore(self, blobs: list[bytes]) -> None:
        """Load the state, rebuild what is due when, and take each key group's watermark."""
        self.state.restore(blobs)
        self._due.clear()
        self._times.clear()
        self.fired, self.fired_until, self._real = {}, NO_WATERMARK, None
        marks: dict[int, float] = {}
        late: dict[int, int] = {}
        lateness, at = self.lateness, self._at
        spans = set()  # the windows' lengths: panes (a slide), whole windows (the size)
        for g, name, key, value in self.state.entries():
            if name == WINDOWS:
                for w in value:
                    at(w[1], key)
                    if lateness:
                        at(w[1] + lateness, key)
                    spans.add(w[1] - w[0])
            elif name == MARKS and self.mark_keys.get(g) == key:
                marks[g] = value
            elif name == FIRED and value:  # fired at the end of input: due to be forgotten
                self.fired[key] = dict(value)
                for w in value:
                    at(w[1] + lateness, key)
                    self.fired_until = max(self.fired_until, w[1])
            elif name == LATE_STATE:
                late[g] = value
        self.late.restored(late)
        self._restored_spans(spans)
        owned = self.mark_keys
        self.wm = (min(marks[g] for g in owned) if owned and all(g in marks for g in owned)
                   else NO_WATERMARK)
        self.ahead = {g: v for g, v in marks.items() if v > self.wm}

    def _restored_spans(self, spans: set) -> None:
        """Sliding windows: a checkpoint taken before they were kept as panes holds whole
        windows (any subtask's, after a rescale: beside panes): a window fires as the
        merge of its whole window, if any, and its panes, so whole windows drain as they
        fire.  A state holding panes restored where panes cannot serve (allowed lateness,
        another aggregate, since) is refused, naming the operator."""
        a = self.assigner
        if not spans or type(a) is not Sliding or not a.exact or a.slide >= a.size:
            return
        if self.panes:
            self.whole = any(x != a.slide for x in spans)
        elif a.slide in spans:
            raise ValueError(
                f"window operator {self.uid!r}: the checkpoint holds its sliding windows "
                f"as panes (one slide each), which serve only windows without "
                f"allowed_lateness counting or summarizing (sum, min, max, mean); the "
                f"pipeline now has allowed_lateness={self.lateness!r} and "
                f"{self.agg.name}: restore it as it was, or start it without this "
                f"checkpoint")


class WindowCombine(Operator):
    """The local half of a tumbling-window aggregation of records (two-phase, planned by
    :func:`cutline.plan.plan` for windows without allowed lateness whose late records are
    dropped, with an aggregate that merges): the records of windows still open by the
    watermark this task has sent on are added per key and window into accumulators, held,
    and sent as :class:`~cutline.logical.WindowPartial` before the watermark that reaches
    their window's end (:meth:`on_watermark`), a barrier, the task going idle, the end of
    input, or when it holds ``MAX_KEYS`` windows; a record of a window the watermark
    reached, or one a user function fails on, goes on as it is, and the window operator
    decides on it as on any record.  No state: a snapshot never finds anything held."""

    flushes = True
    MAX_KEYS = 100_000

    def __init__(self, node: Node) -> None:
        super().__init__(node)
        if node.key_fn is None:
            raise ValueError(f"window operator {node.uid!r} has no key function")
        spec: WindowSpec = node.fn
        a = spec.assigner
        assert isinstance(a, Tumbling) and a.exact  # (the planner combines these only)
        self.key_fn: Callable[[Any], Any] = fast_key(node.key_fn)
        self.ts_fn, self.agg = spec.ts_fn, spec.aggregate
        self.size, self.offset = a.size, a.offset
        self.wm: float = NO_WATERMARK  # the watermark sent on after this operator
        # window end -> key -> [accumulator, records, latest time] (one start per end)
        self.held: dict[Any, dict[Any, list]] = {}
        self.starts: dict[Any, Any] = {}  # window end -> its start
        self.count = 0  # windows held

    def process(self, batch: list) -> list:
        out: list = []
        emit = out.append
        key_fn, ts_fn, agg = self.key_fn, self.ts_fn, self.agg
        value_fn, create, add = agg.value, agg.create, agg.add
        counting = agg.name == "count"
        size, offset, wm, held = self.size, self.offset, self.wm, self.held
        floor, w = math.floor, _NO_WINDOW
        for record in batch:
            try:
                k = key_fn(record)
                ts = ts_fn(record)
                t = type(ts)
                if t is not int and (t is not float or ts != ts or ts == _INF or ts == -_INF):
                    ts = to_timestamp(ts)
                if not w[0] <= ts < w[1]:  # not the previous record's window
                    w = window_of(ts, offset, size, floor)  # (named as the operator does)
                start, end = w
                if end <= wm:  # due where this task runs: the window operator decides
                    emit(record)
                    continue
                v = None if counting else (record if value_fn is None else value_fn(record))
            except Exception:  # noqa: BLE001 - the window operator fails or dead-letters it
                emit(record)
                continue
            windows = held.get(end)
            if windows is None:
                held[end] = windows = {}
                self.starts[end] = start
            slot = windows.get(k)
            if slot is None:
                windows[k] = [1 if counting else add(create(), v), 1, ts]
                self.count += 1
                continue
            slot[0] = slot[0] + 1 if counting else add(slot[0], v)
            slot[1] += 1
            if ts > slot[2]:
                slot[2] = ts
        if self.count >= self.MAX_KEYS:
            out.extend(self.flush())
        return out

    def _sent(self, ends: list) -> list:
        out: list = []
        for end in ends:
            start = self.starts.pop(end)
            for k, (acc, n, ts) in self.held.pop(end).items():
                out.append(WindowPartial(k, start, end, acc, n, ts))
        self.count -= len(out)
        return out

    def on_watermark(self, ts: float) -> list:
        """The partials of the windows that watermark ``ts`` reaches (``end <= ts``) go on
        before it does (downstream no window operator's watermark passes a held partial's
        window: it is never ahead of what this task sends); the others stay held."""
        self.wm = ts
        if not self.held:
            return []
        return self._sent(sorted(e for e in self.held if e <= ts))

    def flush(self) -> list:
        return self._sent(sorted(self.held)) if self.held else []


class WindowResults(Operator):
    """The results of the window operator before it (its late records go to
    :class:`WindowLate`)."""

    def __init__(self, node: Node) -> None:
        super().__init__(node)
        self.split = bool(node.fn.emit_late)

    def process(self, batch: list) -> list:
        if not self.split:
            return batch
        return [r for r in batch if type(r) is not LateRecord]


class WindowLate(Operator):
    """``windowed.late()``: the records the window operator before it found too late."""

    def process(self, batch: list) -> list:
        return [r.record for r in batch if type(r) is LateRecord]
