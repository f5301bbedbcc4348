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
