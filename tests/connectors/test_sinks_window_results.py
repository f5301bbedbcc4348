"""Window results and late records straight into ParquetSink, DeltaSink and UpsertSink (no
``map``), read back as a user would (pyarrow, deltalake, sqlite3) and compared with the
counts computed offline; a record a sink cannot convert fails the job at once, named.

Layout: a ``WindowResult`` is the row ``key, start, end, value`` (``start`` / ``end`` float64
seconds; a tuple key ``key_0, key_1, ...``; a dict value one column per field); the upsert
sink keys it by ``(key, start, end)``, so a re-emission under ``allowed_lateness`` replaces
its row.
"""

from __future__ import annotations

import collections
import dataclasses
import sqlite3
import time
from typing import NamedTuple

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cutline import CheckpointConfig, Pipeline, WindowResult, tumbling
from cutline.connectors import DeltaSink, GeneratorSource, ParquetSink, UpsertSink
from cutline.connectors.base import UnsupportedRecordError
from cutline.connectors.parquet_sink import row_of
from cutline.runtime.failures import repeats
from cutline.spark.launcher import JobFailed
from windows_pipelines import (
    DISORDER, LATENESS, SIZE, _hashable, event, expected, key_of, ts_of,
)

pytest.importorskip("deltalake")

N = 24_000  # records from 20,000 on include some later than LATENESS: the late output


# ---------------------------------------------------------------------- the expected output

def expected_rows(records: int) -> tuple[collections.Counter, dict, collections.Counter]:
    """(every emitted result as a row tuple, the last value per window, the late records)
    of a failure-free run, from the offline counts of windows_pipelines."""
    results, late = expected(records)
    rows = collections.Counter({(r.key, float(r.start), float(r.end), r.value): n
                                for r, n in results.items()})
    final: dict = {}
    for r in results:  # counts only grow: a window's last emission is its largest count
        k = (r.key, float(r.start), float(r.end))
        final[k] = max(final.get(k, 0), r.value)
    return rows, final, late


def windows_into(tmp, out, late_out, *, records: int = N, name: str = "win-sinks",
                 parallelism: int = 2) -> Pipeline:
    """events -> assign_timestamps -> key_by -> tumbling count -> ``out`` (no map), and its
    ``.late()`` -> ``late_out``.  One source split: records reach the windows in order, so
    the output is exactly :func:`expected_rows` (re-emissions under lateness included)."""
    cfg = CheckpointConfig(interval=0.3, storage=f"file://{tmp}/checkpoints")
    p = Pipeline(name, parallelism=parallelism, checkpoint=cfg)
    counts = (p.source(GeneratorSource(count=records, fn=event), uid="events", parallelism=1)
              .assign_timestamps(ts_of, max_delay=DISORDER, uid="stamps", parallelism=1)
              .key_by(key_of)
              .window(tumbling(SIZE), allowed_lateness=LATENESS)
              .count(uid="counts"))
    for o in out if isinstance(out, list) else [out]:
        counts.sink(o, uid=f"out-{type(o).__name__}")
    counts.late(uid="late").sink(late_out, uid="late-out")
    return p


def window_table_rows(table: pa.Table) -> collections.Counter:
    assert table.column_names == ["key", "start", "end", "value"]
    assert table.schema.field("start").type == pa.float64() == table.schema.field("end").type
    assert table.schema.field("value").type == pa.int64()
    return collections.Counter(tuple(r.values()) for r in table.to_pylist())


def late_table_rows(table: pa.Table) -> collections.Counter:
    return collections.Counter(_hashable(r) for r in table.to_pylist())


def read_parquet(path) -> pa.Table:
    return pq.read_table(str(path))  # the directory, as a pyarrow / Spark user reads it


def read_delta(path) -> pa.Table:
    from deltalake import DeltaTable

    return DeltaTable(str(path)).to_pyarrow_table()


def read_kv(path, table: str = "kv") -> dict:
    """The upserted rows, read with sqlite3: {json key: json value}."""
    with sqlite3.connect(path) as db:
        return dict(db.execute(f'SELECT key, value FROM "{table}"').fetchall())


# ---------------------------------------------------------------------- on threads

def test_window_results_into_parquet_are_the_offline_counts(tmp_path):
    out, late = ParquetSink(str(tmp_path / "windows")), ParquetSink(str(tmp_path / "late"))
    result = windows_into(tmp_path, out, late).run(engine="threads", timeout=120)
    assert result.attempts == 1
    want, _, want_late = expected_rows(N)
    assert window_table_rows(read_parquet(tmp_path / "windows")) == want
    assert sum(want.values()) > len({r[:3] for r in want}) + 500  # re-emissions were written
    assert late_table_rows(read_parquet(tmp_path / "late")) == want_late
    assert len(want_late) > 20


def test_window_results_into_delta_are_the_offline_counts(tmp_path):
    out, late = DeltaSink(str(tmp_path / "windows")), DeltaSink(str(tmp_path / "late"))
    result = windows_into(tmp_path, out, late).run(engine="threads", timeout=120)
    assert result.attempts == 1
    want, _, want_late = expected_rows(N)
    assert window_table_rows(read_delta(tmp_path / "windows")) == want
    assert late_table_rows(read_delta(tmp_path / "late")) == want_late


def test_window_results_upsert_by_key_start_end_so_a_re_emission_replaces_its_row(tmp_path):
    out = UpsertSink(str(tmp_path / "windows.db"))  # no key=: (key, start, end)
    late = UpsertSink(str(tmp_path / "late.db"), key="i")
    result = windows_into(tmp_path, out, late).run(engine="threads", timeout=120)
    assert result.attempts == 1
    _, final, want_late = expected_rows(N)
    assert out.read() == final  # the last (largest) count of every window, once
    raw = read_kv(str(tmp_path / "windows.db"))
    assert len(raw) == len(final) and raw['["k1",0.0,100.0]'] == str(final[("k1", 0.0, 100.0)])
    got_late = collections.Counter(_hashable(r) for r in late.read().values())
    assert got_late == want_late


def test_tuple_keys_and_dict_values_become_columns(tmp_path):
    """A tuple key is key_0, key_1, ...; a dict value is a column per field (value_<name>
    where the name is taken); into Parquet and Delta alike, through a pipeline."""
    cfg = CheckpointConfig(interval=0.3, storage=f"file://{tmp_path}/checkpoints")
    p = Pipeline("layout", parallelism=2, checkpoint=cfg)
    stats = (p.source(GeneratorSource(count=2_000, fn=event), uid="events", parallelism=1)
             .assign_timestamps(ts_of, max_delay=DISORDER, parallelism=1)
             .key_by(lambda e: (e["k"], e["i"] % 2))
             .window(tumbling(SIZE))
             .aggregate(lambda: {"n": 0, "end": 0},
                        lambda a, e: {"n": a["n"] + 1, "end": max(a["end"], e["ts"])},
                        uid="stats"))
    stats.sink(ParquetSink(str(tmp_path / "pq")), uid="pq")
    stats.sink(DeltaSink(str(tmp_path / "delta")), uid="delta")
    p.run(engine="threads", timeout=120)
    counts: collections.Counter = collections.Counter()
    last: dict = {}
    for e in map(event, range(2_000)):
        w = (e["k"], e["i"] % 2, float(e["ts"] // SIZE * SIZE))
        counts[w] += 1
        last[w] = max(last.get(w, 0), e["ts"])
    want = {(k0, k1, s, s + SIZE, counts[(k0, k1, s)], last[(k0, k1, s)])
            for (k0, k1, s) in counts}
    for table in (read_parquet(tmp_path / "pq"), read_delta(tmp_path / "delta")):
        assert table.column_names == ["key_0", "key_1", "start", "end", "n", "value_end"]
        rows = [tuple(r.values()) for r in table.to_pylist()]
        assert len(rows) == len(want) and set(rows) == want


class Point(NamedTuple):
    x: int
    y: str


class Item(NamedTuple):
    i: int
    name: str


@dataclasses.dataclass
class Reading:
    sensor: str
    value: float


def test_records_become_rows():
    assert row_of({"a": 1}) == {"a": 1}
    assert row_of(WindowResult("u1", 0, 10, 3)) == {"key": "u1", "start": 0.0, "end": 10.0,
                                                    "value": 3}
    assert row_of(WindowResult(("u1", 2), 5, 10, {"n": 1, "key_0": "x", "value": 2})) == {
        "key_0": "u1", "key_1": 2, "start": 5.0, "end": 10.0, "n": 1, "value_key_0": "x",
        "value": 2}
    assert row_of(WindowResult("u", 0, 1, {1: "a"})) == {"key": "u", "start": 0.0,
                                                         "end": 1.0, "value": {1: "a"}}
    assert row_of(Point(1, "a")) == {"x": 1, "y": "a"}
    assert row_of(Reading("s", 1.5)) == {"sensor": "s", "value": 1.5}
    assert row_of(WindowResult("u", 0, 1, (2, 0.5))) == {"key": "u", "start": 0.0,
                                                         "end": 1.0, "value_0": 2,
                                                         "value_1": 0.5}
    assert row_of(("u1", 3.0)) == {"value_0": "u1", "value_1": 3.0}
    assert row_of(7) == {"value": 7} and row_of([1, 2]) == {"value": [1, 2]}
    assert row_of({1, 2}) is None and row_of(object()) is None and row_of(Reading) is None


def _writer(sink):
    w = sink.create_writer()
    w.open(0, 1, "job")
    w.operator = "out"  # as a task names it
    return w


@pytest.mark.parametrize("make", [lambda d: ParquetSink(str(d / "o")),
                                  lambda d: DeltaSink(str(d / "o"))], ids=["parquet", "delta"])
def test_an_unconvertible_record_fails_at_write_naming_sink_type_and_what_it_accepts(
        tmp_path, make):
    sink = make(tmp_path)
    with pytest.raises(UnsupportedRecordError) as info:
        _writer(sink).write([{"a": 1}, frozenset({1})])
    msg = str(info.value)
    assert msg.startswith(f"sink 'out' ({sink!r}) cannot write a record of type frozenset "
                          "(frozenset({1})). It accepts dicts (a column per key), "
                          "WindowResult (columns key or key_0, key_1, ..., start, end, value"), msg
    assert info.value.type_name == "frozenset" and repeats(info.value)
    # a value Arrow cannot type: in the first batch at once, in a later one at pre-commit
    with pytest.raises(UnsupportedRecordError, match=r"sink 'out' .* cannot write the record "
                       r"\{'a': <object object at .*its column 'a' holds a object"):
        _writer(sink).write([{"a": 1}, {"a": object()}])
    w = _writer(sink)
    w.write([{"a": 1}])
    w.write([{"a": "two"}])
    with pytest.raises(UnsupportedRecordError, match=r"the record \{'a': 'two'\}: its column "
                                                     r"'a' holds a str \('two'\)") as info:
        w.pre_commit(1)
    assert info.value.type_name == "str"


def test_the_upsert_sink_names_what_it_cannot_key_or_encode(tmp_path):
    w = _writer(UpsertSink(str(tmp_path / "kv.db")))
    with pytest.raises(UnsupportedRecordError, match=r"cannot write the record \{'i': 1\}: "
                       r"UpsertSink\(key=None\) takes WindowResult records only\. It accepts"):
        w.write([{"i": 1}])
    w = _writer(UpsertSink(str(tmp_path / "kv.db"), key="i"))
    with pytest.raises(UnsupportedRecordError, match=r"its value .* holds a set, which is not "
                                                     r"JSON .* It accepts records whose key") \
            as info:
        w.write([{"i": 1, "tags": {"a"}}])
    assert info.value.type_name == "set"
    with pytest.raises(UnsupportedRecordError, match="it has no field 'i'"):
        w.write([{"j": 1}])
    w.write([Item(1, "a")])  # a named tuple's field by name
    w.commit([w.pre_commit(1)])
    assert UpsertSink(str(tmp_path / "kv.db")).read() == {1: [1, "a"]}
    by_key = UpsertSink(str(tmp_path / "kv.db"), key="key", table="latest")
    w = _writer(by_key)  # the latest window per key: a WindowResult's value by default
    w.write([WindowResult("u", 0, 10, 3), WindowResult("u", 10, 20, 5)])
    w.commit([w.pre_commit(1)])
    assert by_key.read() == {"u": 5}


class Opaque:
    def __repr__(self) -> str:
        return "Opaque()"


BAD = {  # per sink: (a record it cannot convert, the type its message names)
    "parquet": ({37, 38}, "a record of type set ({37, 38})"),
    "delta": (Opaque(), "a record of type Opaque (Opaque())"),
    "upsert": ({"i": 37, "tags": {1}}, "its value {'i': 37, 'tags': {1}} holds a set"),
}


def bad_job(tmp, kind: str, rate: float | None = 2_000) -> tuple[Pipeline, object]:
    """A long job (50 s at ``rate``) whose record 37 its sink cannot convert; checkpoints
    far apart, so only a failure at the write ends it early."""
    record = BAD[kind][0]
    cfg = CheckpointConfig(interval=600, timeout=600, storage=f"file://{tmp}/checkpoints")
    p = Pipeline(f"bad-{kind}", parallelism=1, checkpoint=cfg)
    sink = {"parquet": lambda: ParquetSink(str(tmp / "out")),
            "delta": lambda: DeltaSink(str(tmp / "out")),
            "upsert": lambda: UpsertSink(str(tmp / "kv.db"), key="i")}[kind]()
    (p.source(GeneratorSource(count=100_000, rate=rate,
                              fn=lambda i: record if i == 37 else {"i": i}), uid="numbers")
      .sink(sink, uid="out"))
    return p, sink


@pytest.mark.parametrize("kind", list(BAD))
def test_a_job_whose_sink_cannot_convert_a_record_fails_at_once(tmp_path, kind):
    p, sink = bad_job(tmp_path, kind)
    t0 = time.monotonic()
    with pytest.raises(JobFailed) as info:
        p.run(engine="threads", timeout=120)
    took = time.monotonic() - t0
    msg = str(info.value)
    # fatal: the task's own message is the cause (one that Spark would retry reads
    # "task numbers.0: TypeError: ..."), naming the sink, the type and what it accepts
    assert msg.startswith(f"job 'bad-{kind}' failed: task numbers.0: sink 'out' ({sink!r}) "
                          "cannot write "), msg
    assert BAD[kind][1] in msg and ". It accepts " in msg, msg
    assert took < 20, f"the job took {took:.0f} s to fail (the input takes 50 s)"


# ---------------------------------------------------------------------- on Spark

@pytest.mark.slow
def test_window_results_into_the_three_sinks_on_spark(spark, tmp_path):
    outs = [ParquetSink(str(tmp_path / "pq")), DeltaSink(str(tmp_path / "delta")),
            UpsertSink(str(tmp_path / "kv.db"))]
    late = ParquetSink(str(tmp_path / "late"))
    result = windows_into(tmp_path, outs, late, name="win-sinks-spark").run(spark=spark,
                                                                             timeout=240)
    assert result.attempts == 1
    want, final, want_late = expected_rows(N)
    assert window_table_rows(read_parquet(tmp_path / "pq")) == want
    assert window_table_rows(read_delta(tmp_path / "delta")) == want
    assert outs[2].read() == final
    assert late_table_rows(read_parquet(tmp_path / "late")) == want_late


@pytest.mark.slow
def test_an_unconvertible_record_fails_at_once_on_spark_never_retried(spark, tmp_path):
    p, sink = bad_job(tmp_path, "parquet")
    drivers = []
    t0 = time.monotonic()
    with pytest.raises(JobFailed) as info:
        p.run(spark=spark, timeout=240, on_start=drivers.append)
    msg = str(info.value)
    assert f"sink 'out' ({sink!r}) cannot write a record of type set ({{37, 38}})" in msg, msg
    assert drivers and drivers[0].run.attempts == 1  # Spark never ran the stage again
    assert time.monotonic() - t0 < 60
