"""Silent peers on embedded Spark: a data channel stalled by the fault-injecting proxy in the
first attempt, then a Spark Python worker frozen with SIGSTOP in the second.  Heartbeats
find each within ``heartbeat_timeout``, the attempt fails, Spark restarts the stage, and the
output is exactly a failure-free run's (one job, three attempts)."""

from __future__ import annotations

import collections
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from cutline.driver import dataflow

from netfaults import Routes, stall
from pipelines import expected_rows, wordcount

HB = 3.0
CHANNEL = "sentences.0->count.1"


class Freeze:
    """``delay`` seconds into attempt ``attempt``, SIGSTOP the worker of slot ``slot``."""

    def __init__(self, attempt: int, slot: int, delay: float) -> None:
        self.attempt, self.slot, self.delay = attempt, slot, delay
        self.frozen: list[tuple[int, float]] = []  # (pid, when)

    def __call__(self, driver) -> None:
        threading.Thread(target=self._run, args=(driver,), daemon=True).start()

    def _run(self, driver) -> None:
        while not driver.done.is_set():
            a = driver.run.attempt
            if a.number == self.attempt and a.started:
                break
            time.sleep(0.02)
        else:
            return
        time.sleep(self.delay)
        pid = driver.run.task_pids.get(self.slot)
        if pid is not None and not driver.done.is_set():
            os.kill(pid, signal.SIGSTOP)
            self.frozen.append((pid, time.monotonic()))

    def thaw(self) -> None:
        """SIGKILL a frozen worker Spark has not killed (its slot would stay taken)."""
        for pid, _ in self.frozen:
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if state == "T":
                os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
def test_a_stalled_channel_then_a_frozen_worker_are_found_and_recovered(spark, tmp_path,
                                                                         monkeypatch):
    records = 10_500  # 3,000/s: each attempt is still reading when its fault strikes
    p, sink = wordcount(tmp_path, records, rate=3000, parallelism=3, interval=0.3)
    routes = Routes({CHANNEL: stall(1.0, 600)})
    monkeypatch.setattr(dataflow, "ROUTE", routes)
    freeze, drivers = Freeze(attempt=1, slot=2, delay=1.0), []
    try:
        result = p.run(spark=spark, heartbeat_timeout=HB, timeout=240, restart_timeout=60,
                       on_start=lambda d: (drivers.append(d), freeze(d)))
    finally:
        routes.close()
        freeze.thaw()
    assert sorted(routes.fired[CHANNEL]) == [(0, "stall down"), (0, "stall up")]
    assert len(freeze.frozen) == 1
    log = drivers[0].controller.attempt_log
    assert result.attempts == 3, log
    # each attempt ended because a peer went silent: the heartbeats found both faults
    assert "went silent" in log[1].after_failure and CHANNEL in log[1].after_failure, log
    assert "went silent" in log[2].after_failure, log
    # found within the heartbeat timeout (plus a tick and Spark's restart)
    assert log[2].at - freeze.frozen[0][1] < HB + 30
    assert collections.Counter(sink.results()) == expected_rows(records)
