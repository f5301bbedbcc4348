"""What runs a run's tasks: the one interface of :class:`cutline.spark.stage.SparkStage`
(a barrier stage of a Spark session) and :class:`cutline.driver.threads.ThreadsEngine`
(threads of this process), for dataflow jobs and process graphs alike."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .dataflow import JobFailed

__all__ = ["Engine"]


class Engine(Protocol):
    name: str
    driver_host: str  # where the driver listens
    task_host: str  # where tasks listen ("": each finds its address towards the driver)
    restarts: bool  # resubmit() can run the stage again (the recovery watchdog's remedy)
    tls: bool  # the engine's own traffic is encrypted: the run's should be too
    log_path: Any  # where the engine logs (None: a failure's story goes to a new file)

    def submit(self, task_main: Callable[[Any, int], Any], spec: Any, description: str,
               on_end: Callable[[], None]) -> None:
        """Run ``task_main(spec, k)`` for every slot ``k``; ``on_end()`` when that ends."""
        ...

    def resubmit(self) -> None:
        """End whatever runs of the stage and submit it again (only if :attr:`restarts`)."""
        ...

    def failure(self) -> str | None:
        """Why the engine gave up, in one line, or None."""
        ...

    def details(self) -> str:
        """The long story of a failure, for the log file."""
        ...

    def failed(self, message: str) -> JobFailed:
        """The exception that tells the caller the run failed with ``message``."""
        ...

    def join(self, timeout: float) -> None: ...

    def cancel(self) -> None: ...
