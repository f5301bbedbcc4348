"""A task's upload thread: the asynchronous part of its snapshots, in checkpoint order."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

log = logging.getLogger("cutline.task")

__all__ = ["SnapshotUploads"]


class SnapshotUploads:
    """Runs jobs one at a time, in the order submitted, on a daemon thread.

    One per subtask, so the subtask's acknowledgements leave in checkpoint order (the
    coordinator completes checkpoint ``n`` before ``n + 1``).  A job reports its own
    failure (it declines its checkpoint); an exception that escapes it is logged.
    """

    def __init__(self, name: str) -> None:
        self._jobs: queue.Queue = queue.Queue()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name=f"{name}-uploads", daemon=True)
        self._thread.start()

    def submit(self, job: Callable[[], None]) -> None:
        self._jobs.put(job)

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None or self._stopped:
                return
            try:
                job()
            except Exception:  # noqa: BLE001 - the job declines its own checkpoint
                log.exception("snapshot upload failed")

    def close(self, timeout: float = 5.0) -> None:
        """Drop jobs not started, wait up to ``timeout`` for the running one."""
        self._stopped = True
        self._jobs.put(None)
        self._thread.join(timeout)
