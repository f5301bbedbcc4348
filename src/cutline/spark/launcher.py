"""Run a pipeline as one Spark barrier stage, with the coordinator in the driver.

The stage is ``parallelize(slots).barrier().mapPartitions(run_slot).map(..).partitionBy(1)``:
ending the barrier stage in a shuffle makes it a ShuffleMapStage, which Spark resubmits as
a whole when any task fails (a barrier *ResultStage* is never retried).  Each Spark task
hosts one slot: subtask ``k`` of every chain.  The rows the stage returns are not trusted
as proof of anything: the driver knows which checkpoint committed and which tasks
finished, and decides from that.
"""

from __future__ import annotations

import logging
import os
import sys
import sysconfig
import types
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ..plan import plan as make_plan
from ..runtime.task import JobSpec, Slot
from .driver import CheckpointRecord, JobDriver, JobFailed

log = logging.getLogger("cutline.spark")

__all__ = ["run_pipeline", "run_threads", "JobResult", "JobCancelled", "embedded_session"]

_SESSION = None


def embedded_session(slots: int, max_failures: int = 8, stage_attempts: int = 8) -> Any:
    """The library's own ``local[N,F]`` session (N slots, F task attempts); a job's barrier
    stage may be resubmitted ``stage_attempts`` times in a row (one per failure)."""
    global _SESSION
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    if _SESSION is None:
        # Python workers run this interpreter (the venv cutline is installed in).
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        # An embedded session is a single machine: keep every socket on loopback.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        _SESSION = (SparkSession.builder
                    .master(f"local[{max(slots, 2)},{max_failures}]")
                    .appName("cutline")
                    .config("spark.ui.enabled", "false")
                    .config("spark.ui.showConsoleProgress", "false")
                    .config("spark.sql.shuffle.partitions", "1")
                    .config("spark.stage.maxConsecutiveAttempts", str(stage_attempts))
                    .config("spark.driver.host", "127.0.0.1")
                    .config("spark.driver.bindAddress", "127.0.0.1")
                    .getOrCreate())
        _SESSION.sparkContext.setLogLevel("ERROR")
    return _SESSION


@dataclass
class JobResult:
    job: str
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

    @property
    def latest_checkpoint(self) -> CheckpointRecord | None:
        return self.checkpoints[-1] if self.checkpoints else None


def _ship_user_code(pipeline: Any) -> None:
    """Pickle the user's own modules by value, so Spark workers need not import them.

    Functions from installed packages (and cutline) stay by reference; a user's
    ``mymodule.parse`` used in ``map()`` travels with the job, as ``__main__`` code does.
    """
    from pyspark import cloudpickle

    installed = {sysconfig.get_paths()[k] for k in ("purelib", "platlib", "stdlib")}
    seen: set[str] = set()

    def visit(obj: Any, depth: int = 0) -> None:
        if obj is None or depth > 2:
            return
        mod_name = getattr(obj, "__module__", None)
        if isinstance(mod_name, str) and mod_name not in seen:
            seen.add(mod_name)
            mod = sys.modules.get(mod_name)
            path = getattr(mod, "__file__", None) or ""
            top = mod_name.split(".")[0]
            if (mod is not None and path and top not in ("cutline", "__main__")
                    and not any(path.startswith(d) for d in installed)):
                cloudpickle.register_pickle_by_value(mod)
        if not isinstance(obj, (types.FunctionType, type)) and hasattr(obj, "__dict__"):
            for value in vars(obj).values():
                if callable(value):
                    visit(value, depth + 1)

    for node in pipeline.nodes:
        visit(node.fn)
        visit(node.key_fn)


def _slot_main(spec: JobSpec):
    def run(_: Any):
        from pyspark import BarrierTaskContext

        ctx = BarrierTaskContext.get()
        slot = Slot(spec, ctx.partitionId())
        yield slot.run()

    return run


def run_threads(pipeline: Any, *, restore_from: str | None = None,
                timeout: float | None = None,
                allow_non_restored_state: bool = False, on_start: Any = None) -> JobResult:
    """Run every slot on a thread of this process (no Spark): for tests and debugging.

    The same driver, tasks, channels and storage as on Spark; no fault tolerance beyond
    restarting from checkpoints in a new run.
    """
    plan = make_plan(pipeline)
    driver = JobDriver(plan, pipeline.checkpoint, pipeline.name, restore_from)
    driver.check_restore(allow_non_restored_state)
    spec = JobSpec(plan=plan, job=pipeline.name, secret=driver.secret,
                   coordinator=driver.address, mode=pipeline.checkpoint.protocol_mode.value,
                   aligned_timeout=pipeline.checkpoint.aligned_timeout,
                   storage_url=pipeline.checkpoint.storage,
                   storage_options=pipeline.checkpoint.storage_options)
    driver.start()
    errors: list[BaseException] = []

    def slot_main(k: int) -> None:
        try:
            Slot(spec, k).run()
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    t0 = time.monotonic()
    threads = [threading.Thread(target=slot_main, args=(k,), daemon=True)
               for k in range(plan.slots)]
    for t in threads:
        t.start()
    if on_start is not None:
        on_start(driver)
    try:
        while not driver.done.wait(0.05):
            if errors:
                raise JobFailed(f"job {pipeline.name!r} failed: {errors[0]}") from errors[0]
            if timeout is not None and time.monotonic() - t0 > timeout:
                raise JobCancelled(f"job {pipeline.name!r} cancelled: not finished within "
                                   f"{timeout}s")
            if driver.cancel_requested:
                raise JobCancelled(f"job {pipeline.name!r} cancelled: "
                                   f"{driver.cancel_requested}")
        if driver.error:
            raise JobFailed(f"job {pipeline.name!r} failed: {driver.error}")
        for t in threads:
            t.join(timeout=30)
    except (KeyboardInterrupt, JobCancelled):
        _cancelled(pipeline, driver)
        raise
    finally:
        driver.stop()
    return JobResult(pipeline.name, driver.checkpoints, driver.attempts,
                     time.monotonic() - t0, driver.restored_from, plan.describe(),
                     savepoint=driver.stopped_with_savepoint)


def run_pipeline(pipeline: Any, spark: Any = None, *, restore_from: str | None = None,
                 timeout: float | None = None, on_start: Any = None,
                 engine: str = "spark", progress: Any = False,
                 faults: tuple[tuple[str, int, int], ...] = (),
                 allow_non_restored_state: bool = False) -> JobResult:
    """Run ``pipeline`` to the end (bounded sources) and return what happened.

    ``restore_from`` starts from a checkpoint or savepoint path; otherwise the job resumes
    from the latest completed checkpoint under its storage, if any.  ``on_start(driver)``
    is called once the driver is up (tests use it to inject faults).

    State is matched to operators by uid; a pipeline whose parallelism changed is rescaled
    (keyed state by key groups, source positions and sink transactions redistributed).  A
    checkpoint holding state of an operator the pipeline no longer has fails the run before
    it starts, unless ``allow_non_restored_state=True`` drops that state.
    """
    if engine == "threads":
        return run_threads(pipeline, restore_from=restore_from, timeout=timeout,
                           allow_non_restored_state=allow_non_restored_state,
                           on_start=on_start)
    if engine != "spark":
        raise ValueError(f"engine must be 'spark' or 'threads', got {engine!r}")
    plan = make_plan(pipeline)
    if spark is None:
        spark = embedded_session(plan.slots)
    sc = spark.sparkContext
    slots_available = sc.defaultParallelism
    if slots_available < plan.slots:
        raise ValueError(f"pipeline {pipeline.name!r} needs {plan.slots} task slots for its "
                         f"barrier stage, the Spark session offers {slots_available}")
    _ship_user_code(pipeline)
    local = sc.master.startswith("local")
    host = "127.0.0.1" if local else spark.conf.get("spark.driver.host")
    driver = JobDriver(plan, pipeline.checkpoint, pipeline.name, restore_from, host=host)
    driver.check_restore(allow_non_restored_state)
    spec = JobSpec(plan=plan, job=pipeline.name, secret=driver.secret,
                   coordinator=driver.address, mode=pipeline.checkpoint.protocol_mode.value,
                   aligned_timeout=pipeline.checkpoint.aligned_timeout,
                   storage_url=pipeline.checkpoint.storage,
                   storage_options=pipeline.checkpoint.storage_options,
                   host="127.0.0.1" if local else "", faults=tuple(faults))
    driver.start()
    stage_error: list[BaseException] = []

    def stage() -> None:
        try:
            (sc.parallelize(range(plan.slots), plan.slots).barrier()
             .mapPartitions(_slot_main(spec)).map(lambda r: (0, r)).partitionBy(1).collect())
        except BaseException as exc:  # noqa: BLE001 - reported below
            stage_error.append(exc)
        finally:
            driver.events.put((None, {"op": "_stage_ended"}))

    t0 = time.monotonic()
    sc.setJobGroup(f"cutline-{pipeline.name}-{os.getpid()}", f"cutline job {pipeline.name}")
    runner = threading.Thread(target=stage, name="cutline-stage", daemon=True)
    runner.start()
    if on_start is not None:
        on_start(driver)
    from contextlib import nullcontext

    from ..report import Progress

    display = (Progress(progress if not isinstance(progress, bool) else None)
               if progress else None)
    try:
        with display or nullcontext():
            _wait(driver, stage_error, pipeline.name, t0, timeout, display)
        if driver.error:
            if stage_error:  # Spark's own reason says more than "the stage ended"
                raise JobFailed(f"job {pipeline.name!r} failed: Spark gave up on the stage: "
                                f"{_first_line(stage_error[0])}")
            raise JobFailed(f"job {pipeline.name!r} failed: {driver.error}")
        runner.join(timeout=60)
    except (KeyboardInterrupt, JobCancelled):
        _cancelled(pipeline, driver)
        raise
    finally:
        if not driver.done.is_set() or driver.error:
            sc.cancelJobGroup(f"cutline-{pipeline.name}-{os.getpid()}")
        driver.stop()
    return JobResult(pipeline.name, driver.checkpoints, driver.attempts,
                     time.monotonic() - t0, driver.restored_from, plan.describe(),
                     task_pids=driver.task_pids, cpu_seconds=driver.cpu_seconds,
                     savepoint=driver.stopped_with_savepoint)


def _wait(driver: JobDriver, stage_error: list, name: str, t0: float,
          timeout: float | None, display: Any) -> None:
    while not driver.done.wait(0.1):
        if display is not None:
            display.update(driver)
        if stage_error:
            raise JobFailed(f"job {name!r} failed: Spark gave up on the stage: "
                            f"{_first_line(stage_error[0])}")
        if timeout is not None and time.monotonic() - t0 > timeout:
            raise JobCancelled(f"job {name!r} cancelled: not finished within {timeout}s")
        if driver.cancel_requested:
            raise JobCancelled(f"job {name!r} cancelled: {driver.cancel_requested}")
    if display is not None:
        display.update(driver)


class JobCancelled(JobFailed):
    """The job was stopped before it finished (timeout or interrupt)."""


def _cancelled(pipeline: Any, driver: JobDriver) -> None:
    """Cancellation keeps the checkpoints unless ``retain_on_cancel=False``."""
    if not pipeline.checkpoint.retain_on_cancel:
        driver.stop()
        deleted = driver.storage.discard_all()
        log.info("job %s cancelled: deleted checkpoints %s", pipeline.name, deleted)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


class RunningJob:
    """A job started with :meth:`Pipeline.start`: it runs on a thread of this process while
    the caller takes savepoints, stops it with one, or cancels it."""

    def __init__(self, pipeline: Any, spark: Any = None, **kwargs: Any) -> None:
        self.pipeline = pipeline
        self._driver: JobDriver | None = None
        self._ready = threading.Event()
        self._result: JobResult | None = None
        self._error: BaseException | None = None
        user_on_start = kwargs.pop("on_start", None)

        def on_start(driver: JobDriver) -> None:
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

    def _running_driver(self, timeout: float) -> JobDriver:
        deadline = time.monotonic() + timeout
        self._ready.wait(timeout)
        driver = self._driver
        while driver is not None and not driver.attempt.started and not driver.done.is_set() \
                and time.monotonic() < deadline:
            time.sleep(0.02)
        if driver is None or driver.done.is_set() or self._error is not None:
            raise RuntimeError(f"job {self.pipeline.name!r} is not running"
                               + (f": {self._error}" if self._error else ""))
        return driver

    def savepoint(self, timeout: float = 600.0) -> str:
        """Take a savepoint of the running job; returns its path."""
        return self._running_driver(timeout).savepoint().result(timeout)

    def stop_with_savepoint(self, timeout: float = 600.0) -> str:
        """Take a savepoint, commit the sinks' transactions up to it, stop; returns its path.
        ``Pipeline.run(restore_from=path)`` continues exactly once."""
        path = self._running_driver(timeout).savepoint(stop=True).result(timeout)
        self.result(timeout)
        return path

    def cancel(self, why: str = "cancelled by the user") -> None:
        """Cancel (checkpoints kept or deleted as ``retain_on_cancel`` says)."""
        self._ready.wait()
        if self._driver is not None:
            self._driver.cancel_requested = why

    @property
    def driver(self) -> JobDriver | None:
        return self._driver

    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self, timeout: float | None = None) -> JobResult:
        """Wait for the job to end; its :class:`JobResult`, or its error raised."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"job {self.pipeline.name!r} still running after {timeout}s")
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result
