"""Executors whose Python cannot run cutline: found by the stage's own tasks, said at once.

On a cluster whose executors run a Python without cutline (or without msgpack, pyarrow,
...), each task of the barrier stage would die unpickling its function, Spark would retry
the stage again and again, and the user would read a Py4J trace.  Instead the stage runs
:func:`guarded`: a function that travels by value (this module is pickled with
cloudpickle, never imported on an executor) and carries the job's task as bytes.  Each task
first looks for the packages a task imports (found, not imported: microseconds), then
unpickles the job (which imports the packages the pipeline's functions come from); a task
that lacks one returns a row saying what and where instead of running.  When no executor
has them (the usual case: the cluster's Python is not the driver's), every task returns at
once, the stage ends in its first attempt, and the driver turns the row into
:func:`missing_message`.  When only some executors lack them, their tasks end and the
others wait for peers that never register: the driver's start watchdog ends that
(``start_timeout``).  (Sharing what each task found through ``allGather`` would tell them
too, but a barrier sync costs a second per attempt.)
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any

__all__ = ["TASK_NEEDS", "UNFIT", "guarded", "missing_message", "unfit_row"]

TASK_NEEDS = ("cutline", "msgpack", "fsspec", "pyarrow")
"""What every task imports (beyond pyspark): cutline and its dependencies on the executors."""

UNFIT = "cutline: the executors' Python lacks a module"
"""The first field of the row a task returns instead of running."""

HOW_TO = ("Install cutline, the version this driver runs, in that Python on every executor; "
          "or point PYSPARK_PYTHON (spark.pyspark.python with spark-submit) at a Python that "
          "has it; or ship a packed environment with the job: spark.archives=env.tar.gz#env "
          "(spark-submit --archives; venv-pack or conda-pack makes one) and "
          "PYSPARK_PYTHON=./env/bin/python")


def _first_missing(modules: tuple[str, ...]) -> tuple[str, str] | None:
    """The first of ``modules`` this Python cannot find (found, not imported: the task
    imports them), and why; None: all there."""
    import importlib.util

    for name in modules:
        try:
            if importlib.util.find_spec(name) is not None:
                continue
            why = f"No module named {name!r}"
        except Exception as exc:  # noqa: BLE001 - a broken install: say so
            why = f"{type(exc).__name__}: {exc}"
        return name, why
    return None


def guarded(task_main: Callable[[Any, int], Any], spec: Any,
            modules: tuple[str, ...]) -> Callable[[Iterable[Any]], Iterator[Any]]:
    """The barrier stage's partition function: ``task_main(spec, k)`` for partition ``k``
    where this Python finds ``modules``; else the :data:`UNFIT` row of the first one it
    lacks (see :func:`unfit_row`)."""
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    payload = cloudpickle.dumps((task_main, spec))  # unpickled once cutline is known there

    def run(_: Iterable[Any]) -> Iterator[Any]:
        import pickle
        import socket

        from pyspark import BarrierTaskContext

        missing = _first_missing(modules)
        if missing is None:
            try:
                main, job = pickle.loads(payload)
            except ModuleNotFoundError as exc:  # a package the pipeline's code comes from
                missing = (exc.name or str(exc), str(exc))
        if missing is not None:
            yield (UNFIT, sys.executable, socket.gethostname(), *missing)
            return
        try:
            result = main(job, BarrierTaskContext.get().partitionId())
        except BaseException as exc:
            if getattr(exc, "end_process", False):
                # threads of the task that would not end (StuckSubtasks): PySpark reuses
                # this worker process, where they would outlive their attempt; end it
                sys.stderr.write(f"cutline: {exc}\n")
                sys.stderr.flush()
                os._exit(70)
            raise
        yield result

    return run


def unfit_row(rows: Iterable[Any]) -> str | None:
    """What the stage's rows say is missing on the executors (None: nothing)."""
    for row in rows:
        if isinstance(row, tuple) and len(row) == 5 and row[0] == UNFIT:
            return missing_message(*row[1:])
    return None


def missing_message(python: str, host: str, missing: str, why: str) -> str:
    where = f"Spark runs the job's tasks with {python} (on host {host}), where {why}."
    if missing == "cutline":
        return f"the executors' Python cannot import cutline: {where} {HOW_TO}"
    if missing in TASK_NEEDS or missing == "rocksdict":
        return f"the executors' Python cannot import {missing} (cutline needs it): {where} {HOW_TO}"
    return (f"the executors' Python cannot import {missing} (the pipeline's code needs it): "
            f"{where} Install it in that Python on every executor, or ship it with the job: "
            "a packed environment (spark.archives), or SparkContext.addPyFile for pure Python")
