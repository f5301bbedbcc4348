"""DiscardSink: drops records, counts them exactly once, in every checkpoint mode, across a
restore, a rescale and (on Spark) a kill -9."""

import os
import pickle
import subprocess
import sys

import pytest

import cutline
from cutline import CheckpointConfig, Pipeline
from cutline.connectors import DiscardSink, GeneratorSource

KEYS = 50


def key_of(i: int) -> int:
    return i % KEYS


def pipeline(tmp_path, name: str, n: int, sink: DiscardSink, parallelism: int = 2,
             rate: float | None = None, interval: float = 0.1, **checkpoint) -> Pipeline:
    cfg = CheckpointConfig(interval=interval, storage=f"file://{tmp_path}/ck", **checkpoint)
    p = Pipeline(name, parallelism=parallelism, checkpoint=cfg)
    (p.source(GeneratorSource(count=n, rate=rate), uid="numbers")
       .key_by(key_of)
       .count(uid="count")
       .sink(sink, uid="out"))
    return p


def test_exported_from_cutline_and_connectors():
    assert cutline.DiscardSink is DiscardSink
    assert "DiscardSink" in cutline.__all__ and "DiscardSink" in cutline.connectors.__all__
    # ``import cutline`` stays light: the connectors load when a sink is asked for
    code = "import sys, cutline; assert 'cutline.connectors' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_writer_counts_and_its_handles_carry_the_running_total():
    sink = DiscardSink()
    w = sink.create_writer()
    w.open(1, 2, "job")
    w.write([1, 2, 3])
    h1 = w.pre_commit(1)
    w.write(list(range(10)))
    h2 = w.pre_commit(2)
    assert h1 == {"checkpoint_id": 1, "subtask": 1, "records": 3, "total": 3}
    assert h2 == {"checkpoint_id": 2, "subtask": 1, "records": 10, "total": 13}
    assert w.records == 13 and sink.count() == 0  # nothing committed yet
    w.commit([h1])
    assert sink.count() == 3
    w.commit([h2])
    w.commit([h1, h2])  # committing again changes nothing
    w.abort([])
    assert sink.count() == 13 == sink.count("job") and sink.count("other") == 0
    w.close()


def _numbers(idx):
    import pyarrow as pa

    return pa.record_batch({"n": pa.array(idx)})


def test_a_batch_stream_counts_rows_not_batches(tmp_path):
    sink = DiscardSink()
    p = Pipeline("batches", parallelism=2, checkpoint=CheckpointConfig(
        interval=0.1, storage=f"file://{tmp_path}/ck"))
    p.source(GeneratorSource(count=10_000, batch_fn=_numbers, batch_rows=300),
             uid="numbers").sink(sink, uid="out")
    p.run(engine="threads", timeout=60)
    assert sink.count() == 10_000


def test_recover_continues_from_the_restored_count_and_adds_up_after_a_rescale(tmp_path):
    sink = DiscardSink(str(tmp_path / "counts"))
    old = []
    for subtask, n in ((0, 5), (1, 7)):
        w = sink.create_writer()
        w.open(subtask, 2, "job")
        w.write([None] * n)
        old.append(w.pre_commit(4))
        w.commit([old[-1]])
    assert sink.count() == 12
    # scale down 2 -> 1: subtask 0 takes over subtask 1's transactions and its count
    w = sink.create_writer()
    w.open(0, 1, "job")
    w.recover(old)
    assert w.records == 12 and sink.count() == 12
    assert sorted(os.listdir(tmp_path / "counts" / "job")) == ["count-0.json"]
    w.write([None] * 3)
    w.commit([w.pre_commit(5)])
    assert sink.count() == 15
    # a fresh start (no checkpoint) counts from zero
    fresh = sink.create_writer()
    fresh.open(0, 1, "job")
    fresh.recover([])
    assert sink.count() == 0


def test_pickled_sink_counts_for_itself():
    sink = DiscardSink()
    w = sink.create_writer()
    w.open(0, 1, "job")
    w.write([1])
    w.commit([w.pre_commit(1)])
    copy = pickle.loads(pickle.dumps(sink))
    assert sink.count() == 1 and copy.count() == 0
    assert repr(sink) == "DiscardSink()"


@pytest.mark.parametrize("checkpoint", [
    {"mode": "exactly_once"},
    {"mode": "exactly_once", "unaligned": True},
    {"mode": "exactly_once", "aligned_timeout": 0.0},
    {"mode": "at_least_once"},
], ids=["aligned", "unaligned", "aligned_timeout", "at_least_once"])
def test_counts_every_record_in_every_mode_on_threads(tmp_path, checkpoint):
    n = 20_000
    sink = DiscardSink()
    p = pipeline(tmp_path, "discard", n, sink, rate=40_000, **checkpoint)
    result = p.run(engine="threads", timeout=60)
    assert len(result.checkpoints) >= 3 and result.checkpoints[-1].final
    assert sink.count() == n == sink.count("discard")


def test_count_survives_a_restore_and_a_rescale_on_threads(tmp_path):
    n = 6_000
    sink = DiscardSink(str(tmp_path / "counts"))
    first = pipeline(tmp_path, "discard", n, sink).run(engine="threads", timeout=60)
    assert sink.count() == n
    # the next run resumes from the final checkpoint at parallelism 1: nothing more to
    # count, and the restored count stands (subtask 1's is now subtask 0's).  A finished
    # job resumes only when asked to (restore_from): by default a rerun is refused.
    again = pipeline(tmp_path, "discard", n, sink, parallelism=1)
    again.run(engine="threads", timeout=60, restore_from=first.latest_checkpoint.path)
    assert sink.count() == n
    assert sorted(os.listdir(tmp_path / "counts" / "discard")) == ["count-0.json"]


@pytest.mark.slow
def test_counts_exactly_once_across_a_kill_9_on_spark(spark, tmp_path):
    from cutline.spark.faults import Kill

    n = 30_000
    sink = DiscardSink(str(tmp_path / "counts"))
    p = pipeline(tmp_path, "discard-spark", n, sink, rate=6_000, interval=0.3)
    kill = Kill(after_checkpoint=1, delay=0.2)
    result = p.run(spark=spark, timeout=240, on_start=kill)
    assert kill.killed and result.attempts >= 2
    assert sink.count() == n == sink.count("discard-spark")
