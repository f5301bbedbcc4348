"""A user's script on the test cluster: ``python cluster_script.py URL ROOT TMP CASE...``.

Runs each case's job with ``p.run(spark=session)`` against the standalone master at URL, in
this one driver process (one SparkContext per process), and prints one line per case:
``RESULT <case> <json>`` with what was injected, the attempts, whether the output was
exact, or the error the user saw.  ROOT is the cluster's directory (a worker started here,
capacity coming back, has its pid recorded there for the fixture to stop).
"""

from __future__ import annotations

import collections
import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

from cluster_jobs import per_user, per_user_expected
from cluster_util import Cluster
from cutline.spark.faults import cmdline, executor_of, parent
from pipelines import write_events


def session(url: str, attempts: int | None = None):
    """A driver on the cluster at ``url``: two one-core executors.  ``attempts``: how many
    times in a row Spark may restart the job's stage (its default: 4)."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    if attempts is not None:
        builder = (builder.config("spark.stage.maxConsecutiveAttempts", str(attempts))
                   .config("spark.task.maxFailures", str(attempts)))
    spark = (builder.master(url).appName("cutline-cluster-test")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.executor.cores", "1").config("spark.cores.max", "2")
             .config("spark.executor.memory", "512m")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.pyspark.python", sys.executable)
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def executors(spark) -> int:
    return spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1


def wait_for_executors(spark, n: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while executors(spark) < n:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{executors(spark)} of {n} executors after {timeout}s")
        time.sleep(0.2)


class Kill:
    """``delay`` s into the first attempt, ``kill -9`` what ``target(driver)`` names:
    ``[(what, pid)]``; ``then(driver)`` runs after it (capacity coming back).
    ``recovery``: a second target, killed the moment the next attempt starts (its tasks
    restoring, before it completed a checkpoint: ``during`` says)."""

    def __init__(self, delay: float, target, then=None, recovery=None) -> None:
        self.delay, self.target, self.then, self.recovery = delay, target, then, recovery
        self.fired: list[tuple[str, int]] = []
        self.during: dict = {}

    def __call__(self, driver) -> None:
        def run() -> None:
            while not driver.run.attempt.started and not driver.done.is_set():
                time.sleep(0.02)
            time.sleep(self.delay)
            if driver.done.is_set():
                return
            for what, pid in self.target(driver):
                os.kill(pid, signal.SIGKILL)
                self.fired.append((what, pid))
            if self.then is not None:
                self.then()
            if self.recovery is not None and self.fired:
                self._kill_during_recovery(driver)

        threading.Thread(target=run, daemon=True).start()

    def _kill_during_recovery(self, driver) -> None:
        while not driver.done.is_set():
            a = driver.run.attempt
            if a.number >= 1 and a.started:
                break
            time.sleep(0.002)
        else:
            return
        for what, pid in self.recovery(driver):
            os.kill(pid, signal.SIGKILL)
            self.fired.append((what, pid))
        # checkpoints the new attempt had completed when it was hit (0: still restoring)
        self.during = {"attempt": a.number, "checkpoints": sum(
            1 for c in driver.run.checkpoints if c.attempt == a.number)}


class DieBeforeCommit:
    """``kill -9`` of this driver process the moment a checkpoint from ``n`` on is complete
    in storage (``_metadata`` written), before any sink was told to commit it; not the
    final one (a new run would have nothing left to do)."""

    fired: list = []

    def __init__(self, n: int) -> None:
        from cutline.driver.shell import Driver
        from cutline.protocol import messages as m
        from cutline.protocol.job import Send

        original = Driver._perform

        def perform(driver, commands):
            for cmd in commands:
                if type(cmd) is Send and type(cmd.msg) is m.Complete \
                        and cmd.msg.checkpoint >= n and not cmd.msg.final:
                    print("DRIVER KILLED at checkpoint", cmd.msg.checkpoint, flush=True)
                    os.kill(os.getpid(), signal.SIGKILL)
            return original(driver, commands)

        Driver._perform = perform

    def __call__(self, driver) -> None:
        pass


class Resubmissions(logging.Handler):
    """The driver's word for each time its watchdog resubmitted the stage."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.said: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if "resubmitting it" in text:
            self.said.append(text)


def executor(slot: int):
    def target(driver):
        pid = executor_of(driver.run.task_pids[slot])
        return [("executor", pid)] if pid else []
    return target


def worker(slot: int):
    """The Worker daemon hosting ``slot``'s executor, and the executor: capacity gone."""
    def target(driver):
        ex = executor_of(driver.run.task_pids[slot])
        w = parent(ex) if ex else None
        if not w or "deploy.worker.Worker" not in cmdline(w):
            return []
        return [("worker", w), ("executor", ex)]
    return target


def main() -> None:
    url, root, tmp = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    cluster = Cluster(root, int(url.rsplit(":", 1)[1]))
    spark = session(url)
    wait_for_executors(spark, 2)
    from cutline.spark.faults import KillDaemon

    resubmissions = Resubmissions()
    logging.getLogger("cutline.driver").addHandler(resubmissions)
    cases = sys.argv[4:]
    for i, case in enumerate(cases):
        resubmissions.said = []
        # the driver cases share a job: one driver dies, the next run resumes its storage
        name = "driver" if case.startswith("driver") else case
        work = tmp / name
        events = write_events(work / "in", files=2, per_file=1500)
        p, sink = per_user(work, "aligned", parallelism=2, name=name)
        restart_timeout, latest = 90.0, None
        if case == "executor":  # mid-run, then the next attempt's, while it restores
            fault = Kill(1.0, executor(1), recovery=executor(0))
        elif case == "driver_dies":  # this process: a run on another one resumes
            fault = DieBeforeCommit(1)
        elif case == "driver_rerun":
            from cutline.storage.checkpoints import CheckpointStorage

            fault = Kill(0.0, lambda driver: [])
            handle = CheckpointStorage(p.checkpoint.storage, name).latest()
            latest = handle.path if handle is not None else None
        elif case == "daemon":
            fault = KillDaemon(delay=1.0, kill=1)
        elif case == "worker_gone":  # capacity below the parallelism for good
            # (the start has its own deadline: a busy machine's slow start is no failure)
            fault, restart_timeout = Kill(1.0, worker(1)), 12.0
        elif case == "worker_back":  # ... and back in time
            fault = Kill(1.0, worker(1), then=lambda: cluster.start_worker(9))
        else:
            raise SystemExit(f"unknown case {case}")
        out: dict = {}
        drivers: list = []
        t0 = time.monotonic()
        try:
            result = p.run(spark=spark, timeout=240, restart_timeout=restart_timeout,
                           on_start=lambda d, ds=drivers, f=fault: (ds.append(d), f(d)),
                           progress=False)
            got = collections.Counter(sink.results())
            out.update(attempts=result.attempts, exact=got == per_user_expected(events),
                       rows=sum(got.values()),
                       resubmitted=drivers[0].controller.resubmitted)
            if case == "driver_rerun":
                out.update(latest=latest, restored=result.restored_from)
        except Exception as exc:  # noqa: BLE001 - what the user sees is the result
            out.update(error=f"{type(exc).__name__}: {exc}")
        out.update(fired=[w for w, _ in fault.fired], seconds=round(time.monotonic() - t0, 1),
                   resubmissions=resubmissions.said)
        if getattr(fault, "during", None):
            out.update(during=fault.during)
        print("RESULT", case, json.dumps(out), flush=True)
        if case == "worker_gone" and i + 1 < len(cases):  # capacity back for the next
            cluster.start_worker(8)
            wait_for_executors(spark, 2)
    spark.stop()


if __name__ == "__main__":
    main()
