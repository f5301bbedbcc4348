"""Quiet on the user's own SparkSession (``Pipeline.run(spark=session)``).

The embedded session writes its JVM's output to a log file and shows no progress bar.  A
session the user built is started by PySpark as a shell (``pyspark-shell``), so Spark draws
its console progress bar on stderr (``[Stage 0:>   (0 + 2) / 2]``) every 200 ms while a
stage runs, over cutline's live line; ``spark.ui.showConsoleProgress`` is read once, when
the context starts, and the bar checks no job property.  :func:`progress_bar_muted` points
the bar's output stream at nothing while cutline's stage runs and gives it back after.

:func:`wait_for_stage`: a job is done when every task finished and the final checkpoint
committed, while Spark still writes the barrier stage's shuffle output and runs its result
stage (seconds on a loaded machine, the first time).  If the program stops the session or
exits meanwhile, Spark logs errors with Java frames: ``Failed to update accumulator``
(each finishing Python task reports to the driver's accumulator server, which is gone),
``Block broadcast_0 does not exist``.  On the user's session the run waits for the stage.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

log = logging.getLogger("cutline.spark")

__all__ = ["FAILED_STAGE_END_TIMEOUT", "STAGE_END_TIMEOUT", "progress_bar_muted",
           "wait_for_stage"]

STAGE_END_TIMEOUT = 60.0
"""Seconds a run on the user's session waits, after the job ended, for Spark's stage to end."""
FAILED_STAGE_END_TIMEOUT = 10.0
"""The same after the job failed (its stage cancelled): the error is not held up long."""


# SparkContext (by id) -> [runs muting its bar now, the bar, its console field, the stream
# it wrote to]: runs that overlap on one session mute it once, the last one gives it back
_MUTED: dict[int, list[Any]] = {}
_MUTED_LOCK = threading.Lock()


@contextmanager
def progress_bar_muted(spark: Any) -> Iterator[bool]:
    """Spark's console progress bar, if the session (or SparkContext) ``spark`` draws one,
    writes nowhere inside the block (yields True then) and to its console again after it,
    once every run that muted it meanwhile (on other threads) has ended too."""
    try:
        sc = getattr(spark, "sparkContext", spark)
    except Exception:  # noqa: BLE001 - not a session we can read: nothing to mute
        sc = spark
    key = id(sc)
    with _MUTED_LOCK:
        held = _MUTED.get(key)
        if held is not None:
            held[0] += 1
        else:
            held = _mute(sc)
            if held is not None:
                _MUTED[key] = held
    try:
        yield held is not None
    finally:
        if held is not None:
            with _MUTED_LOCK:
                held[0] -= 1
                if held[0] == 0:
                    del _MUTED[key]
                    with suppress(Exception):
                        held[2].set(held[1], held[3])


def _mute(sc: Any) -> list[Any] | None:
    """``[1, bar, field, old stream]`` with the bar of ``sc`` writing nowhere, or None (it
    draws none, or it cannot be reached)."""
    try:
        shown = sc._jsc.sc().progressBar()  # Option[ConsoleProgressBar]
        if not shown.isDefined():
            return None
        jvm = sc._jvm
        bar = shown.get()
        field = bar.getClass().getDeclaredField("console")  # its PrintStream (stderr)
        field.setAccessible(True)
        old = field.get(bar)
        field.set(bar, jvm.java.io.PrintStream(jvm.java.io.OutputStream.nullOutputStream()))
        return [1, bar, field, old]
    except Exception as exc:  # noqa: BLE001 - another Spark: its bar shows, nothing worse
        log.debug("cutline: cannot mute Spark's console progress bar: %s", exc)
        return None


def wait_for_stage(stage: Any, job: str, timeout: float = STAGE_END_TIMEOUT, *,
                   failed: bool = False) -> bool:
    """Wait until Spark's stage of ``job`` has ended (True), at most ``timeout`` seconds;
    else say that stopping the session now may log Spark errors (False).  After a success
    the call running the stage returns once every task ended.  After a failure the stage
    was cancelled: the call returns at once and Spark's status tracker counts no running
    task of it, while its tasks still wind down until Spark kills them (seconds): then the
    wait is until the executors run no task (any job's: the session may run others)."""
    deadline = time.monotonic() + timeout
    stage.join(timeout)
    thread = getattr(stage, "_thread", None)
    running = thread is not None and thread.is_alive()
    while not running and failed and _tasks_running(stage) and time.monotonic() < deadline:
        time.sleep(0.1)
    if running or (failed and _tasks_running(stage)):
        log.warning("cutline: job %r %s, and Spark's stage of it still runs after %.0f s; "
                    "stopping the Spark session now may log Spark errors", job,
                    "failed" if failed else "ended", timeout)
        return False
    return True


def _tasks_running(stage: Any) -> int:
    """Tasks the session's executors run now (0 when it cannot tell): the status tracker's
    count, and on a local master the executor threads in this JVM that run a task.  The
    tracker reads Spark's status store, which its listener bus fills asynchronously: it may
    count no task while a cancelled one still runs its completion listeners (they release
    its broadcast blocks, which a session stopped meanwhile no longer has)."""
    sc = stage.sc
    try:
        infos = sc._jsc.sc().statusTracker().getExecutorInfos()
        tracked = sum(int(i.numRunningTasks()) for i in infos)
    except Exception as exc:  # noqa: BLE001 - a stopped context runs nothing
        log.debug("cutline: cannot count the executors' running tasks: %s", exc)
        return 0
    return max(tracked, local_task_threads(sc))


TASK_THREAD = "Executor task launch worker"
"""How Spark's executor names the threads of its task pool (``... for task 1.0 in stage 0.0
(TID 1)`` while and after it runs one)."""
TASK_RUNNER = "org.apache.spark.executor.Executor$TaskRunner"
"""The class whose frame is near the bottom of a pool thread's stack while it runs a task
(under the pool's ``runWorker``; an idle thread waits in ``getTask`` there instead)."""


def local_task_threads(sc: Any) -> int:
    """Threads of the local executor (``master`` ``local[...]``: it lives in the driver's
    JVM) running a task now, completion listeners included; 0 on another master or when the
    JVM cannot be asked."""
    try:
        if not str(sc.master).startswith("local"):
            return 0
        jvm = sc._jvm
        stacks = jvm.java.lang.Thread.getAllStackTraces()
        running = 0
        for thread in stacks.keySet():
            if not str(thread.getName()).startswith(TASK_THREAD):
                continue
            frames = stacks.get(thread)  # innermost first: the pool's frames are the last
            bottom = (str(frames[i].getClassName()) for i in range(len(frames) - 1,
                                                                   max(len(frames) - 8, -1), -1))
            running += TASK_RUNNER in bottom
        return running
    except Exception as exc:  # noqa: BLE001 - a stopped context runs nothing
        log.debug("cutline: cannot read the local executor's threads: %s", exc)
        return 0
