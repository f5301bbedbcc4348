"""Integer sums of batch streams never wrap around silently: a sum that leaves int64 fails
the job naming the column (as Spark SQL's ANSI mode does), one near the limit is exact."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cutline import CheckpointConfig, Pipeline, tumbling
from cutline.connectors import GeneratorSource, ParquetSink
from cutline.runtime.batches import Partials
from cutline.state.columnar import SumOverflow, add_exact

BIG = 2**62
TOP = 2**63 - 1


def test_add_exact_adds_and_names_the_overflow():
    a = np.array([1, TOP - 1, -TOP], dtype=np.int64)
    assert add_exact(a, np.array([1, 1, -1], dtype=np.int64)).tolist() == [2, TOP, -TOP - 1]
    with pytest.raises(SumOverflow, match=r"overflows int64: 9223372036854775807 \+ 1"):
        add_exact(np.array([TOP], dtype=np.int64), np.array([1], dtype=np.int64))
    with pytest.raises(SumOverflow):
        add_exact(np.array([-TOP - 1], dtype=np.int64), np.array([-1], dtype=np.int64))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(-2**63, TOP)), min_size=1,
                max_size=40))
def test_grouped_sums_are_exact_or_refused(rows):
    """Partials.arrow's per-key sums: what Python's integers give, or SumOverflow exactly
    when a key's sum leaves int64 - never a wrapped value."""
    table = pa.table({"k": [k for k, _ in rows], "v": pa.array([v for _, v in rows],
                                                                 pa.int64())})
    parts = Partials((("total", "v", "sum"),))
    want: dict[int, int] = {}
    for k, v in rows:
        want[k] = want.get(k, 0) + v
    fits = all(-TOP - 1 <= total <= TOP for total in want.values())
    if not fits:
        with pytest.raises(SumOverflow, match="column 'v' overflows int64"):
            parts.arrow(table, ["k"])
        return
    keys, sums = parts.arrow(table, ["k"])
    assert dict(zip(keys[0].to_pylist(), sums[0].to_pylist())) == want


def _pipeline(name: str, tmp_path, interval: float = 1.0) -> Pipeline:
    return Pipeline(name, parallelism=1, checkpoint=CheckpointConfig(
        interval=interval, storage=f"file://{tmp_path}/ck"))


def _big(ids: np.ndarray) -> pa.RecordBatch:
    return pa.record_batch({"k": pa.array(ids % 2), "v": pa.array(np.full(len(ids), BIG))})


def _near(ids: np.ndarray) -> pa.RecordBatch:  # +BIG, -BIG, ... : sums stay in range
    return pa.record_batch({"k": pa.array(ids % 2),
                            "v": pa.array(np.where((ids // 2) % 2 == 0, BIG, -BIG))})


def _ts(fn):
    def batch(ids: np.ndarray) -> pa.RecordBatch:
        rb = fn(ids)
        return rb.append_column("ts", pa.array(ids.astype(np.float64) / 100))
    return batch


@pytest.mark.parametrize("rows_per_batch", [2, 8])
def test_a_keyed_sum_past_int64_fails_the_job_naming_it(tmp_path, rows_per_batch):
    """Within one batch (8 rows of 2**62 per key) or across batches (the state's merge)."""
    p = _pipeline("overflow", tmp_path)
    (p.source(GeneratorSource(count=16, batch_fn=_big, batch_rows=rows_per_batch),
              uid="ev")
     .key_by("k").agg(uid="sums", total=("v", "sum"))
     .sink(ParquetSink(str(tmp_path / "out")), uid="out"))
    with pytest.raises(Exception, match="overflow") as info:
        p.run(engine="threads", timeout=60)
    assert "sums" in str(info.value) and "int64" in str(info.value)


def test_a_window_sum_past_int64_fails_the_job_naming_it(tmp_path):
    p = _pipeline("overflow-window", tmp_path)
    (p.source(GeneratorSource(count=16, batch_fn=_ts(_big), batch_rows=2), uid="ev")
     .assign_timestamps("ts", max_delay=0.0, uid="time")
     .key_by("k").window(tumbling(60)).agg(uid="win", total=("v", "sum"))
     .sink(ParquetSink(str(tmp_path / "out")), uid="out"))
    with pytest.raises(Exception, match="overflow"):
        p.run(engine="threads", timeout=60)


def test_sums_near_the_limit_stay_exact(tmp_path):
    """Values of +-2**62 whose per-key sums stay in range: summed, not refused."""
    p = _pipeline("near", tmp_path)
    out = ParquetSink(str(tmp_path / "out"))
    (p.source(GeneratorSource(count=40, batch_fn=_near, batch_rows=8), uid="ev")
     .key_by("k").agg(uid="sums", total=("v", "sum"), updates="checkpoint")
     .sink(out, uid="out"))
    p.run(engine="threads", timeout=60)
    last = {r["k"]: r["total"] for r in out.read_records()}
    ids = np.arange(40)
    v = np.where((ids // 2) % 2 == 0, BIG, -BIG)
    assert last == {k: int(v[ids % 2 == k].astype(object).sum()) for k in (0, 1)}


def test_the_state_merge_names_the_overflow(tmp_path):
    """Batches whose partials fit, a total that does not: the keyed state's merge refuses
    it (one batch per checkpoint interval, so the combine sends each batch's partials)."""
    p = _pipeline("overflow-merge", tmp_path, interval=0.05)
    (p.source(GeneratorSource(count=16, batch_fn=_big, batch_rows=2, rate=40), uid="ev")
     .key_by("k").agg(uid="sums", total=("v", "sum"))
     .sink(ParquetSink(str(tmp_path / "out")), uid="out"))
    with pytest.raises(Exception, match=r"'sums' failed .*SumOverflow: .*overflows int64"):
        p.run(engine="threads", timeout=60)


def test_the_columns_merge_refuses_a_total_past_int64():
    """The keyed state's columns: partials that fit, a key's total that does not."""
    from cutline.state.columnar import ColumnarAggregates

    parts = Partials((("total", "v", "sum"),))
    cols = ColumnarAggregates([f for _, f in parts.parts], [pa.int64()], [pa.int64()],
                              parts.reads, table={}, track=False, fresh=True)
    cols.merge([pa.array([0, 1])], [pa.array([BIG, -BIG])])
    cols.merge([pa.array([0, 1])], [pa.array([BIG - 1, -BIG])])  # TOP and -2**63: in range
    assert cols.rows(np.array([0, 1]))[1].to_pylist() == [TOP, -TOP - 1]
    with pytest.raises(SumOverflow, match=r"overflows int64: 9223372036854775807 \+ 1"):
        cols.merge([pa.array([0])], [pa.array([1])])


def test_panes_merged_into_a_window_refuse_a_sum_past_int64():
    """A sliding window fired as the merge of its panes (each pane's sum fits)."""
    from cutline.state.columnar import ColumnarAggregates

    parts = Partials((("total", "v", "sum"),))
    cols = ColumnarAggregates([f for _, f in parts.parts], [pa.int64()], [pa.int64()],
                              parts.reads, table={}, track=False, fresh=True)
    cols.merge([pa.array([0, 1, 2])], [pa.array([BIG, BIG - 1, BIG])])
    rows = np.array([0, 1, 2])
    assert cols.merged(rows, np.array([0, 2]))[0].to_pylist() == [TOP, BIG]  # in range
    with pytest.raises(SumOverflow, match="overflows int64"):
        cols.merged(rows, np.array([0]))


def test_a_sliding_window_whose_panes_overflow_fails_naming_it(tmp_path):
    """Each pane's sum fits (one value per key and pane); the window over six of them
    does not: it fails when it fires, naming the operator."""
    from cutline import sliding

    def panes(ids: np.ndarray) -> pa.RecordBatch:
        return pa.record_batch({"k": pa.array(ids % 2), "v": pa.array(np.full(len(ids), BIG)),
                                "ts": pa.array((ids // 2) * 10.0)})

    p = _pipeline("overflow-panes", tmp_path)
    (p.source(GeneratorSource(count=16, batch_fn=panes, batch_rows=2), uid="ev")
     .assign_timestamps("ts", max_delay=0.0, uid="time")
     .key_by("k").window(sliding(60, 10)).agg(uid="slid", total=("v", "sum"))
     .sink(ParquetSink(str(tmp_path / "out")), uid="out"))
    with pytest.raises(Exception, match=r"'slid' failed .*SumOverflow: .*overflows int64"):
        p.run(engine="threads", timeout=60)


def test_narrow_integers_sum_as_int64_as_arrow_does():
    """int32 values past int32's range in sum: Arrow's sum is int64, nothing overflows."""
    table = pa.table({"k": [0] * 8, "v": pa.array([2**30] * 8, pa.int32())})
    keys, sums = Partials((("total", "v", "sum"),)).arrow(table, ["k"])
    assert sums[0].to_pylist() == [2**33] and sums[0].type == pa.int64()
