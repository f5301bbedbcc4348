"""Watermarks, sans-IO: the tracker, the generators, units (cutline.protocol.watermarks)."""

from __future__ import annotations

import copy
import datetime as dt
import json
import math
import pickle

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cutline.protocol.watermarks import (
    IDLE,
    NO_WATERMARK,
    BoundedOutOfOrderness,
    InputIdle,
    SubtaskAlignment,
    Watermark,
    WatermarkGenerator,
    WatermarkTracker,
    is_time_item,
    paused_by_alignment,
    to_duration,
    to_timestamp,
)

CHANNELS = ["a.0->b.0", "a.1->b.0", "c.0->b.0"]

# one step on a tracker: (what, channel index, timestamp)
steps = st.lists(st.tuples(st.sampled_from(["wm", "idle", "active", "close"]),
                           st.integers(0, len(CHANNELS) - 1),
                           st.integers(-5, 100)), max_size=60)


class Model:
    """The tracker's specification, written the obvious way."""

    def __init__(self) -> None:
        self.wm = {c: NO_WATERMARK for c in CHANNELS}
        self.idle: set = set()
        self.closed: set = set()
        self.out = NO_WATERMARK

    def step(self, what: str, ch: str, ts: int) -> None:
        if what == "wm":
            self.idle.discard(ch)
            self.wm[ch] = max(self.wm[ch], ts)
        elif what == "idle" and ch not in self.closed:
            self.idle.add(ch)
        elif what == "active":
            self.idle.discard(ch)
        elif what == "close":
            self.closed.add(ch)
            self.idle.discard(ch)
        opened = [c for c in CHANNELS if c not in self.closed]
        active = [c for c in opened if c not in self.idle]
        if not opened:
            self.out = math.inf
        elif active:
            self.out = max(self.out, min(self.wm[c] for c in active))


def apply(tracker: WatermarkTracker, what: str, ch: str, ts: int) -> float | None:
    if what == "wm":
        return tracker.on_watermark(ch, ts)
    if what == "idle":
        return tracker.on_idle(ch)
    if what == "active":
        return tracker.on_active(ch)
    return tracker.on_close(ch)


@settings(max_examples=300, deadline=None)
@given(steps)
def test_tracker_is_min_over_open_active_channels_and_never_goes_back(ops):
    t, model = WatermarkTracker(CHANNELS), Model()
    last = t.current
    for what, i, ts in ops:
        before = t.current
        advanced = apply(t, what, CHANNELS[i], ts)
        model.step(what, CHANNELS[i], ts)
        assert t.current == model.out
        assert t.current >= last  # never goes back
        # the return value says exactly when it advanced, and to what
        assert advanced == (t.current if t.current > before else None)
        last = t.current
        n_open = sum(c not in model.closed for c in CHANNELS)
        assert t.all_idle == (n_open > 0 and len(model.idle) == n_open)


@settings(max_examples=200, deadline=None)
@given(steps, steps)
def test_snapshot_restore_round_trip(before, after):
    t = WatermarkTracker(CHANNELS)
    for what, i, ts in before:
        if what != "close":  # closed flags are not kept: after a restore channels reopen
            apply(t, what, CHANNELS[i], ts)
    snap = t.snapshot()
    # msgpack and JSON can carry it
    snap = msgpack.unpackb(msgpack.packb(snap), raw=False)
    assert json.loads(json.dumps(snap)) == snap
    r = WatermarkTracker(CHANNELS)
    r.restore(snap)
    assert r.snapshot() == t.snapshot()
    assert r.current == t.current
    for c in CHANNELS:
        assert r.watermark_of(c) == t.watermark_of(c) and r.is_idle(c) == t.is_idle(c)
    # and both go on the same way
    for what, i, ts in after:
        assert apply(r, what, CHANNELS[i], ts) == apply(t, what, CHANNELS[i], ts)
        assert r.current == t.current


def test_idle_channel_stops_holding_back_and_rejoins():
    t = WatermarkTracker(["x", "y"])
    assert t.on_watermark("x", 10) is None  # y has none yet
    assert t.on_idle("y") == 10
    assert t.all_idle is False
    assert t.on_watermark("x", 20) == 20
    t.on_active("y")  # a record on y: holds again, at its old (no) watermark
    assert t.on_watermark("x", 30) is None
    assert t.current == 20  # never goes back
    assert t.on_watermark("y", 15) is None  # below the combined watermark: no change
    assert t.current == 20
    assert t.on_watermark("y", 25) == 25
    assert t.on_watermark("y", 40) == 30


def test_all_idle_holds_and_all_closed_is_the_end():
    t = WatermarkTracker(["x", "y"])
    t.on_watermark("x", 5)
    t.on_watermark("y", 7)
    assert t.current == 5
    assert t.on_idle("x") == 7
    assert t.on_idle("y") is None and t.all_idle
    assert t.current == 7
    assert t.on_close("x") is None
    assert t.on_close("y") == math.inf
    assert t.all_idle is False


def test_no_channels_is_the_end_at_once():
    t = WatermarkTracker([])
    assert t.current == NO_WATERMARK
    assert t._advance() == math.inf


def test_restore_rescaled_starts_every_channel_at_the_floor():
    t = WatermarkTracker(["x", "y"])
    t.restore_rescaled(12.5)
    assert t.current == 12.5
    assert t.on_watermark("x", 20) is None
    assert t.on_watermark("y", 11) is None  # lower than the floor: ignored
    assert t.on_watermark("y", 15) == 15


def test_restore_rescaled_per_channel_starts_each_where_its_old_receivers_were():
    t = WatermarkTracker(["x", "y", "z"])
    t.restore_rescaled({"x": 30, "y": 12.5})
    assert t.current == 12.5 and t.watermark_of("z") == 12.5  # unnamed: the lowest
    assert t.on_watermark("y", 40) is None and t.on_watermark("z", 35) == 30


def test_in_flight_items_of_one_sender_merge_behind_their_watermarks():
    """Old channels a (its receiver had consumed up to W(20)) and b (behind, from W(10)) of
    one sender: each record goes just before the first watermark after it on its channel,
    so b's records before W(20) come before it though a's channel starts after it."""
    from cutline.runtime.restore import merge_in_flight

    W = Watermark
    a = ["a1", W(30), "a2"]
    b = ["b1", W(20), "b2", W(30), "b3"]
    assert merge_in_flight([a, b]) == ["b1", W(20), "a1", "b2", W(30), "a2", "b3"]
    assert merge_in_flight([["x", W(5)]]) == ["x", W(5)]
    assert merge_in_flight([]) == []


def test_restore_ignores_unknown_channels_and_takes_the_last_real_watermarks():
    """The end of input (inf) restores as the last real watermark kept beside it (a job
    continued from its final checkpoint goes on from there); a checkpoint without one
    (written before they were kept) restores inf as it is."""
    t = WatermarkTracker(["x", "y"])
    t.on_watermark("x", 5)
    t.on_watermark("y", 7)
    t.on_watermark("x", math.inf)
    t.on_close("y")
    snap = t.snapshot()
    assert snap["current"] == "inf" and snap["channels"]["x"] == ["inf", False]
    assert snap["channels"]["y"] == [7, False]
    r = WatermarkTracker(["x", "z"])
    r.restore(snap)
    assert r.watermark_of("x") == 5 and r.watermark_of("z") == NO_WATERMARK
    assert r.current == 7  # (it had reached 7: x at inf, y at 7, before y closed)
    old = {k: v for k, v in snap.items() if k != "real"}
    r.restore(old)
    assert r.watermark_of("x") == math.inf and r.current == math.inf


def test_items_are_small_frozen_and_travel():
    w = Watermark(3.5)
    with pytest.raises(AttributeError):
        w.ts = 4  # type: ignore[misc]
    assert not hasattr(w, "__dict__")
    assert pickle.loads(pickle.dumps(w)) == w
    assert pickle.loads(pickle.dumps(IDLE)) == IDLE == InputIdle()
    assert is_time_item(w) and is_time_item(IDLE)
    assert not is_time_item(3.5) and not is_time_item({"ts": 1})


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 50), st.lists(st.integers(-1000, 1000), max_size=50))
def test_bounded_out_of_orderness_is_max_minus_delay(delay, stamps):
    g = BoundedOutOfOrderness(delay)
    assert isinstance(g, WatermarkGenerator)
    assert g.current() == NO_WATERMARK
    for i, ts in enumerate(stamps):
        g.on_event(ts)
        assert g.current() == max(stamps[:i + 1]) - delay
    r = BoundedOutOfOrderness(delay)
    r.restore(msgpack.unpackb(msgpack.packb(g.snapshot())))
    assert r.current() == g.current()
    assert copy.deepcopy(g).current() == g.current()


def test_bounded_out_of_orderness_refuses_bad_delays():
    for bad in (-1, float("nan"), math.inf, "5", None, True):
        with pytest.raises((ValueError, TypeError), match="max_delay"):
            BoundedOutOfOrderness(bad)
    assert BoundedOutOfOrderness(dt.timedelta(minutes=1)).max_delay == 60


def test_units():
    assert to_timestamp(5) == 5 and to_timestamp(2.5) == 2.5
    assert to_timestamp(dt.datetime(1970, 1, 1, 0, 1)) == 60  # naive = UTC
    tz = dt.timezone(dt.timedelta(hours=1))
    assert to_timestamp(dt.datetime(1970, 1, 1, 1, 1, tzinfo=tz)) == 60
    for bad in (None, "5", float("nan"), True, [1], math.inf, -math.inf):
        with pytest.raises((TypeError, ValueError)):
            to_timestamp(bad)
    with pytest.raises(ValueError, match="timestamp inf is not a finite number"):
        to_timestamp(math.inf)
    assert to_timestamp(math.inf, finite=False) == math.inf  # a timer's time may be
    assert to_duration(dt.timedelta(seconds=1.5), "d") == 1.5
    assert to_duration(None, "d", allow_none=True) is None
    with pytest.raises(ValueError, match="idle_timeout must be > 0"):
        to_duration(0, "idle_timeout", positive=True)
    with pytest.raises(ValueError, match="max_delay"):
        to_duration(-1, "max_delay")


def test_subtask_alignment_floor_as_data():
    """The driver's part of watermark alignment across a source's subtasks: no floor until
    every member reported; the lowest of those neither idle nor finished; never back."""
    a = SubtaskAlignment(["s0", "s1", "s2"])
    assert a.on_report("s0", 10, False) is None  # s1, s2 not heard yet
    assert a.on_report("s1", 50, False) is None
    assert a.on_report("s2", 5, False) == 5
    assert a.on_report("s2", 5, False) is None  # no rise: nothing to send
    assert a.on_report("s2", 30, False) == 10  # s0 is the slowest now
    assert a.on_report("s0", math.inf, False) == 30  # s0 finished: holds no one
    assert a.on_report("s2", 20, True) == 50  # s2 idle: s1 alone
    assert a.on_report("s2", 20, False) is None  # back, behind: the floor stays at 50
    assert a.on_report("s1", 70, True) is None  # (s2 active at 20 < 50)
    assert a.on_report("s2", 60, True) == 70  # all idle or finished: the highest, none waits
    assert not paused_by_alignment(75, 70, 10) and paused_by_alignment(81, 70, 10)
    assert not paused_by_alignment(1e9, None, 0)  # no floor yet: read on
    assert not paused_by_alignment(1e9, 0, None)  # not aligned: read on
    a.reset()
    assert a.sent is None and a.on_report("s0", 1, False) is None


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 20), st.booleans(),
                          st.booleans()), max_size=60))
def test_subtask_alignment_floor_rises_and_is_the_slowest_active(reports):
    """Random reports (a member, by how much its watermark rose, idle, finished): every
    floor handed out is above the one before, and is the lowest watermark of the active
    members when there are any (the one a paused member waits for)."""
    members = [f"s{i}" for i in range(4)]
    a = SubtaskAlignment(members)
    wm = {m_: 0.0 for m_ in members}
    idle: dict[str, bool] = {}
    last = -math.inf
    for i, rise, is_idle, finish in reports:
        m_ = members[i]
        wm[m_] = math.inf if finish or wm[m_] == math.inf else wm[m_] + rise
        idle[m_] = is_idle
        floor = a.on_report(m_, wm[m_], is_idle)
        if floor is None:
            continue
        assert floor > last
        last = floor
        assert len(idle) == len(members)
        active = [wm[x] for x in members if not idle[x] and wm[x] != math.inf]
        if active:
            assert floor == min(active)
