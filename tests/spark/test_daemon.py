"""An embedded session's Python daemon imports cutline's task runtime before it forks
workers (cutline.spark.daemon): the workers it forks have it, and it starts no thread in the
process that forks."""

from __future__ import annotations

import os
import subprocess
import sys

from cutline.spark import launcher
from cutline.spark.daemon import PRELOAD, installed_sources_first
from cutline.spark.faults import cmdline, pyspark_daemon


def test_what_the_daemon_imports_starts_no_thread_and_no_pyarrow():
    code = ("import sys, threading\n"
            "from cutline.spark.daemon import preload, PRELOAD\n"
            "preload()\n"
            "assert all(m in sys.modules for m in PRELOAD), PRELOAD\n"
            "bad = [m for m in ('pyarrow', 'pandas', 'numpy', 'pyspark') if m in sys.modules]\n"
            "print(threading.active_count(), bad)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split("\n")[0]
    assert out == "1 []", out


def test_workers_of_the_embedded_session_are_forked_by_cutlines_daemon(spark):
    def probe(_):
        import os as _os
        import sys as _sys
        import py4j as _py4j
        import pyspark as _pyspark
        return [(_os.getpid(), all(m in _sys.modules for m in PRELOAD),
                 _pyspark.__file__, _py4j.__file__)]

    sc = spark.sparkContext
    assert sc.getConf().get("spark.python.daemon.module") == "cutline.spark.daemon"
    pids = sc.parallelize(range(3), 3).mapPartitions(probe).collect()
    for pid, preloaded, pyspark_file, py4j_file in pids:
        assert preloaded
        # pyspark and py4j from the installed packages (bytecode cached), not Spark's zips
        assert ".zip" not in pyspark_file and ".zip" not in py4j_file, (pyspark_file, py4j_file)
        daemon = pyspark_daemon(pid)  # the fault injectors still find the daemon
        assert daemon is not None and "cutline.spark.daemon" in cmdline(daemon)
    assert os.getpid() not in {pid for pid, *_ in pids}


def test_no_cutline_daemon_for_another_interpreter_or_when_turned_off(monkeypatch):
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    monkeypatch.delenv(launcher.PRELOAD_ENV, raising=False)
    assert launcher._daemon() == {"spark.python.daemon.module": "cutline.spark.daemon"}
    monkeypatch.setenv(launcher.PRELOAD_ENV, "0")
    assert launcher._daemon() == {}
    monkeypatch.delenv(launcher.PRELOAD_ENV)
    monkeypatch.setenv("PYSPARK_PYTHON", "/usr/bin/false")  # not this interpreter
    assert launcher._daemon() == {}
    monkeypatch.setenv("PYSPARK_PYTHON", "no-such-python-here")
    assert launcher._daemon() == {}


def _installed(site, *packages):
    for name in packages:
        (site / name).mkdir(parents=True)
        (site / name / "__init__.py").write_text("")


def test_sparks_source_zips_give_way_to_the_same_installed_packages(tmp_path):
    site = tmp_path / "site-packages"
    _installed(site, "pyspark", "py4j")
    lib = site / "pyspark" / "python" / "lib"
    spark_zip, py4j_zip = str(lib / "pyspark.zip"), str(lib / "py4j-0.10.9.9-src.zip")
    user_zip = str(tmp_path / "deps.zip")
    path = ["/work", spark_zip, py4j_zip, user_zip, str(site)]
    assert installed_sources_first(path) == ["/work", user_zip, str(site)]


def test_sparks_source_zips_stay_where_nothing_else_holds_them(tmp_path):
    site = tmp_path / "site-packages"
    _installed(site, "pyspark")  # no py4j installed beside it
    lib = site / "pyspark" / "python" / "lib"
    spark_zip, py4j_zip = str(lib / "pyspark.zip"), str(lib / "py4j-0.10.9.9-src.zip")
    assert installed_sources_first([spark_zip, py4j_zip, str(site)]) == [py4j_zip, str(site)]
    # that pyspark's directory is not on the path: its zips are the only copy
    assert installed_sources_first([spark_zip, py4j_zip]) == [spark_zip, py4j_zip]
    # a SPARK_HOME of a cluster's (not pip's layout): kept
    home = tmp_path / "spark-4.0.0" / "python" / "lib"
    other = [str(home / "pyspark.zip"), str(home / "py4j-0.10.9.9-src.zip")]
    assert installed_sources_first([*other, str(site)]) == [*other, str(site)]
