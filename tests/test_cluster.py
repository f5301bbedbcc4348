"""Faults on a real Spark standalone cluster: a master and two one-core workers on 127.0.0.1,
started from the installed ``pyspark`` once per test session and stopped by pid.

A process holds one SparkContext (the suite's embedded one), so each job runs as a user's
script in a subprocess (tests/cluster_script.py) with ``p.run(spark=session)`` against the
cluster; one script runs several cases in turn (one driver start).  Every case asserts that
its fault fired and compares the exact output with the failure-free output.  The driver
killed is such a script's own process: a second script resumes its storage."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cluster_util import Cluster, cluster_env, free_port

HERE = Path(__file__).parent


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("cluster"), free_port())
    try:
        c.start_master()
        c.start_worker(0)
        c.start_worker(1)
        c.wait_for_workers(2)
        yield c
    finally:
        c.stop()


def run_cases(cluster: Cluster, tmp: Path, *cases: str,
              killed: bool = False) -> dict[str, dict]:
    """Run the cases in one driver process; ``killed``: its last case kills the driver
    (``kill -9``), so it reports nothing and the process ends with -9."""
    env = dict(cluster_env(), PYTHONPATH=str(HERE), CUTLINE_LOG_DIR=str(tmp / "logs"))
    env.pop("PYTEST_CURRENT_TEST", None)
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, str(HERE / "cluster_script.py"), cluster.url,
                           str(cluster.root), str(tmp), *cases], capture_output=True,
                          text=True, env=env, timeout=900, cwd=tmp)
    print(f"{' '.join(cases)}: {time.monotonic() - t0:.0f} s")  # -s shows where time goes
    log = tmp / f"script-{cases[0]}.log"
    log.write_text(proc.stdout + proc.stderr)  # for a failure's story
    results = {ln.split()[1]: json.loads(ln.split(" ", 2)[2])
               for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")}
    reported = cases[:-1] if killed else cases
    assert proc.returncode == (-9 if killed else 0) and set(results) == set(reported), \
        (proc.returncode, proc.stdout[-3000:], proc.stderr[-5000:])
    if killed:
        results[cases[-1]] = {"said": [ln for ln in proc.stdout.splitlines()
                                       if ln.startswith("DRIVER KILLED")]}
    return results


def restarted_by_spark_or_for_a_reason(case: dict) -> None:
    """Spark restarts the stage after a kill; on a loaded machine the driver's watchdog may
    find no new attempt within the restart deadline (90 s) and resubmit it first.  That is
    the watchdog's job, not a failure, but each resubmission must have been said, why."""
    assert case["resubmitted"] == len(case["resubmissions"]), case
    for said in case["resubmissions"]:
        assert re.fullmatch(r"(no attempt of the stage started within \d+ s after|the Spark "
                            r"stage ended after) (attempt \d+ lost slot \d+.*|the stage was "
                            r"submitted): resubmitting it \([12] of 2\)", said), said


@pytest.mark.slow
def test_driver_executor_daemon_and_worker_faults_on_a_cluster(cluster, tmp_path):
    # the driver killed (kill -9) the moment a checkpoint (not the final one) is in storage,
    # before any sink was told to commit it; the next driver resumes the storage it leaves
    died = run_cases(cluster, tmp_path, "driver_dies", killed=True)
    (said,) = died["driver_dies"]["said"]
    n = int(said.removeprefix("DRIVER KILLED at checkpoint "))
    # the worker lost for good last: the cluster is left with one worker
    r = run_cases(cluster, tmp_path, "driver_rerun", "executor", "daemon", "worker_back",
                  "worker_gone")
    print(json.dumps(r, indent=1))  # -s shows what happened in each case
    # a new driver on the same storage: resumes checkpoint n, commits its transactions once
    rerun = r["driver_rerun"]
    assert rerun["latest"].endswith(f"/driver/chk-{n}"), rerun
    assert rerun["restored"] == rerun["latest"] and rerun["exact"], rerun
    # kill -9 of one executor JVM mid-run: the worker starts another, Spark restarts the
    # stage; and of an executor of the next attempt the moment it starts (restoring)
    ex = r["executor"]
    assert ex["fired"] == ["executor", "executor"] and ex["exact"], ex
    assert ex["during"] == {"attempt": 1, "checkpoints": 0}, ex
    assert ex["attempts"] >= 3, ex
    restarted_by_spark_or_for_a_reason(ex)
    # kill -9 of the PySpark daemon of a surviving executor, then a Python worker
    daemon = r["daemon"]
    assert daemon["fired"] == ["daemon", "killed"] and daemon["exact"], daemon
    assert daemon["attempts"] >= 2, daemon
    restarted_by_spark_or_for_a_reason(daemon)
    # a worker gone for good: one slot left for a stage of two; the job waits, the driver
    # resubmits the stage twice, then fails saying why
    gone = r["worker_gone"]
    assert gone["fired"] == ["worker", "executor"], gone
    assert gone["error"] == (
        "JobFailed: job 'worker_gone' failed: no attempt of the stage started within 12 s "
        "after attempt 0 lost slot 1, nor after the driver resubmitted it 2 times (the "
        "stage needs 2 free task slots at once: is capacity missing, or a task Spark "
        "cannot end holding one?)")
    # ... and when a worker comes back in time, the job resumes exactly
    back = r["worker_back"]
    assert back["fired"] == ["worker", "executor"] and back["exact"], back
    assert back["attempts"] >= 2, back
    restarted_by_spark_or_for_a_reason(back)
    # the workers the script started (capacity coming back) are the fixture's to stop
    assert len(cluster.pid_file.read_text().split()) == 4
