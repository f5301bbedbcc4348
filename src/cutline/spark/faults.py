"""Fault injection for demos and tests: ``kill -9`` of a Spark Python worker mid-run."""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass, field

from ..driver.dataflow import JobDriver


@dataclass
class Kill:
    """What a killer did: the pids it killed and when (after which checkpoint)."""

    after_checkpoint: int
    delay: float
    slot: int | None = None
    killed: list[tuple[int, int, float]] = field(default_factory=list)  # (slot, pid, time)

    def __call__(self, driver: JobDriver) -> None:
        threading.Thread(target=self._run, args=(driver,), daemon=True).start()

    def _run(self, driver: JobDriver) -> None:
        while not driver.done.is_set():
            if len(driver.checkpoints) >= self.after_checkpoint and driver.task_pids:
                break
            time.sleep(0.02)
        else:
            return
        time.sleep(self.delay)
        pids = driver.task_pids
        if driver.done.is_set() or not pids:
            return
        slot = self.slot if self.slot in pids else max(pids)
        pid = pids[slot]
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        self.killed.append((slot, pid, time.time()))
