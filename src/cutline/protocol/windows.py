"""Event-time windows, sans-IO: which windows a timestamp falls in, and how sessions merge.

* :func:`tumbling` ``(size, offset=0)``: windows ``[offset + k*size, offset + (k+1)*size)``;
  every timestamp is in exactly one.
* :func:`sliding` ``(size, slide, offset=0)``: windows of ``size`` starting every ``slide``;
  a timestamp is in ``size / slide`` of them when ``slide`` divides ``size`` (else in
  ``floor`` or ``ceil`` of it), as Spark's ``window(col, size, slide)``.
* :func:`session` ``(gap)``: a record opens ``[ts, ts + gap)``; windows that overlap or touch
  merge into one (Flink's ``MergingWindowSet`` / ``TimeWindow.mergeWindows``): a session
  ends after ``gap`` seconds without records.  :func:`merge_into` says which windows a new
  one merges with; the final sessions of a set of timestamps do not depend on the order
  they arrive in.

Windows are half open, ``[start, end)``, and follow Spark: a window fires when the
watermark reaches ``end`` (:mod:`cutline.protocol.watermarks`).  Durations are seconds
(int or float) or ``datetime.timedelta``; window bounds are ints when they are whole
numbers, so ``60`` and ``60.0`` name the same window in the same way.

:class:`WindowResult` ``(key, start, end, value)`` is what a windowed aggregate emits per
key and window (a ``NamedTuple``: ``_asdict()`` gives a row for a sink).

What is computed per key and window is an :class:`Aggregate` (an accumulator: create, add,
merge, result): :func:`counting`, :func:`summarizing` (sum / min / max / mean of a field or
of a function of the record), :func:`reducing`, :func:`aggregating` (the user's own) and
:func:`applying` (a function of all the window's records).  A :class:`WindowSpec` is the
whole definition the window operator runs.

Nothing here does I/O or imports the runtime.
"""

from __future__ import annotations

import datetime as _dt
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

__all__ = ["Aggregate", "Session", "Sliding", "TimeWindow", "Tumbling", "WindowAssigner",
           "WindowResult", "WindowSpec", "aggregating", "applying", "columns", "counting",
           "merge_into", "merge_partial", "merge_windows", "reducing", "session", "sliding",
           "summarizing", "tumbling", "window_time"]


class TimeWindow(NamedTuple):
    """The half-open interval ``[start, end)`` of event time (seconds)."""

    start: float
    end: float

    def intersects(self, other: tuple[float, float]) -> bool:
        """Overlapping or touching (Flink's rule: sessions ``[0, 10)`` and ``[10, 20)``
        merge, a record 10 s after another with ``gap=10`` continues its session)."""
        return self.start <= other[1] and other[0] <= self.end

    def cover(self, other: tuple[float, float]) -> "TimeWindow":
        """The smallest window holding both."""
        return TimeWindow(min(self.start, other[0]), max(self.end, other[1]))


class WindowResult(NamedTuple):
    """One window's result for one key: emitted when the watermark passes ``end`` (and again,
    updated, for each late record within ``allowed_lateness``)."""

    key: Any
    start: float
    end: float
    value: Any


def window_time(result: WindowResult) -> float:
    """A window result's event time, for a timed operator after a window: the last instant
    of its window, ``end - 1e-6`` (Spark's ``window_time``), so a result falls in the
    downstream window that holds its own."""
    return result.end - 1e-6


def _whole(x: Any) -> Any:
    """``x`` as an int when it is a whole float (window bounds compare and print alike)."""
    if type(x) is float and x.is_integer():
        return int(x)
    return x


def duration(value: Any, name: str, *, positive: bool = True) -> float:
    """``value`` (seconds as int/float, or a ``timedelta``) checked for the argument
    ``name``: a ``TypeError`` / ``ValueError`` naming ``name`` for other types, NaN,
    infinity, negative values, or (``positive``) zero.  Whole numbers come back as int."""
    if isinstance(value, _dt.timedelta):
        seconds: Any = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = value
    else:
        raise TypeError(f"{name} must be seconds (int or float) or a timedelta, "
                        f"not {type(value).__name__} {value!r}")
    if seconds != seconds:
        raise ValueError(f"{name} must be a number of seconds, got NaN")
    if math.isinf(seconds):
        raise ValueError(f"{name} must be a finite number of seconds, got {value!r}")
    if seconds < 0 or (positive and seconds == 0):
        raise ValueError(f"{name} must be {'> 0' if positive else '>= 0'} seconds, "
                         f"got {value!r}")
    return _whole(seconds)


def _offset(value: Any, name: str, period: float, period_name: str) -> float:
    if isinstance(value, _dt.timedelta):
        value = value.total_seconds()
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise TypeError(f"{name} must be seconds (int or float) or a timedelta, "
                        f"not {type(value).__name__} {value!r}")
    if value != value or math.isinf(value):
        raise ValueError(f"{name} must be a finite number of seconds, got {value!r}")
    if abs(value) >= period:
        raise ValueError(f"{name} must be smaller than {period_name} ({period!r}) in "
                         f"absolute value, got {value!r}")
    return _whole(value)


def _dyadic(x: Any) -> bool:
    """``x`` is a whole number or a float with few binary fraction digits (0.5, 0.25):
    the grid ``offset + k * size`` is then exact in floats, so :func:`_latest_start` names
    every timestamp's window with the same bounds (``ts - (ts - offset) % size`` does not:
    the subtraction rounds for fractional ``ts``).  ``0.1`` is not (``3 * 0.1 != 0.3``):
    see :func:`_on_grid`."""
    return type(x) is int or (x * 2**20).is_integer()


_NS = 1_000_000_000
# sliding windows a record may fall in: each is an accumulator to update per record
MAX_WINDOWS_PER_RECORD = 10_000


def _ns(x: Any) -> int:
    """Seconds as whole nanoseconds (sizes that binary floats do not hold, see :func:`_dyadic`)."""
    return round(x * _NS)


def _on_grid(offset: int, k: int, step: int, plus: int = 0) -> Any:
    """The window bound ``offset + k * step + plus`` (nanoseconds) in seconds, correctly
    rounded: a function of ``k``, so every record of a window names the same bounds, the end
    of a window is the start of the next, and ``3 * 0.1`` is ``0.3`` as the user wrote it."""
    return _whole((offset + k * step + plus) / _NS)


def _last_start(ts: float, offset: int, step: int) -> int:
    """The ``k`` with ``_on_grid(offset, k, step) <= ts < _on_grid(offset, k + 1, step)``."""
    k = math.floor((ts - offset / _NS) / (step / _NS))
    while _on_grid(offset, k, step) > ts:
        k -= 1
    while _on_grid(offset, k + 1, step) <= ts:
        k += 1
    return k


def _latest_start(ts: float, offset: Any, step: Any) -> Any:
    """The latest ``offset + k * step <= ts``, as ``offset + k * step``: exact when both
    are whole or dyadic (:func:`_dyadic`).  (``ts - (ts - offset) % step`` is not: with a
    fractional ``ts`` the subtraction rounds, ``-376`` became ``-375.99999999999994`` and
    one window had two names.)"""
    k = math.floor((ts - offset) / step)
    start = offset + k * step
    if start > ts:
        start -= step
    elif start + step <= ts:
        start += step
    return _whole(start)


class WindowAssigner(ABC):
    """Which windows a timestamp falls in.  ``merging``: windows of one key merge
    (sessions; see :func:`merge_into`).  ``exact``: bounds computed in plain float
    arithmetic (see :func:`_dyadic`)."""

    merging = False
    exact = True

    def assign(self, ts: float) -> tuple[TimeWindow, ...]:
        """The windows holding ``ts``, by start (ascending)."""
        return tuple(TimeWindow(s, e) for s, e in self.bounds(ts))

    @abstractmethod
    def bounds(self, ts: float) -> list[tuple[Any, Any]]:
        """:meth:`assign` as plain ``(start, end)`` tuples (equal, and hashing equal, to
        the :class:`TimeWindow` s): what the window operator keys its state by."""

    def end_of(self, start: Any) -> Any:
        """The end of the window that starts at ``start`` (tumbling and sliding)."""
        raise NotImplementedError(f"{self!r} windows have no fixed size")

    @abstractmethod
    def signature(self) -> str:
        """What identifies the windows in a checkpoint (a restore into different windows is
        refused): e.g. ``tumbling(size=60, offset=0)``."""

    def __repr__(self) -> str:
        return self.signature()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, WindowAssigner) and type(other) is type(self) and \
            other.signature() == self.signature()

    def __hash__(self) -> int:
        return hash(self.signature())


class Tumbling(WindowAssigner):
    """Fixed, non-overlapping windows of ``size`` seconds, aligned to ``offset``."""

    __slots__ = ("size", "offset", "exact", "_grid")

    def __init__(self, size: Any, offset: Any = 0) -> None:
        self.size = duration(size, "tumbling(size=...)")
        self.offset = _offset(offset, "tumbling(offset=...)", self.size, "size")
        self.exact = _dyadic(self.size) and _dyadic(self.offset)
        self._grid = (_ns(self.offset), _ns(self.size))

    def bounds(self, ts: float) -> list[tuple[Any, Any]]:
        if not self.exact:
            offset, size = self._grid
            k = _last_start(ts, offset, size)
            return [(_on_grid(offset, k, size), _on_grid(offset, k + 1, size))]
        start = _latest_start(ts, self.offset, self.size)
        return [(start, _whole(start + self.size))]

    def end_of(self, start: Any) -> Any:
        if not self.exact:
            offset, size = self._grid
            return _on_grid(offset, round((start - self.offset) / self.size) + 1, size)
        return _whole(start + self.size)

    def signature(self) -> str:
        return f"tumbling(size={self.size!r}, offset={self.offset!r})"


class Sliding(WindowAssigner):
    """Windows of ``size`` seconds starting every ``slide`` seconds (aligned to ``offset``):
    overlapping when ``slide < size``; ``slide == size`` is tumbling."""

    __slots__ = ("size", "slide", "offset", "_n", "exact", "_grid")

    def __init__(self, size: Any, slide: Any, offset: Any = 0) -> None:
        self.size = duration(size, "sliding(size=...)")
        self.slide = duration(slide, "sliding(slide=...)")
        if self.slide > self.size:
            raise ValueError(f"sliding(slide=...) must be <= size ({self.size!r}): a slide "
                             f"of {self.slide!r} leaves gaps no window covers")
        self.offset = _offset(offset, "sliding(offset=...)", self.slide, "slide")
        self._n = math.ceil(self.size / self.slide)  # at most this many windows per ts
        if self._n > MAX_WINDOWS_PER_RECORD:
            raise ValueError(
                f"sliding(slide=...) of {self.slide!r} puts every record in {self._n:,} "
                f"windows of size {self.size!r} (at most {MAX_WINDOWS_PER_RECORD:,}): choose a "
                f"slide of at least {self.size / MAX_WINDOWS_PER_RECORD:g} s")
        self.exact = _dyadic(self.size) and _dyadic(self.slide) and _dyadic(self.offset)
        self._grid = (_ns(self.offset), _ns(self.slide), _ns(self.size))

    def bounds(self, ts: float) -> list[tuple[Any, Any]]:
        size, slide = self.size, self.slide
        if not self.exact:  # windows j, j-1, ... while they reach past ts
            offset, step, length = self._grid
            j, out = _last_start(ts, offset, step), []
            while (end := _on_grid(offset, j, step, length)) > ts:
                out.append((_on_grid(offset, j, step), end))
                j -= 1
            return out[::-1]
        last = _latest_start(ts, self.offset, slide)
        if type(last) is int and type(slide) is int and type(size) is int:  # exact
            return [(s, s + size) for s in range(last - (self._n - 1) * slide, last + 1, slide)
                    if s + size > ts]
        out = []
        for i in range(self._n - 1, -1, -1):
            start = last - i * slide
            if start + size > ts:
                start = _whole(start)
                out.append((start, _whole(start + size)))
        return out

    def end_of(self, start: Any) -> Any:
        if not self.exact:
            offset, step, length = self._grid
            return _on_grid(offset, round((start - self.offset) / self.slide), step, length)
        return _whole(start + self.size)

    def signature(self) -> str:
        return f"sliding(size={self.size!r}, slide={self.slide!r}, offset={self.offset!r})"


class Session(WindowAssigner):
    """A window per activity burst: a record at ``ts`` opens ``[ts, ts + gap)``; windows of
    one key that overlap or touch merge."""

    __slots__ = ("gap",)
    merging = True

    def __init__(self, gap: Any) -> None:
        self.gap = duration(gap, "session(gap=...)")

    def bounds(self, ts: float) -> list[tuple[Any, Any]]:
        ts = _whole(ts)
        return [(ts, _whole(ts + self.gap))]

    def signature(self) -> str:
        return f"session(gap={self.gap!r})"


def tumbling(size: Any, offset: Any = 0) -> Tumbling:
    """Tumbling windows of ``size`` seconds (or a ``timedelta``) starting at
    ``offset + k * size``."""
    return Tumbling(size, offset)


def sliding(size: Any, slide: Any, offset: Any = 0) -> Sliding:
    """Sliding windows of ``size`` seconds starting every ``slide`` seconds (``0 < slide <=
    size``)."""
    return Sliding(size, slide, offset)


def session(gap: Any) -> Session:
    """Session windows that close after ``gap`` seconds without records (per key)."""
    return Session(gap)


# --------------------------------------------------------------------------- merging


def merge_into(windows: Iterable[tuple[float, float]],
               new: tuple[float, float]) -> tuple[TimeWindow, list]:
    """Add ``new`` to a key's ``windows`` (pairwise disjoint: the result of earlier
    merges).  Returns ``(result, merged)``: the window ``new`` ends up in, and the existing
    windows (as given) that merge into it, by start (``merged == [result]`` when ``new``
    lies inside an existing window; ``[]`` when it touches none: then ``result == new``).

    The existing windows ``new`` intersects are exactly those ``result`` covers: they are
    disjoint, so none lies between two of them without touching ``new`` too.
    """
    start, end = new
    merged = [w for w in windows if w[0] <= end and start <= w[1]]  # TimeWindow.intersects
    if len(merged) > 1:
        merged.sort()
    for w in merged:
        if w[0] < start:
            start = w[0]
        if w[1] > end:
            end = w[1]
    return TimeWindow(start, end), merged


def merge_windows(windows: Iterable[tuple[float, float]]) -> list[tuple[TimeWindow,
                                                                          list[TimeWindow]]]:
    """Merge any windows (Flink's ``TimeWindow.mergeWindows``): ``[(result, members)]`` by
    start, members by start; windows that overlap or touch, transitively, are one result."""
    out: list[tuple[TimeWindow, list[TimeWindow]]] = []
    for w in sorted(TimeWindow(*w) for w in windows):
        if out and out[-1][0].intersects(w):
            cur, members = out[-1]
            out[-1] = (cur.cover(w), members + [w])
        else:
            out.append((w, [w]))
    return out


# --------------------------------------------------------------------------- aggregates


@dataclass(frozen=True)
class Aggregate:
    """What a window computes, as an accumulator.

    ``create()`` a new accumulator, ``add(acc, value) -> acc`` (``value``: ``value(record)``,
    or the record when ``value`` is None), ``merge(a, b) -> acc`` (session windows merging;
    None: the aggregate cannot merge), ``result(acc)`` the window's value.  ``full``
    (:func:`applying`): the accumulator is the window's records and ``full(key, window,
    records)`` yields the records to emit instead of one :class:`WindowResult`.
    ``name`` identifies the aggregate in a checkpoint (a restore into another is refused).
    """

    name: str
    create: Callable[[], Any]
    add: Callable[[Any, Any], Any]
    merge: Callable[[Any, Any], Any] | None
    result: Callable[[Any], Any]
    value: Callable[[Any], Any] | None = None
    full: Callable[[Any, TimeWindow, list], Iterable[Any] | None] | None = None


def _zero() -> int:
    return 0


def _plus_one(acc: int, _: Any) -> int:
    return acc + 1


def _plus(a: Any, b: Any) -> Any:
    return a + b


def _identity(x: Any) -> Any:
    return x


def _none() -> None:
    return None


def _min(acc: Any, v: Any) -> Any:
    return v if acc is None or v < acc else acc


def _max(acc: Any, v: Any) -> Any:
    return v if acc is None or v > acc else acc


def _merge_min(a: Any, b: Any) -> Any:
    return a if b is None else _min(a, b)


def _merge_max(a: Any, b: Any) -> Any:
    return a if b is None else _max(a, b)


def _mean_zero() -> tuple[Any, int]:
    return (0, 0)


def _mean_add(acc: tuple[Any, int], v: Any) -> tuple[Any, int]:
    return (acc[0] + v, acc[1] + 1)


def _mean_merge(a: tuple[Any, int], b: tuple[Any, int]) -> tuple[Any, int]:
    return (a[0] + b[0], a[1] + b[1])


def _mean_result(acc: tuple[Any, int]) -> Any:
    return acc[0] / acc[1] if acc[1] else None


def counting() -> Aggregate:
    """The number of records."""
    return Aggregate("count", _zero, _plus_one, _plus, _identity, value=None)


class _Field:
    """``record[name]`` for a mapping (a JSON object), else ``getattr(record, name)``."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, record: Any) -> Any:
        if isinstance(record, Mapping):
            return record[self.name]
        return getattr(record, self.name)


def _value_of(what: str, of: Any) -> tuple[Callable[[Any], Any], str]:
    """A field name or a function of the record -> (the function, its description)."""
    if isinstance(of, str):
        return _Field(of), repr(of)
    if callable(of):
        return of, "<function>"
    raise TypeError(f"{what}() takes a field name (str) or a function of the record, "
                    f"got {type(of).__name__} {of!r}")


def summarizing(kind: str, of: Any) -> Aggregate:
    """``kind`` ("sum", "min", "max" or "mean") of ``of`` (a field name, or a function of
    the record).  ``mean`` is a float; ``min``/``max`` of an empty merge are None."""
    value, text = _value_of(kind, of)
    name = f"{kind}({text})"
    if kind == "sum":
        return Aggregate(name, _zero, _plus, _plus, _identity, value)
    if kind == "min":
        return Aggregate(name, _none, _min, _merge_min, _identity, value)
    if kind == "max":
        return Aggregate(name, _none, _max, _merge_max, _identity, value)
    if kind == "mean":
        return Aggregate(name, _mean_zero, _mean_add, _mean_merge, _mean_result, value)
    raise ValueError(f"no aggregate {kind!r}: sum, min, max or mean")


def merge_partial(fn: str, cur: Any, part: Any) -> Any:
    """Two partial aggregates of a column (``None``: none yet) as one: ``count`` and ``sum``
    add, ``min`` / ``max`` keep the extreme, ``mean`` is a ``(sum, count)`` pair."""
    if cur is None:
        return part
    if part is None:
        return cur
    if fn in ("count", "sum"):
        return cur + part
    if fn == "min":
        return part if part < cur else cur
    if fn == "max":
        return part if part > cur else cur
    # mean: (sum, count); a sum of nulls only is None
    total = cur[0] if part[0] is None else part[0] if cur[0] is None else cur[0] + part[0]
    return (total, cur[1] + part[1])


class _Columns:
    """:func:`columns`' accumulator: a list, one partial per aggregate."""

    __slots__ = ("fns",)

    def __init__(self, fns: tuple[str, ...]) -> None:
        self.fns = fns

    def create(self) -> list:
        return [None] * len(self.fns)

    def add(self, acc: list, parts: Any) -> list:
        return [merge_partial(f, a, p) for f, a, p in zip(self.fns, acc, parts)]

    @staticmethod
    def add_one_count(acc: list, parts: Any) -> list:
        """:meth:`add` of a lone ``count`` (a window's hot path: no per-aggregate dispatch)."""
        a = acc[0]
        return [parts[0] if a is None else a + parts[0]]

    @staticmethod
    def result_as_is(acc: list) -> tuple:
        """:meth:`result` without a ``mean``: the partials are the results."""
        return tuple(acc)

    def result(self, acc: list) -> tuple:
        return tuple((a[0] / a[1] if a is not None and a[1] else None) if f == "mean" else a
                     for f, a in zip(self.fns, acc))


def columns(aggs: Iterable[tuple[str, str | None, str]]) -> Aggregate:
    """Named aggregates of columns, ``(output name, column, function)`` each (``count``
    counts rows, its column is ``None``): a batch stream's window, whose operator adds each
    record batch's partial aggregates (a tuple, one per aggregate; mean: ``(sum, count)``)
    with ``add``.  The value is a tuple of the results, in order."""
    aggs = tuple(aggs)
    impl = _Columns(tuple(fn for _, _, fn in aggs))
    name = "columns(" + ", ".join(f"{n}={f}({c or ''})" for n, c, f in aggs) + ")"
    add = impl.add_one_count if impl.fns == ("count",) else impl.add
    result = impl.result if "mean" in impl.fns else impl.result_as_is
    return Aggregate(name, impl.create, add, add, result)


class _Reducing:
    """``reduce(fn)``'s accumulator: ``()`` empty, else ``(value,)`` (a record may be None)."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[Any, Any], Any]) -> None:
        self.fn = fn

    @staticmethod
    def create() -> tuple:
        return ()

    def add(self, acc: tuple, record: Any) -> tuple:
        return (self.fn(acc[0], record),) if acc else (record,)

    def merge(self, a: tuple, b: tuple) -> tuple:
        if not a or not b:
            return a or b
        return (self.fn(a[0], b[0]),)

    @staticmethod
    def result(acc: tuple) -> Any:
        return acc[0] if acc else None


def reducing(fn: Callable[[Any, Any], Any]) -> Aggregate:
    """``fn(a, b)`` over the window's records (in arrival order)."""
    r = _Reducing(fn)
    return Aggregate("reduce", r.create, r.add, r.merge, r.result)


def aggregating(create: Callable[[], Any], add: Callable[[Any, Any], Any],
                merge: Callable[[Any, Any], Any] | None = None,
                result: Callable[[Any], Any] | None = None) -> Aggregate:
    """The user's accumulator: ``create()``, ``add(acc, record) -> acc``, ``merge(a, b) ->
    acc`` (needed by session windows), ``result(acc)`` (default: the accumulator)."""
    return Aggregate("aggregate", create, add, merge, result or _identity)


def _new_list() -> list:
    return []


def _append(acc: list, record: Any) -> list:
    acc.append(record)
    return acc


def applying(fn: Callable[[Any, TimeWindow, list], Iterable[Any] | None]) -> Aggregate:
    """``fn(key, window, records)`` once the window is complete: the records it returns or
    yields are emitted (instead of a :class:`WindowResult`).  Keeps every record of a window
    in state until it fires."""
    return Aggregate("apply", _new_list, _append, _plus, _identity, full=fn)


MAX_PANES = 64  # sliding windows of more slides keep whole windows (a window merges them)
_PANE_AGGREGATES = ("sum(", "min(", "max(", "mean(")  # (summarizing's names; and count)


def sliceable(assigner: WindowAssigner, allowed_lateness: float) -> bool:
    """Windows that panes (slices of one slide) can hold: exact sliding windows whose size
    is a whole number of slides, without allowed lateness (the batch and the per-record
    window operators add their own conditions)."""
    a = assigner
    return (type(a) is Sliding and a.exact and a.slide < a.size
            and not allowed_lateness and (a.size / a.slide).is_integer())


@dataclass
class WindowSpec:
    """A window operator's definition (its logical node's ``fn``): the assigner, how late a
    record may be (``allowed_lateness`` seconds past a window's end: the window is updated
    and its result emitted again), how a record's timestamp is read (``ts_fn``), and the
    aggregate.  ``emit_late``: records later than that are emitted (wrapped) for the late
    side output, else dropped and counted (``on_late="drop"``) or the job fails
    (``on_late="fail"``)."""

    assigner: WindowAssigner
    allowed_lateness: float
    ts_fn: Callable[[Any], Any]
    aggregate: Aggregate
    emit_late: bool = False
    on_late: str = "drop"
    # the planner put a ``combine`` before the exchange (two-phase aggregation): the input
    # holds partial aggregates per key and window, and records the combine sent on as they
    # were (their window was due already where it ran)
    partial: bool = False

    @property
    def panes(self) -> bool:
        """Sliding windows kept as panes (slices of one slide; a window fires as the merge
        of the ``size / slide`` panes it covers, as Flink SQL slices hopping windows): exact
        sliding windows whose size is a whole number of slides (at most
        :data:`MAX_PANES`: a window merges that many), without allowed lateness, counting
        or summarizing (``sum``, ``min``, ``max``, ``mean``: a user's ``reduce`` runs in
        arrival order and a user's ``merge`` may reuse either accumulator, so those keep
        whole windows)."""
        a, name = self.assigner, self.aggregate.name
        return (sliceable(a, self.allowed_lateness)
                and a.size / a.slide <= MAX_PANES and not self.partial  # type: ignore
                and (name == "count" or name.startswith(_PANE_AGGREGATES)))

    def state_signature(self) -> str:
        """What a checkpoint's state of this operator depends on (a restore into another
        signature is refused): the windows and the aggregate, not the lateness.  (Panes
        and whole windows share it: a restore tells them apart by their length,
        :meth:`cutline.runtime.windows.WindowOperator.restore`.)"""
        return f"{self.assigner.signature()}.{self.aggregate.name}"
