"""Session windows and late data on batch streams (issue 15): the batch window operator
gives the per-record window operator's output row for row.

Random record batches and watermarks (hypothesis) go through both operators: the batch
one with ``agg(n=count, total=sum, hi=max, avg=mean)``, the per-record one four times
(``count()``, ``sum``, ``max``, ``mean``) on the same rows as dicts.  Per step the rows
each emits are the same: while taking a batch in the same order (a row within
``allowed_lateness`` of a fired window emits it again, a late row goes to ``.late()``),
at a watermark as the same set (the order across keys of one window end is not defined).
Bad windows are refused when the pipeline is built.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from columnar_pipelines import late_sessions, observed_sessions, session_events
from cutline import CheckpointConfig, Pipeline, session, sliding, tumbling
from cutline.connectors import GeneratorSource, ParquetSink
from cutline.logical import HASH, BatchWindowSpec, ColumnKey, make_node
from cutline.protocol.windows import WindowSpec, columns, counting, summarizing
from cutline.runtime.registry import build_operator
from cutline.runtime.windows import LateRecord

MAXP = 16
AGGS = (("n", None, "count"), ("total", "v", "sum"), ("hi", "v", "max"), ("avg", "v", "mean"))


def _ops(assigner, lateness, keys):
    """The batch window operator and the per-record ones (count, sum, max, mean)."""
    key = ColumnKey(tuple(keys))
    spec = BatchWindowSpec(tuple(keys), AGGS, assigner, lateness, "ts", columns(AGGS),
                           emit_late=True)
    batch = build_operator(make_node(0, "w", "window_agg", spec, key_fn=key, partitioning=HASH,
                                columnar=True), 0, 1, MAXP)
    records = [build_operator(make_node(0, "w", "window", WindowSpec(
        assigner, lateness, lambda r: r["ts"], agg, emit_late=True), key_fn=key), 0, 1, MAXP)
        for agg in (counting(), summarizing("sum", "v"), summarizing("max", "v"),
                    summarizing("mean", "v"))]
    return batch, records


def _batch_out(items, keys):
    rows, late = [], []
    for it in items:
        if type(it) is LateRecord:
            late += it.record.to_pylist()
        else:
            for r in it.to_pylist():
                k = r[keys[0]] if len(keys) == 1 else tuple(r[c] for c in keys)
                rows.append((k, r["start"], r["end"], r["n"], r["total"], r["hi"], r["avg"]))
    return rows, late


def _record_out(outs):
    late = [it.record for it in outs[0] if type(it) is LateRecord]
    results = [[it for it in out if type(it) is not LateRecord] for out in outs]
    rows = [(c.key, float(c.start), float(c.end), c.value, s.value, h.value, m.value)
            for c, s, h, m in zip(*results)]
    assert all(len(r) == len(rows) for r in results)
    return rows, late


_assigners = st.one_of(
    st.integers(1, 8).map(tumbling),
    st.tuples(st.integers(1, 4), st.integers(1, 3)).map(lambda a: sliding(a[0] * a[1], a[1])),
    st.sampled_from([1, 2, 3, 5, 2.5]).map(session),
    st.sampled_from([tumbling(0.3), tumbling(1.1, 0.2), sliding(1.2, 0.3)]))  # 0.1 * 3 != 0.3


def _steps(seed: int) -> list:
    """Record batches (key, time, value) and watermarks, the watermark mostly rising (from
    a seed: hypothesis drawing every value costs more than the operators)."""
    rnd = random.Random(seed)
    out: list = []
    wm = 0.0
    for _ in range(rnd.randint(1, 12)):
        if rnd.random() < 0.5:
            wm += rnd.randint(0, 8)
            out.append(wm)
            continue
        n = rnd.randint(1, 12)
        lo = max(0, int(wm) - 10) * 2
        ts = [rnd.randint(lo, int(wm) * 2 + 24) / 2 for _ in range(n)]
        if rnd.random() < 0.3:  # a batch of one instant: of one window (or pane)
            ts = [ts[0]] * n
        out.append(pa.record_batch({
            "k": [rnd.choice("abc") for _ in range(n)],
            "j": [rnd.randint(0, 1) for _ in range(n)],
            "ts": pa.array(ts),
            "v": [rnd.randint(-5, 20) for _ in range(n)]}))
    out.append(float("inf"))
    return out


@settings(max_examples=25, deadline=None)
@given(_assigners, st.sampled_from([0, 0, 2, 6.5]), st.sampled_from([["k"], ["k", "j"]]),
       st.integers(0, 2**32))
def test_batch_windows_emit_the_per_record_windows_rows(assigner, lateness, keys, seed):
    batch, records = _ops(assigner, lateness, keys)
    for step in _steps(seed):
        if isinstance(step, float):
            got, _ = _batch_out(batch.on_watermark(step), keys)
            want, _ = _record_out([op.on_watermark(step) for op in records])
            assert sorted(got) == sorted(want), step
        else:
            got_rows, got_late = _batch_out(batch.process([step]), keys)
            rows = step.to_pylist()
            want_rows, want_late = _record_out([op.process(rows) for op in records])
            assert got_rows == want_rows  # in the same order
            assert got_late == want_late
    assert batch.late_records == records[0].late_records
    # all fired and gone, but those the lateness covers from the last real watermark (kept
    # for a job continued from the final checkpoint), the same in both
    real = batch._real[0] if batch._real else math.inf
    for op in (batch, records[0]):
        assert all(w[1] + lateness > real for m in op.windows.fast.values() for w in m)
    assert {k: set(m) for k, m in batch.windows.fast.items()} == {
        k: set(m) for k, m in records[0].windows.fast.items()}
    assert set(batch.fired) == set(records[0].fired)


def _table_windows(op):
    """The windows in the operator's ``windows`` table, by key (what a snapshot holds)."""
    return {k: set(m) for _, name, k, m in op.state.entries() if name == "windows" and m}


def _open_windows(op):
    """Every (key, window) the operator holds: its columns' live rows and its table's."""
    held = {(k, w) for k, ws in _table_windows(op).items() for w in ws}
    if op.open is not None:
        for r in np.flatnonzero(np.isfinite(op.starts[:op.open.size])).tolist():
            held.add(op._window_of(op.open.keys[r]))
    return held


def _per_key(assigner, keys):
    """A batch window operator that keeps its windows (or panes) key by key, never as
    columns: the oracle of the columns' state."""
    op, _ = _ops(assigner, 0, keys)
    op.decided = True
    return op


_columnar_assigners = st.one_of(
    st.integers(1, 8).map(tumbling),
    st.tuples(st.integers(2, 5), st.sampled_from([1, 2, 0.5])).map(
        lambda a: sliding(a[0] * a[1], a[1])))


@settings(max_examples=40, deadline=None)
@given(_columnar_assigners, st.sampled_from([["k"], ["k", "j"]]), st.integers(0, 2**32),
       st.integers(0, 12))
def test_windows_as_columns_snapshot_and_restore_as_per_key(assigner, keys, seed, cut):
    """Tumbling windows without lateness, and sliding windows as panes, are held as
    columns: each watermark fires the rows the per-key path fires (the per-record
    operator's windows), a snapshot taken at any step writes them into the per-key table
    (what the per-key path holds, key by key), and an operator restored from it goes on as
    the one that was not stopped: the same rows at every step, nothing fired twice."""
    steps = _steps(seed)
    cut = min(cut, len(steps) - 1)
    batch, records = _ops(assigner, 0, keys)
    oracle = _per_key(assigner, keys)
    outputs: list = []
    blob, late_before = None, 0
    for i, step in enumerate(steps):
        if i == cut:
            blob, late_before = batch.snapshot(), batch.late_records
            assert _table_windows(batch) == _table_windows(oracle)
            assert {k: m for _, name, k, m in batch.state.entries() if name == "windows"
                    and m} == {k: m for _, name, k, m in oracle.state.entries()
                               if name == "windows" and m}
        if isinstance(step, float):
            got = _batch_out(batch.on_watermark(step), keys)[0]
            assert [r[1:3] for r in got] == sorted(r[1:3] for r in got)  # by end
            assert sorted(got) == sorted(_batch_out(oracle.on_watermark(step), keys)[0])
            outputs.append(sorted(got))
            want, _ = _record_out([op.on_watermark(step) for op in records])
            assert sorted(got) == sorted(want)
        else:
            outputs.append(_batch_out(batch.process([step]), keys))
            assert outputs[-1] == _batch_out(oracle.process([step]), keys)
            for op in records:
                op.process(step.to_pylist())
        if batch.decided:
            assert batch.open is not None  # no lateness, numbers: as columns
            assert oracle.open is None
    assert not _open_windows(batch)
    assert batch.fired == oracle.fired
    again, _ = _ops(assigner, 0, keys)
    again.restore([blob])
    for step, want in zip(steps[cut:], outputs[cut:]):
        if isinstance(step, float):
            assert sorted(_batch_out(again.on_watermark(step), keys)[0]) == want
        else:
            assert _batch_out(again.process([step]), keys) == want
    assert again.late_records == batch.late_records - late_before
    assert not _open_windows(again)


def _both(assigner, steps, keys=("k",)):
    """Each step's rows out of the columns and of the per-key path (sorted)."""
    keys = list(keys)
    outs = []
    for op in (_ops(assigner, 0, keys)[0], _per_key(assigner, keys)):
        got = []
        for step in steps:
            items = op.on_watermark(step) if isinstance(step, float) else op.process([step])
            got.append(sorted(_batch_out(items, keys)[0], key=repr))
        outs.append((op, got))
    return outs


def test_panes_as_columns_key_zero_and_minus_zero_as_one_key():
    """Keys 0.0 and -0.0 are one key (Python's dict, the per-key path): a window covering
    a pane of each fires once, with both rows."""
    rb = [pa.record_batch({"k": pa.array([k]), "j": [0], "ts": [t], "v": [v]})
          for k, t, v in ((0.0, 1.0, 1), (-0.0, 3.0, 2))]
    (cols, got), (_, want) = _both(sliding(4, 2), [*rb, 10.0])
    assert cols.open is not None
    got = [sorted((r[0] + 0.0, *r[1:]) for r in rows) for rows in got]  # (equal keys)
    assert got == want
    assert [r[1:] for r in got[-1]] == [(-2.0, 2.0, 1, 1, 1, 1.0), (0.0, 4.0, 2, 3, 2, 1.5),
                                        (2.0, 6.0, 1, 2, 2, 2.0)]


@pytest.mark.parametrize("assigner", [sliding(4, 2), tumbling(4)])
def test_windows_as_columns_take_batches_with_null_typed_columns(assigner):
    """A batch whose value or key column holds nulls only (Arrow type null) merges into
    the columns as the per-key path takes it; a first batch with null-typed keys keeps the
    windows key by key."""
    def rb(k, v):
        return pa.record_batch({"k": k, "j": [0], "ts": [1.0], "v": v})

    for steps in ([rb(["a"], [1]), rb(["a"], pa.array([None])), 10.0],
                  [rb(pa.array([None]), [1]), rb(["a"], [2]), 10.0],
                  [rb(["a"], [1]), rb(pa.array([None]), [2]), 10.0]):
        (_, got), (_, want) = _both(assigner, steps)
        assert got == want and got[-1]


def test_firing_panes_of_long_windows_costs_the_windows_that_fire():
    """A watermark fires the windows ending by it from the panes they cover, not from
    every live pane times the panes per window: one window of 2,000 panes fires with
    memory for about its panes (a matrix of every pane and window took 40 MB)."""
    import tracemalloc

    n = 2000
    (op, _), = [(o, None) for o in [_ops(sliding(n, 1), 0, ["k"])[0]]]
    op.process([pa.record_batch({"k": ["a"] * n, "j": [0] * n,
                                 "ts": [float(t) for t in range(n)], "v": [1] * n})])
    op.on_watermark(float(n))
    assert op.open is not None
    tracemalloc.start()
    try:
        rows, _ = _batch_out(op.on_watermark(float(n + 1)), ["k"])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert rows == [("a", 1.0, float(n + 1), n - 1, n - 1, 1, 1.0)]
    assert peak < 4_000_000, peak


def test_windows_saved_then_fired_leave_the_table():
    """A window a snapshot saved and the watermark then fired is gone from the next
    snapshot: restored from it, nothing fires twice."""
    batch, _ = _ops(tumbling(10), 0, ["k"])
    rb = pa.record_batch({"k": ["a", "b", "a"], "j": [0, 0, 0], "ts": [1.0, 2.0, 15.0],
                          "v": [1, 2, 3]})
    assert _batch_out(batch.process([rb]), ["k"]) == ([], [])
    assert batch.open is not None
    batch.snapshot()  # [0, 10) of a and b, [10, 20) of a: saved
    assert _table_windows(batch) == {"a": {(0, 10), (10, 20)}, "b": {(0, 10)}}
    rows, _ = _batch_out(batch.on_watermark(10.0), ["k"])
    assert sorted(rows) == [("a", 0.0, 10.0, 1, 1, 1, 1.0), ("b", 0.0, 10.0, 1, 2, 2, 2.0)]
    blob = batch.snapshot()
    assert _table_windows(batch) == {"a": {(10, 20)}}
    again, _ = _ops(tumbling(10), 0, ["k"])
    again.restore([blob])
    assert again.on_watermark(12.0) == []
    assert _batch_out(again.process([pa.record_batch(
        {"k": ["a"], "j": [0], "ts": [11.0], "v": [4]})]), ["k"]) == ([], [])
    assert again.open is not None
    rows, _ = _batch_out(again.on_watermark(20.0), ["k"])
    assert rows == [("a", 10.0, 20.0, 2, 7, 4, 3.5)]
    assert _table_windows(again) == {}


def test_a_bridging_row_is_not_late_in_its_batch_as_record_by_record():
    """Gap 10, watermark 100: a row at 85 alone is late; after a row at 93 of its key in
    the same batch it is not (the sessions merge into [85, 103)), as per record."""
    batch, records = _ops(session(10), 0, ["k"])
    for op in (batch, *records):
        op.on_watermark(100)
    rb = pa.record_batch({"k": ["a", "a", "b"], "j": [0, 0, 0], "ts": [93.0, 85.0, 85.0],
                          "v": [1, 2, 3]})
    rows, late = _batch_out(batch.process([rb]), ["k"])
    assert (rows, late) == ([], [{"k": "b", "j": 0, "ts": 85.0, "v": 3}])
    rows, _ = _batch_out(batch.on_watermark(103), ["k"])
    assert rows == [("a", 85.0, 103.0, 2, 3, 2, 1.5)]


# ------------------------------------------------------------------ pipelines, bad input


def test_session_windows_and_late_rows_of_a_batch_pipeline(tmp_path):
    """``key_by("user").window(session(gap), allowed_lateness=...).agg(...)`` and its
    ``.late()`` in a pipeline (threads engine): the per-record operator's rows."""
    p = Pipeline("sessions", parallelism=2,
                 checkpoint=CheckpointConfig(interval=0.2, storage=f"file://{tmp_path}/ck"))
    sinks = late_sessions(p, tmp_path, 3000, batch_rows=300)
    p.run(engine="threads", timeout=60)
    rows, late = session_events(3000)
    assert sum(late.values()) == 10 and max(dict(r)["n"] for r in rows) > 100  # re-fired
    assert observed_sessions(*sinks) == (rows, late)


def _reading(i):
    """Reading ``i``: (sensor, time, value), times 0.25 s apart, some out of order."""
    return {"k": i % 3, "ts": (i + (3 if i % 7 == 0 else 0)) * 0.25, "v": i % 11}


def _readings(idx):
    rows = [_reading(int(i)) for i in idx]
    return pa.RecordBatch.from_pylist(rows, schema=pa.schema(
        [("k", pa.int64()), ("ts", pa.float64()), ("v", pa.int64())]))


def _per_sensor(r):
    return r["k"] if isinstance(r, dict) else r.key


def test_windows_of_a_batch_streams_windows_as_record_by_record(tmp_path):
    """A batch window's rows carry event time, their window's last instant (``end`` less
    1 µs, as a record window's result): windows of them follow, on batches and after
    ``rows()``, with the per-record pipeline's rows (a 2 s window ending at 10 falls in
    the 10 s window [0, 10), not [10, 20))."""
    from cutline.connectors import CollectSink

    def pipeline(name):
        return Pipeline(name, parallelism=2, checkpoint=CheckpointConfig(
            interval=0.2, storage=f"file://{tmp_path}/{name}-ck"))

    n = 400
    p = pipeline("records")
    sink = CollectSink(str(tmp_path / "records"))
    (p.source(GeneratorSource(count=n, fn=_reading), uid="src")
     .assign_timestamps(lambda r: r["ts"], max_delay=1, uid="t")
     .key_by(_per_sensor).window(tumbling(2)).sum("v", uid="two")
     .key_by(_per_sensor).window(tumbling(10)).max(lambda r: r.value, uid="ten")
     .map(lambda r: (r.key, float(r.start), float(r.end), r.value), uid="rows")
     .sink(sink, uid="out"))
    p.run(engine="threads", timeout=60)
    want = sorted(sink.results())
    assert len(want) >= 30 and {w[2] - w[1] for w in want} == {10.0}

    p = pipeline("batches")
    on_batches, on_rows = CollectSink(str(tmp_path / "b")), CollectSink(str(tmp_path / "r"))
    two = (p.source(GeneratorSource(count=n, batch_fn=_readings, batch_rows=37), uid="src")
           .assign_timestamps("ts", max_delay=1, uid="t")
           .key_by("k").window(tumbling(2)).agg(v_sum=("v", "sum"), uid="two"))
    two.key_by("k").window(tumbling(10)).agg(hi=("v_sum", "max"), uid="ten").sink(
        on_batches, uid="out")
    (two.rows(uid="as-rows").key_by(_per_sensor).window(tumbling(10))
     .max(lambda r: r["v_sum"], uid="ten-rows")
     .map(lambda r: (r.key, float(r.start), float(r.end), r.value), uid="rows")
     .sink(on_rows, uid="rows-out"))
    p.run(engine="threads", timeout=60)
    got = sorted((r["k"], r["start"], r["end"], r["hi"])
                 for b in on_batches.results() for r in b.to_pylist())
    assert got == want
    assert sorted(on_rows.results()) == want


def _stream(tmp_path):
    p = Pipeline("bad", checkpoint=CheckpointConfig(storage=f"file://{tmp_path}/ck"))
    return p.source(GeneratorSource(count=10, batch_fn=lambda i: pa.record_batch(
        {"ts": pa.array(i, pa.float64()), "k": pa.array(i % 3)})), uid="src")


@pytest.mark.parametrize("make, error", [
    (lambda: session(0), r"session\(gap=\.\.\.\) must be > 0 seconds, got 0"),
    (lambda: session(-2), r"session\(gap=\.\.\.\) must be > 0 seconds, got -2"),
    (lambda: session(float("nan")), r"session\(gap=\.\.\.\) must be a number of seconds"),
    (lambda: session("5s"), r"session\(gap=\.\.\.\) must be seconds \(int or float\)"),
])
def test_a_bad_session_gap_is_refused_up_front(make, error):
    with pytest.raises((TypeError, ValueError), match=error):
        make()


def test_bad_batch_windows_are_refused_when_the_pipeline_is_built(tmp_path):
    s = _stream(tmp_path)
    with pytest.raises(ValueError, match=r"window\(\) needs event time"):
        s.key_by("k").window(session(5))
    keyed = s.assign_timestamps("ts", uid="t").key_by("k")
    with pytest.raises(ValueError, match=r"allowed_lateness=\.\.\.\) must be >= 0"):
        keyed.window(session(5), allowed_lateness=-1)
    with pytest.raises(TypeError, match=r"window\(\) takes tumbling.*session\(gap\)"):
        keyed.window(5)
    with pytest.raises(ValueError, match=r"\['end'\] name the window's bounds"):
        keyed.window(session(5)).agg(end="count")
    out = keyed.window(session(5)).count(uid="s")
    out.late(uid="late").sink(ParquetSink(str(tmp_path / "late")), uid="late-out")
    with pytest.raises(AttributeError, match="map\\(\\) works on records"):
        out.late(uid="late2").map(str)


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 1000), st.integers(1, 6), st.integers(0, 10**6), st.integers(0, 2**32))
def test_batch_window_starts_with_an_offset_name_the_per_record_windows(slide, k, offset, seed):
    # fractional timestamps and an offset: ts - (ts - offset) % slide rounded (-376 came out
    # as -375.99999999999994): both paths compute offset + j * slide and agree exactly
    import numpy as np

    offset %= slide
    rnd = random.Random(seed)
    ts = np.array([round(rnd.uniform(-3, 3), 3) for _ in range(40)])
    for assigner in (tumbling(slide, offset), sliding(slide * k, slide, offset)):
        batch, _ = _ops(assigner, 0, ["k"])
        rows, starts = batch._windows(ts)
        got = sorted(zip(rows.tolist(), starts.tolist()))
        want = sorted((i, float(s)) for i, t in enumerate(ts.tolist())
                      for s, _ in assigner.bounds(t))
        assert got == want
