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
    p, sink = wordcount(tmp_path, 600, rate=100)  # 6 s: still running when refused
    job = p.start(engine="threads", progress=False)
    try:
        deadline = time.monotonic() + 60
        while job.driver is None and time.monotonic() < deadline:
            time.sleep(0.02)
        p2, _ = wordcount(tmp_path, 600)
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
    assert collections.Counter(sink.results()) == expected_rows(600)  # nothing changed


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


def test_of_two_spark_runs_started_at_once_the_loser_starts_no_spark(tmp_path, monkeypatch):
    """Issue 29: both drivers passed the lease check before Spark started, and the loser was
    refused only once its own Spark session was up (~8 s).  The lease is now taken before
    the session: the loser never asks for one.  No Spark here: the winner's session start
    records the call, waits for the loser's refusal, and fails (its lease is released)."""
    import threading

    from cutline.spark import launcher

    class NoSpark(Exception):
        pass

    asked: list[str] = []
    refused = threading.Event()

    def embedded_context(slots, *args, **kwargs):
        asked.append(threading.current_thread().name)
        refused.wait(10)  # the winner's Spark "starts" while the other driver is judged
        raise NoSpark("no Spark in this test")

    monkeypatch.setattr(launcher, "embedded_context", embedded_context)
    together = threading.Barrier(2)
    outcome: dict[str, BaseException] = {}

    def start(name: str) -> None:
        p, _ = wordcount(tmp_path, 50)
        together.wait()
        try:
            p.run(progress=False, dashboard=False)  # engine="spark", the default
        except BaseException as exc:  # noqa: BLE001 - the test looks at it
            outcome[name] = exc
            if isinstance(exc, JobAlreadyRunningError):
                refused.set()

    drivers = [threading.Thread(target=start, args=(n,), name=n) for n in ("a", "b")]
    for t in drivers:
        t.start()
    for t in drivers:
        t.join(60)
    assert sorted(type(e).__name__ for e in outcome.values()) == \
        ["JobAlreadyRunningError", "NoSpark"], outcome
    (winner,) = [n for n, e in outcome.items() if isinstance(e, NoSpark)]
    assert asked == [winner]  # the loser never started Spark
    loser = next(e for e in outcome.values() if isinstance(e, JobAlreadyRunningError))
    assert "job 'wordcount' is already running" in str(loser)
    # the winner failed before its driver took the lease over: released all the same
    assert not list((tmp_path / "checkpoints" / "wordcount").glob("_lease-*"))


def test_a_driver_handed_a_lease_owns_it(tmp_path):
    """run_pipeline takes the lease and hands it to the driver (job_driver): its run refreshes it
    with its dashboard, releases it when it stops, and a lease another driver took over
    while Spark was starting stops the run before it starts."""
    from cutline import JobFailed
    from cutline.driver.dataflow import job_driver
    from cutline.plan import plan as make_plan
    from cutline.storage.checkpoints import CheckpointStorage
    from cutline.storage.lease import JobLease

    p, _ = wordcount(tmp_path, 50)
    storage = CheckpointStorage(p.checkpoint.storage, p.name)
    lease = JobLease(storage)
    lease.acquire()
    driver = job_driver(make_plan(p), p.checkpoint, p.name, lease=lease)
    assert driver.run.lease is lease and lease.on_lost == driver.lease_lost
    driver.run.dashboard_url = "http://127.0.0.1:1/?token=x"
    assert lease._body()["dashboard"] == driver.run.dashboard_url
    driver.stop()
    assert lease.path is None and not list(storage.fs.glob(f"{storage.dir}/_lease-*"))

    lease = JobLease(storage)
    lease.acquire()
    lease.lost = "job 'wordcount': another driver took over its storage"
    with pytest.raises(JobFailed, match="another driver took over"):
        job_driver(make_plan(p), p.checkpoint, p.name, lease=lease)
    assert lease.path is None and not list(storage.fs.glob(f"{storage.dir}/_lease-*"))


def test_of_two_spark_graph_runs_started_at_once_the_loser_starts_no_spark(tmp_path,
                                                                            monkeypatch):
    """The same for process graphs (run_graph took its lease after the engine started)."""
    import threading

    from cutline.spark import graph as spark_graph
    from graph_programs import ledger_graph

    class NoSpark(Exception):
        pass

    asked: list[str] = []
    refused = threading.Event()

    def embedded_context(slots, *args, **kwargs):
        asked.append(threading.current_thread().name)
        refused.wait(10)
        raise NoSpark("no Spark in this test")

    monkeypatch.setattr(spark_graph, "embedded_context", embedded_context)
    storage = f"file://{tmp_path}/graphs"
    together = threading.Barrier(2)
    outcome: dict[str, BaseException] = {}

    def start(name: str) -> None:
        g = ledger_graph(4, 10)
        together.wait()
        try:
            g.run(engine="spark", tasks=2, storage=storage, timeout=60)
        except BaseException as exc:  # noqa: BLE001 - the test looks at it
            outcome[name] = exc
            if isinstance(exc, JobAlreadyRunningError):
                refused.set()

    runs = [threading.Thread(target=start, args=(n,), name=n) for n in ("a", "b")]
    for t in runs:
        t.start()
    for t in runs:
        t.join(60)
    assert sorted(type(e).__name__ for e in outcome.values()) == \
        ["JobAlreadyRunningError", "NoSpark"], outcome
    (winner,) = [n for n, e in outcome.items() if isinstance(e, NoSpark)]
    assert asked == [winner]
    assert not list((tmp_path / "graphs" / "ledger").glob("_lease-*"))
