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

Spark puts its Python sources first on the workers' path: ``pyspark.zip`` and
``py4j-*-src.zip`` from ``SPARK_HOME/python/lib``, zips of sources that Python compiles at
every import (a zip holds no cached bytecode): 0.45 s of the first stage's start on a quiet
core, against 0.15 s for the same modules compiled once.  When those zips belong to the
pyspark installed in a directory on the path (pip's layout: ``SPARK_HOME`` is
``site-packages/pyspark``, the driver's own pyspark), the daemon imports pyspark and py4j
from that directory instead: the same files, their bytecode cached
(:func:`installed_sources_first`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

PRELOAD = ("cutline.runtime.task",)
"""The modules the daemon imports before it forks a worker."""


def preload() -> None:
    import importlib

    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the worker imports it again and reports it
            pass


def installed_sources_first(path: list[str]) -> list[str]:
    """``path`` (``sys.path``) without Spark's source zips (``.../pyspark/python/lib/
    pyspark.zip`` and ``py4j-*.zip``) whose package is installed in that same pyspark's
    parent directory, itself on ``path``: the modules then come from there, compiled once.
    Any other zip (a cluster's ``SPARK_HOME``, a user's ``--py-files``) stays."""
    on_path = {os.path.normpath(p) for p in path if p and not p.endswith((".zip", ".jar"))}
    kept = []
    for entry in path:
        zipped = Path(entry)
        package = ("pyspark" if zipped.name == "pyspark.zip" else
                   "py4j" if zipped.name.startswith("py4j-") and zipped.suffix == ".zip"
                   else None)
        home = zipped.parent.parent.parent  # SPARK_HOME, above python/lib
        site = home.parent
        if (package is not None and zipped.parent.name == "lib"
                and zipped.parent.parent.name == "python" and home.name == "pyspark"
                and os.path.normpath(site) in on_path
                and (site / package / "__init__.py").is_file()):
            continue
        kept.append(entry)
    return kept


def main() -> None:
    sys.path[:] = installed_sources_first(sys.path)
    preload()
    from pyspark.daemon import manager

    manager()


if __name__ == "__main__":
    main()
