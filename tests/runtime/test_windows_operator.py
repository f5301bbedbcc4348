"""The window operator driven directly: records and watermarks in, results out, on the memory
and the RocksDB state backend; snapshots, restores and rescales by key group."""

import collections
import math
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cutline.logical import make_node
from cutline.protocol.windows import (
    TimeWindow,
    WindowResult,
    WindowSpec,
    aggregating,
    applying,
    counting,
    reducing,
    session,
    sliding,
    summarizing,
    tumbling,
)
from cutline.runtime.operators import UserFunctionError
from cutline.runtime.registry import build_operator
from cutline.runtime.windows import LateRecord, WindowLate, WindowResults, group_keys
from cutline.state.keygroups import key_group

MAXP = 16
BACKENDS = ["memory", "rocksdb"]


# every test here: state backends' working directories under its tmp_path (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("local_dirs")


def key(r):
    return r[0]


def ts(r):
    return r[1]


def make(assigner, agg=None, *, backend="memory", lateness=0, late=False, groups=None,
         ts_fn=ts, key_fn=key):
    spec = WindowSpec(assigner, lateness, ts_fn, agg or counting(), emit_late=late)
    node = make_node(0, "win", "window", spec, key_fn=key_fn)
    i, p = groups or (0, 1)  # subtask i of p
    return build_operator(node, i, p, MAXP, state_backend=backend)


def blob_of(op, storage, n):
    snap = op.snapshot()
    return snap if isinstance(snap, bytes) else snap.finish(storage, n)


def run(op, steps):
    """Feed ``steps`` (lists of records, or a number: a watermark); all output in order."""
    out = []
    for step in steps:
        out += op.on_watermark(step) if isinstance(step, (int, float)) else op.process(step)
    return out


def results(out):
    return sorted((r for r in out if isinstance(r, WindowResult)), key=repr)


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


# ---------------------------------------------------------------------- firing


def test_tumbling_counts_fire_when_the_watermark_reaches_the_end(backend):
    op = make(tumbling(10), backend=backend)
    try:
        assert op.process([("a", 1), ("b", 3), ("a", 9.5), ("a", 12)]) == []
        assert op.on_watermark(9.99) == []
        assert op.on_watermark(10) == [WindowResult("a", 0, 10, 2), WindowResult("b", 0, 10, 1)]
        assert op.on_watermark(10) == []  # watermarks never go back or repeat
        assert op.process([("b", 15)]) == []
        assert op.on_watermark(math.inf) == [WindowResult("a", 10, 20, 1),
                                             WindowResult("b", 10, 20, 1)]
        assert not list(k for _, name, k, _ in op.state.entries() if name == "windows")
    finally:
        op.close()


def test_results_come_out_by_window_time(backend):
    op = make(tumbling(10), backend=backend)
    try:
        op.process([("b", 25), ("a", 5), ("c", 15), ("a", 26)])
        out = op.on_watermark(100)
        assert [(r.start, r.key) for r in out][:2] == [(0, "a"), (10, "c")]
        assert {(r.start, r.key) for r in out[2:]} == {(20, "b"), (20, "a")}
    finally:
        op.close()


def test_sliding_counts(backend):
    op = make(sliding(10, 5), backend=backend)
    try:
        op.process([("a", 1), ("a", 6), ("a", 11)])
        assert op.on_watermark(10) == [WindowResult("a", -5, 5, 1), WindowResult("a", 0, 10, 2)]
        assert op.on_watermark(20) == [WindowResult("a", 5, 15, 2), WindowResult("a", 10, 20, 1)]
    finally:
        op.close()


def test_session_windows_merge(backend):
    op = make(session(5), reducing(lambda a, b: (a[0], max(a[1], b[1]))), backend=backend)
    try:
        op.process([("a", 1), ("a", 20), ("b", 3), ("a", 4)])  # a: [1, 9) and [20, 25)
        op.process([("a", 12)])  # [12, 17) touches neither... [4, 9) ends at 9 < 12
        op.process([("a", 8)])   # [8, 13) touches [1, 9) and [12, 17): one session [1, 17)
        out = op.on_watermark(100)
        assert [(r.key, r.start, r.end) for r in out] == [("b", 3, 8), ("a", 1, 17),
                                                           ("a", 20, 25)]
        assert out[1].value == ("a", 12)
    finally:
        op.close()


def test_session_merge_needs_no_refire_when_the_watermark_is_between(backend):
    op = make(session(10), backend=backend)
    try:
        op.process([("a", 0)])
        assert op.on_watermark(5) == []
        op.process([("a", 8)])  # [0, 18)
        assert op.on_watermark(10) == []  # the old end of [0, 10) passed: not a session any more
        assert op.on_watermark(18) == [WindowResult("a", 0, 18, 2)]
    finally:
        op.close()


# ---------------------------------------------------------------------- aggregates


RECS = [{"k": "a", "t": 1, "x": 5}, {"k": "a", "t": 2, "x": -1}, {"k": "a", "t": 3, "x": 7},
        {"k": "b", "t": 4, "x": 2}]


@pytest.mark.parametrize("agg, want", [
    (counting(), {"a": 3, "b": 1}),
    (summarizing("sum", "x"), {"a": 11, "b": 2}),
    (summarizing("min", "x"), {"a": -1, "b": 2}),
    (summarizing("max", lambda r: r["x"] * 10), {"a": 70, "b": 20}),
    (summarizing("mean", "x"), {"a": 11 / 3, "b": 2.0}),
    (reducing(lambda a, b: {**a, "x": a["x"] + b["x"]}), None),
    (aggregating(lambda: set(), lambda acc, r: acc | {r["x"]}, None, sorted),
     {"a": [-1, 5, 7], "b": [2]}),
])
def test_aggregates(backend, agg, want):
    op = make(tumbling(10), agg, backend=backend, key_fn=lambda r: r["k"],
              ts_fn=lambda r: r["t"])
    try:
        op.process(RECS)
        got = {r.key: r.value for r in op.on_watermark(10)}
        if want is None:
            want = {"a": {"k": "a", "t": 1, "x": 11}, "b": RECS[3]}
        assert got == want
    finally:
        op.close()


def test_field_of_an_object():
    Rec = collections.namedtuple("Rec", "k t x")
    op = make(tumbling(10), summarizing("sum", "x"))
    op.process([Rec("a", 1, 2), Rec("a", 2, 3)])
    assert op.on_watermark(10) == [WindowResult("a", 0, 10, 5)]


def test_apply_sees_the_window_and_its_records(backend):
    def top(key, window, records):
        assert isinstance(window, TimeWindow)
        best = max(records, key=lambda r: r["x"])
        yield {"key": key, "start": window.start, "best": best["x"], "n": len(records)}

    op = make(tumbling(10), applying(top), backend=backend, key_fn=lambda r: r["k"],
              ts_fn=lambda r: r["t"])
    try:
        op.process(RECS)
        assert op.on_watermark(10) == [{"key": "a", "start": 0, "best": 7, "n": 3},
                                       {"key": "b", "start": 0, "best": 2, "n": 1}]
    finally:
        op.close()


def test_session_aggregates_merge_their_accumulators(backend):
    op = make(session(3), summarizing("mean", lambda r: r[2]), backend=backend)
    try:
        op.process([("a", 0, 1), ("a", 5, 3)])
        op.process([("a", 2.5, 8)])  # joins [0, 3) and [5, 8): mean of 1, 3, 8
        assert op.on_watermark(20) == [WindowResult("a", 0, 8, 4.0)]
    finally:
        op.close()


# ---------------------------------------------------------------------- lateness


def test_late_records_update_within_lateness_and_go_to_the_side_output_after(backend):
    op = make(tumbling(10), backend=backend, lateness=5, late=True)
    try:
        op.process([("a", 1), ("a", 2)])
        assert op.on_watermark(11) == [WindowResult("a", 0, 10, 2)]
        # late, within the lateness: the window is updated and emitted again at once
        assert op.process([("a", 3)]) == [WindowResult("a", 0, 10, 3)]
        assert op.on_watermark(14.9) == []
        assert op.process([("a", 4)]) == [WindowResult("a", 0, 10, 4)]
        assert op.on_watermark(15) == []  # end + lateness: the window's state goes
        assert not list(k for _, name, k, _ in op.state.entries() if name == "windows")
        assert op.process([("a", 5), ("b", 15)]) == [LateRecord(("a", 5))]
        assert op.late_records == 1
    finally:
        op.close()


def test_late_records_are_dropped_without_a_side_output():
    op = make(tumbling(10))
    op.process([("a", 1)])
    assert op.on_watermark(10) == [WindowResult("a", 0, 10, 1)]
    assert op.process([("a", 2)]) == []
    assert op.late_records == 1


def test_a_late_record_in_a_sliding_window_is_late_only_when_late_for_all():
    op = make(sliding(10, 5), late=True)
    op.process([("a", 7)])
    op.on_watermark(10)  # [0, 10) fired, [5, 15) open
    assert op.process([("a", 8)]) == []  # still counts in [5, 15)
    assert op.process([("a", 3)]) == [LateRecord(("a", 3))]  # only in [-5, 5), [0, 10)
    assert op.on_watermark(15) == [WindowResult("a", 5, 15, 2)]


def test_results_and_late_split():
    spec = WindowSpec(tumbling(10), 0, ts, counting(), emit_late=True)
    batch = [WindowResult("a", 0, 10, 1), LateRecord(("a", 3)), {"x": 1}]
    assert WindowResults(make_node(1, "r", "window_results", spec)).process(batch) == [
        WindowResult("a", 0, 10, 1), {"x": 1}]
    assert WindowLate(make_node(2, "l", "window_late", spec)).process(batch) == [("a", 3)]


# ---------------------------------------------------------------------- bad records


def test_bad_timestamps_fail_naming_the_operator_and_record():
    op = make(tumbling(10))
    with pytest.raises(UserFunctionError, match=r"window operator 'win' failed on record "
                                                r"\('a', 'noon'\)"):
        op.process([("a", 1), ("a", "noon")])
    with pytest.raises(UserFunctionError, match="NaN"):
        op.process([("a", float("nan"))])
    with pytest.raises(UserFunctionError, match="finite"):
        op.process([("a", math.inf)])


def test_bad_records_go_to_the_dead_letter_sink_when_set():
    op = make(tumbling(10))
    bad = []
    op.on_bad_record = lambda o, r, e, i, n: bad.append((r, i, n))
    assert op.process([("a", 1), ("a", None), ("a", 2)]) == []
    assert bad == [(("a", None), 1, 3)]
    assert op.on_watermark(10) == [WindowResult("a", 0, 10, 2)]


def test_datetime_timestamps():
    import datetime as dt

    op = make(tumbling(dt.timedelta(minutes=1)))
    t0 = dt.datetime(2026, 1, 1, 12, 0, 30, tzinfo=dt.timezone.utc)
    op.process([("a", t0), ("a", t0 + dt.timedelta(seconds=20))])
    (r,) = op.on_watermark(t0.timestamp() + 60)
    assert (r.start, r.end, r.value) == (t0.timestamp() - 30, t0.timestamp() + 30, 2)
    assert type(r.start) is int


# ---------------------------------------------------------------------- checkpoints


def test_group_keys_fall_in_their_groups():
    keys = group_keys(MAXP)
    assert [key_group(k, MAXP) for k in keys] == list(range(MAXP))
    assert len(group_keys(128)) == 128


def test_snapshot_and_restore_continue_exactly(backend, storage):
    steps = [[("a", 1), ("b", 2)], 5, [("a", 12), ("c", 9)], 10, [("a", 7)], 25, [("b", 30)]]
    rest = [[("c", 31)], 40, math.inf]
    whole = make(tumbling(10), backend=backend, lateness=10, late=True)
    want = run(whole, steps + rest)
    whole.close()
    first = make(tumbling(10), backend=backend, lateness=10, late=True)
    got = run(first, steps)
    blob = blob_of(first, storage, 1)
    first.close()
    second = make(tumbling(10), backend=backend, lateness=10, late=True)
    second.restore([blob])
    assert second.wm == 25
    got += run(second, rest)
    second.close()
    assert got == want


def test_a_rescaled_restore_never_reopens_a_fired_window(backend, storage):
    """Two subtasks acted on different watermarks (one saw 100, one 30); restored into one
    subtask (whose input watermark starts at the lower, 30), a record for a window the first
    had fired is late, not a new window."""
    ops = [make(tumbling(10), backend=backend, late=True, groups=(i, 2)) for i in range(2)]
    owner = {}
    for k in "abcdefghijklmnop":
        owner.setdefault(0 if key_group(k, MAXP) in ops[0].state.key_groups else 1, k)
    k0, k1 = owner[0], owner[1]
    ops[0].process([(k0, 5)])
    ops[1].process([(k1, 5), (k1, 35)])
    assert ops[0].on_watermark(100) == [WindowResult(k0, 0, 10, 1)]
    assert ops[1].on_watermark(30) == [WindowResult(k1, 0, 10, 1)]
    blobs = [blob_of(op, storage, 1) for op in ops]
    for op in ops:
        op.close()
    one = make(tumbling(10), backend=backend, late=True)
    one.restore(blobs)
    assert one.wm == 30
    assert one.on_watermark(30) == []
    # k0's groups acted on 100: [20, 30) closed there; k1's on 30: [30, 40) still open
    assert one.process([(k0, 25), (k1, 36)]) == [LateRecord((k0, 25))]
    assert one.process([(k0, 101)]) == []
    assert one.on_watermark(40) == [WindowResult(k1, 30, 40, 2)]
    assert one.ahead  # k0's groups are still ahead (at 100)
    assert one.on_watermark(200) == [WindowResult(k0, 100, 110, 1)]
    assert not one.ahead
    # and back to two subtasks: each group keeps its watermark
    blob = blob_of(one, storage, 2)
    one.close()
    two = [make(tumbling(10), backend=backend, late=True, groups=(i, 2)) for i in range(2)]
    for op in two:
        op.restore([blob])
        assert op.wm == 200
        op.close()


# ---------------------------------------------------------------------- sliding windows as panes

def test_sliding_windows_without_lateness_are_held_as_panes(backend):
    """A record goes into its one pane (one slide), not into size / slide windows; a window
    fires as the merge of its panes, and a pane goes when its last window fired."""
    op = make(sliding(10, 2), backend=backend, late=True)
    try:
        assert op.panes
        op.process([("a", 1), ("a", 3), ("a", 3.5), ("b", 9)])
        assert {k: set(m) for k, m in op.windows.fast.items()} == {
            "a": {(0, 2), (2, 4)}, "b": {(8, 10)}}
        assert results(op.on_watermark(4)) == results([
            WindowResult("a", -8, 2, 1), WindowResult("a", -6, 4, 3)])
        assert results(op.on_watermark(12)) == results(
            [WindowResult("a", s, s + 10, 3 if s > -8 else 1) for s in (-4, -2, 0)]
            + [WindowResult("a", 2, 12, 2)]
            + [WindowResult("b", s, s + 10, 1) for s in (0, 2)])
        assert {k: set(m) for k, m in op.windows.fast.items()} == {"b": {(8, 10)}}
        # late only for a pane whose last window fired: [2, 12) did, [4, 14) did not
        assert op.process([("a", 3), ("a", 4.5)]) == [LateRecord(("a", 3))]
        assert results(op.on_watermark(14)) == results([
            WindowResult("a", 4, 14, 1), WindowResult("b", 4, 14, 1)])
    finally:
        op.close()
    for lateness, agg in ((3, counting()),
                          (0, applying(lambda key, window, records: [len(records)]))):
        other = make(sliding(10, 2), agg, backend=backend, lateness=lateness)
        try:
            assert not other.panes  # (windows whole: lateness, or apply)
        finally:
            other.close()


def test_only_counts_and_summaries_of_few_slides_are_held_as_panes():
    """A user's reduce runs in arrival order and a user's merge may reuse either
    accumulator (as Flink allows): those keep whole windows, as do windows of more than
    MAX_PANES slides (a window merges that many panes)."""
    def merge(a, b):
        a.extend(b)
        return a

    for agg, assigner, held in (
            (counting(), sliding(64, 1), True), (summarizing("mean", "x"), sliding(6, 2), True),
            (counting(), sliding(65, 1), False), (reducing(lambda a, b: b), sliding(6, 2), False),
            (aggregating(list, lambda acc, r: acc + [r], merge, None), sliding(6, 2), False)):
        op = make(assigner, agg)
        try:
            assert op.panes is held, (agg.name, assigner)
        finally:
            op.close()


def test_a_checkpoint_of_whole_sliding_windows_restores_beside_panes(backend, storage):
    """A checkpoint taken before sliding windows were held as panes (whole windows in the
    state) restores beside panes, rescaled to two subtasks (one with whole windows, one
    without) and back to one (both kinds in one state): a window fires as the merge of
    its whole window and its panes, exactly the model's output.  A state holding panes
    restored into an operator that now has allowed lateness is refused, naming it."""
    steps = [[("a", 1), ("b", 2), ("a", 7)], 4, [("a", 8), ("c", 9)], [("a", 12), ("b", 3)],
             10, [("c", 30), ("a", 13)], 12, [("b", 14), ("a", 9)], 16, math.inf]
    old = make(sliding(10, 5), backend=backend, late=True)
    old.panes = False  # as the operator was before panes
    got = drive([old], steps, storage, {3: 2, 6: 1}, backend, sliding(10, 5), 0)
    assert got == model(sliding(10, 5), 0, steps)
    panes = make(sliding(10, 5), backend=backend, late=True)
    run(panes, steps[:3])
    blob = blob_of(panes, storage, 9)
    panes.close()
    late = make(sliding(10, 5), backend=backend, lateness=3, late=True)
    try:
        with pytest.raises(ValueError, match="'win'.*as panes"):
            late.restore([blob])
    finally:
        late.close()


# ---------------------------------------------------------------------- properties


def model(assigner, lateness, steps):
    """What the operator must emit, computed the slow way (counts; emit_late)."""
    wm, wins, out = -math.inf, {}, []
    for step in steps:
        if isinstance(step, (int, float)):
            if step <= wm:
                out.append(collections.Counter())
                continue
            fired = []
            for (k, w), recs in wins.items():
                if wm < w[1] <= step:
                    fired.append((w[1], w[0], k, len(recs)))
            wm = step
            out.append(collections.Counter(WindowResult(k, s, e, n) for e, s, k, n in fired))
            wins = {kw: r for kw, r in wins.items() if kw[1][1] + lateness > wm}
            continue
        for r in step:
            ok = [w for w in assigner.assign(r[1]) if w.end + lateness > wm]
            if not ok:
                out.append(LateRecord(r))
            for w in ok:
                wins.setdefault((r[0], tuple(w)), []).append(r)
                if w.end <= wm:
                    out.append(WindowResult(r[0], w.start, w.end, len(wins[(r[0], tuple(w))])))
    return out


def drive(ops, steps, storage, restores, backend, assigner, lateness):
    """Run ``steps`` through subtasks ``ops``, snapshotting and restoring (rescaled) at the
    points ``restores`` names: {step index: new parallelism}."""
    out = []
    n = 0
    for i, step in enumerate(steps):
        if i in restores:
            n += 1
            blobs = [blob_of(op, storage, n) for op in ops]
            for op in ops:
                op.close()
            p = restores[i]
            ops = [make(assigner, backend=backend, lateness=lateness, late=True,
                        groups=(j, p)) for j in range(p)]
            for op in ops:
                op.restore(blobs)
        if isinstance(step, (int, float)):
            out.append(collections.Counter(r for op in ops for r in op.on_watermark(step)))
        else:
            for r in step:
                (op,) = [op for op in ops if key_group(r[0], MAXP) in op.state.key_groups]
                out.extend(op.process([r]))
    for op in ops:
        op.close()
    return out


records = st.lists(st.tuples(st.sampled_from("abcdefg"), st.integers(0, 60)), max_size=8)
steps_st = st.lists(st.one_of(records, st.integers(0, 70)), max_size=14)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=steps_st, kind=st.sampled_from(["tumbling", "sliding"]),
       lateness=st.sampled_from([0, 7]), data=st.data())
def test_same_output_as_the_model_with_any_restores(steps, kind, lateness, data, storage):
    assigner = tumbling(10) if kind == "tumbling" else sliding(10, 5)
    steps = steps + [math.inf]
    want = model(assigner, lateness, steps)
    restores = data.draw(st.dictionaries(st.integers(0, len(steps) - 1),
                                         st.sampled_from([1, 2, 3]), max_size=3))
    backend = data.draw(st.sampled_from(BACKENDS))
    ops = [make(assigner, backend=backend, lateness=lateness, late=True)]
    if data.draw(st.booleans()):  # whole sliding windows, as before panes, restored beside them
        ops[0].panes = False
    got = drive(ops, steps, storage, restores, backend, assigner, lateness)
    assert got == want


@settings(max_examples=40, deadline=None)
@given(ts_list=st.lists(st.integers(0, 100), min_size=1, max_size=25), gap=st.integers(1, 8),
       seed=st.integers(0, 2**32))
def test_session_results_do_not_depend_on_arrival_order(ts_list, gap, seed):
    def sessions(order):
        op = make(session(gap), applying(lambda k, w, recs: [(k, w, sorted(recs))]))
        for t in order:
            op.process([("a", t)])
        return op.on_watermark(math.inf)

    shuffled = list(ts_list)
    random.Random(seed).shuffle(shuffled)
    assert sessions(ts_list) == sessions(shuffled)


def session_model(gap, lateness, steps):
    """Sessions the slow way (Flink's rules): merge first, the merged window decides
    lateness; fire when the watermark passes a session's end; forget it after lateness."""
    wm, sessions, out = -math.inf, collections.defaultdict(dict), []
    for step in steps:
        if isinstance(step, (int, float)):
            fired = collections.Counter()
            if step > wm:
                for k, ws in sessions.items():
                    for (s, e), n in ws.items():
                        if wm < e <= step:
                            fired[WindowResult(k, s, e, n)] += 1
                wm = step
                for k in sessions:
                    sessions[k] = {w: n for w, n in sessions[k].items() if w[1] + lateness > wm}
            out.append(fired)
            continue
        for k, t in step:
            ws = sessions[k]
            s, e = t, t + gap
            hit = [w for w in ws if w[0] <= e and s <= w[1]]
            s, e = min([s] + [w[0] for w in hit]), max([e] + [w[1] for w in hit])
            if e + lateness <= wm:
                out.append(LateRecord((k, t)))
                continue
            n = sum(ws.pop(w) for w in hit) + 1
            ws[(s, e)] = n
            if e <= wm:
                out.append(WindowResult(k, s, e, n))
    return out


session_steps = st.lists(st.one_of(
    st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 80)), max_size=6),
    st.integers(0, 90)), max_size=16)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=session_steps, gap=st.integers(1, 12), lateness=st.sampled_from([0, 9]),
       data=st.data())
def test_sessions_same_output_as_the_model_with_any_restores(steps, gap, lateness, data,
                                                             storage):
    steps = steps + [math.inf]
    want = session_model(gap, lateness, steps)
    restores = data.draw(st.dictionaries(st.integers(0, len(steps) - 1),
                                         st.sampled_from([1, 2, 3]), max_size=2))
    backend = data.draw(st.sampled_from(BACKENDS))
    assigner = session(gap)
    ops = [make(assigner, backend=backend, lateness=lateness, late=True)]
    assert drive(ops, steps, storage, restores, backend, assigner, lateness) == want
