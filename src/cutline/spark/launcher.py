"""Run a pipeline on Spark: the embedded session, ``run_pipeline`` and :class:`RunningJob`.

The tasks run as one Spark barrier stage (:mod:`cutline.spark.stage`); each Spark task
hosts one slot: subtask ``k`` of every chain.  The driver side, the same on every engine,
is :mod:`cutline.driver`.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import threading
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from ..driver.dataflow import DataflowRun, JobFailed, refuse_finished
from ..driver.logs import new_log_file, redirect_output
from ..driver.run import JobCancelled, JobResult, run_job
from ..driver.shell import Driver
from ..driver.threads import ThreadsEngine
from ..plan import plan as make_plan
from ..protocol.liveness import HEARTBEAT_TIMEOUT, check_timeout
from ..runtime.restore import IncompatibleCheckpointError
from ..storage.checkpoints import CheckpointStorage, CheckpointStorageError
from ..storage.lease import JobLease
from ..warm import import_meanwhile
from . import cds
from .quiet import FAILED_STAGE_END_TIMEOUT, progress_bar_muted, wait_for_stage
from .stage import SparkStage, ship_user_code

log = logging.getLogger("cutline.spark")

__all__ = ["run_pipeline", "run_threads", "JobResult", "JobCancelled", "JobFailed",
           "RunningJob", "EmbeddedSpark", "embedded_context", "embedded_session"]

USER_ERRORS = (JobFailed, IncompatibleCheckpointError, CheckpointStorageError,
               KeyboardInterrupt)
"""Errors whose message says it all: ``Pipeline.run`` (and ``RunningJob.result``) raises
them with a traceback that ends at the user's call (the task's traceback is in the log
file the message names): a failed or cancelled run (``JobFailed``, ``FinishedJobError``,
``JobCancelled``), a checkpoint that does not fit the pipeline, and the checkpoint
storage's refusals (``JobAlreadyRunningError``: another driver runs the job;
``CheckpointNotFoundError``: no checkpoint at ``restore_from``; a corrupt one; storage
that cannot be opened or written)."""

RESTART_TIMEOUT = 180.0
"""Seconds a job waits for a new attempt of its stage after a loss before resubmitting it."""

START_TIMEOUT = 300.0
"""Seconds a job waits for its first attempt (every task slot registered) after submitting
its stage: executors launch, Python workers start and import; Flink's
``slot.request.timeout`` has the same default."""

_SESSION = None
SPARK_LOG: Path | None = None
"""The log file of the embedded session's JVM and Python workers (None: not started)."""


def embedded_session(slots: int, max_failures: int = 8, stage_attempts: int = 8, *,
                     quick_start: bool = True, conf: dict[str, str] | None = None) -> Any:
    """The library's own ``local[N,F]`` session (N slots, F task attempts); a job's barrier
    stage may be resubmitted ``stage_attempts`` times in a row (one per failure).

    ``quick_start``: the JVM compiles with its quick compiler only (C1).  cutline's records
    never pass through the JVM (tasks talk over their own channels; Spark schedules and
    restarts them), so its peak speed does not matter and starting is 1.5-2.5x faster.
    Benchmarks that run Spark's own engine on the session pass False.  ``conf``: more
    Spark settings for the new session (e.g. ``spark.driver.memory``)."""
    global _SESSION, SPARK_LOG
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    if isinstance(_SESSION, EmbeddedSpark):  # a run started the context: a session on it
        with redirect_output(SPARK_LOG) if SPARK_LOG is not None else nullcontext():
            _SESSION = SparkSession.builder.getOrCreate()  # (on the active context)
        return _SESSION
    if _SESSION is None:
        _python_env()
        # Spark's JVM and its Python workers write to a log file, not the terminal: a
        # failure prints cutline's cause in a few lines and names the file.
        SPARK_LOG = new_log_file("spark")
        conf = dict(conf or {})
        options = conf.pop("spark.driver.extraJavaOptions",
                           "-XX:TieredStopAtLevel=1" if quick_start else "")
        options, writing = cds.java_options(options, "session")
        with redirect_output(SPARK_LOG):
            builder = SparkSession.builder.config("spark.driver.extraJavaOptions", options)
            for k, v in conf.items():
                builder = builder.config(k, v)
            _SESSION = _build_session(builder, slots, max_failures, stage_attempts)
        sc = _SESSION.sparkContext
        cds.note_writer(writing, sc)
        cds.note_use(options, sc)
        sc.setLogLevel("WARN")
    return _SESSION


class EmbeddedSpark:
    """The library's own ``local[N,F]`` Spark context, without a ``SparkSession`` on it:
    what a pipeline's barrier stage needs (cutline's records never pass through Spark SQL).
    A ``SparkSession``'s SQL state takes 3-4 s more to start on 2 cores (a third of a small
    job's time, process start to exit: ``bench/startup.py``).  Has what the stage reads of
    a session: ``sparkContext``, ``conf.get``, ``version``, ``stop()``.
    :func:`embedded_session` puts a session on the same context when one is asked for."""

    def __init__(self, sc: Any) -> None:
        self.sparkContext = sc

    @property
    def conf(self) -> Any:
        return self.sparkContext.getConf()

    @property
    def version(self) -> str:
        return str(self.sparkContext.version)

    def stop(self) -> None:
        self.sparkContext.stop()

    def __repr__(self) -> str:
        return f"EmbeddedSpark({self.sparkContext.master})"


def embedded_context(slots: int, max_failures: int = 8, stage_attempts: int = 8) -> Any:
    """What ``Pipeline.run()`` runs on when given no session: a ``SparkSession`` already
    active in this process (the user's, or :func:`embedded_session`'s), else the library's
    own context (:class:`EmbeddedSpark`: started once, shared by every run after)."""
    global _SESSION, SPARK_LOG
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    if _SESSION is None:
        _python_env()
        options, writing = cds.java_options("-XX:TieredStopAtLevel=1", "context")
        conf = (SparkConf()
                .set("spark.driver.extraJavaOptions", options)
                .setAll(list(_settings(slots, max_failures, stage_attempts).items())))
        SPARK_LOG = new_log_file("spark")
        meanwhile = _import_meanwhile()
        try:
            with redirect_output(SPARK_LOG):
                sc = SparkContext.getOrCreate(conf)
        finally:
            meanwhile.join(MEANWHILE_JOIN)
        cds.note_writer(writing, sc)
        cds.note_use(options, sc)
        sc.setLogLevel("WARN")
        _SESSION = EmbeddedSpark(sc)
    return _SESSION


WARM_IMPORTS = ("pyspark.testing.utils",)
"""What PySpark imports in the driver at its first Py4J call with arguments, while it starts a
context (the NumPy converter ``pyspark.sql.types`` registers asks ``pyspark.testing.utils``
whether NumPy is there, and that module imports pandas: 0.3 s on a quiet core).  Imported
on a thread while the JVM starts (the driver only waits for it then), not after it."""
MEANWHILE_JOIN = 30.0
"""Seconds the context's start waits for that thread once the context is up (it is done by
then, or the driver was already waiting for the same import)."""


def _import_meanwhile() -> threading.Thread:
    """Import :data:`WARM_IMPORTS` on a thread of their own; a module that fails to import
    is left to PySpark, which imports it again and says why."""
    return import_meanwhile(WARM_IMPORTS, "ahead of the context")


def _python_env() -> None:
    # Python workers run this interpreter (the venv cutline is installed in).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # An embedded session is a single machine: keep every socket on loopback.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


PRELOAD_ENV = "CUTLINE_SPARK_PRELOAD"
"""Set to ``0`` to start an embedded session's Python workers from PySpark's own daemon
(:mod:`cutline.spark.daemon` otherwise)."""


def _daemon() -> dict[str, str]:
    """An embedded session's Python daemon: :mod:`cutline.spark.daemon`, which imports
    cutline's task runtime before it forks workers, when the workers run this interpreter
    (a ``PYSPARK_PYTHON`` of the user's own may not have cutline: PySpark's then)."""
    if os.environ.get(PRELOAD_ENV, "1").strip().lower() in ("0", "false", "off", "no"):
        return {}
    worker = os.environ.get("PYSPARK_PYTHON", sys.executable)
    try:
        same = os.path.samefile(shutil.which(worker) or worker, sys.executable)
    except OSError:
        same = False
    return {"spark.python.daemon.module": "cutline.spark.daemon"} if same else {}


def _settings(slots: int, max_failures: int, stage_attempts: int) -> dict[str, str]:
    return {**_daemon(),
            "spark.master": f"local[{max(slots, 2)},{max_failures}]",
            "spark.app.name": "cutline",
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.shuffle.partitions": "1",
            "spark.stage.maxConsecutiveAttempts": str(stage_attempts),
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1"}


def _build_session(builder: Any, slots: int, max_failures: int, stage_attempts: int) -> Any:
    for k, v in _settings(slots, max_failures, stage_attempts).items():
        builder = builder.config(k, v)
    return builder.getOrCreate()


def run_threads(pipeline: Any, *, restore_from: str | None = None,
                timeout: float | None = None,
                allow_non_restored_state: bool = False, on_start: Any = None,
                progress: Any = None, dashboard: Any = None,
                heartbeat_timeout: float = HEARTBEAT_TIMEOUT) -> JobResult:
    """Run every slot on a thread of this process (no Spark): for tests and debugging.

    The same driver, tasks, channels and storage as on Spark; no fault tolerance beyond
    restarting from checkpoints in a new run.
    """
    plan = make_plan(pipeline)
    return run_job(pipeline, plan, ThreadsEngine(plan.slots), restore_from=restore_from,
                   timeout=timeout, on_start=on_start, progress=progress, faults=(),
                   allow_non_restored_state=allow_non_restored_state, dashboard=dashboard,
                   heartbeat_timeout=check_timeout(heartbeat_timeout))


def run_pipeline(pipeline: Any, spark: Any = None, *, restore_from: str | None = None,
                 timeout: float | None = None, on_start: Any = None,
                 engine: str = "spark", progress: Any = None,
                 faults: tuple[tuple[str, int, int], ...] = (),
                 allow_non_restored_state: bool = False, dashboard: Any = None,
                 restart_timeout: float = RESTART_TIMEOUT,
                 start_timeout: float = START_TIMEOUT,
                 heartbeat_timeout: float = HEARTBEAT_TIMEOUT) -> JobResult:
    """Run ``pipeline`` to the end (bounded sources) and return what happened.

    ``restore_from`` starts from a checkpoint or savepoint path; otherwise the job resumes
    from the latest completed checkpoint under its storage, if any.  ``on_start(driver)``
    is called once the driver is up (tests use it to inject faults): a
    :class:`~cutline.driver.shell.Driver` whose ``run`` (a
    :class:`~cutline.driver.dataflow.DataflowRun`) holds what there is to read of the job
    (``driver.run.checkpoints``, ``driver.run.attempt``, ``driver.run.task_pids``).

    State is matched to operators by uid; a pipeline whose parallelism changed is rescaled
    (keyed state by key groups, source positions and sink transactions redistributed).  A
    checkpoint holding state of an operator the pipeline no longer has fails the run before
    it starts, unless ``allow_non_restored_state=True`` drops that state.

    ``progress``: a live line (records/s, checkpoints, attempt) while the job runs.  By
    default (None) shown in an interactive terminal, not in CI, a notebook or a pipe;
    True / False force it; a rich ``Console`` shows it there.

    ``dashboard``: a live web page and Prometheus endpoint on 127.0.0.1 while the job runs
    (its URL, with the job's token, is printed at start).  By default (None) on where the
    progress line shows, or as ``$CUTLINE_DASHBOARD`` says (1, 0 or a port); True / False
    force it; a number is the port (default: any free one).

    ``restart_timeout``: after a task is lost a new attempt must start within this many
    seconds; else the driver cancels the stage and submits it again, twice at most, then
    fails the job saying why.  Spark may never restart a stage: a task it cannot end holds
    a slot (its PySpark daemon was killed), or the cluster lost the capacity the barrier
    stage needs.  ``start_timeout``: the same for the job's start, from submitting the
    stage to its first attempt (every task running and registered): a first start takes
    longer than a restart (executors launch, Python workers start), so a short
    ``restart_timeout`` does not fail a slow start.

    ``heartbeat_timeout``: a task, the driver or a channel's other end that sends nothing
    (not even a heartbeat: idle connections carry one every fifth of this) for this many
    seconds is failed: a frozen process, a half-open connection.  The attempt fails and
    the job recovers as after a lost worker (docs/network-faults.md).
    """
    check_timeout(restart_timeout, "restart_timeout")
    check_timeout(start_timeout, "start_timeout")
    heartbeat_timeout = check_timeout(heartbeat_timeout)
    if engine == "threads":
        return run_threads(pipeline, restore_from=restore_from, timeout=timeout,
                           allow_non_restored_state=allow_non_restored_state,
                           on_start=on_start, progress=progress, dashboard=dashboard,
                           heartbeat_timeout=heartbeat_timeout)
    if engine != "spark":
        raise ValueError(f"engine must be 'spark' or 'threads', got {engine!r}")
    plan = make_plan(pipeline)
    cfg = pipeline.checkpoint
    storage = CheckpointStorage(cfg.storage, pipeline.name, cfg.storage_options)
    if restore_from is None:  # a finished job is refused at once, not after Spark started
        refuse_finished(storage, storage.latest(deep=False))
    # One job per storage, decided before Spark starts: of two drivers started at once, the
    # one that does not create the lease is refused at once (it starts no Spark session).
    # The driver takes the lease over and releases it; if anything fails before, here.
    lease = JobLease(storage)
    lease.acquire()
    try:
        return _run_on_spark(pipeline, plan, spark, lease, restore_from=restore_from,
                             timeout=timeout, on_start=on_start, progress=progress,
                             faults=faults, allow_non_restored_state=allow_non_restored_state,
                             dashboard=dashboard, restart_timeout=restart_timeout,
                             start_timeout=start_timeout, heartbeat_timeout=heartbeat_timeout)
    finally:
        lease.release()  # (the driver released it when the run ended: nothing to do then)


def _run_on_spark(pipeline: Any, plan: Any, spark: Any, lease: JobLease,
                  **options: Any) -> JobResult:
    if spark is None:
        spark = embedded_context(plan.slots)
    stage = SparkStage(spark, plan.slots, f"pipeline {pipeline.name!r}",
                       f"cutline-{pipeline.name}",
                       log_path=SPARK_LOG if spark is _SESSION else None,
                       needs=("rocksdict",) if pipeline.checkpoint.state_backend == "rocksdb"
                       else ())
    ship_user_code(n for node in pipeline.nodes
                   for n in (node.fn, node.key_fn, getattr(node, "on_timer", None)))
    users_session = spark is not _SESSION  # the user may stop it next: Spark ends first
    with progress_bar_muted(spark):  # the user's session draws one over the live line
        try:
            result = run_job(pipeline, plan, stage, lease=lease, **options)
        except BaseException:
            if users_session:  # the stage was cancelled: its end, briefly (the error comes first)
                wait_for_stage(stage, pipeline.name, FAILED_STAGE_END_TIMEOUT, failed=True)
            raise
        if users_session:
            wait_for_stage(stage, pipeline.name)
        return result


class RunningJob:
    """A job started with :meth:`Pipeline.start`: it runs on a thread of this process while
    the caller takes savepoints, stops it with one, or cancels it."""

    def __init__(self, pipeline: Any, spark: Any = None, **kwargs: Any) -> None:
        self.pipeline = pipeline
        self._driver: Driver[DataflowRun] | None = None
        self._ready = threading.Event()
        self._result: JobResult | None = None
        self._error: BaseException | None = None
        user_on_start = kwargs.pop("on_start", None)
        # a job in the background draws no live line unless asked (it would cut through
        # whatever the caller prints meanwhile)
        kwargs.setdefault("progress", False)

        def on_start(driver: Driver[DataflowRun]) -> None:
            self._driver = driver
            self._ready.set()
            if user_on_start is not None:
                user_on_start(driver)

        def main() -> None:
            try:
                self._result = run_pipeline(pipeline, spark, on_start=on_start, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - re-raised by result()
                self._error = exc
            finally:
                self._ready.set()

        self._thread = threading.Thread(target=main, name=f"cutline-{pipeline.name}",
                                        daemon=True)
        self._thread.start()

    def _running_driver(self, timeout: float) -> Driver[DataflowRun]:
        deadline = time.monotonic() + timeout
        self._ready.wait(timeout)
        driver = self._driver
        while driver is not None and not driver.run.attempt.started and not driver.done.is_set() \
                and time.monotonic() < deadline:
            time.sleep(0.02)
        if driver is None or driver.done.is_set() or self._error is not None:
            raise RuntimeError(f"job {self.pipeline.name!r} is not running"
                               + (f": {self._error}" if self._error else ""))
        return driver

    def savepoint(self, timeout: float = 600.0) -> str:
        """Take a savepoint of the running job; returns its path."""
        return self._running_driver(timeout).run.savepoint().result(timeout)

    def stop_with_savepoint(self, timeout: float = 600.0) -> str:
        """Take a savepoint, commit the sinks' transactions up to it, stop; returns its path.
        ``Pipeline.run(restore_from=path)`` continues exactly once."""
        path = self._running_driver(timeout).run.savepoint(stop=True).result(timeout)
        self.result(timeout)
        return path

    def cancel(self, why: str = "cancelled by the user") -> None:
        """Cancel (checkpoints kept or deleted as ``retain_on_cancel`` says)."""
        self._ready.wait()
        if self._driver is not None:
            self._driver.cancel_requested = why

    @property
    def driver(self) -> Driver[DataflowRun] | None:
        return self._driver

    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self, timeout: float | None = None) -> JobResult:
        """Wait for the job to end; its :class:`JobResult`, or its error raised."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"job {self.pipeline.name!r} still running after {timeout}s")
        if isinstance(self._error, USER_ERRORS):  # its message says it all (Pipeline.run)
            raise self._error.with_traceback(None) from None
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result
