"""Executors whose Python lacks cutline (a cluster's own Python, not the driver's venv): the
job fails in the stage's first attempt, saying what is missing, where, and what to do.

The suite's embedded session stands in for a cluster: its Python workers are started with
``sc.pythonExec``, here pointed for one job at a bare venv (made without pip: it has the
standard library and finds pyspark the way Spark's workers do, through Spark's PYTHONPATH).
A cluster's executors (a user's session) run PySpark's own daemon, while the embedded
session starts ``cutline.spark.daemon``, which a Python without cutline cannot import: the
executors' Python is a script that starts PySpark's daemon in its place, as a cluster's
executors do.
"""

from __future__ import annotations

import os
import socket
import sys
import types
import venv

import pytest

from cutline import CheckpointConfig, Pipeline
from cutline.connectors import CollectSink, GeneratorSource
from cutline.driver.dataflow import JobFailed

pytestmark = pytest.mark.slow

HOW_TO = ("Install cutline, the version this driver runs, in that Python on every executor; "
          "or point PYSPARK_PYTHON (spark.pyspark.python with spark-submit) at a Python that "
          "has it; or ship a packed environment with the job: spark.archives=env.tar.gz#env "
          "(spark-submit --archives; venv-pack or conda-pack makes one) and "
          "PYSPARK_PYTHON=./env/bin/python")


def _job(tmp_path, name: str, square=lambda i: i * i) -> Pipeline:
    p = Pipeline(name, parallelism=2, checkpoint=CheckpointConfig(
        interval=0.5, storage=f"file://{tmp_path}/{name}/chk"))
    (p.source(GeneratorSource(count=10), uid="n")
       .map(square, uid="square")
       .sink(CollectSink(str(tmp_path / name / "out")), uid="out"))
    return p


def _fails_at_once(spark, tmp_path, python: str | None, name: str, **job) -> str:
    """The job's error with the executors running ``python`` (None: the session's own);
    Spark ran its stage once."""
    sc = spark.sparkContext
    own = sc.pythonExec
    sc.pythonExec = python or own
    try:
        with pytest.raises(JobFailed) as info:
            _job(tmp_path, name, **job).run(spark=spark, timeout=120, progress=False)
    finally:
        sc.pythonExec = own
    tracker = sc.statusTracker()
    (job,) = tracker.getJobIdsForGroup(f"cutline-{name}-{os.getpid()}")
    stage = min(tracker.getJobInfo(job).stageIds)  # the barrier stage (then the collect)
    assert tracker.getStageInfo(stage).currentAttemptId == 0  # no retry: failed at once
    return str(info.value)


def _as_a_cluster(python: str, folder) -> str:
    """An executable for ``sc.pythonExec`` that runs ``python``, starting PySpark's own
    daemon where the embedded session asks for cutline's (a cluster's executors do)."""
    script = folder / "executor-python"
    script.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "-m" ] && [ "$2" = "cutline.spark.daemon" ]; then\n'
        f'  shift 2; exec "{python}" -m pyspark.daemon "$@"\n'
        "fi\n"
        f'exec "{python}" "$@"\n')
    script.chmod(0o755)
    return str(script)


def test_executors_without_cutline_or_its_dependencies_fail_the_job_at_once(spark, tmp_path):
    bare = tmp_path / "bare"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(bare)
    python = str(bare / "bin" / "python")  # what the executors' tasks report as theirs
    executors = _as_a_cluster(python, tmp_path)
    host = socket.gethostname()
    assert _fails_at_once(spark, tmp_path, executors, "nocutline") == (
        f"job 'nocutline' failed: the executors' Python cannot import cutline: Spark runs "
        f"the job's tasks with {python} (on host {host}), where No module named 'cutline'. "
        f"{HOW_TO}")
    # cutline there, one of its dependencies not
    (site,) = (bare / "lib").glob("python3*/site-packages")
    (site / "cutline").mkdir()
    (site / "cutline" / "__init__.py").write_text("")
    assert _fails_at_once(spark, tmp_path, executors, "nomsgpack") == (
        f"job 'nomsgpack' failed: the executors' Python cannot import msgpack (cutline needs "
        f"it): Spark runs the job's tasks with {python} (on host {host}), where No module "
        f"named 'msgpack'. {HOW_TO}")

    # cutline and its dependencies there, a package the pipeline's code comes from not
    # (installed on the driver only: pickled by reference, imported where it runs)
    package = types.ModuleType("cutline_test_driver_only")

    class Square:
        def __call__(self, i: int) -> int:
            return i * i

    Square.__module__, Square.__qualname__ = package.__name__, "Square"
    package.Square = Square
    sys.modules[package.__name__] = package
    try:
        said = _fails_at_once(spark, tmp_path, None, "nopackage", square=Square())
    finally:
        del sys.modules[package.__name__]
    assert said == (
        "job 'nopackage' failed: the executors' Python cannot import cutline_test_driver_only "
        "(the pipeline's code needs it): Spark runs the job's tasks with "
        f"{spark.sparkContext.pythonExec} (on host {host}), where No module named "
        f"'cutline_test_driver_only'. Install it in that Python on every executor, or ship it "
        "with the job: a packed environment (spark.archives), or SparkContext.addPyFile for "
        "pure Python")
