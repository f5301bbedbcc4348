"""Checkpoint storage faults on real Spark: the S3 server (moto, loopback) fails or stalls
exactly the state-file writes of checkpoint 2.

A task whose state write fails declines the checkpoint; a write that stalls past the
checkpoint timeout expires it.  Either way checkpoint 2 is aborted and counted against
``tolerable_failures``, the job keeps running, later checkpoints complete, and the output is
exactly the failure-free one.  With ``tolerable_failures=0`` the job fails, saying why.
"""

import collections

import pytest

from cutline.driver.dataflow import JobFailed
from pipelines import expected_rows, wordcount

pytestmark = pytest.mark.slow

RECORDS = 16_000
CHK2_STATE = r"/chk-2/[^/]+\.state$"


def _job(s3, tmp_path, **checkpoint):
    p, sink = wordcount(tmp_path, RECORDS, "aligned", rate=8_000, interval=0.3)
    p.with_checkpoint(storage=s3.url("faults"), storage_options=s3.options, **checkpoint)
    return p, sink


@pytest.fixture
def faults(s3):
    yield s3.faults
    s3.faults.clear()


@pytest.mark.parametrize("fault", ["error", "stall"])
def test_a_failed_checkpoint_write_declines_only_that_checkpoint(spark, s3, faults, tmp_path,
                                                                  fault):
    if fault == "error":  # every attempt (s3fs retries) gets HTTP 500
        rule = faults.add("PUT", CHK2_STATE, status=500)
        p, sink = _job(s3, tmp_path, tolerable_failures=1)
    else:
        # The write hangs 2.5 s > the 2 s timeout: checkpoint 2 cannot complete in time.
        # The write blocks its task thread, so checkpoint 3 (triggered when 2 expires)
        # completes only after it: within its own 2 s as long as the stall is < 2 timeouts.
        rule = faults.add("PUT", CHK2_STATE, delay=2.5)
        p, sink = _job(s3, tmp_path, tolerable_failures=1, timeout=2.0)
    result = p.run(spark=spark, timeout=180)
    assert rule.hits >= 1, "the storage fault never fired"
    ids = [c.id for c in result.checkpoints]
    assert 1 in ids and 2 not in ids, ids
    assert any(i > 2 for i in ids), f"no checkpoint completed after the failed one: {ids}"
    assert result.attempts == 1  # declined, not restarted
    assert collections.Counter(sink.results()) == expected_rows(RECORDS)


def test_with_no_tolerable_failures_the_job_fails_saying_why(spark, s3, faults, tmp_path):
    rule = faults.add("PUT", CHK2_STATE, status=500)
    p, _ = _job(s3, tmp_path, tolerable_failures=0)
    with pytest.raises(JobFailed) as info:
        p.run(spark=spark, timeout=180)
    assert rule.hits >= 1
    msg = str(info.value)
    assert "Exceeded checkpoint tolerable failure threshold (0)" in msg
    assert "checkpoint 2 declined by task" in msg
    assert "writing state failed" in msg and "injected fault" in msg
