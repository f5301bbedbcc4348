"""The columnar path's exactly-once twins on Spark: a Python worker killed with ``kill -9``
mid-run, aligned and unaligned (stateless, keyed and windowed branches).  The baseline is
the failure-free output, computed from the
input (``columnar_pipelines.expected``; ``test_columnar`` checks a failure-free run gives
it): the stateless branch row for row, the keyed aggregates per user."""

import pytest

from columnar_pipelines import columnar, expected, observed
from cutline.spark.faults import Kill

pytestmark = pytest.mark.slow

RECORDS = 40_000


@pytest.mark.parametrize("mode", ["aligned", "unaligned"])
def test_kill_9_of_a_worker_recovers_batch_streams_exactly(spark, tmp_path, mode):
    p, rows, aggs, wins = columnar(tmp_path, RECORDS, mode, rate=10_000, batch_rows=1000)
    kill = Kill(after_checkpoint=1, delay=0.3)
    result = p.run(spark=spark, timeout=240, on_start=kill)
    assert kill.killed, "the worker was never killed"
    assert result.attempts >= 2
    assert [c for c in result.checkpoints if c.attempt >= 1], "no checkpoint after the restart"
    assert observed(rows, aggs, wins) == expected(RECORDS)
