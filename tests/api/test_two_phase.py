"""Two-phase aggregation (issue 28, items 1-3): the planner's combine before the exchange,
keyed aggregates merged into columns (numpy, no Python call per key), update streams sized
by time (``updates="checkpoint"`` / seconds).

Checked against plain Python oracles, and the same job planned without the combine
(``plan.combinable`` off) where the oracle would have to replay watermark timing (late
rows)."""

from __future__ import annotations

import collections

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cutline.plan
from cutline import CheckpointConfig, Pipeline, sliding, tumbling
from cutline.connectors import CollectSink, GeneratorSource, ParquetSink
from cutline.protocol.windows import merge_partial
from cutline.state.columnar import ColumnarAggregates
from cutline.state.memory import MemoryStateBackend

USERS = 37


def events(ix: np.ndarray) -> pa.RecordBatch:
    """Row ``i``: user ``u<i*7 % 37>``, value ``i % 100`` (null every 11th row), event time
    ``i / 10`` s up to 0.9 s out of order, and every 97th row 40 s behind (late for a 1 s
    delay once its window fired)."""
    ts = ix / 10 - (ix * 7919 % 10) / 10 - np.where(ix % 97 == 96, 40.0, 0.0)
    value = pa.array(np.where(ix % 11 == 5, 0, ix % 100), mask=(ix % 11 == 5))
    return pa.record_batch({"i": pa.array(ix), "user": pa.array([f"u{u}" for u in ix * 7 % USERS]),
                            "value": value, "ts": pa.array(ts)})


def _cfg(tmp_path, backend="memory", interval=0.2):
    return CheckpointConfig(interval=interval, storage=f"file://{tmp_path}/ck",
                            state_backend=backend)


def _final(rows: list[dict], key: str = "user") -> dict:
    """An update stream's latest row per key (rows in commit order)."""
    out: dict = {}
    for r in rows:
        out[r[key]] = r
    return out


def _agg_oracle(n: int) -> dict:
    per: dict[str, list] = collections.defaultdict(list)
    for i in range(n):
        per[f"u{i * 7 % USERS}"].append(None if i % 11 == 5 else i % 100)
    out = {}
    for u, vs in per.items():
        xs = [v for v in vs if v is not None]
        out[u] = (len(vs), sum(xs), min(xs), max(xs), sum(xs) / len(xs))
    return out


# ------------------------------------------------------------------ the plan

def _pipeline(build, tmp_path, parallelism=2):
    p = Pipeline("two-phase", parallelism=parallelism, checkpoint=_cfg(tmp_path))
    src = p.source(GeneratorSource(count=100, batch_fn=events, batch_rows=50), uid="ev")
    build(src).sink(CollectSink(str(tmp_path / "out")), uid="out")
    return p


@pytest.mark.parametrize("build, combined", [
    (lambda s: s.key_by("user").agg(n="count", uid="agg"), True),
    (lambda s: s.key_by("user").count(uid="agg", updates=2.5), True),
    (lambda s: s.key_by("user").agg(n="count", uid="agg", updates="batch"), False),
    (lambda s: s.assign_timestamps("ts", max_delay=1).key_by("user").window(tumbling(10))
     .count(uid="agg"), True),
    (lambda s: s.assign_timestamps("ts", max_delay=1).key_by("user")
     .window(tumbling(10), allowed_lateness=5).count(uid="agg"), False),
    (lambda s: s.assign_timestamps("ts", max_delay=1).key_by("user")
     .window(sliding(10, 5)).count(uid="agg"), False),
    (lambda s: s.rows().key_by("user").count(uid="agg"), False),
    (lambda s: s.rows().key_by("user").count(uid="agg", updates="checkpoint"), True),
])
def test_the_planner_combines_time_sized_aggregations_before_the_exchange(
        tmp_path, build, combined):
    desc = cutline.plan.plan(_pipeline(build, tmp_path)).describe()
    assert ("combine[agg.combine]" in desc) is combined, desc


def test_a_window_with_a_late_output_is_not_combined(tmp_path):
    def build(s):
        w = s.assign_timestamps("ts", max_delay=1).key_by("user").window(tumbling(10))\
            .count(uid="agg")
        w.late(uid="late").sink(CollectSink(str(tmp_path / "late")), uid="late-out")
        return w

    assert "combine" not in cutline.plan.plan(_pipeline(build, tmp_path)).describe()


def test_a_stream_read_by_several_operators_gets_a_combine_chain_of_its_own(tmp_path):
    p = Pipeline("two-phase", parallelism=2, checkpoint=_cfg(tmp_path))
    src = p.source(GeneratorSource(count=100, batch_fn=events, batch_rows=50), uid="ev")
    src.key_by("user").agg(n="count", uid="agg").sink(CollectSink(str(tmp_path / "a")))
    src.select("i").sink(CollectSink(str(tmp_path / "b")))
    desc = cutline.plan.plan(p).describe()
    assert "chain 3 x2: combine[agg.combine]" in desc and "ev =forward=> agg.combine" in desc


def test_updates_is_checked_with_a_clear_error(tmp_path):
    p = Pipeline("two-phase", checkpoint=_cfg(tmp_path))
    src = p.source(GeneratorSource(count=10, batch_fn=events, batch_rows=5), uid="ev")
    with pytest.raises(ValueError, match=r"agg\(updates=...\) is 'checkpoint'.*got 'record'"):
        src.key_by("user").agg(n="count", updates="record")
    with pytest.raises(ValueError, match=r"count\(updates=...\).*got 0"):
        src.rows().key_by("user").count(updates=0)
    with pytest.raises(ValueError, match="window agg"):
        src.assign_timestamps("ts").key_by("user").window(tumbling(1)).count(updates=1.0)


# ------------------------------------------------------------------ exact contents

@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
@pytest.mark.parametrize("updates", ["checkpoint", 0.05, "batch"])
def test_batch_aggregates_equal_the_python_oracle(tmp_path, backend, updates):
    if backend == "rocksdb":
        pytest.importorskip("rocksdict")
    n = 20_000
    p = Pipeline("agg", parallelism=2, checkpoint=_cfg(tmp_path, backend))
    out = ParquetSink(str(tmp_path / "out"))
    (p.source(GeneratorSource(count=n, batch_fn=events, batch_rows=500, rate=40_000),
              uid="ev")
     .key_by("user").agg(n="count", total=("value", "sum"), lo=("value", "min"),
                         hi=("value", "max"), avg=("value", "mean"), uid="agg",
                         updates=updates)
     .sink(out, uid="out"))
    result = p.run(engine="threads", timeout=120)
    rows = out.read_records()
    got = {u: (r["n"], r["total"], r["lo"], r["hi"], r["avg"]) for u, r in _final(rows).items()}
    assert got == _agg_oracle(n)
    per_key = collections.Counter(r["user"] for r in rows)
    if updates == "checkpoint":  # one row per key and checkpoint at most (and the end)
        assert max(per_key.values()) <= result.checkpoints_completed + 1
    counts = collections.defaultdict(list)
    for r in rows:
        counts[r["user"]].append(r["n"])
    assert all(len(set(c)) == len(c) for c in counts.values())  # never the same row twice


def test_running_count_sized_by_checkpoints_equals_the_python_oracle(tmp_path):
    from pipelines import sentence

    n = 6000
    p = Pipeline("wc", parallelism=2, checkpoint=_cfg(tmp_path))
    sink = CollectSink(str(tmp_path / "out"))
    (p.source(GeneratorSource(count=n, fn=sentence, rate=8000), uid="sentences")
     .flat_map(str.split, uid="split").key_by(lambda w: w)
     .count(uid="count", updates="checkpoint").sink(sink, uid="out"))
    result = p.run(engine="threads", timeout=120)
    rows = sink.results()
    want = collections.Counter(w for i in range(n) for w in sentence(i).split())
    assert dict(_final_pairs(rows)) == dict(want)
    assert len(rows) == len(set(rows))  # each (word, count) once: exactly once
    assert len(rows) <= len(want) * (result.checkpoints_completed + 1)


def _final_pairs(rows):
    out: dict = {}
    for k, c in rows:
        out[k] = max(c, out.get(k, 0))
    return out


def test_updates_every_interval_emit_between_checkpoints(tmp_path):
    """A checkpoint every 60 s, updates every 0.1 s: a key's count comes out several
    times during the run (the final one at the end of input), each time higher."""
    p = Pipeline("agg", parallelism=2, checkpoint=_cfg(tmp_path, interval=60))
    out = CollectSink(str(tmp_path / "out"))
    (p.source(GeneratorSource(count=4000, batch_fn=events, batch_rows=100, rate=4000),
              uid="ev")
     .key_by("user").agg(n="count", uid="agg", updates=0.1).rows().sink(out, uid="out"))
    p.run(engine="threads", timeout=60)
    counts = collections.defaultdict(list)
    for r in out.results():
        counts[r["user"]].append(r["n"])
    assert {u: max(c) for u, c in counts.items()} == \
        {u: v[0] for u, v in _agg_oracle(4000).items()}
    assert max(len(c) for c in counts.values()) >= 3
    assert all(c == sorted(set(c)) for c in counts.values())  # rising, never twice


def _windows(tmp_path, name, n, combine):
    p = Pipeline(name, parallelism=2, checkpoint=_cfg(tmp_path / name))
    out = ParquetSink(str(tmp_path / name / "out"))
    (p.source(GeneratorSource(count=n, batch_fn=events, batch_rows=200), uid="ev",
              parallelism=1)  # one split: the late rows do not depend on timing
     .assign_timestamps("ts", max_delay=1.0, uid="time")
     .key_by("user").window(tumbling(10)).agg(n="count", total=("value", "sum"),
                                             hi=("value", "max"), uid="win")
     .sink(out, uid="out"))
    saved = cutline.plan.combinable
    if not combine:
        cutline.plan.combinable = lambda node: False  # type: ignore[assignment]
    try:
        assert ("win.combine" in cutline.plan.plan(p).describe()) is combine
        result = p.run(engine="threads", timeout=120)
    finally:
        cutline.plan.combinable = saved
    rows = collections.Counter(tuple(sorted(r.items())) for r in out.read_records())
    return rows, result.late_records


def test_tumbling_windows_two_phase_equal_one_phase_late_rows_included(tmp_path):
    n = 12_000
    two, late2 = _windows(tmp_path, "two", n, True)
    one, late1 = _windows(tmp_path, "one", n, False)
    assert late1["win"] > 0  # the 40 s stragglers behind a fired window
    assert two == one and late2 == late1
    # and the windows equal the oracle over the rows that were not late
    per: dict = collections.Counter()
    for r in two:
        d = dict(r)
        per[d["user"]] += d["n"]
    assert sum(per.values()) + late2["win"] == n


# ------------------------------------------------------------------ vectorised state

class Reading:
    """A backend table whose ``get`` is counted (``reads``)."""

    def __init__(self, table):
        self.table, self.fast, self.reads = table, table.fast, []

    def get(self, key, default=None):
        self.reads.append(key)
        return self.table.get(key, default)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(0, 30), st.integers(-50, 50) | st.none()),
                         min_size=1, max_size=40), min_size=1, max_size=6),
       st.booleans(), st.sampled_from([3, 10, 1_000_000]))
def test_columnar_state_merges_as_merge_partial_does(batches, restart, max_keys):
    """Partials of batches (count, sum, min, max, mean of a column with nulls) merged into
    numpy columns give what merge_partial gives key by key; saved into the backend after
    every batch (past ``max_keys`` rows the columns empty out, and a key seen again is
    read back: only then, until a restart), they read back (a restart in the middle) in
    the per-key format."""
    from cutline.runtime.batches import Partials

    aggs = (("n", None, "count"), ("s", "v", "sum"), ("lo", "v", "min"), ("hi", "v", "max"),
            ("m", "v", "mean"))
    partials = Partials(aggs)
    backend = MemoryStateBackend(range(128), 128)
    table = backend.table("aggregate")
    cols = None
    restarted = False
    want: dict = {}
    for b, rows in enumerate(batches):
        t = pa.table({"k": pa.array([k for k, _ in rows], pa.int64()),
                      "v": pa.array([v for _, v in rows], pa.int64())})
        key_cols, arrays = partials.arrow(t, ["k"])
        if cols is None:
            cols = ColumnarAggregates([f for _, f in partials.parts], [a.type for a in arrays],
                                      [pa.int64()], partials.reads, Reading(table),
                                      max_keys=max_keys, fresh=True)
        held, reads = set(cols.keys), cols.table.reads
        reads.clear()
        cols.merge(key_cols, arrays)
        keys = key_cols[0].to_pylist()
        if not restarted:  # a new key is read only when it was emptied out before
            assert set(reads) <= set(want) - held
        cols.take_changed()  # (the flush before a snapshot: then the columns may empty)
        cols.save()
        lists = [a.to_pylist() for a in arrays]
        for i, k in enumerate(keys):
            cur = want.get(k)
            want[k] = [merge_partial(fn, cur[j] if cur else None,
                                     (lists[idx[0]][i], lists[idx[1]][i]) if fn == "mean"
                                     else lists[idx[0]][i])
                       for j, (fn, idx) in enumerate(partials.reads)]
        if restart and b == len(batches) // 2:
            cols.save()
            blob = backend.snapshot()
            backend = MemoryStateBackend(range(128), 128)
            backend.restore([blob])
            table = backend.table("aggregate")
            cols.table = Reading(table)
            cols.restored()
            restarted = True
    assert cols is not None
    got = pa.Table.from_arrays(cols.rows(np.arange(cols.size)),
                               names=["k", *(a[0] for a in aggs)]).to_pylist()
    cols.save()
    for r in got:
        acc = want[r["k"]]
        mean = acc[4][0] / acc[4][1] if acc[4][1] else None
        assert (r["n"], r["s"], r["lo"], r["hi"], r["m"]) == (*acc[:4], mean)
    for k, acc in want.items():  # (those emptied out too)
        stored = table.get(k)
        assert list(stored) == [tuple(a) if isinstance(a, tuple) else a for a in acc]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 12), st.integers(-50, 50) | st.none()), min_size=1,
                max_size=60),
       st.lists(st.integers(1, 6), min_size=1, max_size=20), st.randoms(),
       st.sampled_from([pa.int64(), pa.float64()]))
def test_columnar_runs_merge_as_merge_partial_does(rows, runs, rnd, vtype):
    """Rows merged in runs (``merged``: a sliding window as the merge of its panes) give
    what merge_partial gives merging each run's accumulators one after another, nulls
    (a sum, min, max, mean of nulls only) included; float sums added in the same order."""
    from cutline.runtime.batches import Partials

    aggs = (("n", None, "count"), ("s", "v", "sum"), ("lo", "v", "min"), ("hi", "v", "max"),
            ("m", "v", "mean"))
    partials = Partials(aggs)
    t = pa.table({"k": pa.array([k for k, _ in rows], pa.int64()),
                  "v": pa.array([v if v is None or vtype == pa.int64() else v / 7
                                 for _, v in rows], vtype)})
    key_cols, arrays = partials.arrow(t, ["k"])
    cols = ColumnarAggregates([f for _, f in partials.parts], [a.type for a in arrays],
                              [pa.int64()], partials.reads, {}, fresh=True)
    cols.merge(key_cols, arrays)
    accs = cols.accumulators(np.arange(cols.size))
    order, heads = [], []
    for n in runs:
        heads.append(len(order))
        order += [rnd.randrange(cols.size) for _ in range(n)]
    got = pa.Table.from_arrays(cols.merged(np.array(order), np.array(heads)),
                               names=[a[0] for a in aggs]).to_pylist()
    bounds = [*heads, len(order)]
    for r, lo, hi in zip(got, bounds, bounds[1:]):
        acc = None
        for i in order[lo:hi]:
            acc = list(accs[i]) if acc is None else [
                merge_partial(fn, a, b) for (fn, _), a, b in zip(partials.reads, acc, accs[i])]
        mean = acc[4][0] / acc[4][1] if acc[4][0] is not None and acc[4][1] else None
        assert (r["n"], r["s"], r["lo"], r["hi"], r["m"]) == (*acc[:4], mean)


def test_two_key_columns_and_a_batch_of_another_type(tmp_path):
    """Keys of two columns merge into columns as single keys do; a later batch whose
    aggregate has another type converts when exact, else fails naming the types."""
    from cutline.logical import AggSpec, ColumnKey, make_node
    from cutline.runtime.operators import UserFunctionError
    from cutline.runtime.registry import build_operator

    spec = AggSpec(("a", "b"), (("n", None, "count"), ("s", "v", "sum")))
    node = make_node(0, "agg", "aggregate", spec, key_fn=ColumnKey(("a", "b")), columnar=True)
    op = build_operator(node, 0, 1, 128)
    want: dict = collections.Counter()
    sums: dict = collections.Counter()
    for k in range(3):
        a = [f"x{i % 3}" for i in range(50)]
        b = [(i + k) % 2 for i in range(50)]
        v = list(range(50))
        values = pa.array(v, pa.int64()) if k < 2 else pa.array([float(x) for x in v])
        assert op.process([pa.record_batch({"a": a, "b": b, "v": values})]) == []
        for x, y, z in zip(a, b, v):
            want[(x, y)] += 1
            sums[(x, y)] += z
    got = pa.Table.from_batches(op.flush()).to_pylist()
    assert {(r["a"], r["b"]): (r["n"], r["s"]) for r in got} == \
        {k: (want[k], sums[k]) for k in want}
    assert op.flush() == []  # nothing changed since
    bad = pa.record_batch({"a": ["x0"], "b": [0], "v": pa.array([0.5])})
    with pytest.raises(UserFunctionError, match="does not convert"):
        op.process([bad])


def test_a_batch_of_a_wider_float_type_converts_only_when_exact(tmp_path):
    """The first batch's max is float32, a later batch's float64: 0.5 converts exactly and
    merges; 0.1 has no float32 value (Arrow's cast rounded it to 0.10000000149011612, and
    the max came out as that, silently) and fails naming the types."""
    from cutline.logical import AggSpec, ColumnKey, make_node
    from cutline.runtime.operators import UserFunctionError
    from cutline.runtime.registry import build_operator

    spec = AggSpec(("k",), (("hi", "v", "max"),))
    node = make_node(0, "agg", "aggregate", spec, key_fn=ColumnKey(("k",)), columnar=True)
    op = build_operator(node, 0, 1, 128)
    assert op.process([pa.record_batch({"k": [1, 2], "v": pa.array([0.25, 0.0],
                                                                   pa.float32())})]) == []
    assert op.process([pa.record_batch({"k": [1], "v": pa.array([0.5])})]) == []
    got = pa.Table.from_batches(op.flush()).to_pylist()
    assert sorted((r["k"], r["hi"]) for r in got) == [(1, 0.5), (2, 0.0)]
    for value in (0.1, 1e300):
        with pytest.raises(UserFunctionError, match="does not convert"):
            op.process([pa.record_batch({"k": [2], "v": pa.array([value])})])


def test_the_window_combine_names_windows_as_the_operator_does():
    """Fractional timestamps and an offset (a start computed as ``ts - (ts - offset) %
    size`` rounds): the same rows through the combine and the window operator, or through
    the operator alone, fire the same windows."""
    from cutline.logical import BatchWindowSpec, ColumnKey, make_node
    from cutline.protocol.windows import columns
    from cutline.runtime.batch_windows import BatchWindowCombine
    from cutline.runtime.registry import build_operator

    aggs = (("n", None, "count"),)
    rng = np.random.default_rng(3)
    ts = np.round(rng.uniform(-1000, 1000, 4000), 3)
    rb = pa.record_batch({"user": pa.array([f"u{i % 7}" for i in range(len(ts))]),
                          "ts": pa.array(ts)})
    fired = []
    for combined in (False, True):
        spec = BatchWindowSpec(("user",), aggs, tumbling(2.5, offset=0.75), 0, "ts",
                               columns(aggs), partial=combined)
        node = make_node(0, "w", "window_agg", spec, key_fn=ColumnKey(("user",)), columnar=True)
        op = build_operator(node, 0, 1, 128)
        batch = [rb]
        if combined:
            comb = BatchWindowCombine(make_node(1, "w.combine", "combine", spec, columnar=True))
            batch = comb.process([rb]) + comb.flush()
        assert op.process(batch) == []
        rows = pa.Table.from_batches(op.on_watermark(float("inf"))).to_pylist()
        fired.append(sorted((r["user"], r["start"], r["n"]) for r in rows))
    assert fired[0] == fired[1] and sum(n for _, _, n in fired[0]) == len(ts)


# ------------------------------------------------------------------ per-record windows

def _record(i: int) -> dict:
    """Record ``i`` as a dict (the rows of :func:`events`): the same users, values, times
    and stragglers 40 s behind."""
    b = events(np.array([i]))
    return {c: b.column(c)[0].as_py() for c in ("i", "user", "value", "ts")}


def _record_windows(tmp_path, name, n, combine, agg, backend="memory"):
    p = Pipeline(name, parallelism=2, checkpoint=_cfg(tmp_path / name, backend))
    out = CollectSink(str(tmp_path / name / "out"))
    win = (p.source(GeneratorSource(count=n, fn=_record), uid="ev", parallelism=1)
           .assign_timestamps(lambda r: r["ts"], max_delay=1.0, uid="time")
           .key_by(lambda r: r["user"]).window(tumbling(10)))
    results = agg(win)
    results.sink(out, uid="out")
    saved = cutline.plan.combinable
    if not combine:
        cutline.plan.combinable = lambda node: False  # type: ignore[assignment]
    try:
        assert ("win.combine" in cutline.plan.plan(p).describe()) is combine
        result = p.run(engine="threads", timeout=120)
    finally:
        cutline.plan.combinable = saved
    rows = collections.Counter((r.key, r.start, r.end, repr(r.value)) for r in out.results())
    return rows, result.late_records


@pytest.mark.parametrize("agg", [
    lambda w: w.count(uid="win"),
    lambda w: w.sum(lambda r: r["value"] or 0, uid="win"),
    lambda w: w.max(lambda r: r["i"], uid="win"),
    lambda w: w.mean(lambda r: r["i"], uid="win"),
    lambda w: w.reduce(lambda a, b: a if a["i"] < b["i"] else b, uid="win"),
], ids=["count", "sum", "max", "mean", "reduce"])
@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
def test_per_record_tumbling_windows_two_phase_equal_one_phase(tmp_path, agg, backend):
    """The per-record window's combine (issue 28 item 1 on the per-record path): the same
    windows, the same late records counted (the 40 s stragglers behind fired windows)."""
    n = 6_000
    two, late2 = _record_windows(tmp_path, "two", n, True, agg, backend)
    one, late1 = _record_windows(tmp_path, "one", n, False, agg, backend)
    assert late1["win"] > 0
    assert two == one and late2 == late1


def test_per_record_windows_that_cannot_merge_or_keep_late_records_are_not_combined(
        tmp_path):
    def plan_of(build):
        p = Pipeline("x", parallelism=2, checkpoint=_cfg(tmp_path))
        w = (p.source(GeneratorSource(count=10, fn=_record), uid="ev")
             .assign_timestamps(lambda r: r["ts"], max_delay=1.0).key_by(lambda r: r["user"]))
        build(w).sink(CollectSink(str(tmp_path / "o")), uid="out")
        return cutline.plan.plan(p).describe()

    assert "win.combine" in plan_of(lambda w: w.window(tumbling(10)).count(uid="win"))
    for build in (lambda w: w.window(tumbling(10)).apply(lambda k, win, rs: [len(rs)],
                                                         uid="win"),
                  lambda w: w.window(tumbling(10), on_late="fail").count(uid="win"),
                  lambda w: w.window(tumbling(10), allowed_lateness=2).count(uid="win"),
                  lambda w: w.window(sliding(10, 5)).count(uid="win")):
        assert "combine" not in plan_of(build)


def test_the_record_window_combine_holds_open_windows_and_passes_due_records():
    from cutline.logical import make_node, WindowPartial
    from cutline.protocol.windows import WindowSpec, counting
    from cutline.runtime.registry import build_operator

    spec = WindowSpec(tumbling(10), 0, lambda r: r[1], counting())
    comb = build_operator(make_node(1, "w.combine", "combine", spec, key_fn=lambda r: r[0]),
                          0, 1, 16)
    assert comb.process([("a", 1), ("a", 2), ("b", 15), ("a", 12)]) == []
    assert comb.on_watermark(10) == [WindowPartial("a", 0, 10, 2, 2, 2)]
    # a record of a window the watermark passed goes on as it is; a failing key too
    bad = ("x",)
    assert comb.process([("a", 3), bad]) == [("a", 3), bad]
    assert sorted(comb.flush(), key=repr) == [WindowPartial("a", 10, 20, 1, 1, 12),
                                              WindowPartial("b", 10, 20, 1, 1, 15)]
    assert comb.flush() == []
    # the window operator merges partials as records, and counts a late partial's records
    win = build_operator(make_node(2, "w", "window", spec, key_fn=lambda r: r[0]), 0, 1, 16)
    assert win.process([WindowPartial("a", 0, 10, 2, 2, 2), ("a", 5)]) == []
    assert [(r.key, r.start, r.value) for r in win.on_watermark(10)] == [("a", 0, 3)]
    assert win.process([WindowPartial("a", 0, 10, 4, 4, 9)]) == []
    assert win.late_records == 4 and win.late.total == 4


@pytest.mark.parametrize("size, offset", [(2.5, 0.75), (10, 3), (0.5, 0.25)])
@pytest.mark.parametrize("combined", [False, True], ids=["one-phase", "two-phase"])
def test_per_record_tumbling_windows_name_each_window_once_exactly(size, offset, combined):
    """Fractional timestamps around an offset (``ts - (ts - offset) % size`` rounds: 1.957
    in ``tumbling(10, offset=3)`` got the start -7.000000000000001 where 2.5 got -7, one
    window under two names, two results): every record lands in its window, computed in
    exact rational arithmetic, and each window fires once, with the whole count, through
    the window operator alone and through its combine."""
    import random
    from fractions import Fraction

    from cutline.logical import make_node
    from cutline.protocol.windows import WindowSpec, counting
    from cutline.runtime.registry import build_operator

    rng = random.Random(3)
    records = [(f"u{i % 3}", round(rng.uniform(-50, 50), 3)) for i in range(4000)]
    want: collections.Counter = collections.Counter()
    for k, ts in records:
        start = Fraction(offset) + (Fraction(ts) - Fraction(offset)) // Fraction(size) * \
            Fraction(size)
        want[(k, start, start + Fraction(size))] += 1
    spec = WindowSpec(tumbling(size, offset=offset), 0, lambda r: r[1], counting())
    op = build_operator(make_node(0, "w", "window", spec, key_fn=lambda r: r[0]), 0, 1, 16)
    batch: list = records
    if combined:
        comb = build_operator(make_node(1, "w.combine", "combine", spec, key_fn=lambda r: r[0]),
                              0, 1, 16)
        batch = comb.process(records) + comb.flush()
    assert op.process(batch) == []
    got = collections.Counter()
    for r in op.on_watermark(float("inf")):
        got[(r.key, Fraction(r.start), Fraction(r.end))] += r.value
    assert got == want


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c", "d"]),
                          st.sampled_from([0.0, -0.0, 60.0, 120.0, float("nan")]),
                          st.integers(-5, 5) | st.none()), min_size=1, max_size=30),
       st.booleans(), st.sampled_from([pa.float64(), pa.int64()]), st.booleans())
def test_grouping_by_a_constant_key_column_gives_every_keys_groups(rows, same, stype, partial):
    """Partials grouped by (key, start) where ``start`` holds one value (a window combine's
    batch, most often) come out as grouping by both columns gives them: the same groups in
    the same order, the column's type kept; a column that is not one value bit for bit
    (0.0 beside -0.0, a null) is grouped as it is."""
    from cutline.runtime.batches import Partials, _constant_key

    partials = Partials((("n", None, "count"), ("s", "v", "sum"), ("m", "v", "mean")))
    starts = [rows[0][1]] * len(rows) if same else [s for _, s, _ in rows]
    if stype == pa.int64():
        starts = [None if s != s else int(s) for s in starts]  # (nan: a null)
    t = pa.table({"user": [u for u, _, _ in rows], "__window_start": pa.array(starts, stype),
                  "v": pa.array([v for _, _, v in rows], pa.int64())})
    if partial:  # partials merged again (the combine's and the aggregation's merge)
        t = partials.partial(pa.concat_tables([t, t]), ["user", "__window_start"])
    got = partials.partial(t, ["user", "__window_start"], partial)
    grouped = t.group_by(["user", "__window_start"], use_threads=False).aggregate(
        partials.merge if partial else [([] if c == "" else c, f) for c, f in partials.parts])
    names = partials.merged_names if partial else partials.names
    want = pa.table([grouped["user"], grouped["__window_start"], *(grouped[n] for n in names)],
                    names=got.column_names)
    assert got.schema == want.schema
    assert got.to_pylist() == want.to_pylist() or (  # (nan != nan: compared as bits)
        pa.types.is_floating(stype) and got.drop_columns(["__window_start"]).equals(
            want.drop_columns(["__window_start"])) and np.array_equal(
            got["__window_start"].to_numpy().view(np.int64),
            want["__window_start"].to_numpy().view(np.int64)))
    col = t["__window_start"].combine_chunks()
    bits = col.to_numpy(zero_copy_only=False).view(np.int64) if not col.null_count else None
    constant = t.num_rows > 1 and bits is not None and bool((bits == bits[0]).all())
    assert _constant_key(t, ["user", "__window_start"]) == ("__window_start" if constant
                                                            else None)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=12), st.integers(0, 2**16),
       st.sampled_from([8, 64, 1 << 17]))
def test_combines_holding_rows_send_what_the_operator_alone_computes(sizes, seed, max_rows):
    """The keyed and the window combine hold the rows they are given and group them when
    more than ``MAX_ROWS`` are held, a window is due or at a flush: batches spanning one, a
    few or many windows, watermarks between them; the partials they send, merged by the
    operator, give what the operator computes from the rows alone."""
    from cutline.logical import AggSpec, BatchWindowSpec, ColumnKey, make_node
    from cutline.protocol.windows import columns
    from cutline.runtime.batch_windows import BatchWindowCombine
    from cutline.runtime.batches import BatchCombine
    from cutline.runtime.registry import build_operator

    rng = np.random.default_rng(seed)
    aggs = (("n", None, "count"), ("s", "v", "sum"), ("m", "v", "mean"))
    batches, t0 = [], 0.0
    for n in sizes:  # each batch a few seconds of event time, some spanning many windows
        span = rng.choice([0.5, 4.0, 60.0])
        ts = np.round(t0 + rng.uniform(0, span, n), 3)
        t0 += span / 2
        batches.append(pa.record_batch({
            "user": pa.array([f"u{u}" for u in rng.integers(0, 5, n)]), "ts": pa.array(ts),
            "v": pa.array(rng.integers(-9, 9, n))}))
    # keyed
    want = collections.defaultdict(lambda: [0, 0])
    for rb in batches:
        for u, v in zip(rb["user"].to_pylist(), rb["v"].to_pylist()):
            want[u][0] += 1
            want[u][1] += v
    spec = AggSpec(("user",), aggs, partial=True)
    comb = BatchCombine(make_node(1, "a.combine", "combine", spec, columnar=True))
    comb.MAX_ROWS = max_rows
    sent = [b for rb in batches for b in comb.process([rb])] + comb.flush()
    op = build_operator(make_node(0, "a", "aggregate", spec, key_fn=ColumnKey(("user",)),
                                  columnar=True), 0, 1, 128)
    op.process(sent)
    got = {r["user"]: [r["n"], r["s"]] for r in pa.Table.from_batches(op.flush()).to_pylist()}
    assert got == {k: v for k, v in want.items()}
    # windows: the combine's watermark trails the batches' times by 1 s
    fired = []
    for combined in (False, True):
        wspec = BatchWindowSpec(("user",), aggs, tumbling(2.0), 0, "ts", columns(aggs),
                                partial=combined)
        op = build_operator(make_node(0, "w", "window_agg", wspec,
                                      key_fn=ColumnKey(("user",)), columnar=True), 0, 1, 128)
        wc = BatchWindowCombine(make_node(1, "w.combine", "combine", wspec, columnar=True))
        wc.MAX_ROWS = max_rows
        out = []
        for rb in batches:
            wm = float(rb["ts"].to_numpy().min()) - 1.0
            out += op.process(wc.process([rb]) if combined else [rb])
            if combined:
                out += op.process(wc.on_watermark(wm))
            out += op.on_watermark(wm)
        if combined:
            out += op.process(wc.flush())
        out += op.on_watermark(float("inf"))
        rows = pa.Table.from_batches([b for b in out if b.num_rows]).to_pylist()
        fired.append(sorted((r["user"], r["start"], r["n"], r["s"]) for r in rows))
    assert fired[0] == fired[1]


def test_a_combine_sends_batches_of_another_type_and_names_a_bad_one():
    """Rows whose summed column is int64, then float64: the combine sends both partials
    (the aggregation converts them, exact); a column the aggregate cannot take fails
    naming the batch it came in."""
    from cutline.logical import AggSpec, ColumnKey, make_node
    from cutline.runtime.batches import BatchCombine
    from cutline.runtime.operators import UserFunctionError
    from cutline.runtime.registry import build_operator

    spec = AggSpec(("k",), (("s", "v", "sum"),), partial=True)
    comb = BatchCombine(make_node(1, "a.combine", "combine", spec, columnar=True))
    comb.process([pa.record_batch({"k": [1, 2], "v": [3, 4]})])
    comb.process([pa.record_batch({"k": [1], "v": [2.0]})])
    sent = comb.flush()
    op = build_operator(make_node(0, "a", "aggregate", spec, key_fn=ColumnKey(("k",)),
                                  columnar=True), 0, 1, 128)
    assert len(sent) == 2
    op.process(sent)  # (one task batch: taken one record batch at a time)
    assert sorted((r["k"], r["s"]) for r in pa.Table.from_batches(op.flush()).to_pylist()) \
        == [(1, 5), (2, 4)]
    comb.process([pa.record_batch({"k": [1], "v": [1]})])
    comb.process([pa.record_batch({"k": [7, 8, 9], "v": ["a", "b", "c"]})])
    with pytest.raises(UserFunctionError, match="record batch of 3 rows"):
        comb.flush()
