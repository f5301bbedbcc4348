"""Fault injection for demos and tests: ``kill -9`` of a Spark Python worker mid-run, of
the PySpark daemon that forks them, or (on a cluster) of the executor JVM above them."""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..driver.shell import Driver


@dataclass
class Kill:
    """What a killer did: the pids it killed and when (after which checkpoint)."""

    after_checkpoint: int
    delay: float
    slot: int | None = None
    killed: list[tuple[int, int, float]] = field(default_factory=list)  # (slot, pid, time)

    def __call__(self, driver: Driver[Any]) -> None:
        threading.Thread(target=self._run, args=(driver,), daemon=True).start()

    def _run(self, driver: Driver[Any]) -> None:
        while not driver.done.is_set():
            if len(driver.run.checkpoints) >= self.after_checkpoint and driver.run.task_pids:
                break
            time.sleep(0.02)
        else:
            return
        time.sleep(self.delay)
        pids: dict[int, int] = driver.run.task_pids
        if driver.done.is_set() or not pids:
            return
        slot = self.slot if self.slot in pids else max(pids)
        pid = pids[slot]
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        self.killed.append((slot, pid, time.time()))


def parent(pid: int) -> int | None:
    """The parent of process ``pid`` (Linux ``/proc``), or None (gone)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def cmdline(pid: int) -> str:
    """Process ``pid``'s command line, its arguments joined by spaces ("" if gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def pyspark_daemon(worker_pid: int) -> int | None:
    """The PySpark daemon that forked the Python worker ``worker_pid`` (its parent running
    ``pyspark.daemon``, or :mod:`cutline.spark.daemon` on an embedded session), or None
    (no daemon: gone, or workers not forked by one)."""
    daemon = parent(worker_pid)
    line = cmdline(daemon) if daemon else ""
    return daemon if daemon and ("pyspark.daemon" in line or "cutline.spark.daemon" in line) \
        else None


def executor_of(worker_pid: int) -> int | None:
    """The executor JVM (``CoarseGrainedExecutorBackend``) above a Python worker on a
    cluster, or None (embedded Spark: the driver's JVM runs the tasks)."""
    pid: int | None = worker_pid
    for _ in range(4):
        pid = parent(pid) if pid else None
        if pid and "CoarseGrainedExecutorBackend" in cmdline(pid):
            return pid
    return None


@dataclass
class KillDaemon:
    """``delay`` seconds into the first attempt, ``kill -9`` of the PySpark daemon (the
    parent of Spark's Python workers: the OOM killer picks it as readily as a worker);
    ``then`` seconds later, optionally freeze slot ``freeze`` (SIGSTOP: a task Spark cannot
    end) and ``kill -9`` the worker of slot ``kill``.  ``fired``: what it did, in order, as
    ``(what, pid)``; ``frozen``: pids to SIGKILL when the test is over."""

    delay: float
    kill: int | None = None
    freeze: int | None = None
    then: float = 0.5
    fired: list[tuple[str, int]] = field(default_factory=list)

    def __call__(self, driver: Driver[Any]) -> None:
        threading.Thread(target=self._run, args=(driver,), daemon=True).start()

    @property
    def frozen(self) -> list[int]:
        return [pid for what, pid in self.fired if what == "froze"]

    def _run(self, driver: Driver[Any]) -> None:
        while not driver.run.attempt.started and not driver.done.is_set():
            time.sleep(0.02)
        time.sleep(self.delay)
        pids: dict[int, int] = driver.run.task_pids
        # the daemon of a slot that survives the kill: Spark must end that slot's task
        daemon = next((d for slot, pid in sorted(pids.items()) if slot != self.kill
                       for d in [pyspark_daemon(pid)] if d), None)
        if driver.done.is_set() or daemon is None:
            return
        os.kill(daemon, signal.SIGKILL)
        self.fired.append(("daemon", daemon))
        time.sleep(self.then)
        for what, slot, sig in (("froze", self.freeze, signal.SIGSTOP),
                                ("killed", self.kill, signal.SIGKILL)):
            if slot is not None and slot in pids and not driver.done.is_set():
                try:
                    os.kill(pids[slot], sig)
                except ProcessLookupError:
                    continue
                self.fired.append((what, pids[slot]))
