"""Run a pipeline's tasks on an engine (a Spark barrier stage, or threads) to the end.

One run loop for both engines: start the :class:`~cutline.driver.dataflow.JobDriver`,
submit the tasks, wait (showing progress), and turn what happened into a
:class:`JobResult` or a :class:`JobFailed` with the cause first.
"""

from __future__ import annotations

import logging
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

from ..plan import PhysicalPlan
from ..protocol.job import CheckpointRecord
from ..runtime.task import JobSpec, Slot
from .dataflow import STAGE_ENDED, JobDriver, JobFailed

log = logging.getLogger("cutline.run")

__all__ = ["JobCancelled", "JobFailed", "JobResult", "run_job"]


class JobCancelled(JobFailed):
    """The job was stopped before it finished (timeout or interrupt)."""


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


def _slot_main(spec: JobSpec, k: int) -> dict:
    return Slot(spec, k).run()


def run_job(pipeline: Any, plan: PhysicalPlan, engine: Any, *, restore_from: str | None,
            timeout: float | None, on_start: Any, progress: Any,
            faults: tuple[tuple[str, int, int], ...],
            allow_non_restored_state: bool) -> JobResult:
    """``engine``: :class:`~cutline.spark.stage.SparkStage` or
    :class:`~cutline.driver.threads.ThreadsEngine`."""
    cfg = pipeline.checkpoint
    driver = JobDriver(plan, cfg, pipeline.name, restore_from, host=engine.driver_host)
    driver.check_restore(allow_non_restored_state)
    spec = JobSpec(plan=plan, job=pipeline.name, secret=driver.secret,
                   coordinator=driver.address, mode=cfg.protocol_mode.value,
                   aligned_timeout=cfg.aligned_timeout, storage_url=cfg.storage,
                   storage_options=cfg.storage_options, host=engine.task_host,
                   faults=tuple(faults))
    driver.start()
    t0 = time.monotonic()
    engine.submit(_slot_main, spec, f"cutline job {pipeline.name}",
                  lambda: driver.events.put((None, STAGE_ENDED)))
    if on_start is not None:
        on_start(driver)
    from ..report import Progress

    display = (Progress(progress if not isinstance(progress, bool) else None)
               if progress else None)
    try:
        with display or nullcontext():
            _wait(driver, engine, pipeline.name, t0, timeout, display)
        if driver.error:
            raise JobFailed(f"job {pipeline.name!r} failed: {engine.explain(driver.error)}")
        engine.join(60)
    except (KeyboardInterrupt, JobCancelled):
        _cancelled(pipeline, driver)
        raise
    finally:
        if not driver.done.is_set() or driver.error:
            engine.cancel()
        driver.stop()
    return JobResult(pipeline.name, driver.checkpoints, driver.attempts,
                     time.monotonic() - t0, driver.restored_from, plan.describe(),
                     task_pids=driver.task_pids, cpu_seconds=driver.cpu_seconds,
                     savepoint=driver.stopped_with_savepoint)


def _wait(driver: JobDriver, engine: Any, name: str, t0: float,
          timeout: float | None, display: Any) -> None:
    while not driver.done.wait(0.05):
        if display is not None:
            display.update(driver)
        failure = engine.failure()
        if failure:
            raise engine.failed(f"job {name!r} failed: {failure}")
        if timeout is not None and time.monotonic() - t0 > timeout:
            raise JobCancelled(f"job {name!r} cancelled: not finished within {timeout}s")
        if driver.cancel_requested:
            raise JobCancelled(f"job {name!r} cancelled: {driver.cancel_requested}")
    if display is not None:
        display.update(driver)


def _cancelled(pipeline: Any, driver: JobDriver) -> None:
    """Cancellation keeps the checkpoints unless ``retain_on_cancel=False``."""
    if not pipeline.checkpoint.retain_on_cancel:
        driver.stop()
        deleted = driver.storage.discard_all()
        log.info("job %s cancelled: deleted checkpoints %s", pipeline.name, deleted)
