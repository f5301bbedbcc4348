"""Checkpoint storage and sinks on s3:// against a real S3-compatible server (moto, loopback),
configured through fsspec storage options; hdfs:// through pyarrow where it is usable."""

import collections
import logging
import socket
import time

import pytest

from cutline import CheckpointConfig, Pipeline
from cutline.connectors import CollectSink, GeneratorSource, ParquetSink
from cutline.spark.faults import Kill
from cutline.storage.checkpoints import (
    CheckpointStorage,
    CheckpointStorageError,
    CorruptCheckpointError,
)
from pipelines import expected_rows, sentence


def _storage(s3, name="ck", job="job"):
    return CheckpointStorage(s3.url(name), job, storage_options=s3.options)


def _checkpoint(st, n, tasks=("a.0", "b.0")):
    states = {t: st.write_task_state(n, t, f"state of {t} at {n}".encode() * 10) for t in tasks}
    return st.commit(n, {"n": n}, states=states)


def test_checkpoint_storage_on_s3_write_commit_latest_retain(s3):
    st = _storage(s3)
    assert st.latest() is None and st.completed() == []
    for n in (1, 2, 3):
        path = _checkpoint(st, n)
        assert path.startswith("s3://")
    st.write_task_state(4, "a.0", b"partial")  # no _metadata: not a checkpoint
    assert st.completed() == [1, 2, 3]
    assert st.next_id() == 5
    latest = st.latest()
    assert latest.id == 3 and latest.tasks == ["a.0", "b.0"]
    assert latest.read_task_state("b.0") == b"state of b.0 at 3" * 10
    assert latest.metadata == {"n": 3}
    # a new storage object (as in another process) sees the same, also by URL
    again = CheckpointStorage(st.url, "job", storage_options=s3.options)
    assert again.completed() == [1, 2, 3]
    assert again.open(latest.path).id == 3
    assert st.retain(2) == [1]
    assert st.completed() == [2, 3]


def test_checkpoint_storage_on_s3_detects_corruption_and_falls_back(s3, caplog):
    st = _storage(s3)
    _checkpoint(st, 1)
    _checkpoint(st, 2)
    fs = s3.fs()
    victim = f"{st.dir}/chk-2/b.0.state"
    data = fs.cat_file(victim)
    fs.pipe_file(victim, data[:-1] + b"X")  # same size, other bytes
    with caplog.at_level(logging.WARNING, logger="cutline.storage.checkpoints"):
        latest = st.latest()
    assert latest.id == 1
    assert "skipping corrupt checkpoint chk-2" in caplog.text
    with pytest.raises(CorruptCheckpointError, match=r"checksum mismatch in chk-2/b\.0\.state"):
        st.open(2).read_task_state("b.0")
    fs.pipe_file(f"{st.dir}/chk-1/_metadata", b"\x00garbage")
    assert st.latest() is None


def test_s3_without_options_or_credentials_is_refused_clearly(s3, monkeypatch):
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    with pytest.raises(CheckpointStorageError, match=r"is not writable \(NoCredentialsError"):
        # (fsspec caches filesystems by their arguments: a fresh one sees this environment)
        CheckpointStorage(s3.url("nocreds"), "job", {"skip_instance_cache": True})


def test_environment_variables_configure_s3_too(s3, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    st = CheckpointStorage(s3.url("env"), "job", {"skip_instance_cache": True})
    _checkpoint(st, 1)
    assert st.latest().id == 1


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_storage_fails_the_run_up_front(s3, tmp_path):
    options = dict(s3.options, endpoint_url=f"http://127.0.0.1:{_closed_port()}")
    cfg = CheckpointConfig(storage=s3.url("gone"), storage_options=options)
    p = Pipeline("unreachable", parallelism=1, checkpoint=cfg)
    sink = CollectSink(str(tmp_path / "out"))
    p.source(GeneratorSource(count=10), uid="n").sink(sink, uid="out")
    t0 = time.monotonic()
    with pytest.raises(CheckpointStorageError,
                       match=r"checkpoint storage URL 's3://cutline-test/gone-\w+' is not "
                             r"writable \(EndpointConnectionError: Could not connect to the "
                             r"endpoint URL"):
        p.run(engine="threads", timeout=60)
    assert time.monotonic() - t0 < 30
    assert sink.results() == []  # nothing ran


def test_storage_options_are_validated_and_kept_out_of_repr():
    with pytest.raises(ValueError, match="storage_options must be a dict of fsspec options"):
        CheckpointConfig(storage_options=["endpoint_url"])
    cfg = CheckpointConfig(storage="s3://b/p", storage_options={"secret": "hunter2"})
    assert "hunter2" not in repr(cfg)
    assert cfg.storage_options == {"secret": "hunter2"}


def test_parquet_and_collect_sinks_on_s3(s3):
    for sink in (ParquetSink(s3.url("pq"), storage_options=s3.options, roll_records=3),
                 CollectSink(s3.url("collect"), storage_options=s3.options)):
        w = sink.create_writer()
        w.open(0, 1, "job")
        w.write([{"i": i} for i in range(5)])
        h1 = w.pre_commit(1)
        w.write([{"i": 5}])
        h2 = w.pre_commit(2)
        w.commit([h1])
        w.commit([h1])  # idempotent
        w2 = sink.create_writer()  # a restarted subtask recovers checkpoint 2
        w2.open(0, 1, "job")
        w2.recover([h1, h2])
        got = sink.read_records() if isinstance(sink, ParquetSink) else sink.results()
        assert sorted(r["i"] for r in got) == list(range(6))


def test_hdfs_checkpoint_storage_through_pyarrow(tmp_path):
    try:
        st = CheckpointStorage("hdfs://127.0.0.1:8020/cutline-test", "job")
    except CheckpointStorageError as e:
        msg = str(e)
        assert msg.startswith("cannot open checkpoint storage 'hdfs://127.0.0.1:8020/")
        assert "JAVA_HOME" in msg and "libhdfs.so" in msg and "CLASSPATH" in msg
        assert len(msg.splitlines()) == 1  # one line, not pages of dlopen errors
        pytest.skip(f"pyarrow's HDFS client is not usable here: {msg}")
    _checkpoint(st, 1)  # pragma: no cover - needs a Hadoop installation and a namenode
    assert st.latest().id == 1


# ---------------------------------------------------------------------------- on Spark

def _words_to_parquet(s3, tmp, records, rate):
    cfg = CheckpointConfig(interval=0.3, storage=s3.url("spark-ck"),
                           storage_options=s3.options)
    p = Pipeline("s3words", parallelism=2, checkpoint=cfg)
    sink = ParquetSink(s3.url("spark-out"), storage_options=s3.options)
    (p.source(GeneratorSource(count=records, fn=sentence, rate=rate), uid="sentences")
       .flat_map(str.split, uid="split")
       .key_by(lambda w: w)
       .count(uid="count")
       .map(lambda wc: {"word": wc[0], "n": wc[1]}, uid="row")
       .sink(sink, uid="out"))
    return p, sink


@pytest.mark.slow
def test_kill_9_with_checkpoints_and_output_on_s3_is_exact(spark, s3, tmp_path):
    records = 20_000
    p, sink = _words_to_parquet(s3, tmp_path, records, rate=8_000)
    kill = Kill(after_checkpoint=1, delay=0.3)
    result = p.run(spark=spark, timeout=240, on_start=kill)
    assert kill.killed, "the worker was never killed"
    assert result.attempts >= 2
    assert [c for c in result.checkpoints if c.attempt >= 1], "no checkpoint after the restart"
    assert all(c.path.startswith("s3://cutline-test/spark-ck-") for c in result.checkpoints)
    got = collections.Counter((r["word"], r["n"]) for r in sink.read_records())
    assert got == expected_rows(records)
    # retention ran on s3: at most `retained` checkpoints are left
    left = CheckpointStorage(p.checkpoint.storage, "s3words", s3.options).completed()
    assert 1 <= len(left) <= p.checkpoint.retained
