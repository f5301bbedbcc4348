"""An embedded session's Python daemon imports cutline's task runtime before it forks
workers (cutline.spark.daemon): the workers it forks have it, and it starts no thread in the
process that forks."""

from __future__ import annotations

import os
import subprocess
import sys

from cutline.spark import launcher
from cutline.spark.daemon import PRELOAD
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
        return [(_os.getpid(), all(m in _sys.modules for m in PRELOAD))]

    sc = spark.sparkContext
    assert sc.getConf().get("spark.python.daemon.module") == "cutline.spark.daemon"
    pids = sc.parallelize(range(3), 3).mapPartitions(probe).collect()
    for pid, preloaded in pids:
        assert preloaded
        daemon = pyspark_daemon(pid)  # the fault injectors still find the daemon
        assert daemon is not None and "cutline.spark.daemon" in cmdline(daemon)
    assert os.getpid() not in {pid for pid, _ in pids}


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
