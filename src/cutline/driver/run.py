"""Run a pipeline's tasks on an engine (a Spark barrier stage, or threads) to the end.

One run loop for both engines and both kinds of run (:func:`drive`: a dataflow job here,
a process graph in :func:`cutline.spark.graph.run_graph`): start the driver, submit the
tasks, wait (showing progress), and turn what happened into a result or a
:class:`JobFailed` with the cause first, chosen by the run's
:class:`~cutline.protocol.controller.DoneCause`.
"""

from __future__ import annotations

import logging
import sys
import time
from contextlib import nullcontext, suppress
from dataclasses import dataclass, field
from typing import Any

from ..plan import PhysicalPlan
from ..protocol.controller import DoneCause
from ..protocol.job import CheckpointRecord
from ..protocol.liveness import HEARTBEAT_TIMEOUT
from ..runtime.failures import SetupError, report_setup_failure
from ..runtime.task import JobSpec, Slot
from ..warm import import_meanwhile
from .dataflow import DataflowRun, JobFailed, job_driver
from .engine import Engine
from .logs import RunLog, append, log_dir, new_log_file
from .shell import Driver

log = logging.getLogger("cutline.run")

__all__ = ["JobCancelled", "JobFailed", "JobResult", "drive", "run_job"]


class JobCancelled(JobFailed):
    """The job was stopped before it finished (timeout or interrupt)."""


@dataclass
class JobResult:
    job: str
    # the newest completed checkpoints (protocol.job.HISTORY of them, oldest first)
    checkpoints: list[CheckpointRecord]
    attempts: int
    duration: float
    restored_from: str | None
    plan: str
    task_pids: dict[int, int] = field(default_factory=dict)
    # the savepoint the job stopped with (RunningJob.stop_with_savepoint), else None
    savepoint: str | None = None
    # CPU seconds per slot (one Spark task's Python process, every thread) in the last attempt
    cpu_seconds: dict[int, float] = field(default_factory=dict)
    # completed checkpoints in the whole run (``checkpoints`` keeps the newest of them)
    checkpoints_completed: int = 0
    # late records dropped per window operator (uid), every subtask: counted exactly once
    # (in the checkpoints, so a restored count goes on); every window that drops them
    late_records: dict[str, int] = field(default_factory=dict)
    # the run's static report (the dashboard's page after the job), in its job directory
    report: str | None = None

    @property
    def latest_checkpoint(self) -> CheckpointRecord | None:
        return self.checkpoints[-1] if self.checkpoints else None


_STAGE_GRACE = 0.5  # seconds a finished job waits for Spark to close its stage


COLUMNAR_IMPORTS = ("pandas",)
"""What pyarrow imports in a task process at its first ``to_numpy``, ``group_by`` or
``pa.array`` (pandas, 0.3 s on a quiet core: numpy and pandas start threads when imported,
so cutline's daemon cannot import them before it forks): a slot of a pipeline with batch
streams imports it on a thread while it sets up and registers, not after."""


def _slot_main(spec: JobSpec, k: int) -> dict:
    if any(n.columnar for c in spec.plan.chains for n in c.nodes):
        import_meanwhile(COLUMNAR_IMPORTS, "while the slot starts")
    try:
        slot = Slot(spec, k)
    except SetupError as exc:  # it would fail the same way on a retry: the job fails
        report_setup_failure(spec.coordinator, spec.secret, k, exc)
        return {"slot": k, "failed": str(exc)}
    return slot.run()


def run_job(pipeline: Any, plan: PhysicalPlan, engine: Any, *, restore_from: str | None,
            timeout: float | None, on_start: Any, progress: Any,
            faults: tuple[tuple[str, int, int], ...],
            allow_non_restored_state: bool, dashboard: Any = None,
            restart_timeout: float | None = None,
            start_timeout: float | None = None,
            heartbeat_timeout: float = HEARTBEAT_TIMEOUT, lease: Any = None) -> JobResult:
    """``engine``: :class:`~cutline.spark.stage.SparkStage` or
    :class:`~cutline.driver.threads.ThreadsEngine`.  ``dashboard``: serve the live
    dashboard (:func:`~cutline.driver.dashboard.dashboard_port` says when).
    ``restart_timeout`` / ``start_timeout``: the watchdog's deadlines after a loss and at
    the start (:class:`~cutline.protocol.job.JobController`), on an engine that can
    resubmit its stage.  ``heartbeat_timeout``: a task, driver or channel peer silent this
    long is failed (:mod:`cutline.protocol.liveness`).  ``lease``: the job's
    :class:`~cutline.storage.lease.JobLease`, already held (the driver takes it over and
    releases it); None: the driver acquires it."""
    for node in pipeline.nodes:  # what a source can tell before anything runs
        check = getattr(node.fn, "check", None) if node.kind == "source" else None
        warning = check() if callable(check) else None
        if warning:
            log.warning("cutline: source %r: %s", node.uid, warning)
    cfg = pipeline.checkpoint
    tls = getattr(pipeline, "tls", None)
    driver = job_driver(plan, cfg, pipeline.name, restore_from, host=engine.driver_host,
                        restart_timeout=restart_timeout if engine.restarts else None,
                        start_timeout=start_timeout if engine.restarts else None,
                        tls=bool(engine.tls if tls is None else tls),
                        heartbeat_timeout=heartbeat_timeout, lease=lease)
    run = driver.run
    run.on_resubmit = engine.resubmit if engine.restarts else None
    try:  # this run's log file, in the job's folder (driver.logs)
        driver.run_log = RunLog(run.storage, run.lease.run, engine.log_path)
    except OSError as exc:
        log.warning("cutline: job %r: no run log (%s); failures go to %s", pipeline.name, exc,
                    log_dir())
    try:  # a failed check stops the driver here, _start_dashboard its own; the log closes here
        try:
            run.check_restore(allow_non_restored_state)
        except BaseException:
            driver.stop()  # the run does not start: leave no listener behind
            raise
        spec = JobSpec(plan=plan, job=pipeline.name, secret=driver.secret,
                       coordinator=run.route("control", driver.address),
                       mode=cfg.protocol_mode.value,
                       aligned_timeout=cfg.aligned_timeout, storage_url=cfg.storage,
                       storage_options=cfg.storage_options, host=engine.task_host,
                       faults=tuple(faults), heartbeat_timeout=heartbeat_timeout)
        board = _start_dashboard(driver, dashboard, engine)
    except BaseException:
        _close_run_log(driver)
        raise
    from .history import start_recording

    record = start_recording(driver, engine.name)  # history.jsonl; report.html at the end
    from ..report import Progress, progress_by_default

    if progress is None:
        progress = progress_by_default()
    display = (Progress(progress if not isinstance(progress, bool) else None)
               if progress else None)
    t0 = time.monotonic()
    try:
        with display or nullcontext():
            t0 = drive(driver, engine, _slot_main, spec, f"job {pipeline.name!r}",
                       timeout=timeout, on_start=on_start, display=display)
        # Every task finished and the final checkpoint committed: the job is done.  Spark's
        # bookkeeping of the stage (its shuffle and result stage, 0.3-2 s) may end after
        # the run returns; a next job's barrier stage simply waits for its slots.
        engine.join(_STAGE_GRACE)
        run.say_late_summary()
    except KeyboardInterrupt:
        _cancelled(pipeline, driver)
        raise _interrupted(pipeline, driver) from None
    except JobCancelled:
        _cancelled(pipeline, driver)
        raise
    finally:
        if not driver.done.is_set() or driver.error:
            engine.cancel()
        driver.stop()
        if board is not None:
            board.stop()
        if record is not None:
            record.finish(sys.exc_info()[1])
        _close_run_log(driver)
    return JobResult(pipeline.name, run.checkpoints, run.attempts,
                     time.monotonic() - t0, run.restored_from, plan.describe(),
                     task_pids=run.task_pids, cpu_seconds=run.cpu_seconds,
                     savepoint=run.stopped_with_savepoint,
                     checkpoints_completed=run.controller.checkpoints_completed,
                     late_records=run.late_records(),
                     report=record.report if record is not None else None)


def _start_dashboard(driver: Driver[DataflowRun], option: Any, engine: Any) -> Any:
    """The job's live dashboard, started and announced, or None (not wanted)."""
    from .dashboard import Dashboard, JobView, dashboard_port

    try:
        port = dashboard_port(option)
        if port is None:
            return None
        board = Dashboard(JobView(driver, engine.name), port)
    except BaseException as exc:
        driver.stop()  # the run does not start: leave no listener behind
        if isinstance(exc, OSError):
            raise OSError(exc.errno, f"cannot serve the dashboard of job {driver.run.job!r} on "
                                     f"127.0.0.1:{port}: {exc.strerror}") from None
        raise
    driver.run.dashboard_url = board.url
    board.announce()
    return board


def drive(driver: Driver[Any], engine: Engine, task_main: Any, spec: Any, what: str, *,
          timeout: float | None, on_start: Any = None, display: Any = None) -> float:
    """Start ``driver``, submit ``task_main(spec, k)`` on ``engine`` and wait for the end
    of the run ``what`` ("job 'name'", "graph 'name'"); returns when the tasks started
    (``time.monotonic()``).  Raises :class:`JobFailed` with the cause first (and the long
    story in a log file), or :class:`JobCancelled` after ``timeout`` seconds or when the
    driver's ``cancel_requested`` says why.  Leaves stopping the driver and the engine to
    the caller."""
    driver.start()
    t0 = time.monotonic()
    engine.submit(task_main, spec, f"cutline {what}", driver.stage_ended)
    if on_start is not None:
        on_start(driver)
    while not driver.done.wait(0.05):
        if display is not None:
            display.update(driver)
        if engine.failure():
            # the engine gave up; a task's own report of why may still be on its way
            if not driver.controller.failure_reported:
                driver.done.wait(1.0)
            raise _failed(what, driver, engine)
        if timeout is not None and time.monotonic() - t0 > timeout:
            raise JobCancelled(f"{what} cancelled: not finished within {timeout}s")
        cancel = driver.cancel_requested
        if cancel:
            raise JobCancelled(f"{what} cancelled: {cancel}")
    if display is not None:
        display.update(driver)
    if driver.error or (driver.cause is not None and driver.cause.failed):
        raise _failed(what, driver, engine)
    return t0


def _failed(what: str, driver: Driver[Any], engine: Engine) -> JobFailed:
    """The run failed: one message with cutline's cause, and the long story (the task's
    Python traceback, Spark's error with its Java frames) in a log file it names."""
    c = driver.controller
    engine_says = engine.failure()
    if driver.error and driver.cause is not DoneCause.STAGE_ENDED:
        # a task's fatal failure, a silent task, the coordinator's or the watchdog's
        # verdict: cutline's cause
        cause = driver.error
    elif c.last_failure is not None:
        # the engine's stage ended (or it gave up): the first task failure it followed
        cause = c.last_failure
        if engine_says and engine_says.split(": ", 1)[-1] not in cause:
            cause += f" ({engine_says})"
    else:
        cause = engine_says or driver.error or "unknown"
    message = f"{what} failed: {cause}"
    story = "\n\n".join(t for t in (c.trace, engine.details()) if t)
    run_log: RunLog | None = driver.run_log
    if run_log is not None:  # the run's own log: the story, then Spark's part of the run
        run_log.failure(f"cutline: {message}", story)
        path = run_log.path
    else:
        path = engine.log_path or new_log_file("job")
        append(path, f"cutline: {message}", story)
    log.error("cutline: %s", message)
    log.error("cutline: the task's traceback%s: %s",
              " and Spark's logs" if engine.log_path else "", path)
    exc = engine.failed(message)
    exc.log_path = str(path)  # where the long story is
    return exc


def _close_run_log(driver: Any) -> None:
    run_log = getattr(driver, "run_log", None)
    if run_log is not None:
        driver.run_log = None
        run_log.close()


def _interrupted(pipeline: Any, driver: Driver[DataflowRun]) -> KeyboardInterrupt:
    """Ctrl-C: the job is cancelled; say where it can resume from."""
    run = driver.run
    latest = run.checkpoints[-1].path if run.checkpoints else None
    if latest is None:
        with suppress(Exception):
            handle = run.storage.latest()
            latest = handle.path if handle is not None else None
    name = pipeline.name
    if latest is None or not pipeline.checkpoint.retain_on_cancel:
        text = f"job {name!r} interrupted before any checkpoint completed: a new run starts over"
    else:
        text = (f"job {name!r} interrupted; its latest checkpoint is {latest}. Run it again "
                f"to resume from there (or p.run(restore_from={latest!r}))")
    log.warning("cutline: %s", text)
    return KeyboardInterrupt(text)


def _cancelled(pipeline: Any, driver: Driver[DataflowRun]) -> None:
    """Cancellation keeps the checkpoints unless ``retain_on_cancel=False``."""
    if not pipeline.checkpoint.retain_on_cancel:
        driver.stop()
        deleted = driver.run.storage.discard_all()
        log.info("job %s cancelled: deleted checkpoints %s", pipeline.name, deleted)
