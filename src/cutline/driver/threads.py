"""Run a job's tasks on threads of this process instead of Spark: for tests and debugging.

The same driver, tasks, channels and storage as on Spark; no restarts (a failed task fails
the run, which a new run resumes from its checkpoints).  Same interface as
:class:`cutline.spark.stage.SparkStage`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .dataflow import JobFailed

log = logging.getLogger("cutline.threads")

__all__ = ["ThreadsEngine"]


class ThreadsEngine:
    name = "threads"
    driver_host = "127.0.0.1"
    task_host = "127.0.0.1"
    local = True
    restarts = False  # a failed slot fails the run: no stage to resubmit
    tls = False  # one process: TLS only when the pipeline asks for it

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.errors: list[BaseException] = []
        self._threads: list[threading.Thread] = []

    @property
    def error(self) -> BaseException | None:
        return self.errors[0] if self.errors else None

    def submit(self, task_main: Callable[[Any, int], Any], spec: Any, description: str,
               on_end: Callable[[], None]) -> None:
        def main(k: int) -> None:
            try:
                task_main(spec, k)
            except BaseException as exc:  # noqa: BLE001 - reported by the run loop
                log.debug("task slot %d failed", k, exc_info=True)
                self.errors.append(exc)

        self._threads = [threading.Thread(target=main, args=(k,), name=f"cutline-slot-{k}",
                                          daemon=True) for k in range(self.slots)]
        for t in self._threads:
            t.start()

    def resubmit(self) -> None:
        raise RuntimeError("the threads engine does not restart its tasks")

    log_path = None  # no log file of its own: a failure's traceback goes to a new one

    def failure(self) -> str | None:
        e = self.error
        return None if e is None else f"{type(e).__name__}: {e}"

    def details(self) -> str:
        """The long story of a failure, for the log file."""
        import traceback

        return "".join(traceback.format_exception(self.error)) if self.error else ""

    def failed(self, message: str) -> JobFailed:
        from .dataflow import JobFailed

        return JobFailed(message)  # the slot's traceback is in the log file

    def join(self, timeout: float) -> None:
        for t in self._threads:
            t.join(timeout)

    def cancel(self) -> None:
        pass  # the driver's stop closes the tasks' connections: they end on their own
