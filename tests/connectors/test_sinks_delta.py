"""The Delta Lake sink: two-phase commit keyed by job and checkpoint id through Delta's
application transactions (``txn``), idempotent re-commit, and exactly-once under kill -9."""

import collections
import json
import os

import pytest

pytest.importorskip("deltalake")

from cutline import CheckpointConfig, Pipeline  # noqa: E402
from cutline.connectors import CommitError, DeltaSink, GeneratorSource  # noqa: E402
from cutline.connectors.base import UnsupportedRecordError  # noqa: E402
from cutline.connectors.delta import app_id  # noqa: E402
from cutline.runtime.failures import repeats  # noqa: E402
from pipelines import expected_rows, sentence  # noqa: E402


def _writer(sink, subtask=0, parallelism=1, job="job"):
    w = sink.create_writer()
    w.open(subtask, parallelism, job)
    return w


def _rows(sink):
    return sorted((r["k"], r["v"]) for r in sink.read_records())


def _log_entries(path):
    log = os.path.join(path, "_delta_log")
    out = []
    for name in sorted(os.listdir(log)):
        if name.endswith(".json"):
            with open(os.path.join(log, name)) as f:
                out.append([json.loads(line) for line in f if line.strip()])
    return out


def test_commit_appends_in_a_transaction_recording_job_and_checkpoint(tmp_path):
    sink = DeltaSink(str(tmp_path / "t"))
    w = _writer(sink)
    w.write([{"k": "a", "v": 1}, {"k": "b", "v": 2}])
    h = w.pre_commit(7)
    assert sink.read_records() == []  # staged: not in the table
    w.commit([h])
    assert _rows(sink) == [("a", 1), ("b", 2)]
    dt = sink.table()
    assert dt.transaction_version(app_id("job", 0)) == 7
    commit = _log_entries(str(tmp_path / "t"))[-1]
    info = next(a["commitInfo"] for a in commit if "commitInfo" in a)
    assert info["cutline.job"] == "job" and info["cutline.checkpoints"] == [7]
    assert {"txn": {"appId": "cutline-job-0", "version": 7}} in commit
    assert [a["add"]["path"] for a in commit if "add" in a] == ["part-job-0-7-0.parquet"]


def test_recommitting_the_same_handles_never_duplicates(tmp_path):
    sink = DeltaSink(str(tmp_path / "t"), roll_records=2)  # several files per checkpoint
    w = _writer(sink)
    w.write([{"k": str(i), "v": i} for i in range(5)])
    h1 = w.pre_commit(1)
    w.write([{"k": "x", "v": 9}])
    h2 = w.pre_commit(2)
    assert len(h1["files"]) == 3
    w.commit([h1])
    w.commit([h1])                  # the same checkpoint's handles twice
    w.commit([h1, h2])              # and again with the next one
    again = _writer(sink)           # a restarted subtask re-commits on recovery
    again.recover([h1, h2])
    again.commit([h1, h2])
    assert _rows(sink) == sorted([(str(i), i) for i in range(5)] + [("x", 9)])
    assert sink.table().version() == 2  # v0 created, then one append per checkpoint
    files = sink.table().file_uris()
    assert len(files) == len(set(files)) == 4


def test_recovery_after_a_crash_between_moving_files_and_the_delta_commit(tmp_path):
    sink = DeltaSink(str(tmp_path / "t"), roll_records=2)
    w = _writer(sink)
    w.write([{"k": str(i), "v": i} for i in range(3)])
    h = w.pre_commit(4)
    for n, rel in enumerate(h["files"][:1]):  # one file moved, then the process died
        os.replace(os.path.join(str(tmp_path / "t"), rel), w._destination(h, n))
    restarted = _writer(sink)
    restarted.recover([h])
    assert _rows(sink) == [(str(i), i) for i in range(3)]
    assert not os.listdir(tmp_path / "t" / "_staging" / "job" / "0")  # staging cleaned


def test_recovery_drops_staged_data_no_checkpoint_covers(tmp_path):
    sink = DeltaSink(str(tmp_path / "t"))
    w = _writer(sink)
    w.write([{"k": "kept", "v": 1}])
    h1 = w.pre_commit(1)
    w.write([{"k": "lost", "v": 2}])
    w.pre_commit(2)  # checkpoint 2 never completed: its records will be replayed
    restarted = _writer(sink)
    restarted.recover([h1])
    assert _rows(sink) == [("kept", 1)]
    assert not os.listdir(tmp_path / "t" / "_staging" / "job" / "0")


def test_a_stale_concurrent_commit_of_the_same_checkpoint_is_not_duplicated(tmp_path):
    sink = DeltaSink(str(tmp_path / "t"))
    w = _writer(sink)
    w.write([{"k": "a", "v": 1}])
    h = w.pre_commit(1)
    w.commit([h])
    # A zombie of an older attempt read the table just before that commit (no txn yet):
    # its append of the same checkpoint conflicts in Delta; it re-reads and finds it done.
    from deltalake import DeltaTable

    zombie = _writer(sink)
    zombie._sink = DeltaSink(str(tmp_path / "t"))
    views = [DeltaTable(sink.uri, version=sink.table().version() - 1)]
    zombie._sink.table = lambda: views.pop() if views else sink.table()
    zombie._commit([h], strict=False)
    assert not views, "the zombie never saw the stale table"
    assert _rows(sink) == [("a", 1)]
    assert sink.table().version() == 1


def test_a_new_run_of_the_same_job_into_the_same_table_is_refused(tmp_path):
    sink = DeltaSink(str(tmp_path / "t"))
    w = _writer(sink)
    w.write([{"k": "a", "v": 1}])
    w.commit([w.pre_commit(5)])
    fresh = _writer(sink)           # a run without the first run's checkpoints
    fresh.recover([])
    fresh.write([{"k": "b", "v": 2}])
    h = fresh.pre_commit(1)         # its id 1 <= 5: the txn would skip it, silently
    with pytest.raises(CommitError, match="an earlier run of a job with the same name"):
        fresh.commit([h])
    assert _rows(sink) == [("a", 1)]


def test_records_are_conformed_to_the_table_schema(tmp_path):
    import pyarrow as pa

    schema = pa.schema([("k", pa.string()), ("v", pa.int64()), ("note", pa.string())])
    sink = DeltaSink(str(tmp_path / "t"), schema=schema)
    w = _writer(sink)
    # a field the table lacks fails the job at once, never retried (UnsupportedRecordError)
    with pytest.raises(UnsupportedRecordError, match=r"fields \['value'\] are not columns of "
                                                     r"the Delta table \(columns: k, v, note\)"):
        w.write([{"k": "a", "v": 1}, "not a dict"])
    assert repeats(UnsupportedRecordError("s", 1, "x"))
    w = _writer(sink)
    w.write([{"k": "a", "v": 1}])
    w.commit([w.pre_commit(2)])
    assert sink.read_records() == [{"k": "a", "v": 1, "note": None}]


def test_two_subtasks_create_and_append_to_one_table(tmp_path):
    sink = DeltaSink(str(tmp_path / "t"))
    ws = [_writer(sink, i, 2) for i in range(2)]
    hs = []
    for i, w in enumerate(ws):
        w.write([{"k": f"s{i}", "v": i}])
        hs.append(w.pre_commit(1))
    for w, h in zip(ws, hs):
        w.commit([h])
    assert _rows(sink) == [("s0", 0), ("s1", 1)]
    dt = sink.table()
    assert dt.transaction_version(app_id("job", 0)) == 1
    assert dt.transaction_version(app_id("job", 1)) == 1


def test_delta_sink_on_s3(s3):
    sink = DeltaSink(s3.url("delta"), storage_options=s3.options)  # delta-rs options derived
    w = _writer(sink)
    w.write([{"k": "a", "v": 1}])
    h1 = w.pre_commit(1)
    w.commit([h1])
    w.commit([h1])
    w.write([{"k": "b", "v": 2}])
    h2 = w.pre_commit(2)
    _writer(sink).recover([h1, h2])
    assert _rows(sink) == [("a", 1), ("b", 2)]
    assert sink.table().transaction_version(app_id("job", 0)) == 2


# ---------------------------------------------------------------------------- on Spark

def _to_row(wc):
    return {"word": wc[0], "n": wc[1]}


@pytest.mark.slow
@pytest.mark.parametrize("point", ["before_commit", "after_commit"])
def test_kill_9_around_the_commit_leaves_the_table_exact(spark, tmp_path, point):
    records = 20_000
    cfg = CheckpointConfig(interval=0.3, storage=f"file://{tmp_path}/checkpoints")
    p = Pipeline("deltawords", parallelism=2, checkpoint=cfg)
    sink = DeltaSink(str(tmp_path / "table"))
    (p.source(GeneratorSource(count=records, fn=sentence, rate=8_000), uid="sentences")
       .flat_map(str.split, uid="split")
       .key_by(lambda w: w)
       .count(uid="count")
       .map(_to_row, uid="row")
       .sink(sink, uid="delta"))
    # Slot 1 hosts the sink subtask delta.1: SIGKILL it once checkpoint 2 completed, before
    # it commits (the restart must commit it: never lost) or right after (the restart
    # re-commits the same checkpoint: never duplicated).
    result = p.run(spark=spark, timeout=240, faults=((point, 1, 2),))
    assert result.attempts >= 2, "the fault never fired"
    got = collections.Counter((r["word"], r["n"]) for r in sink.read_records())
    assert got == expected_rows(records)  # what a failure-free run writes (test_spark)
    # Each checkpoint of each subtask is in exactly one Delta transaction, each file added
    # once: the restart skipped what the txn version said was committed (a re-add of the
    # same path would not duplicate rows, Delta keys files by path, but must not happen).
    commits = _log_entries(str(tmp_path / "table"))
    infos = [a["commitInfo"] for c in commits for a in c if "commitInfo" in a]
    done = [(i["cutline.subtask"], n) for i in infos for n in i.get("cutline.checkpoints", [])]
    assert len(done) == len(set(done)) and (1, 2) in done, done
    adds = [a["add"]["path"] for c in commits for a in c if "add" in a]
    assert len(adds) == len(set(adds))
    assert sink.table().transaction_version(app_id("deltawords", 1)) >= 2
