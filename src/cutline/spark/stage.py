"""The one place a job's tasks become a Spark barrier stage, for pipelines and process graphs.

The stage is ``parallelize(slots).barrier().mapPartitions(main).map(..).partitionBy(1)``:
ending the barrier stage in a shuffle makes it a ShuffleMapStage, which Spark resubmits as
a whole when any task fails (a barrier *ResultStage* is never retried).  Each Spark task
runs ``task_main(spec, k)`` for its partition ``k``, once every task found cutline and what
it needs in its executor's Python (:mod:`cutline.spark.probe`: else the job fails at once,
saying what is missing where).  The rows the stage returns are not
trusted as proof of anything: the driver knows what committed and which tasks finished.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import threading
import types
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..driver.dataflow import JobFailed

from .probe import TASK_NEEDS, guarded, unfit_row

__all__ = ["SparkStage", "ship_user_code"]


def ship_user_code(objects: Iterable[Any]) -> None:
    """Pickle the user's own modules by value, so Spark workers need not import them.

    Functions and classes from installed packages (and cutline) stay by reference; a user's
    ``mymodule.parse`` used in ``map()``, or the module of a process class, travels with the
    job, as ``__main__`` code does.  Follows a class's bases and an object's callables.
    """
    from pyspark import cloudpickle

    installed = {sysconfig.get_paths()[k] for k in ("purelib", "platlib", "stdlib")}
    seen: set[str] = set()

    def by_value(mod_name: str) -> None:
        if mod_name in seen:
            return
        seen.add(mod_name)
        mod = sys.modules.get(mod_name)
        path = getattr(mod, "__file__", None) or ""
        if (mod is not None and path and mod_name.split(".")[0] not in ("cutline", "__main__")
                and not any(path.startswith(d) for d in installed)):
            cloudpickle.register_pickle_by_value(mod)

    def visit(obj: Any, depth: int = 0) -> None:
        if obj is None or depth > 2:
            return
        mod_name = getattr(obj, "__module__", None)
        if isinstance(mod_name, str):
            by_value(mod_name)
        if not isinstance(obj, (types.FunctionType, type)):
            for cls in type(obj).__mro__:
                by_value(cls.__module__)
            if hasattr(obj, "__dict__"):
                for value in vars(obj).values():
                    if callable(value):
                        visit(value, depth + 1)

    for obj in objects:
        visit(obj)


def spark_reason(text: str) -> str:
    """One line of a Py4J / Spark error: the stage failure's reason and, when a Python
    worker raised, the last line of its traceback."""
    lines = [ln.strip() for ln in text.strip().splitlines()]
    reason = next((ln.split("Job aborted due to stage failure: ", 1)[1] for ln in lines
                   if "Job aborted due to stage failure: " in ln), None)
    python = None
    if any("PythonException" in ln for ln in lines):
        # the worker's traceback ends at its exception line, before the Java frames
        for ln in lines:
            if ln.startswith("at ") or ln.startswith("Driver stacktrace"):
                break
            if ln and not ln.startswith(("File ", "Traceback", "^", "~")) and ": " in ln \
                    and ln.split(":", 1)[0].replace(".", "").replace("_", "").isalnum():
                python = ln
    if reason is not None:
        reason = reason.split(", most recent failure:", 1)[0].split(":", 1)[0] \
            if python else reason
    parts = [p for p in (reason, python) if p]
    if not parts:
        first = next((ln for ln in lines if ln), "")
        parts = [first or "unknown error"]
    return "; ".join(parts)


class SparkStage:
    """Runs ``task_main(spec, k)`` for k in ``range(slots)`` as one barrier stage of
    ``spark``'s context, on a thread of the driver; ``on_end()`` is called when Spark's call
    returns, however it ends (its exception, if any, is :attr:`error`)."""

    def __init__(self, spark: Any, slots: int, what: str, group: str,
                 log_path: Path | None = None, needs: tuple[str, ...] = ()) -> None:
        self.log_path = log_path  # where the session's JVM and workers log, if we know
        # modules a task imports beyond cutline's own needs (an optional dependency the job
        # uses): each task looks for all of them before it starts (probe.py)
        self.needs = needs
        self.sc = spark.sparkContext
        if self.sc.defaultParallelism < slots:
            raise ValueError(f"{what} needs {slots} task slots for its barrier stage, the "
                             f"Spark session offers {self.sc.defaultParallelism}")
        self.slots = slots
        self.local = self.sc.master.startswith("local")
        self.name = f"spark {self.sc.master}"
        # where the driver listens: loopback for an embedded session, else the address the
        # executors reach the Spark driver on
        self.driver_host = "127.0.0.1" if self.local else spark.conf.get("spark.driver.host")
        # where tasks listen: loopback, or "" (each finds its address towards the driver)
        self.task_host = "127.0.0.1" if self.local else ""
        # Spark encrypts its own traffic: the job's channels, control and admin ports too
        conf = self.sc.getConf()
        self.tls = any(conf.get(k, "false").strip().lower() == "true"
                       for k in ("spark.network.crypto.enabled", "spark.ssl.enabled"))
        self._group = f"{group}-{os.getpid()}"
        self.group = self._group  # Spark job group: cancel() ends its tasks
        self.error: BaseException | None = None
        self.unfit: str | None = None  # what the executors' Python lacks (probe.py)
        self._thread: threading.Thread | None = None
        self._submission = 0
        self._submit_args: tuple | None = None

    restarts = True  # resubmit() can run the stage again (the recovery watchdog's remedy)

    def submit(self, task_main: Callable[[Any, int], Any], spec: Any, description: str,
               on_end: Callable[[], None]) -> None:
        self._submit_args = (task_main, spec, description, on_end)
        n = self._submission
        # each submission its own job group: cancelling a stuck one leaves the next alone
        group = self.group = self._group if n == 0 else f"{self._group}-{n}"

        def stage() -> None:
            try:
                self.sc.setJobGroup(group, description)
                rows = (self.sc.parallelize(range(self.slots), self.slots).barrier()
                        .mapPartitions(guarded(task_main, spec, (*TASK_NEEDS, *self.needs)))
                        .map(lambda r: (0, r)).partitionBy(1).collect())
                if n == self._submission:  # executors that cannot run cutline said so
                    self.unfit = unfit_row(r for _, r in rows)
            except BaseException as exc:  # noqa: BLE001 - the driver decides what happened
                if n == self._submission:
                    self.error = exc
            finally:
                if n == self._submission:  # a stage cancelled to resubmit it is no news
                    on_end()

        self._thread = threading.Thread(target=stage, name="cutline-stage", daemon=True)
        self._thread.start()

    def resubmit(self) -> None:
        """Cancel the stage (its job group) and submit it again, as :meth:`submit` did."""
        assert self._submit_args is not None, "resubmit() before submit()"
        old = self.group
        self._submission += 1
        self.sc.cancelJobGroup(old)
        self.submit(*self._submit_args)

    def failure(self) -> str | None:
        """Spark's reason for giving up on the stage, in one line (no Java frames), or
        why the executors cannot run the job's tasks at all."""
        if self.unfit is not None:
            return self.unfit
        if self.error is None:
            return None
        return f"Spark gave up on the stage: {spark_reason(str(self.error))}"

    def details(self) -> str:
        """Spark's whole error (Java frames and all), for the log file."""
        return "" if self.error is None else str(self.error)

    def failed(self, message: str) -> JobFailed:
        from ..driver.dataflow import JobFailed

        return JobFailed(message)  # not chained: Py4J's exception carries Java frames

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def cancel(self) -> None:
        self.sc.cancelJobGroup(self.group)
