"""One job per storage, as users run it: a second start of a running job is refused at once,
naming it; the lease is gone when the run ends (the lease itself: tests/storage/test_lease.py)."""

from __future__ import annotations

import collections
import os
import time

import pytest

from cutline.storage.lease import JobAlreadyRunningError

from pipelines import expected_rows, wordcount


def test_a_second_run_of_a_running_job_is_refused_at_once(tmp_path):
    p, sink = wordcount(tmp_path, 1500, rate=100)  # 15 s: still running when refused
    job = p.start(engine="threads", progress=False)
    try:
        deadline = time.monotonic() + 60
        while job.driver is None and time.monotonic() < deadline:
            time.sleep(0.02)
        p2, _ = wordcount(tmp_path, 1500)
        with pytest.raises(JobAlreadyRunningError) as e:
            p2.run(engine="threads", progress=False)
        assert not job.driver.done.is_set()  # refused while the first one ran
        assert "job 'wordcount' is already running" in str(e.value)
        assert f"pid {os.getpid()}" in str(e.value)
        result = job.result(timeout=120)
    finally:
        if job.driver is not None and not job.driver.done.is_set():
            job.cancel()
    assert result.checkpoints_completed >= 1
    assert collections.Counter(sink.results()) == expected_rows(1500)  # nothing changed


def test_a_run_after_the_holder_ended_starts(tmp_path):
    p, _ = wordcount(tmp_path, 50)
    p.run(engine="threads", progress=False)
    assert not [f for f in os.listdir(tmp_path / "checkpoints" / "wordcount")
                if f.startswith("_lease")]


def test_a_process_graph_on_the_storage_of_a_running_one_is_refused(tmp_path):
    import threading

    from graph_programs import ledger_graph

    storage = f"file://{tmp_path}/graphs"
    results: list = []
    first = threading.Thread(target=lambda: results.append(
        ledger_graph(4, 400, 0.01).run(engine="threads", tasks=2, snapshot_interval=0.1,
                                        storage=storage, timeout=120)))
    first.start()
    lease_dir = tmp_path / "graphs" / "ledger"
    deadline = time.monotonic() + 60
    # the lease itself, not the file it is linked from while being created
    while not [f for f in lease_dir.glob("_lease-*") if f.name[7:].isdigit()] \
            and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        with pytest.raises(JobAlreadyRunningError, match="job 'ledger' is already running"):
            ledger_graph(4, 10).run(engine="threads", tasks=2, storage=storage, timeout=60)
    finally:
        first.join(180)
    assert results and results[0].stopped == "terminated"
    assert not list(lease_dir.glob("_lease-*"))  # released when the run ended
    again = ledger_graph(4, 10).run(engine="threads", tasks=2, storage=storage, timeout=60)
    assert again.stopped == "terminated"
