"""Sources and sinks against their contracts: replay from positions, two-phase commit."""

import json
import multiprocessing
import os
import pathlib
import pickle
import time

import msgpack
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cutline.connectors import (
    CollectSink, CommitError, FileSource, GeneratorSource, ParquetSink, PrintSink, RecordError,
    Sink, SinkWriter, Source, SourceReader,
)


def roundtrip(state):
    """What the checkpoint store does to a position or a handle."""
    return msgpack.unpackb(msgpack.packb(state, use_bin_type=True), raw=False)


def drain(reader, max_records=7, timeout=10.0):
    out, deadline = [], time.monotonic() + timeout
    while (batch := reader.read_batch(max_records)) is not None:
        out.extend(batch)
        assert time.monotonic() < deadline, "bounded reader never ended"
    return out


def opened(source, subtask=0, parallelism=1):
    r = source.create_reader()
    r.open(subtask, parallelism)
    return r


# ---------------------------------------------------------------- generator

def square(i):
    return i * i


@pytest.mark.parametrize("p", [1, 3])
def test_generator_is_deterministic_and_partitioned(p):
    src = GeneratorSource(count=50, fn=square)
    runs = [[drain(opened(src, s, p)) for s in range(p)] for _ in range(2)]
    assert runs[0] == runs[1]
    for s, part in enumerate(runs[0]):
        assert part == [square(i) for i in range(s, 50, p)]
    assert sorted(x for part in runs[0] for x in part) == [square(i) for i in range(50)]


@pytest.mark.parametrize("p", [1, 3])
@pytest.mark.parametrize("cut", [0, 1, 4, 9])
def test_generator_replays_exactly_from_snapshot(p, cut):
    src = GeneratorSource(count=40)
    seen = []
    for s in range(p):
        r = opened(src, s, p)
        prefix = []
        while len(prefix) < cut and (b := r.read_batch(2)):
            prefix.extend(b)
        state = roundtrip(r.snapshot())
        rest_original = drain(r)
        fresh = opened(src, s, p)
        fresh.restore(state)
        rest = drain(fresh)
        assert rest == rest_original
        seen.extend(prefix + rest)
    assert sorted(seen) == list(range(40))


def test_generator_refuses_a_position_of_another_subtask():
    r = opened(GeneratorSource(count=10), 0, 3)
    r.read_batch(2)
    other = opened(GeneratorSource(count=10), 1, 3)
    with pytest.raises(ValueError, match="another subtask/parallelism"):
        other.restore(r.snapshot())


def test_generator_unbounded_and_picklable():
    src = GeneratorSource()
    r = opened(src, 0, 2)
    assert r.read_batch(5) == [0, 2, 4, 6, 8]
    assert pickle.loads(pickle.dumps(src)).count is None
    assert isinstance(src, Source) and isinstance(r, SourceReader)


def test_generator_rate_limit_roughly_honoured():
    # 200 records/s in total over 2 subtasks -> 100/s each; read both for ~0.5 s.
    src = GeneratorSource(rate=200)
    readers = [opened(src, s, 2) for s in range(2)]
    got, start = 0, time.monotonic()
    while time.monotonic() - start < 0.5:
        for r in readers:
            batch = r.read_batch(1000)
            assert batch is not None and len(batch) <= 1000
            got += len(batch)
    elapsed = time.monotonic() - start
    assert 40 <= got <= 200 * elapsed + 2 * 10 + 2  # + the 0.1 s burst allowance per subtask


def test_generator_rate_limited_read_does_not_block_long():
    r = opened(GeneratorSource(rate=0.5), 0, 1)  # one record every 2 s
    start = time.monotonic()
    assert r.read_batch(10) == []
    assert time.monotonic() - start < 0.5


# ---------------------------------------------------------------- file source

def write_jsonl(path, records):
    with open(path, "w") as f:
        for rec in records:
            f.write(json.dumps(rec) + "\n")


@pytest.fixture
def data_dir(tmp_path):
    """Three files per format with 10, 15 and 5 records, ids 0..29, plus files to ignore."""
    d = tmp_path / "in"
    chunks = [range(0, 10), range(10, 25), range(25, 30)]
    for fmt in ("jsonl", "csv", "parquet"):
        sub = d / fmt
        sub.mkdir(parents=True)
        for k, ids in enumerate(chunks):
            recs = [{"id": i, "name": f"n,{i}" if i % 4 else f"multi\nline {i}"} for i in ids]
            if fmt == "jsonl":
                write_jsonl(sub / f"f{k}.jsonl", recs)
            elif fmt == "csv":
                with open(sub / f"f{k}.csv", "w") as f:
                    f.write("id,name\n")
                    for r in recs:
                        f.write(f'{r["id"]},"{r["name"]}"\n')
            else:
                pq.write_table(pa.Table.from_pylist(recs), sub / f"f{k}.parquet",
                               row_group_size=4)
        (sub / ".hidden").write_text("garbage")
        (sub / "_SUCCESS").write_text("")
    return d


def ids(records):
    return [int(r["id"]) for r in records]


def test_file_source_rate_paces_reads_and_loses_nothing(data_dir):
    # 60 records/s over 2 subtasks -> 30/s each; the 30 records take ~0.5 s (the bucket
    # starts empty), with positions as exact as without a rate.
    src = FileSource(str(data_dir / "jsonl"), rate=60)
    readers = [opened(src, s, 2) for s in range(2)]
    got, live, start = [], set(range(2)), time.monotonic()
    while live:
        for k in sorted(live):
            batch = readers[k].read_batch(1000)
            if batch is None:
                live.discard(k)
            else:
                assert len(batch) <= 4  # never more than ~0.1 s worth at once
                got += batch
    assert sorted(ids(got)) == list(range(30))
    assert time.monotonic() - start >= 0.4
    for bad in (0, -1, float("nan"), float("inf"), True):
        with pytest.raises(ValueError, match="rate must be a positive"):
            FileSource(str(data_dir / "jsonl"), rate=bad)
    with pytest.raises(ValueError, match="leave rate None"):
        src.batches()


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_file_source_reads_everything(data_dir, fmt):
    records = drain(opened(FileSource(str(data_dir / fmt), format=fmt)))
    assert ids(records) == list(range(30))
    assert records[4]["name"] == "multi\nline 4" and records[5]["name"] == "n,5"
    if fmt == "csv":
        assert records[0] == {"id": "0", "name": "multi\nline 0"}  # csv values are strings


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_file_source_partitions_by_file(data_dir, fmt):
    src = FileSource(str(data_dir / fmt), format=fmt)
    parts = [ids(drain(opened(src, s, 2))) for s in range(2)]
    assert parts == [list(range(0, 10)) + list(range(25, 30)), list(range(10, 25))]
    assert ids(drain(opened(src, 2, 3))) == list(range(25, 30))


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_file_source_restore_mid_file_continues_exactly(data_dir, fmt):
    src = FileSource(str(data_dir / fmt), format=fmt)
    for cut in [0, 1, 3, 5, 10, 13, 24, 29, 30]:
        r = opened(src)
        prefix = []
        while len(prefix) < cut:
            prefix.extend(r.read_batch(min(3, cut - len(prefix))))
        state = roundtrip(r.snapshot())
        fresh = opened(src)
        fresh.restore(state)
        assert ids(prefix + drain(fresh)) == list(range(30)), (cut, state)


def test_file_source_follow_picks_up_new_files(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", [{"id": i} for i in range(3)])
    r = opened(FileSource(str(tmp_path), follow=True, poll_interval=0.05))
    assert ids(r.read_batch(10)) == [0, 1, 2]
    assert r.read_batch(10) == []  # unbounded: nothing now, but not the end
    write_jsonl(tmp_path / ".b.tmp", [{"id": i} for i in range(3, 6)])
    os.rename(tmp_path / ".b.tmp", tmp_path / "b.jsonl")  # files appear atomically
    got, deadline = [], time.monotonic() + 5
    while len(got) < 3 and time.monotonic() < deadline:
        got.extend(r.read_batch(10))
    assert ids(got) == [3, 4, 5]
    state = roundtrip(r.snapshot())
    assert state["done"] == ["a.jsonl", "b.jsonl"]
    fresh = opened(FileSource(str(tmp_path), follow=True, poll_interval=0.05))
    fresh.restore(state)
    assert fresh.read_batch(10) == []  # nothing read twice


def test_malformed_jsonl_line_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": 0}\n{"id": 1}\n{"id": 2,,}\n{"id": 3}\n')
    r = opened(FileSource(str(tmp_path)))
    assert ids(r.read_batch(2)) == [0, 1]
    with pytest.raises(RecordError) as err:
        r.read_batch(2)
    e = err.value
    assert e.file.endswith("bad.jsonl") and e.line == 3 and e.position == 20
    assert "bad.jsonl" in str(e) and "line 3" in str(e) and e.reason in str(e)
    assert r.snapshot()["offset"] == 20  # the position stays at the bad record


def test_csv_field_count_mismatch_is_a_record_error(tmp_path):
    (tmp_path / "x.csv").write_text("a,b\n1,2\n3\n")
    with pytest.raises(RecordError, match=r"x\.csv \(line 3.*expected 2 fields"):
        drain(opened(FileSource(str(tmp_path), format="csv")))


def test_csv_with_fieldnames_has_no_header(tmp_path):
    (tmp_path / "x.csv").write_text("1;2\n3;4\n")
    src = FileSource(str(tmp_path), format="csv", fieldnames=["a", "b"], delimiter=";")
    assert drain(opened(src)) == [{"a": "1", "b": "2"}, {"a": "3", "b": "4"}]


def test_file_source_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="input path .*nope does not exist"):
        FileSource(str(tmp_path / "nope"))
    with pytest.raises(ValueError, match="unknown file format 'xml'"):
        FileSource(str(tmp_path), format="xml")


def test_file_source_over_fsspec_url_and_single_file():
    import fsspec
    fs = fsspec.filesystem("memory")
    with fs.open("/cutline-test/in/a.jsonl", "w") as f:
        f.write('{"id": 1}\n{"id": 2}\n')
    src = FileSource("memory://cutline-test/in")
    assert ids(drain(opened(src))) == [1, 2]
    assert ids(drain(opened(FileSource("memory://cutline-test/in/a.jsonl")))) == [1, 2]
    assert pickle.loads(pickle.dumps(src)).path == "memory://cutline-test/in"
    fs.rm("/cutline-test", recursive=True)


# ---------------------------------------------------------------- two-phase-commit sinks

def parquet_sink(path):
    return ParquetSink(str(path / "out"))


def collect_sink(path):
    return CollectSink(str(path / "out"))


def committed(sink):
    return sink.read_records() if isinstance(sink, ParquetSink) else sink.results()


def writer(sink, subtask=0, parallelism=1, job="job"):
    w = sink.create_writer()
    w.open(subtask, parallelism, job)
    return w


def recs(*idx):
    return [{"id": i} for i in idx]


@pytest.fixture(params=[parquet_sink, collect_sink], ids=["parquet", "collect"])
def sink(request, tmp_path):
    return request.param(tmp_path)


def test_collect_sink_temporary_directory_goes_with_the_sink(tmp_path):
    """A CollectSink without a path removes the directory it made when it is collected
    (or at exit); a copy unpickled elsewhere (a worker's) removes nothing; a path given
    stays."""
    import gc

    made = CollectSink()
    w = writer(made)
    w.write(recs(1, 2))
    w.commit([w.pre_commit(1)])
    copy = pickle.loads(pickle.dumps(made))
    assert copy.results() == recs(1, 2)
    del copy
    gc.collect()
    assert made.results() == recs(1, 2)  # the copy's end removed nothing
    path = pathlib.Path(made.path)
    assert path.is_dir()
    del made, w
    gc.collect()
    assert not path.exists()
    given = CollectSink(str(tmp_path / "kept"))
    writer(given).write(recs(3))
    del given
    gc.collect()
    assert (tmp_path / "kept").is_dir()


def staged_files(sink):
    return sorted(p for p in (pathlib.Path(sink.path) / "_staging").rglob("*") if p.is_file())


def test_sink_commit_makes_staged_data_visible_once(sink):
    w = writer(sink)
    assert isinstance(sink, Sink) and isinstance(w, SinkWriter)
    w.write(recs(1, 2))
    w.write(recs(3))
    h = roundtrip(w.pre_commit(1))
    assert h["checkpoint_id"] == 1 and h["subtask"] == 0 and len(h["files"]) == 1
    assert h["files"][0].startswith("_staging/job/0/chk-1")
    assert committed(sink) == []  # staged, not visible
    w.commit([h])
    assert committed(sink) == recs(1, 2, 3)
    w.commit([h])  # idempotent
    w.recover([h])
    assert committed(sink) == recs(1, 2, 3)
    assert staged_files(sink) == []


def test_sink_empty_pre_commit_produces_no_file(sink):
    w = writer(sink)
    h = w.pre_commit(1)
    assert h["files"] == [] and staged_files(sink) == []
    w.commit([h])
    assert committed(sink) == []


def test_sink_abort_discards(sink):
    w = writer(sink)
    w.write(recs(1))
    h = w.pre_commit(1)
    w.abort([h])
    assert staged_files(sink) == [] and committed(sink) == []
    with pytest.raises(CommitError, match="missing"):
        w.commit([h])


def test_sink_recover_recommits_restored_handles_and_drops_the_rest(sink):
    w = writer(sink)
    w.write(recs(1))
    h1 = roundtrip(w.pre_commit(1))
    w.commit([h1])
    w.write(recs(2, 3))
    h2 = roundtrip(w.pre_commit(2))   # checkpoint 2 completed, but the task died before commit
    w.write(recs(4))
    w.pre_commit(3)                   # checkpoint 3 never completed
    w.write(recs(5))                  # not even pre-committed
    # restart from checkpoint 2: its state holds every handle not known to be committed
    w2 = writer(sink)
    w2.recover([h1, h2])
    assert committed(sink) == recs(1, 2, 3)
    assert staged_files(sink) == []
    w2.recover([h1, h2])              # a second restore of the same checkpoint
    assert committed(sink) == recs(1, 2, 3)
    w2.write(recs(4, 5))              # replayed records, next checkpoint
    w2.commit([w2.pre_commit(3)])
    assert committed(sink) == recs(1, 2, 3, 4, 5)


def test_sink_recover_cleans_orphans_after_scale_down(sink):
    old = writer(sink, 3, 4)
    old.write(recs(9))
    old.pre_commit(1)
    new = writer(sink, 1, 2)          # old subtask 3 is now owned by 3 % 2 == 1
    new.recover([])
    assert staged_files(sink) == []


def test_sinks_are_picklable(sink):
    assert pickle.loads(pickle.dumps(sink)).path == sink.path


def test_parquet_sink_layout_rolling_and_non_dict_records(tmp_path):
    sink = ParquetSink(str(tmp_path / "out"), roll_records=3)
    w = writer(sink, 1, 2)
    w.write([1, 2, 3, 4])
    w.write([{"id": 5}, {"id": 6}, {"id": 7}])
    h = w.pre_commit(4)
    assert h["files"] == [f"_staging/job/1/chk-4-{n}.parquet" for n in range(3)]
    w.commit([h])
    names = sorted(p.name for p in (tmp_path / "out").iterdir() if p.is_file())
    assert names == ["part-1-4-0.parquet", "part-1-4-1.parquet", "part-1-4-2.parquet"]
    assert sink.read_records() == [{"value": i} for i in range(1, 4)] + [
        {"value": 4, "id": None}, {"value": None, "id": 5}, {"value": None, "id": 6}, {"id": 7}]
    # pyarrow's dataset reader ignores _staging on its own
    w.write(recs(8))
    w.pre_commit(5)
    assert pq.read_table(str(tmp_path / "out")).num_rows == 7


def test_parquet_sink_refuses_to_overwrite_output_of_another_run(tmp_path):
    sink = ParquetSink(str(tmp_path / "out"))
    w = writer(sink)
    w.write(recs(1))
    w.commit([w.pre_commit(1)])
    again = writer(sink)              # a fresh run into the same directory
    again.write(recs(1, 2))
    with pytest.raises(CommitError, match="already exists"):
        again.commit([again.pre_commit(1)])


def test_parquet_sink_over_fsspec_url():
    import fsspec
    sink = ParquetSink("memory://cutline-sink/out")
    w = writer(sink)
    w.write(recs(1, 2))
    w.commit([w.pre_commit(1)])
    assert sink.read_records() == recs(1, 2)
    fsspec.filesystem("memory").rm("/cutline-sink", recursive=True)


def _write_in_child(sink, subtask):
    w = sink.create_writer()
    w.open(subtask, 2, "job")
    for cid in (1, 2):
        w.write([(subtask, cid, k) for k in range(3)])
        w.commit([w.pre_commit(cid)])


def test_collect_sink_across_processes_and_ordering(tmp_path):
    sink = CollectSink(str(tmp_path / "c"))
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_write_in_child, args=(sink, s)) for s in (1, 0)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert sink.results() == [(s, c, k) for s in (0, 1) for c in (1, 2) for k in range(3)]
    sink.clear()
    assert sink.results() == []


def test_collect_sink_defaults_to_a_temp_dir():
    sink = CollectSink()
    assert os.path.isdir(sink.path)
    w = writer(sink)
    w.write(["a", ("b", 1)])
    w.commit([w.pre_commit(1)])
    assert sink.results() == ["a", ("b", 1)]  # pickled: tuples stay tuples


def test_print_sink_prints_on_commit_at_least_once(capsys):
    w = PrintSink(prefix="> ").create_writer()
    w.open(0, 1, "job")
    w.write([1, {"a": 2}])
    h = roundtrip(w.pre_commit(1))
    assert capsys.readouterr().out == ""
    w.commit([h])
    w.commit([h])
    assert capsys.readouterr().out == "> 1\n> {'a': 2}\n"
    fresh = PrintSink(prefix="> ").create_writer()
    fresh.open(0, 1, "job")
    fresh.recover([h])  # may repeat lines after a restore, never loses them
    assert capsys.readouterr().out == "> 1\n> {'a': 2}\n"
