"""The columnar path (issue 15): batch streams of Arrow record batches.

Key groups of vectorised ``key_by`` equal the per-record ones (hypothesis); columnar file
reads restore at the record; batch operators, keyed aggregations on both backends and a
rescale by key group; Arrow IPC frames; errors name the operator and the type or schema.
"""

from __future__ import annotations

import collections
import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from columnar_pipelines import columnar, events, expected, observed
from cutline import CheckpointConfig, Pipeline, sliding, tumbling
from cutline.connectors import FileSource, GeneratorSource, ParquetSink, RecordError
from cutline.connectors.base import MissingColumnError
from cutline.logical import HASH, ColumnKey, make_node
from cutline.runtime.batches import decode_batches, split_by_key
from cutline.runtime.channels import ARROW, MARSHAL, RECORDS, encode_frame
from cutline.runtime.operators import UserFunctionError
from cutline.runtime.registry import build_operator
from cutline.state.arrow_keys import key_groups
from cutline.state.keygroups import key_group, subtask_for_key_group

# ------------------------------------------------------------------ key groups

_scalars = {
    "int": (st.integers(-2**63, 2**63 - 1), pa.int64()),
    "str": (st.text(max_size=12), pa.string()),
    "float": (st.floats(allow_nan=True, allow_infinity=True), pa.float64()),
    "bool": (st.booleans(), pa.bool_()),
    "bytes": (st.binary(max_size=9), pa.binary()),
}


@st.composite
def keyed_batches(draw):
    n = draw(st.integers(1, 30))
    kinds = draw(st.lists(st.sampled_from(sorted(_scalars)), min_size=1, max_size=3))
    cols = {}
    for j, k in enumerate(kinds):
        strat, typ = _scalars[k]
        cols[f"c{j}"] = pa.array(draw(st.lists(st.none() | strat, min_size=n, max_size=n)),
                                 type=typ)
    offset = draw(st.integers(0, n - 1))
    return pa.record_batch(cols).slice(offset), list(cols)


@settings(max_examples=30, deadline=None)
@given(keyed_batches(), st.sampled_from([1, 7, 128, 1000]))
def test_vectorised_key_groups_equal_the_per_record_ones(case, maxp):
    batch, names = case
    for cols in ([names[0]], names):
        key = ColumnKey(tuple(cols))
        want = [key_group(key(row), maxp) for row in batch.to_pylist()]
        assert key_groups(batch, cols, maxp).tolist() == want


def test_split_by_key_sends_each_row_to_its_key_groups_subtask():
    batch = events(np.arange(5000))
    parts = split_by_key([batch], ("user",), 128, 3)
    assert sum(b.num_rows for part in parts for b in part) == 5000
    for s, part in enumerate(parts):
        for row in pa.Table.from_batches(part, schema=batch.schema).to_pylist():
            assert subtask_for_key_group(key_group(row["user"], 128), 3, 128) == s


# ------------------------------------------------------------------ columnar files


def _write_inputs(d, fmt):
    rows = [{"user": f"u{i % 5}", "value": i, "f": i / 4} for i in range(2500)]
    d.mkdir()
    for k in range(2):
        part = rows[k * 1250:(k + 1) * 1250]
        if fmt == "jsonl":
            (d / f"p{k}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
        elif fmt == "csv":
            (d / f"p{k}.csv").write_text("user,value,f\n" + "".join(
                f"{r['user']},{r['value']},{r['f']}\n" for r in part))
        else:
            pq.write_table(pa.Table.from_pylist(part), d / f"p{k}.parquet", row_group_size=300)
    return rows


def _drain(reader):
    out = []
    while (b := reader.read_batch(1000)) is not None:
        out.extend(b)
    return out


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_columnar_file_read_restores_at_the_record(tmp_path, fmt):
    rows = _write_inputs(tmp_path / "in", fmt)
    src = FileSource(str(tmp_path / "in"), format=fmt).batches(batch_bytes=4096)
    reader = src.create_reader()
    reader.open(0, 1)
    first = []
    for _ in range(3):  # a few batches, then a checkpoint
        first.extend(reader.read_batch(1000))
    pos = reader.snapshot()
    later = src.create_reader()
    later.open(0, 1)
    later.restore(pos)
    got = pa.Table.from_batches(first + _drain(later)).to_pylist()
    assert got == rows  # nothing lost, nothing twice, in order
    assert len(first) >= 3 and all(isinstance(b, pa.RecordBatch) for b in first)


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_columns_reads_only_those_columns_in_their_order(tmp_path, fmt):
    rows = _write_inputs(tmp_path / "in", fmt)
    src = FileSource(str(tmp_path / "in"), format=fmt).batches(columns=["value", "user"],
                                                                batch_bytes=4096)
    reader = src.create_reader()
    reader.open(0, 1)
    got = pa.Table.from_batches(_drain(reader))
    assert got.column_names == ["value", "user"]
    assert got.to_pylist() == [{"value": r["value"], "user": r["user"]} for r in rows]
    missing = FileSource(str(tmp_path / "in"), format=fmt).batches(columns=["user", "nope"])
    reader = missing.create_reader()
    reader.open(0, 1)
    with pytest.raises(MissingColumnError, match=r"p0\.\w+ has no column 'nope' .*; its "
                       r"columns: user, value, f"):
        _drain(reader)


@pytest.mark.parametrize("per_file", [False, True])
def test_jsonl_with_a_schema_reads_only_its_fields(tmp_path, per_file):
    """As ``spark.read.schema(s).json``: the schema's fields, in its order, and no other
    (they are skipped unparsed); without a schema every field is read.  ``per_file``: the
    path that parses each file's blocks alone (``files_at_once`` > 1), else several small
    files are parsed together."""
    rows = _write_inputs(tmp_path / "in", "jsonl")
    schema = pa.schema([("value", pa.int64()), ("user", pa.string())])
    src = FileSource(str(tmp_path / "in"), files_at_once=2 if per_file else 1)
    reader = src.batches(schema, batch_bytes=4096).create_reader()
    reader.open(0, 1)
    got = pa.Table.from_batches(_drain(reader))
    assert got.schema == schema
    want = [{"value": r["value"], "user": r["user"]} for r in rows]
    # (two files at a time interleave their batches)
    assert sorted(got.to_pylist(), key=lambda r: r["value"]) == want
    reader = src.batches(batch_bytes=4096).create_reader()
    reader.open(0, 1)
    assert pa.Table.from_batches(_drain(reader)).column_names == ["user", "value", "f"]


def test_nested_parquet_columns_keep_only_those_fields(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    pq.write_table(pa.table({"kind": [1, 2], "bid": [{"price": 5, "who": "a"},
                                                     {"price": 7, "who": "b"}]}),
                   d / "p.parquet")
    reader = FileSource(str(d), format="parquet").batches(
        columns=["bid.price", "kind"]).create_reader()
    reader.open(0, 1)
    assert pa.Table.from_batches(_drain(reader)).to_pylist() == [
        {"bid": {"price": 5}, "kind": 1}, {"bid": {"price": 7}, "kind": 2}]
    reader = FileSource(str(d), format="parquet").batches(
        columns=["bid.when"]).create_reader()
    reader.open(0, 1)
    with pytest.raises(MissingColumnError, match=r"p\.parquet has no column 'bid\.when' "
                       r"\(batches\(columns=\.\.\.\)\); its columns: kind, bid"):
        _drain(reader)
    for bad, error in ((lambda: FileSource(str(d)).batches(columns="kind"), TypeError),
                       (lambda: FileSource(str(d)).batches(columns=[]), TypeError),
                       (lambda: FileSource(str(d)).batches(columns=["a", "a"]), ValueError),
                       (lambda: FileSource(str(d)).batches(
                           pa.schema([("kind", pa.int64())]), columns=["kind"]), ValueError)):
        with pytest.raises(error, match=r"batches\("):
            bad()


def test_malformed_json_line_names_file_and_line(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    lines = [json.dumps({"a": i}) for i in range(50)]
    lines[36] = '{"a": 36,'
    (d / "x.jsonl").write_text("\n".join(lines) + "\n")
    reader = FileSource(str(d)).batches().create_reader()
    reader.open(0, 1)
    with pytest.raises(RecordError, match=r"x\.jsonl \(line 37, byte offset \d+\)"):
        reader.read_batch(1000)
    with pytest.raises(RecordError, match="line 37"):  # the position stayed: it repeats
        reader.read_batch(1000)


_SMALL = pa.schema([("user", pa.string()), ("value", pa.int64())])


def _small_files(d, files=12, per=40, bad=None):
    """``files`` jsonl files of ``per`` rows (a few hundred bytes each); ``bad``: (file,
    line) made malformed."""
    d.mkdir()
    rows = []
    for k in range(files):
        part = [{"user": f"u{i % 5}", "value": i} for i in range(k * per, (k + 1) * per)]
        lines = [json.dumps(r) for r in part]
        if bad is not None and bad[0] == k:
            lines[bad[1] - 1] = '{"user": "u1", "value": '
        (d / f"f{k:02d}.jsonl").write_text("\n".join(lines) + ("\n" if k % 2 else ""))
        rows += part
    return rows


def test_small_jsonl_files_parse_as_one_batch_and_restore_at_the_record(tmp_path):
    rows = _small_files(tmp_path / "in")  # every other file lacks its last newline
    src = FileSource(str(tmp_path / "in")).batches(_SMALL, batch_bytes=4096)
    reader = src.create_reader()
    reader.open(0, 1)
    first = [reader.read_batch(1000) for _ in range(2)]
    assert [len(b) for b in first] == [1, 1]  # one record batch per read ...
    assert all(b[0].num_rows > 40 for b in first)  # ... of several files' rows
    later = src.create_reader()
    later.open(0, 1)
    later.restore(reader.snapshot())
    got = pa.Table.from_batches([b for bs in first for b in bs] + _drain(later)).to_pylist()
    assert got == rows  # nothing lost, nothing twice, in order


def test_malformed_line_in_small_jsonl_files_names_its_file_and_line(tmp_path):
    _small_files(tmp_path / "in", bad=(2, 17))
    reader = FileSource(str(tmp_path / "in")).batches(_SMALL, batch_bytes=4096)\
        .create_reader()
    reader.open(0, 1)
    with pytest.raises(RecordError, match=r"f02\.jsonl \(line 17, byte offset \d+\)"):
        reader.read_batch(1000)
    with pytest.raises(RecordError, match=r"f02\.jsonl \(line 17"):  # it repeats
        reader.read_batch(1000)


# ------------------------------------------------------------------ pipelines (threads)


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
def test_columnar_pipeline_output_equals_the_expected_rows(tmp_path, backend):
    pytest.importorskip("rocksdict") if backend == "rocksdb" else None
    p, rows, aggs, wins, latest = columnar(tmp_path, 3000, backend=backend)
    p.run(engine="threads", timeout=60)
    assert observed(rows, aggs, wins, latest) == expected(3000)


def _node(kind, fn, **kw):
    return make_node(0, f"{kind}-op", kind, fn, **kw)


@pytest.mark.parametrize("updates", ["checkpoint", "batch"])
def test_aggregate_state_rescales_by_key_group(updates):
    from cutline.logical import AggSpec

    spec = AggSpec(("user",), (("n", None, "count"), ("total", "value", "sum")), updates)
    node = _node("aggregate", spec, key_fn=ColumnKey(("user",)), partitioning=HASH,
                 columnar=True)
    data = events(np.arange(4000))
    ops = [build_operator(node, s, 2, 128) for s in range(2)]
    for s, part in enumerate(split_by_key([data.slice(0, 2000)], ("user",), 128, 2)):
        ops[s].process(part)
    blobs = [op.snapshot() for op in ops]
    one = build_operator(node, 0, 1, 128)  # 2 -> 1: both halves' key groups
    one.restore(blobs)
    out = pa.Table.from_batches(one.process([data.slice(2000)]) + one.flush()).to_pylist()
    want = {}
    for r in data.to_pylist():
        n, t = want.get(r["user"], (0, 0))
        want[r["user"]] = (n + 1, t + r["value"])
    assert {r["user"]: (r["n"], r["total"]) for r in out} == want


def _batch_pipeline(tmp_path, build):
    p = Pipeline("errors", parallelism=1,
                 checkpoint=CheckpointConfig(storage=f"file://{tmp_path}/ck"))
    src = p.source(GeneratorSource(count=100, batch_fn=events, batch_rows=50), uid="events")
    build(src).sink(ParquetSink(str(tmp_path / "out")), uid="out")
    return p


def test_map_batches_returning_the_wrong_type_names_operator_and_type(tmp_path):
    p = _batch_pipeline(tmp_path, lambda s: s.map_batches(lambda b: b.to_pylist(),
                                                         uid="bad"))
    with pytest.raises(Exception, match=r"'bad' .*returned a list; with "
                                        r"batch_format='arrow' it must return a pyarrow"):
        p.run(engine="threads", timeout=60)


def test_sink_schema_mismatch_names_sink_and_schema(tmp_path):
    flip = {"n": 0}

    def drift(b):  # the second batch has another type for "value"
        flip["n"] += 1
        return b if flip["n"] == 1 else b.set_column(2, "value", pc.cast(b["value"], "float64"))

    p = _batch_pipeline(tmp_path, lambda s: s.map_batches(drift, uid="drift"))
    with pytest.raises(Exception, match=r"sink 'out' .*value: double.*does not match.*"
                                        r"value: int64"):
        p.run(engine="threads", timeout=60)


def test_pandas_batches_and_rows_round_trip(tmp_path):
    pytest.importorskip("pandas")
    p = Pipeline("pandas", parallelism=1,
                 checkpoint=CheckpointConfig(storage=f"file://{tmp_path}/ck"))
    (p.source(GeneratorSource(count=300, batch_fn=events, batch_rows=64), uid="events")
       .map_batches(lambda df: df[df["value"] < 10].assign(v=lambda d: d["value"] + 1),
                    batch_format="pandas", uid="pd")
       .filter_batches(lambda b: pc.equal(b["kind"], "click"), uid="fb")
       .rows(uid="rows")
       .map(lambda r: {"i": r["i"], "v": r["v"]}, uid="m")
       .batches(pa.schema([("i", pa.int64()), ("v", pa.int64())]), uid="back")
       .sink(ParquetSink(str(tmp_path / "out")), uid="out"))
    p.run(engine="threads", timeout=60)
    got = sorted((r["i"], r["v"]) for r in ParquetSink(str(tmp_path / "out")).read_records())
    assert got == [(i, i % 100 + 1) for i in range(300) if i % 100 < 10 and i % 3]


def test_batch_stream_refuses_per_record_operators(tmp_path):
    p = Pipeline("x", checkpoint=CheckpointConfig(storage=f"file://{tmp_path}/ck"))
    s = p.source(GeneratorSource(count=10, batch_fn=events))
    with pytest.raises(AttributeError, match=r"map\(\) works on records.*map_batches"):
        s.map(str)
    for name in ("flat_map", "iterate", "batches"):  # a record stream's, not a batch stream's
        assert not hasattr(s, name)
    with pytest.raises(AttributeError, match=r"iterate\(\) works on records.*rows\(\)"):
        s.iterate()
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        s.nope  # noqa: B018
    with pytest.raises(TypeError, match=r"union\(\) of a stream of record batches takes"):
        s.union(p.source(GeneratorSource(count=10)))
    with pytest.raises(TypeError, match=r"union\(\) of a stream of records takes"):
        p.source(GeneratorSource(count=10)).union(s)
    with pytest.raises(TypeError, match="column expression"):
        s.filter(lambda r: True)
    with pytest.raises(TypeError, match="column names"):
        s.key_by(lambda r: r["user"])


# ------------------------------------------------------------------ wire format


def test_record_batches_travel_as_arrow_ipc():
    batches = [events(np.arange(10)), events(np.arange(10, 25))]
    kind, payload = encode_frame(batches)
    assert kind == ARROW
    assert [b.to_pylist() for b in decode_batches(bytes(payload))] == \
        [b.to_pylist() for b in batches]
    mixed = [batches[0], batches[1].select(["i"])]  # two schemas: pickled instead
    assert encode_frame(mixed)[0] == RECORDS
    assert encode_frame([{"a": 1}])[0] == MARSHAL  # plain records (test_channels.py)


def test_user_function_error_names_the_batch_not_its_data():
    from cutline.logical import BatchFunction

    node = _node("map_batches", BatchFunction(lambda b: 1 / 0), columnar=True)
    op = build_operator(node, 0, 1, 128)
    with pytest.raises(UserFunctionError, match=r"record batch of 5 rows: i: int64, user: "
                                                r"string.*ZeroDivisionError"):
        op.process([events(np.arange(5))])


# ------------------------------------------------------------------ sinks, adapters


def test_delta_sink_appends_record_batches_to_a_new_and_an_existing_table(tmp_path):
    pytest.importorskip("deltalake")
    from cutline.connectors import DeltaSink

    table = str(tmp_path / "t")
    for job, lo in (("first", 0), ("second", 400)):  # creates the table, then appends to it
        p = Pipeline(job, parallelism=2,
                     checkpoint=CheckpointConfig(interval=0.2, storage=f"file://{tmp_path}/ck"))
        (p.source(GeneratorSource(count=400, batch_fn=lambda ix, lo=lo: events(ix + lo),
                                  batch_rows=64), uid="events")
           .where(pc.field("kind") == "click", uid="clicks")
           .sink(DeltaSink(table), uid="out"))
        p.run(engine="threads", timeout=60)
    rows = DeltaSink(table).read_records()
    assert sorted((r["i"], r["user"], r["value"]) for r in rows) == \
        [(i, f"u{i * 7 % 13}", i % 100) for i in range(800) if i % 3]


def test_polars_batches(tmp_path):
    pytest.importorskip("polars", reason="polars is optional (not in the test extra: its "
                                         "runtime is a 170 MB install)")
    p = Pipeline("polars", parallelism=1,
                 checkpoint=CheckpointConfig(storage=f"file://{tmp_path}/ck"))
    (p.source(GeneratorSource(count=300, batch_fn=events, batch_rows=64), uid="events")
       .map_batches(lambda df: df.filter(df["value"] < 10).with_columns(
           v=df.filter(df["value"] < 10)["value"] * 2), batch_format="polars", uid="pl")
       .filter_batches(lambda df: df["kind"] == "click", batch_format="polars", uid="fb")
       .select("i", "v", uid="cols")
       .sink(ParquetSink(str(tmp_path / "out")), uid="out"))
    p.run(engine="threads", timeout=60)
    got = sorted((r["i"], r["v"]) for r in ParquetSink(str(tmp_path / "out")).read_records())
    assert got == [(i, i % 100 * 2) for i in range(300) if i % 100 < 10 and i % 3]


# ------------------------------------------------------------------ event time, windows


def _timed(ix):
    """Row ``i``: event time ``i / 10`` s, up to 0.9 s behind the newest (never late for a
    1 s delay), user ``u<i*7 % 5>``, value ``i % 10``."""
    return pa.record_batch({"i": pa.array(ix), "user": pa.array([f"u{u}" for u in ix * 7 % 5]),
                            "value": pa.array(ix % 10),
                            "ts": pa.array(ix / 10 - (ix * 7919 % 10) / 10)})


def _windows_of(n, size, slide):
    want = {}
    for i in range(n):
        ts, user, v = i / 10 - (i * 7919 % 10) / 10, f"u{i * 7 % 5}", i % 10
        last = ts - (ts - 0) % slide
        for k in range(int(np.ceil(size / slide))):
            start = last - k * slide
            if start + size > ts:
                c, s, hi = want.get((user, start), (0, 0, None))
                want[(user, start)] = (c + 1, s + v, v if hi is None else max(hi, v))
    return {k: (c, s, hi, s / c) for k, (c, s, hi) in want.items()}


def test_windowed_aggregations_on_batch_streams(tmp_path):
    p = Pipeline("windows", parallelism=2,
                 checkpoint=CheckpointConfig(interval=0.2, storage=f"file://{tmp_path}/ck"))
    s = (p.source(GeneratorSource(count=1200, batch_fn=_timed, batch_rows=100), uid="ev")
         .assign_timestamps("ts", max_delay=1.0, uid="time"))
    aggs = {"n": "count", "total": ("value", "sum"), "hi": ("value", "max"),
            "avg": ("value", "mean")}
    tumbled = s.key_by("user").window(tumbling(10)).agg(uid="tumbling", **aggs)
    slid = s.key_by("user").window(sliding(12, 4)).agg(uid="sliding", **aggs)
    out = ParquetSink(str(tmp_path / "out"))
    tumbled.union(slid, uid="both").rebalance().where(pc.field("n") > 0, uid="rb")\
        .sink(out, uid="out")
    p.run(engine="threads", timeout=60)
    rows = out.read_records()
    for size, slide in ((10, 10), (12, 4)):
        mine = [r for r in rows if r["end"] - r["start"] == size]
        got = {(r["user"], r["start"]): (r["n"], r["total"], r["hi"], r["avg"]) for r in mine}
        assert len(got) == len(mine)  # one row per key and window
        assert got == _windows_of(1200, size, slide), (size, slide)


def test_batch_window_drops_late_rows_and_updates_within_the_lateness():
    from cutline.logical import BatchWindowSpec
    from cutline.protocol.windows import columns

    aggs = (("n", None, "count"), ("total", "value", "sum"))
    spec = BatchWindowSpec(("user",), aggs, tumbling(10), 5, "ts", columns(aggs))
    op = build_operator(_node("window_agg", spec, key_fn=ColumnKey(("user",)),
                              partitioning=HASH, columnar=True), 0, 1, 128)

    def rows(ts, value):
        return [pa.record_batch({"user": ["a"] * len(ts), "ts": ts, "value": value})]

    assert op.process(rows([1.0, 2.0, 12.0], [1, 2, 4])) == []
    fired = pa.Table.from_batches(op.on_watermark(10)).to_pylist()
    assert fired == [{"user": "a", "start": 0.0, "end": 10.0, "n": 2, "total": 3}]
    again = pa.Table.from_batches(op.process(rows([3.0], [10]))).to_pylist()  # within 5 s
    assert again == [{"user": "a", "start": 0.0, "end": 10.0, "n": 3, "total": 13}]
    op.on_watermark(16)
    assert op.process(rows([4.0], [100])) == [] and op.late_records == 1  # past 10 + 5
    last = pa.Table.from_batches(op.on_watermark(float("inf"))).to_pylist()
    assert last == [{"user": "a", "start": 10.0, "end": 20.0, "n": 1, "total": 4}]


@pytest.mark.parametrize("assigner", [tumbling(10), sliding(10, 5)])  # sliding: panes
def test_batch_window_state_rescales_and_fired_windows_stay_fired(assigner):
    from cutline.logical import BatchWindowSpec
    from cutline.protocol.windows import columns

    aggs = (("n", None, "count"),)
    spec = BatchWindowSpec(("user",), aggs, assigner, 0, "ts", columns(aggs))
    slide = getattr(assigner, "slide", assigner.size)
    assert spec.panes == (slide < assigner.size)
    node = _node("window_agg", spec, key_fn=ColumnKey(("user",)), partitioning=HASH,
                 columnar=True)
    data = _timed(np.arange(600))  # ts 0 .. 60
    ops = [build_operator(node, s, 2, 128) for s in range(2)]
    fired = []
    for s, part in enumerate(split_by_key([data.slice(0, 300)], ("user",), 128, 2)):
        ops[s].process(part)
        fired += ops[s].on_watermark(20 if s == 0 else 10)  # subtask 0 is further on
    one = build_operator(node, 0, 1, 128)  # 2 -> 1: both halves' key groups
    one.restore([op.snapshot() for op in ops])
    # late for subtask 0's key groups (their windows fired at 20), not for the others
    late = split_by_key([data.slice(100, 50)], ("user",), 128, 2)[0]
    fired += one.process(late) + one.process([data.slice(300)])
    assert one.late_records == sum(b.num_rows for b in late)
    fired += one.on_watermark(float("inf"))
    rows = pa.Table.from_batches(fired).to_pylist()
    got = collections.Counter((r["user"], r["start"]) for r in rows)
    assert set(got.values()) == {1}  # no window fired twice, across the rescale
    assert {k: r["n"] for r in rows for k in [(r["user"], r["start"])]} == \
        {(u, float(s)): n for (u, s), (n, *_) in _windows_of(600, 10, slide).items()}


@pytest.mark.parametrize("assigner", [sliding(10, 2.5, offset=0.75), sliding(10, 5, offset=3),
                                      tumbling(10, offset=3)], ids=repr)
def test_batch_windows_name_each_window_once_exactly(assigner):
    """Fractional times around an offset: every row lands in its windows (panes for the
    sliding ones), computed in exact rational arithmetic, each window fires once with its
    whole count (a pane started as ``ts - (ts - offset) % slide`` rounds: -7.000000000000001
    for 1.957 with an offset of 3, a pane under two names and a row in the wrong windows)."""
    import random
    from fractions import Fraction

    from cutline.logical import BatchWindowSpec
    from cutline.protocol.windows import columns

    rng = random.Random(3)
    ts = [round(rng.uniform(-50, 50), 3) for _ in range(4000)]
    users = [f"u{i % 3}" for i in range(len(ts))]
    size = Fraction(assigner.size)
    slide, offset = Fraction(getattr(assigner, "slide", assigner.size)), Fraction(assigner.offset)
    want: collections.Counter = collections.Counter()
    for u, t in zip(users, ts, strict=True):
        last = offset + (Fraction(t) - offset) // slide * slide  # the latest start <= t
        start = last
        while start + size > Fraction(t):
            want[(u, start)] += 1
            start -= slide
    aggs = (("n", None, "count"),)
    spec = BatchWindowSpec(("user",), aggs, assigner, 0, "ts", columns(aggs))
    op = build_operator(_node("window_agg", spec, key_fn=ColumnKey(("user",)),
                              partitioning=HASH, columnar=True), 0, 1, 128)
    assert op.process([pa.record_batch({"user": users, "ts": ts})]) == []
    rows = pa.Table.from_batches(op.on_watermark(float("inf"))).to_pylist()
    got = collections.Counter()
    for r in rows:
        assert Fraction(r["end"]) - Fraction(r["start"]) == size
        got[(r["user"], Fraction(r["start"]))] += r["n"]
    assert got == want
