"""Event-time watermarks, sans-IO: the items that carry them, how a task combines its
inputs' watermarks, and how a timestamp assigner makes them.

* :class:`Watermark` and :data:`IDLE` (an :class:`InputIdle`) travel **inside record
  batches**, FIFO with records, on every channel.  The snapshot protocol does not know them:
  to a handler they are records, so an aligned checkpoint blocks them with their channel and
  an unaligned one records them as channel state.  That makes watermarks part of the
  consistent cut.
* :class:`WatermarkTracker`: a task's watermark is the minimum over its open, active input
  channels, and never goes back.  An idle channel (its source said :data:`IDLE`) does not
  hold the minimum back until a record or a watermark arrives on it again; a closed
  channel does not either; all channels closed -> ``math.inf``.
* Generators: :class:`BoundedOutOfOrderness` (Spark's ``withWatermark``: the largest
  timestamp seen minus ``max_delay``) and the :class:`WatermarkGenerator` protocol a custom
  generator follows.

Times are seconds (int or float, epoch seconds for timestamps); :func:`to_timestamp` and
:func:`to_duration` turn what users pass (``datetime``, ``timedelta``) into them.  Window
semantics follow Spark: a window ``[start, end)`` fires when ``watermark >= end``.

Nothing here imports the runtime: the simulator and the Spark runtime drive these objects.
"""

from __future__ import annotations

import datetime as _dt
import math
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

__all__ = ["BoundedOutOfOrderness", "IDLE", "InputIdle", "NO_WATERMARK", "Watermark",
           "WatermarkGenerator", "WatermarkTracker", "decode_ts", "encode_ts", "is_time_item",
           "SubtaskAlignment", "next_split", "paused_by_alignment", "restored_ts",
           "split_watermark", "to_duration", "to_timestamp"]

#: The watermark before any: every timestamp is later.
NO_WATERMARK = -math.inf


@dataclass(frozen=True, slots=True)
class Watermark:
    """No record with a timestamp ``<= ts`` is expected any more on this channel (records
    that still come are *late*).  Travels in band, FIFO with records."""

    ts: float


@dataclass(frozen=True, slots=True)
class InputIdle:
    """The channel's sender has had no input for its ``idle_timeout``: downstream stops
    holding its watermark back for this channel until a record or a watermark arrives on
    it again.  Use the singleton :data:`IDLE`."""


IDLE = InputIdle()

_TIME_ITEMS = (Watermark, InputIdle)


def is_time_item(item: Any) -> bool:
    """True for a :class:`Watermark` or :class:`InputIdle` (items that are not records)."""
    return type(item) in _TIME_ITEMS


# --------------------------------------------------------------------------- units


def to_timestamp(value: Any, *, finite: bool = True) -> float:
    """``value`` as epoch seconds: an int/float (not NaN, not bool, and with ``finite`` not
    infinite: an infinite event time would take the watermark to the end of time), or a
    ``datetime`` (aware, or naive meaning UTC).  Anything else raises ``TypeError`` /
    ``ValueError`` naming what it got."""
    t = type(value)
    if t is float:
        if value - value:  # NaN or an infinity (inf - inf is NaN): one test on the hot path
            return _not_finite(value, finite)
        return value
    if t is int:
        return value
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=_dt.timezone.utc)
        return value.timestamp()
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        f = float(value)
        if f - f:
            return _not_finite(f, finite)
        return f
    raise TypeError(f"a timestamp must be a number of seconds or a datetime, "
                    f"not {type(value).__name__} {value!r}")


def _not_finite(value: float, finite: bool) -> float:
    if value != value:
        raise ValueError("timestamp is NaN")
    if finite:
        raise ValueError(f"timestamp {value!r} is not a finite number")
    return value


def to_duration(value: Any, name: str, *, positive: bool = False,
                allow_none: bool = False) -> float | None:
    """``value`` (seconds as int/float, or a ``timedelta``) as seconds, for the argument
    ``name``: NaN, infinite, negative (or, with ``positive``, zero) values and other types are
    refused with a ``ValueError`` / ``TypeError`` naming ``name``."""
    if value is None and allow_none:
        return None
    if isinstance(value, _dt.timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise TypeError(f"{name} must be seconds (int or float) or a timedelta, "
                        f"not {type(value).__name__} {value!r}")
    if seconds != seconds or math.isinf(seconds):
        raise ValueError(f"{name} must be a finite number of seconds, got {value!r}")
    if seconds < 0 or (positive and seconds == 0):
        raise ValueError(f"{name} must be {'> 0' if positive else '>= 0'} seconds, "
                         f"got {value!r}")
    return seconds


# --------------------------------------------------------------------------- tracker


class WatermarkTracker:
    """The combined watermark of a task's input channels.

    Per channel: its watermark, whether it is idle, whether it is closed.  The combined
    watermark (:attr:`current`) is the minimum over open, active channels; it never goes
    back.  When every open channel is idle it stays where it is (:attr:`all_idle` says so:
    the task then tells its own outputs it is idle).  When every channel is closed it is
    ``math.inf``.  Each method returns the new combined watermark when it advanced, else
    ``None``.

    A watermark that went to ``math.inf`` (the end of input) keeps its last real (finite)
    value beside it (:attr:`real`, per channel too): a restore takes that one
    (:func:`restored_ts`), so a job continued with new input goes on from there.
    """

    __slots__ = ("_wm", "_idle", "_closed", "_real", "current", "real")

    def __init__(self, channels: Iterable[Hashable]) -> None:
        self._wm: dict[Hashable, float] = {ch: NO_WATERMARK for ch in channels}
        self._idle: set[Hashable] = set()
        self._closed: set[Hashable] = set()
        self._real: dict[Hashable, float] = {}  # channel -> its last finite, once at inf
        self.current: float = NO_WATERMARK
        self.real: float = NO_WATERMARK  # the last finite :attr:`current`, once it is inf

    @property
    def channels(self) -> list[Hashable]:
        return list(self._wm)

    def watermark_of(self, ch: Hashable) -> float:
        return self._wm[ch]

    def is_idle(self, ch: Hashable) -> bool:
        return ch in self._idle

    def is_closed(self, ch: Hashable) -> bool:
        return ch in self._closed

    @property
    def all_idle(self) -> bool:
        """Every open channel is idle (and at least one is)."""
        n_open = len(self._wm) - len(self._closed)
        return n_open > 0 and len(self._idle) == n_open

    def on_watermark(self, ch: Hashable, ts: float) -> float | None:
        """``Watermark(ts)`` arrived on ``ch``: it is active again; its watermark rises to
        ``ts`` (a lower one is ignored: a channel's watermark never goes back)."""
        self._idle.discard(ch)
        old = self._wm[ch]
        if ts > old:
            if ts == math.inf:
                self._real[ch] = old
            self._wm[ch] = ts
        return self._advance()

    def on_idle(self, ch: Hashable) -> float | None:
        """:data:`IDLE` arrived on ``ch``: it stops holding the minimum back."""
        if ch not in self._closed:
            self._idle.add(ch)
        return self._advance()

    def on_active(self, ch: Hashable) -> float | None:
        """A record arrived on ``ch``: if it was idle it holds the minimum again (at its last
        watermark; the combined watermark does not go back, so its records may be late).
        When every other open channel was idle too, the combined watermark may now rise to
        ``ch``'s (as Flink's valve does): the caller advances *before* the record, since
        that watermark came ahead of it on ``ch``."""
        if ch not in self._idle:
            return None
        self._idle.discard(ch)
        return self._advance()

    def on_close(self, ch: Hashable) -> float | None:
        """``ch`` ended (EOF): it no longer holds the minimum back."""
        self._closed.add(ch)
        self._idle.discard(ch)
        return self._advance()

    def _advance(self) -> float | None:
        closed, idle = self._closed, self._idle
        low = math.inf
        active = False
        for ch, wm in self._wm.items():
            if ch in closed or ch in idle:
                continue
            active = True
            if wm < low:
                low = wm
        if not active and len(closed) < len(self._wm):
            return None  # every open channel idle: hold
        if low > self.current:
            if low == math.inf:
                self.real = self._last_real()
            self.current = low
            return low
        return None

    def _last_real(self) -> float:
        """At the end of input: the lowest last real watermark of the channels that had
        one (a channel whose sender had no input holds nothing back at the end), at least
        the combined one before.  The task acts on it before ``inf`` (:class:`EventTime
        <cutline.runtime.chain.EventTime>`), so the last real watermark of every operator
        is the same whichever input ended last."""
        real = self._real
        low = min((real.get(ch, wm) for ch, wm in self._wm.items()
                   if real.get(ch, wm) > NO_WATERMARK), default=NO_WATERMARK)
        return low if low > self.current else self.current

    # ------------------------------------------------------------------ checkpoints

    def snapshot(self) -> dict[str, Any]:
        """The tracker's state, msgpack/JSON-able: ``{"current": wm, "channels": {str(ch):
        [wm, idle]}}`` (``None`` stands for no watermark yet, ``"inf"`` for the end).
        Closed flags are not kept: after a restore every channel is open again and its
        sender ends it again.  At the end of input, ``"real": {"current": wm, "channels":
        {str(ch): wm}}`` too: the last real watermarks of those that are ``"inf"``."""
        out: dict[str, Any] = {"current": encode_ts(self.current),
                               "channels": {str(ch): [encode_ts(wm), ch in self._idle]
                                            for ch, wm in self._wm.items()}}
        if self.current == math.inf or self._real:
            out["real"] = {"current": encode_ts(self.real),
                           "channels": {str(ch): encode_ts(wm)
                                        for ch, wm in self._real.items()}}
        return out

    def restore(self, state: Mapping[str, Any]) -> None:
        """Take the state :meth:`snapshot` returned (of a tracker with the same channels, by
        ``str(ch)``; channels it does not name keep no watermark, names it has that this
        tracker lacks are ignored).  A watermark at the end of input restores as its last
        real one (:func:`restored_ts`)."""
        by_name = {str(ch): ch for ch in self._wm}
        real = state.get("real") or {}
        reals = real.get("channels") or {}
        self.current = restored_ts(state.get("current"), real, "current")
        self.real = NO_WATERMARK
        self._real.clear()
        self._idle.clear()
        self._closed.clear()
        for name, (wm, idle) in state.get("channels", {}).items():
            ch = by_name.get(name)
            if ch is None:
                continue
            self._wm[ch] = restored_ts(wm, reals, name)
            if idle:
                self._idle.add(ch)

    def copy(self) -> "WatermarkTracker":
        """An independent copy (the model checker copies a task's state at every step)."""
        c = WatermarkTracker(())
        c._wm, c._idle, c._closed = dict(self._wm), set(self._idle), set(self._closed)
        c._real, c.current, c.real = dict(self._real), self.current, self.real
        return c

    def restore_rescaled(self, floor: float | Mapping[Any, float]) -> None:
        """After a rescale: every channel starts at ``floor`` (or ``floor[ch]``; a channel
        it does not name at the lowest of them), at most what its old receivers had, so
        nothing fires early; the combined watermark is their minimum."""
        per: Mapping[Any, float] = floor if isinstance(floor, Mapping) else {}
        low = min(per.values(), default=NO_WATERMARK) if isinstance(floor, Mapping) \
            else floor
        self._idle.clear()
        self._closed.clear()
        self._real.clear()
        for ch in self._wm:
            self._wm[ch] = per.get(ch, low)
        self.current = min(self._wm.values(), default=low)


def encode_ts(ts: float) -> float | str | None:
    """A watermark for a checkpoint (msgpack/JSON): ``None`` for none yet, ``"inf"`` for
    the end, else the number."""
    if ts == NO_WATERMARK:
        return None
    if ts == math.inf:
        return "inf"
    return ts


def decode_ts(v: Any) -> float:
    """The watermark :func:`encode_ts` encoded."""
    if v is None:
        return NO_WATERMARK
    if v == "inf":
        return math.inf
    return float(v) if not isinstance(v, int) else v


def restored_ts(v: Any, real: Mapping[Any, Any] | None = None, name: Any = None) -> float:
    """A checkpointed watermark ``v`` (:func:`encode_ts`) as a restore takes it.

    ``"inf"`` is the end of *that run's* input, not a time: restored as it is, no record of
    a continued run (new input files, say) would ever be on time, and no window would fire
    again.  So it restores as the last real watermark kept beside it, ``real[name]`` (an
    old checkpoint without one: ``inf`` as before).  What the end of input fired is
    remembered where it fired (the window operators' fired windows; event-time timers
    fired at the end of input stay fired)."""
    ts = decode_ts(v)
    if ts != math.inf or real is None or name not in real:
        return ts
    return decode_ts(real[name])


# --------------------------------------------------------------------------- splits

_Split = TypeVar("_Split", bound=Hashable)
_SplitIn = TypeVar("_SplitIn", contravariant=True)


class WatermarkOf(Protocol[_SplitIn]):
    """Each split's watermark, looked up with a default (a ``dict`` of split -> timestamp,
    or a live view such as the timestamp assigner's)."""

    def get(self, key: _SplitIn, default: float, /) -> float: ...



def split_watermark(splits: Iterable[_Split], watermark_of: WatermarkOf[_Split]) -> float:
    """The watermark of a source subtask that reads ``splits`` (its *unfinished* splits: a
    file, a generator split, a partition; the ones not begun yet included): the lowest of
    their watermarks, a split not in ``watermark_of`` (no record read yet) at
    :data:`NO_WATERMARK`.  So a split that has not started holds the subtask back, and a
    finished one (not in ``splits``) does not (Flink's per-split watermarks, FLIP-27)."""
    low = math.inf
    get = watermark_of.get
    for s in splits:
        wm = get(s, NO_WATERMARK)
        if wm < low:
            low = wm
            if wm == NO_WATERMARK:
                break
    return low


def next_split(splits: Iterable[_Split],
               watermark_of: WatermarkOf[_Split]) -> _Split | None:
    """Split-level watermark alignment (Flink's FLIP-217, at its tightest): of ``splits``
    (the unfinished ones, in reading order), the one to read a batch from next is the one
    whose watermark is lowest (the first such in order): a split not begun first, then
    always the one furthest behind.  Every other split is paused, so no split runs ahead
    of the slowest by more than the event time one batch covers, and what the operators
    downstream hold open (windows, timers) spans that, not the input.  None: no split."""
    best, low = None, math.inf
    get = watermark_of.get
    for s in splits:
        wm = get(s, NO_WATERMARK)
        if best is None or wm < low:
            best, low = s, wm
            if wm == NO_WATERMARK:
                break
    return best


class SubtaskAlignment:
    """Watermark alignment across the subtasks of a source (``assign_timestamps(
    max_drift=)``, Flink's FLIP-182), the driver's part: each member reports its watermark
    and whether it is idle (an idle assigner, or no split to read); the *floor* is the
    lowest watermark of the members that are neither idle nor finished (``inf``), once
    every member has reported (when all are, the highest of theirs: none waits).
    :meth:`on_report` returns the floor when it rose: the driver sends it to the members,
    and each pauses reading while its own watermark is more than its ``max_drift`` above
    it.  The floor never goes back (a member that comes back from idleness behind it does
    not stop the others again: they are already ahead)."""

    __slots__ = ("members", "_wm", "_idle", "sent")

    def __init__(self, members: Iterable[Hashable]) -> None:
        self.members: tuple[Hashable, ...] = tuple(members)
        self._wm: dict[Hashable, float] = {}
        self._idle: set[Hashable] = set()
        self.sent: float | None = None  # the last floor handed out

    def on_report(self, member: Hashable, watermark: float, idle: bool) -> float | None:
        """``member``'s latest watermark and idleness: the new floor when it rose."""
        self._wm[member] = watermark
        if idle:
            self._idle.add(member)
        else:
            self._idle.discard(member)
        if len(self._wm) < len(self.members):
            return None  # someone has not reported yet: it may be the slowest
        active = [wm for mm, wm in self._wm.items()
                  if mm not in self._idle and wm != math.inf]
        if active:
            floor = min(active)
        else:  # every member idle or finished: none holds another back
            floor = max((wm for wm in self._wm.values() if wm != math.inf), default=math.inf)
        if self.sent is not None and floor <= self.sent:
            return None
        self.sent = floor
        return floor

    def reset(self) -> None:
        """A new attempt: its members report afresh (a restore may go back in time)."""
        self._wm.clear()
        self._idle.clear()
        self.sent = None


def paused_by_alignment(own: float, floor: float | None, max_drift: float | None) -> bool:
    """A source subtask with watermark ``own`` waits (reads nothing) while it is more than
    ``max_drift`` ahead of its group's ``floor`` (None: no floor yet, read on; no
    ``max_drift``: not aligned, read on)."""
    return floor is not None and max_drift is not None and own > floor + max_drift


# --------------------------------------------------------------------------- generators


@runtime_checkable
class WatermarkGenerator(Protocol):
    """What ``assign_timestamps(..., watermark=g)`` accepts.

    ``on_event(ts)`` sees every record's timestamp (seconds); ``current()`` is the
    watermark after them (``-math.inf`` for none yet); the assigner emits it after each
    batch when it rose.  ``snapshot()`` / ``restore(state)`` (optional; msgpack-able state)
    keep it across restores; a generator without them restarts empty after a restore and
    its watermark never goes back (the assigner keeps the last it emitted).
    A generator object is copied for every subtask (deepcopy) before use.
    """

    def on_event(self, ts: float) -> None: ...

    def current(self) -> float: ...


class BoundedOutOfOrderness:
    """Spark's ``withWatermark(col, delay)`` / Flink's bounded out-of-orderness: the
    watermark is the largest timestamp seen minus ``max_delay`` seconds."""

    __slots__ = ("max_delay", "max_ts")

    def __init__(self, max_delay: Any = 0) -> None:
        delay = to_duration(max_delay, "max_delay")
        assert delay is not None
        self.max_delay: float = delay
        self.max_ts: float = NO_WATERMARK

    def on_event(self, ts: float) -> None:
        if ts > self.max_ts:
            self.max_ts = ts

    def current(self) -> float:
        return self.max_ts - self.max_delay

    def snapshot(self) -> Any:
        return encode_ts(self.max_ts)

    def restore(self, state: Any) -> None:
        self.max_ts = decode_ts(state)

    def __repr__(self) -> str:
        return f"BoundedOutOfOrderness(max_delay={self.max_delay!r})"
