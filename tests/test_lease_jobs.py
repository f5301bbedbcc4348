"""One job per storage, as users run it: a second start of a running job is refused at once,
naming it; the lease is gone when the run ends (the lease itself: tests/test_lease.py)."""

from __future__ import annotations

import collections
import os
import time

import pytest

from cutline.storage.lease import JobAlreadyRunningError

from pipelines import expected_rows, wordcount


def test_a_second_run_of_a_running_job_is_refused_at_once(tmp_path):
    p, sink = wordcount(tmp_path, 400, rate=100)
    job = p.start(engine="threads", progress=False)
    try:
        deadline = time.monotonic() + 60
        while job.driver is None and time.monotonic() < deadline:
            time.sleep(0.02)
        p2, _ = wordcount(tmp_path, 400)
        t0 = time.monotonic()
        with pytest.raises(JobAlreadyRunningError) as e:
            p2.run(engine="threads", progress=False)
        assert time.monotonic() - t0 < 10
        assert "job 'wordcount' is already running" in str(e.value)
        assert f"pid {os.getpid()}" in str(e.value)
        result = job.result(timeout=120)
    finally:
        if job.driver is not None and not job.driver.done.is_set():
            job.cancel()
    assert result.checkpoints_completed >= 1
    assert collections.Counter(sink.results()) == expected_rows(400)  # nothing changed


def test_a_run_after_the_holder_ended_starts(tmp_path):
    p, _ = wordcount(tmp_path, 50)
    p.run(engine="threads", progress=False)
    assert not [f for f in os.listdir(tmp_path / "checkpoints" / "wordcount")
                if f.startswith("_lease")]
