"""The runtime on real Spark: a Python worker killed with ``kill -9`` mid-run.

Every test asserts that the fault fired (a pid was killed, Spark ran a second attempt) and
compares the committed output with the exact failure-free output.
"""

import collections

import pytest

from cutline.spark.faults import Kill
from pipelines import expected_rows, wordcount

pytestmark = pytest.mark.slow

RECORDS = 30_000


def test_failure_free_run_on_spark(spark, tmp_path):
    p, sink = wordcount(tmp_path, RECORDS, "aligned", rate=15_000)
    result = p.run(spark=spark, timeout=180)
    assert result.attempts == 1
    assert collections.Counter(sink.results()) == expected_rows(RECORDS)


@pytest.mark.parametrize("mode, timeout", [("aligned", None), ("unaligned", None),
                                           ("aligned", 0.0), ("at_least_once", None)])
def test_kill_9_of_a_worker_recovers_exactly(spark, tmp_path, mode, timeout):
    p, sink = wordcount(tmp_path, RECORDS, mode, rate=8_000, aligned_timeout=timeout)
    kill = Kill(after_checkpoint=1, delay=0.3)
    result = p.run(spark=spark, timeout=240, on_start=kill)
    assert kill.killed, "the worker was never killed"
    assert result.attempts >= 2
    got, want = collections.Counter(sink.results()), expected_rows(RECORDS)
    if mode == "at_least_once":
        assert not want - got, "records lost"
    else:
        assert got == want
    restored = [c for c in result.checkpoints if c.attempt >= 1]
    assert restored, "no checkpoint completed after the restart"


@pytest.mark.parametrize("point, mode", [
    ("alignment", "aligned"),          # killed while holding channels blocked
    ("snapshot_write", "aligned"),     # state file written, ack never sent
    ("snapshot_write", "unaligned"),   # with in-flight data in the state
    ("before_commit", "aligned"),      # checkpoint complete, sink not yet committed (2PC)
])
def test_kill_at_protocol_points_recovers_exactly(spark, tmp_path, point, mode):
    p, sink = wordcount(tmp_path, RECORDS, mode, rate=8_000, interval=0.3)
    # slot 1 hosts the sink subtask count.1 / out.1 and the source subtask sentences.1
    result = p.run(spark=spark, timeout=240, faults=((point, 1, 2),))
    assert result.attempts >= 2, f"the fault at {point} never fired"
    assert collections.Counter(sink.results()) == expected_rows(RECORDS)


def test_kill_9_restores_an_incremental_in_memory_chain_exactly(spark, tmp_path):
    """20,000 keys, a few thousand touched between checkpoints: the in-memory backend's
    checkpoints are deltas on a full snapshot.  A worker killed after the fourth restores
    such a chain; the output is the failure-free one, row for row."""
    from cutline import CheckpointConfig, Pipeline
    from cutline.connectors import CollectSink, GeneratorSource
    from cutline.state.changelog import is_changelog_snapshot, manifest
    from cutline.storage.checkpoints import CheckpointStorage
    from cutline.storage.schema import read_task_states

    keys, records = 20_000, 48_000
    cfg = CheckpointConfig(interval=0.3, storage=f"file://{tmp_path}/chk", retained=1000)
    p = Pipeline("deltas", parallelism=2, checkpoint=cfg)
    sink = CollectSink(str(tmp_path / "out"))
    (p.source(GeneratorSource(count=records, fn=lambda i: i % keys, rate=8_000), uid="nums")
       .key_by(lambda n: n)
       .count(uid="count")
       .sink(sink, uid="out"))
    kill = Kill(after_checkpoint=4, delay=0.1)
    result = p.run(spark=spark, timeout=240, on_start=kill)
    assert kill.killed and result.attempts >= 2
    want = collections.Counter((k, n) for k in range(keys)
                               for n in range(1, records // keys + (k < records % keys) + 1))
    assert collections.Counter(sink.results()) == want
    # what the second attempt restored: the last checkpoint of the first, a chain of files
    storage = CheckpointStorage(f"file://{tmp_path}/chk", "deltas")
    restored = max(c.id for c in result.checkpoints if c.attempt == 0)
    blobs = [b for st in read_task_states(storage.open(restored)).values()
             for b in st.ops.values()]
    assert blobs and all(is_changelog_snapshot(b) for b in blobs)
    assert max(len(manifest(b)["files"]) for b in blobs) >= 2, "no delta was restored"
