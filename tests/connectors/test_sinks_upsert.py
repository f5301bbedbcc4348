"""The key-value upsert sink (SQLite): staged upserts applied per checkpoint, last writer wins
by checkpoint id, re-applying a checkpoint is harmless, exactly-once under kill -9."""

import collections
import sqlite3

import pytest

from cutline import CheckpointConfig, Pipeline
from cutline.connectors import CommitError, GeneratorSource, UpsertSink
from cutline.spark.faults import Kill
from pipelines import sentence


def _writer(sink, subtask=0, parallelism=1, job="job"):
    w = sink.create_writer()
    w.open(subtask, parallelism, job)
    return w


def _sink(tmp_path, **kw):
    return UpsertSink(str(tmp_path / "kv.db"), key=lambda r: r[0], value=lambda r: r[1], **kw)


def test_upserts_become_visible_at_commit_last_write_wins(tmp_path):
    sink = _sink(tmp_path)
    w = _writer(sink)
    w.write([("a", 1), ("b", 1), ("a", 2)])
    h1 = w.pre_commit(1)
    assert sink.read() == {}  # staged only
    w.commit([h1])
    assert sink.read() == {"a": 2, "b": 1}
    w.write([("a", 3), ("b", None), (("t", 1), [1, 2])])  # None deletes; tuple keys work
    w.commit([w.pre_commit(2)])
    assert sink.read() == {"a": 3, ("t", 1): [1, 2]}


def test_reapplying_a_checkpoint_is_harmless(tmp_path):
    sink = _sink(tmp_path)
    w = _writer(sink)
    w.write([("a", 1), ("b", 2)])
    h1 = w.pre_commit(1)
    w.write([("a", 10)])
    h2 = w.pre_commit(2)
    w.commit([h1, h2])
    w.commit([h1, h2])   # the same handles again
    w.commit([h1])       # an older checkpoint after a newer one: never overwrites it
    again = _writer(sink)
    again.recover([h1, h2])
    assert sink.read() == {"a": 10, "b": 2}
    with sqlite3.connect(tmp_path / "kv.db") as conn:
        assert conn.execute("SELECT count(*) FROM kv").fetchone()[0] == 2
        assert conn.execute("SELECT count(*) FROM _cutline_staged").fetchone()[0] == 0
        assert conn.execute("SELECT version FROM _cutline_txn").fetchall() == [(2,)]
        assert conn.execute("SELECT checkpoint FROM kv WHERE key = '\"a\"'").fetchone() == (2,)


def test_an_older_checkpoint_never_overwrites_a_newer_value(tmp_path):
    sink = _sink(tmp_path)
    old, new = _writer(sink, 0, 2), _writer(sink, 1, 2)
    old.write([("k", "old")])
    h_old = old.pre_commit(3)
    new.write([("k", "new")])
    new.commit([new.pre_commit(4)])
    old.commit([h_old])  # checkpoint 3 of another subtask commits late
    assert sink.read() == {"k": "new"}


def test_recovery_commits_restored_handles_and_drops_the_rest(tmp_path):
    sink = _sink(tmp_path)
    w = _writer(sink)
    w.write([("kept", 1)])
    h1 = w.pre_commit(1)
    w.write([("replayed", 2)])
    w.pre_commit(2)  # never completed
    restarted = _writer(sink)
    restarted.recover([h1])
    assert sink.read() == {"kept": 1}
    with sqlite3.connect(tmp_path / "kv.db") as conn:
        assert conn.execute("SELECT count(*) FROM _cutline_staged").fetchone()[0] == 0


def test_abort_discards_and_a_lost_staging_is_a_commit_error(tmp_path):
    sink = _sink(tmp_path)
    w = _writer(sink)
    w.write([("a", 1)])
    h = w.pre_commit(1)
    w.abort([h])
    with pytest.raises(CommitError, match="1 staged upserts expected"):
        w.commit([h])
    assert sink.read() == {}


def test_a_new_run_of_the_same_job_into_the_same_table_is_refused(tmp_path):
    sink = _sink(tmp_path)
    w = _writer(sink)
    w.write([("a", 1)])
    w.commit([w.pre_commit(5)])
    fresh = _writer(sink)
    fresh.recover([])
    fresh.write([("a", 2)])
    with pytest.raises(CommitError, match="an earlier run of a job with the same name"):
        fresh.commit([fresh.pre_commit(1)])
    assert sink.read() == {"a": 1}


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="local SQLite file"):
        UpsertSink("s3://bucket/kv.db", key="k")
    with pytest.raises(ValueError, match="SQL identifier"):
        UpsertSink("/tmp/kv.db", key="k", table="x; drop table y")
    w = UpsertSink("/tmp/never.db", key="k").create_writer()
    with pytest.raises(RuntimeError, match="before open"):
        w.write([{"k": 1}])


# ---------------------------------------------------------------------------- on Spark

def _totals(records):
    return collections.Counter(w for i in range(records) for w in sentence(i).split())


@pytest.mark.slow
def test_kill_9_leaves_the_key_value_table_exact(spark, tmp_path):
    records = 20_000
    cfg = CheckpointConfig(interval=0.3, storage=f"file://{tmp_path}/checkpoints")
    p = Pipeline("kvwords", parallelism=2, checkpoint=cfg)
    sink = UpsertSink(str(tmp_path / "kv.db"), key=lambda wc: wc[0], value=lambda wc: wc[1])
    (p.source(GeneratorSource(count=records, fn=sentence, rate=8_000), uid="sentences")
       .flat_map(str.split, uid="split")
       .key_by(lambda w: w)
       .count(uid="count")        # each word on one subtask: its sink subtask upserts it
       .sink(sink, uid="kv"))
    kill = Kill(after_checkpoint=1, delay=0.3)
    result = p.run(spark=spark, timeout=240, on_start=kill)
    assert kill.killed, "the worker was never killed"
    assert result.attempts >= 2
    assert sink.read() == dict(_totals(records))  # the failure-free run's final table
