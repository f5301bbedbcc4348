"""Event time on real Spark: a watermark-driven operator (tests' TumblingCount) with a
Python worker killed by ``kill -9`` mid-run, aligned and unaligned.

The events are out of order within the watermark's delay, so the failure-free output is
known exactly (every window once, with its full count, nothing late); after the kill the
committed output must be exactly that: no window lost, fired early (a smaller count and a
second firing) or fired twice.
"""

import collections

import pytest

from cutline.spark.faults import Kill
from watermarks_pipelines import expected_windows, fired, windowed

pytestmark = pytest.mark.slow

RECORDS = 30_000


def test_windows_on_spark_failure_free(spark, tmp_path):
    p, sink = windowed(tmp_path, RECORDS, rate=15_000)
    result = p.run(spark=spark, timeout=180)
    assert result.attempts == 1
    rows = sink.results()
    assert collections.Counter(rows) == expected_windows(RECORDS)


@pytest.mark.parametrize("mode", ["aligned", "unaligned"])
def test_windows_exactly_once_across_a_kill_9_on_spark(spark, tmp_path, mode):
    p, sink = windowed(tmp_path, RECORDS, mode, rate=8_000, slow=mode == "unaligned")
    kill = Kill(after_checkpoint=2, delay=0.3)
    result = p.run(spark=spark, timeout=240, on_start=kill)
    assert kill.killed, "the worker was never killed"
    assert result.attempts >= 2
    assert [c for c in result.checkpoints if c.attempt >= 1], "no checkpoint after restart"
    rows = sink.results()
    assert fired(rows) == expected_windows(RECORDS)
    assert collections.Counter(rows) == expected_windows(RECORDS)  # nothing else, no late
