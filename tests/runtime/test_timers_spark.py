"""Timers in ``process`` on real Spark: a failure-free run, and a Python worker killed with
``kill -9`` mid-run in aligned and unaligned mode (memory and RocksDB state), whose output
(every row of it driven by event-time timers: "alert when a key saw nothing for GAP seconds
of event time", :mod:`test_timers_pipelines`) must equal the failure-free run row for row.
"""

import collections

import pytest

from cutline.spark.faults import Kill
from test_timers_pipelines import expected, silences

pytestmark = pytest.mark.slow

RECORDS = 24_000


def test_timers_on_spark_without_failures(spark, tmp_path):
    p, sink = silences(RECORDS, tmp=tmp_path, rate=12_000)
    result = p.run(spark=spark, timeout=180)
    assert result.attempts == 1
    assert collections.Counter(sink.results()) == expected(RECORDS)


@pytest.mark.parametrize("mode, backend", [("aligned", "memory"), ("unaligned", "memory"),
                                           ("aligned", "rocksdb"), ("unaligned", "rocksdb")])
def test_kill_9_with_timers_recovers_exactly(spark, tmp_path, mode, backend):
    p, sink = silences(RECORDS, tmp=tmp_path, mode=mode, rate=8_000, interval=0.4,
                       backend=backend)
    kill = Kill(after_checkpoint=1, delay=0.3)
    result = p.run(spark=spark, timeout=240, on_start=kill)
    assert kill.killed, "the worker was never killed"
    assert result.attempts >= 2
    assert [c for c in result.checkpoints if c.attempt >= 1], "no checkpoint after the restart"
    got, want = collections.Counter(sink.results()), expected(RECORDS)
    assert got == want, (f"{sum((got - want).values())} rows too many, "
                         f"{sum((want - got).values())} missing")
