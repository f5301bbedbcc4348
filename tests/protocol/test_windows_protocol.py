"""Window assigners and session merging (cutline.protocol.windows), as data and by hypothesis."""

import datetime as dt
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cutline.protocol.windows import (
    TimeWindow,
    WindowResult,
    merge_into,
    merge_windows,
    session,
    sliding,
    tumbling,
)

timestamps = st.one_of(st.integers(-10**9, 10**10),
                       st.floats(-1e6, 1e9, allow_nan=False).map(lambda x: round(x, 3)))


def test_examples():
    assert tumbling(60).assign(125) == (TimeWindow(120, 180),)
    assert tumbling(60, offset=15).assign(125) == (TimeWindow(75, 135),)
    assert tumbling(10).assign(-1) == (TimeWindow(-10, 0),)
    assert sliding(10, 5).assign(12.5) == (TimeWindow(5, 15), TimeWindow(10, 20))
    assert sliding(10, 3).assign(7) == (TimeWindow(0, 10), TimeWindow(3, 13), TimeWindow(6, 16))
    assert session(5).assign(3.0) == (TimeWindow(3, 8),)
    assert tumbling(dt.timedelta(minutes=1)).size == 60
    # whole floats become ints: a window has one spelling
    (w,) = tumbling(60.0).assign(125.0)
    assert type(w.start) is int and type(w.end) is int
    assert tumbling(0.5).assign(1.25) == (TimeWindow(1.0, 1.5),)
    assert WindowResult("k", 0, 60, 3)._asdict() == {"key": "k", "start": 0, "end": 60,
                                                     "value": 3}


@pytest.mark.parametrize("make, name", [
    (lambda: tumbling(0), "tumbling(size=...)"),
    (lambda: tumbling(-1), "tumbling(size=...)"),
    (lambda: tumbling(float("nan")), "tumbling(size=...)"),
    (lambda: tumbling(math.inf), "tumbling(size=...)"),
    (lambda: tumbling(60, offset=60), "tumbling(offset=...)"),
    (lambda: tumbling(60, offset=float("nan")), "tumbling(offset=...)"),
    (lambda: sliding(10, 0), "sliding(slide=...)"),
    (lambda: sliding(10, -2), "sliding(slide=...)"),
    (lambda: sliding(0, 1), "sliding(size=...)"),
    (lambda: sliding(10, 20), "sliding(slide=...)"),
    (lambda: sliding(10, float("nan")), "sliding(slide=...)"),
    (lambda: sliding(3600, 0.001), "sliding(slide=...) of 0.001 puts every record in "
                                   "3,600,000 windows"),  # sliding(86400, 10) is allowed
    (lambda: sliding(10, 5, offset=5), "sliding(offset=...)"),
    (lambda: session(0), "session(gap=...)"),
    (lambda: session(-5), "session(gap=...)"),
    (lambda: session(float("nan")), "session(gap=...)"),
    (lambda: session(dt.timedelta(0)), "session(gap=...)"),
])
def test_bad_arguments_are_refused_naming_the_argument(make, name):
    with pytest.raises(ValueError) as e:
        make()
    assert name in str(e.value)


@pytest.mark.parametrize("make", [lambda: tumbling("60"), lambda: sliding(10, None),
                                  lambda: session(True)])
def test_bad_types_are_refused(make):
    with pytest.raises(TypeError, match="seconds"):
        make()


@given(ts=timestamps, size=st.integers(1, 10**6), offset=st.integers(0, 10**6))
def test_tumbling_every_timestamp_in_exactly_one_window(ts, size, offset):
    offset %= size
    (w,) = tumbling(size, offset).assign(ts)
    assert w.start <= ts < w.end
    assert w.end - w.start == size
    assert (w.start - offset) % size == 0


@given(ts=timestamps, slide=st.integers(1, 1000), k=st.integers(1, 20),
       offset=st.integers(0, 10**6))
def test_sliding_every_timestamp_in_size_over_slide_windows(ts, slide, k, offset):
    size, offset = slide * k, offset % slide
    ws = sliding(size, slide, offset).assign(ts)
    assert len(ws) == size // slide
    assert len(set(ws)) == len(ws)
    assert list(ws) == sorted(ws)
    for w in ws:
        assert w.start <= ts < w.end and w.end - w.start == size
        assert (w.start - offset) % slide == 0


@given(ts=st.integers(-10**6, 10**6), slide=st.integers(1, 100), size=st.integers(1, 500))
def test_sliding_with_a_slide_that_does_not_divide(ts, slide, size):
    if slide > size:
        return
    ws = sliding(size, slide).assign(ts)
    assert size // slide <= len(ws) <= -(-size // slide)
    for w in ws:
        assert w.start <= ts < w.end
    # every window start <= ts with start + size > ts is there: none missing
    starts = {s for s in range(ts - size - slide, ts + 1) if s % slide == 0 and s + size > ts}
    assert {w.start for w in ws} == starts


def test_sizes_binary_floats_do_not_hold_name_each_window_once():
    # 5 * 0.1 == 0.5 but 0.5 - 0.5 % 0.1 == 0.4: a record at 0.5 was counted in [0.4, 0.5)
    assert tumbling(0.1).assign(0.5) == (TimeWindow(0.5, 0.6),)
    assert tumbling(0.3).assign(3.3) == (TimeWindow(3.3, 3.6),)
    assert tumbling(0.1, offset=0.05).assign(0.05) == (TimeWindow(0.05, 0.15),)
    # 12.5 and 12.55 named the window [12.5, 13.5) 12.5 and 12.500000000000002: two windows
    assert sliding(1, 0.1).assign(12.55)[-1] == sliding(1, 0.1).assign(12.5)[-1] == \
        TimeWindow(12.5, 13.5)
    assert sliding(0.3, 0.1).assign(0.3) == (TimeWindow(0.1, 0.4), TimeWindow(0.2, 0.5),
                                            TimeWindow(0.3, 0.6))
    assert tumbling(0.1).end_of(0.3) == 0.4 and sliding(1, 0.1).end_of(12.5) == 13.5
    assert tumbling(0.5).exact and sliding(10, 3).exact and not tumbling(0.1).exact


@given(ts=st.floats(-1e6, 1e9, allow_nan=False).map(lambda x: round(x, 3)),
       tenths=st.integers(1, 50), k=st.integers(1, 6), offset=st.integers(0, 100))
def test_decimal_sizes_give_every_timestamp_its_windows_with_one_name_each(ts, tenths, k,
                                                                           offset):
    slide = tenths / 10
    off = (offset % tenths) / 10
    (w,) = tumbling(slide, off).assign(ts)
    assert w.start <= ts < w.end
    assert tumbling(slide, off).assign(w.start) == (w,)  # its first instant names it alike
    assert tumbling(slide, off).assign(w.end)[0].start == w.end  # the next one starts there
    assert tumbling(slide, off).end_of(w.start) == w.end
    size = round(slide * k, 9)
    ws = sliding(size, slide, off).assign(ts)
    assert len(ws) == k and list(ws) == sorted(ws)
    for v in ws:
        assert v.start <= ts < v.end
        assert v in sliding(size, slide, off).assign(v.start)
        assert sliding(size, slide, off).end_of(v.start) == v.end
    if abs(ts) < 1e6:  # bounds on the nanosecond grid where floats are finer than that
        assert round(w.start, 9) == w.start and round(w.end, 9) == w.end


def test_merge_into_examples():
    assert merge_into([], (0, 5)) == (TimeWindow(0, 5), [])
    assert merge_into([(0, 5)], (1, 3)) == (TimeWindow(0, 5), [TimeWindow(0, 5)])
    assert merge_into([(0, 5), (7, 12), (20, 25)], (4, 9)) == (
        TimeWindow(0, 12), [TimeWindow(0, 5), TimeWindow(7, 12)])
    assert merge_into([(0, 10)], (10, 20)) == (TimeWindow(0, 20), [TimeWindow(0, 10)])
    assert merge_into([(0, 10)], (11, 20)) == (TimeWindow(11, 20), [])


def sessions_by_adding(ts_list, gap):
    """A key's sessions after adding records one at a time (what the operator does)."""
    windows: set = set()
    for ts in ts_list:
        (new,) = session(gap).assign(ts)
        result, merged = merge_into(windows, new)
        windows.difference_update(merged)
        windows.add(result)
    return windows


@settings(max_examples=300)
@given(ts_list=st.lists(st.integers(0, 500), min_size=1, max_size=40),
       gap=st.integers(1, 30), seed=st.integers(0, 2**32))
def test_session_merges_do_not_depend_on_arrival_order(ts_list, gap, seed):
    shuffled = list(ts_list)
    random.Random(seed).shuffle(shuffled)
    a, b = sessions_by_adding(ts_list, gap), sessions_by_adding(shuffled, gap)
    assert a == b
    # and equal the batch merge (Flink's mergeWindows) of all the records' windows
    assert a == {r for r, _ in merge_windows(session(gap).assign(t)[0] for t in ts_list)}
    # sessions are disjoint, cover every record, and a gap >= `gap` separates them
    ordered = sorted(a)
    for x, y in zip(ordered, ordered[1:]):
        assert x.end < y.start
    for t in ts_list:
        assert sum(w.start <= t < w.end for w in a) == 1
    for w in a:
        inside = sorted(t for t in ts_list if w.start <= t < w.end)
        assert w.start == inside[0] and w.end == inside[-1] + gap


@given(ts_list=st.lists(st.floats(0, 100, allow_nan=False), min_size=1, max_size=30),
       gap=st.floats(0.01, 10), seed=st.integers(0, 2**32))
def test_session_merges_order_independent_with_float_times(ts_list, gap, seed):
    shuffled = list(ts_list)
    random.Random(seed).shuffle(shuffled)
    assert sessions_by_adding(ts_list, gap) == sessions_by_adding(shuffled, gap)


def test_assigners_compare_by_definition():
    assert tumbling(60) == tumbling(60.0) == tumbling(dt.timedelta(seconds=60))
    assert tumbling(60) != tumbling(30)
    assert tumbling(60) != sliding(60, 60)
    assert sliding(10, 5).signature() == "sliding(size=10, slide=5, offset=0)"
    assert repr(session(30)) == "session(gap=30)"


@given(ts=st.floats(-10.0, 10.0, allow_nan=False).map(lambda x: round(x, 3)),
       slide=st.integers(1, 1000), k=st.integers(1, 20), offset=st.integers(0, 10**6),
       quarter=st.booleans())
def test_window_starts_with_an_offset_are_on_the_grid_for_fractional_timestamps(
        ts, slide, k, offset, quarter):
    # ts - (ts - offset) % slide rounds: -376 came out as -375.99999999999994, and one window
    # had two names (1.6% of random cases): every start is offset + j * slide, exactly
    offset %= slide
    step, off = (slide / 4, offset / 4) if quarter else (slide, offset)
    for w in sliding(step * k, step, off).assign(ts) + tumbling(step, off).assign(ts):
        assert w.start <= ts < w.end
        assert (w.start - off) / step == round((w.start - off) / step)
        assert w.start == off + round((w.start - off) / step) * step
