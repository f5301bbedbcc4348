"""PySpark's worker daemon, with cutline's task runtime imported before it forks workers.

Spark starts one Python daemon per executor (``python -m pyspark.daemon``), which forks a
worker for every Python task it is asked for.  Each worker of a cutline job then imports
cutline's task runtime when it unpickles the task: 140 modules, 0.6 s of CPU on a quiet
core and 1.4 s at load 4, on the critical path of every attempt (a barrier stage starts
when its last task has registered).  An embedded session (``Pipeline.run()`` given no
session) starts its daemon from this module instead (``spark.python.daemon.module``):
the daemon imports :mod:`cutline.runtime.task` once, and every worker it forks has it,
the worker that replaces one killed in a failure too.

Only modules that start no thread are imported here: a process that forks must not hold
threads (PySpark's own daemon imports pandas and pyarrow after the fork for that reason),
and cutline's runtime imports neither (``tests/spark/test_daemon.py`` checks both).  An
import that fails is left to the worker, which fails the task saying why.  A user's own
session keeps PySpark's daemon.
"""

from __future__ import annotations

PRELOAD = ("cutline.runtime.task",)
"""The modules the daemon imports before it forks a worker."""


def preload() -> None:
    import importlib

    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the worker imports it again and reports it
            pass


def main() -> None:
    preload()
    from pyspark.daemon import manager

    manager()


if __name__ == "__main__":
    main()
