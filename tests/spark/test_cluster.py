"""Faults on a real Spark standalone cluster: a master and two one-core workers on 127.0.0.1,
started from the installed ``pyspark`` once for this module and stopped by pid.

A process holds one SparkContext (the suite's embedded one), so each job runs as a user's
script in a subprocess (tests/cluster_script.py) with ``p.run(spark=session)`` against the
cluster.  A driver's start (its executors' JVMs on the workers) costs seconds, so the module
runs the fault cases in two scripts, once (:func:`cases`, module-scoped: the driver killed
ends the first; the second runs the rest in turn, the worker gone for good last), and each
case is its own test of what its run reported: that its fault fired, and its exact output
against the failure-free output (or, capacity gone, the error the user saw).  The driver
killed is such a script's own process: a second script resumes its storage.

Whichever test runs first waits for all the cases (its time limit covers them)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cluster_util import Cluster, cluster_env, free_port

HERE = Path(__file__).resolve().parents[1]  # tests/, with cluster_script.py

# (the first test waits for both scripts: up to SCRIPT_LIMIT each, and the cluster's start)
SCRIPT_LIMIT = 900
pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.timeout(2 * SCRIPT_LIMIT + 300)]


@pytest.fixture(scope="module")
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


@dataclass
class Script:
    """One driver script's run: what it printed per case, and how it ended."""

    cases: tuple[str, ...]
    returncode: int | None
    stdout: str
    stderr: str
    results: dict[str, dict] = field(default_factory=dict)

    def story(self) -> str:
        return (f"script for {' '.join(self.cases)} ended with {self.returncode}\n"
                f"stdout: {self.stdout[-3000:]}\nstderr: {self.stderr[-5000:]}")


def run_cases(cluster: Cluster, tmp: Path, *cases: str) -> Script:
    """Run the cases in one driver process and collect each case's ``RESULT`` line."""
    env = dict(cluster_env(), PYTHONPATH=str(HERE), CUTLINE_LOG_DIR=str(tmp / "logs"))
    env.pop("PYTEST_CURRENT_TEST", None)
    t0 = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, str(HERE / "cluster_script.py"), cluster.url,
                               str(cluster.root), str(tmp), *cases], capture_output=True,
                              text=True, env=env, timeout=SCRIPT_LIMIT, cwd=tmp)
        code, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:  # (subprocess.run killed it)
        code, out, err = (None, _text(exc.stdout),
                          _text(exc.stderr) + f"\n(timed out: {SCRIPT_LIMIT} s)")
    print(f"{' '.join(cases)}: {time.monotonic() - t0:.0f} s")  # -s shows where time goes
    (tmp / f"script-{cases[0]}.log").write_text(out + err)  # for a failure's story
    results = {ln.split()[1]: json.loads(ln.split(" ", 2)[2])
               for ln in out.splitlines() if ln.startswith("RESULT ")}
    return Script(cases, code, out, err, results)


def _text(b: bytes | str | None) -> str:
    return b.decode(errors="replace") if isinstance(b, bytes) else b or ""


@dataclass
class Cases:
    died: Script  # driver_dies: the script kills its own driver (kill -9)
    rest: Script  # driver_rerun, executor, daemon, worker_back, worker_gone

    def __getitem__(self, case: str) -> dict:
        script = self.died if case == "driver_dies" else self.rest
        assert case in script.results, f"no result for case {case!r}: " + script.story()
        return script.results[case]


@pytest.fixture(scope="module")
def cases(cluster, tmp_path_factory) -> Cases:
    tmp = tmp_path_factory.mktemp("cases")
    # the driver killed (kill -9) the moment a checkpoint (not the final one) is in
    # storage, before any sink was told to commit it; the next driver resumes that storage
    died = run_cases(cluster, tmp, "driver_dies")
    said = [ln for ln in died.stdout.splitlines() if ln.startswith("DRIVER KILLED")]
    died.results["driver_dies"] = {"said": said, "returncode": died.returncode}
    # the worker lost for good last: the cluster is left with one worker
    rest = run_cases(cluster, tmp, "driver_rerun", "executor", "daemon", "worker_back",
                     "worker_gone")
    print(json.dumps(rest.results, indent=1))  # -s shows what happened in each case
    return Cases(died, rest)


def restarted_by_spark_or_for_a_reason(case: dict) -> None:
    """Spark restarts the stage after a kill; on a loaded machine the driver's watchdog may
    find no new attempt within the restart deadline (90 s) and resubmit it first.  That is
    the watchdog's job, not a failure, but each resubmission must have been said, why."""
    assert case["resubmitted"] == len(case["resubmissions"]), case
    for said in case["resubmissions"]:
        assert re.fullmatch(r"(no attempt of the stage started within \d+ s after|the Spark "
                            r"stage ended after) (attempt \d+ lost slot \d+.*|the stage was "
                            r"submitted): resubmitting it \([12] of 2\)", said), said


def test_a_new_driver_resumes_the_storage_of_a_driver_killed_before_commit(cases):
    died = cases["driver_dies"]
    assert died["returncode"] == -9, cases.died.story()
    (said,) = died["said"]
    n = int(said.removeprefix("DRIVER KILLED at checkpoint "))
    # a new driver on the same storage: resumes checkpoint n, commits its transactions once
    rerun = cases["driver_rerun"]
    assert "error" not in rerun, rerun
    assert rerun["latest"].endswith(f"/driver/chk-{n}"), rerun
    assert rerun["restored"] == rerun["latest"] and rerun["exact"], rerun


def test_an_executor_killed_mid_run_and_while_restoring(cases):
    # kill -9 of one executor JVM mid-run: the worker starts another, Spark restarts the
    # stage; and of an executor of the next attempt the moment it starts (restoring)
    ex = cases["executor"]
    assert "error" not in ex, ex
    assert ex["fired"] == ["executor", "executor"] and ex["exact"], ex
    assert ex["during"] == {"attempt": 1, "checkpoints": 0}, ex
    assert ex["attempts"] >= 3, ex
    restarted_by_spark_or_for_a_reason(ex)


def test_the_pyspark_daemon_then_a_python_worker_killed(cases):
    daemon = cases["daemon"]
    assert "error" not in daemon, daemon
    assert daemon["fired"] == ["daemon", "killed"] and daemon["exact"], daemon
    assert daemon["attempts"] >= 2, daemon
    restarted_by_spark_or_for_a_reason(daemon)


def test_a_worker_lost_and_back_in_time_resumes_exactly(cases):
    back = cases["worker_back"]
    assert "error" not in back, back
    assert back["fired"] == ["worker", "executor"] and back["exact"], back
    assert back["attempts"] >= 2, back
    restarted_by_spark_or_for_a_reason(back)


def test_a_worker_gone_for_good_fails_the_job_saying_why(cases):
    # one slot left for a stage of two; the job waits, the driver resubmits the stage
    # twice, then fails saying why
    gone = cases["worker_gone"]
    assert gone["fired"] == ["worker", "executor"], gone
    assert gone["error"] == (
        "JobFailed: job 'worker_gone' failed: no attempt of the stage started within 12 s "
        "after attempt 0 lost slot 1, nor after the driver resubmitted it 2 times (the "
        "stage needs 2 free task slots at once: is capacity missing, or a task Spark "
        "cannot end holding one?)")


def test_the_driver_scripts_end_cleanly_and_record_what_they_started(cases, cluster):
    assert cases.rest.returncode == 0, cases.rest.story()
    assert set(cases.rest.results) == set(cases.rest.cases), cases.rest.story()
    # the workers the script started (capacity coming back) are the fixture's to stop
    assert len(cluster.pid_file.read_text().split()) == 4
