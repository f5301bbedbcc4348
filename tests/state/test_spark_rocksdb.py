"""RocksDB state on real Spark: a Python worker killed with ``kill -9`` mid-run, in every
checkpoint mode; the committed output is compared with the exact failure-free output.

The keyed operator is a ``process`` function using value, list and map state, so all three
go through RocksDB, incremental checkpoints, the background upload and the restore.
"""

import collections

import pytest

from cutline import CheckpointConfig, Pipeline
from cutline.connectors import CollectSink, GeneratorSource
from cutline.spark.faults import Kill
from cutline.storage.checkpoints import CheckpointStorage
from pipelines import sentence

pytestmark = pytest.mark.slow

RECORDS = 24_000


def tally(ctx, word):
    n = ctx.value_state("n", 0)
    n.update(n.value + 1)
    lengths = ctx.list_state("lengths")
    lengths.append(len(word))
    by_length = ctx.map_state("by_length")
    by_length[len(word)] = by_length.get(len(word), 0) + 1
    return ((word, n.value, len(lengths), sum(by_length.values())),)


def expected(records: int) -> collections.Counter:
    totals = collections.Counter(w for i in range(records) for w in sentence(i).split())
    return collections.Counter((w, k, k, k) for w, n in totals.items() for k in range(1, n + 1))


def tally_pipeline(tmp, mode: str, aligned_timeout=None):
    cfg = CheckpointConfig(
        interval=0.4, storage=f"file://{tmp}/checkpoints", state_backend="rocksdb",
        mode="at_least_once" if mode == "at_least_once" else "exactly_once",
        unaligned=mode == "unaligned", aligned_timeout=aligned_timeout)
    p = Pipeline("tally", parallelism=2, checkpoint=cfg)
    sink = CollectSink(str(tmp / "out"))
    (p.source(GeneratorSource(count=RECORDS, fn=sentence, rate=8_000), uid="sentences")
       .flat_map(str.split, uid="split")
       .key_by(lambda w: w)
       .process(tally, uid="tally")
       .sink(sink, uid="out"))
    return p, sink


@pytest.mark.parametrize("mode, timeout", [("aligned", None), ("unaligned", None),
                                           ("aligned", 0.0), ("at_least_once", None)])
def test_kill_9_with_rocksdb_state_recovers_exactly(spark, tmp_path, mode, timeout):
    p, sink = tally_pipeline(tmp_path, mode, timeout)
    kill = Kill(after_checkpoint=1, delay=0.3)
    result = p.run(spark=spark, timeout=240, on_start=kill)
    assert kill.killed, "the worker was never killed"
    assert result.attempts >= 2
    restored = [c for c in result.checkpoints if c.attempt >= 1]
    assert restored, "no checkpoint completed after the restart"
    got, want = collections.Counter(sink.results()), expected(RECORDS)
    if mode == "at_least_once":
        assert not want - got, "records lost"
    else:
        assert got == want
    latest = CheckpointStorage(p.checkpoint.storage, p.name).latest()
    assert latest.shared, "the checkpoint holds no RocksDB files"


def test_kill_9_while_uploading_recovers_exactly(spark, tmp_path):
    """The worker dies on the upload thread: state file written, ack never sent."""
    p, sink = tally_pipeline(tmp_path, "aligned")
    # slot 1 hosts tally.1, whose snapshots finish on its upload thread
    result = p.run(spark=spark, timeout=240, faults=(("snapshot_write", 1, 2),))
    assert result.attempts >= 2, "the fault never fired"
    assert collections.Counter(sink.results()) == expected(RECORDS)
