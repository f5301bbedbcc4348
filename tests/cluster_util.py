"""A Spark standalone cluster on 127.0.0.1 from the installed ``pyspark`` (no downloads):
one master and workers of one core each, every process started by pid and stopped by pid.

The test process starts it (tests/spark/test_cluster.py); a job runs in a user script in a
subprocess that may start a worker too (capacity that comes back): every pid anybody
started is appended to ``<root>/pids`` and :meth:`Cluster.stop` ends them all.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pyspark

SPARK_HOME = Path(pyspark.__file__).parent


def cluster_env() -> dict[str, str]:
    return dict(os.environ, SPARK_HOME=str(SPARK_HOME), SPARK_LOCAL_IP="127.0.0.1",
                PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_port(port: int, timeout: float, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"spark master exited: {log.read_text()[-2000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"spark master not listening on {port} after {timeout}s")


@dataclass
class Cluster:
    root: Path
    port: int

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    @property
    def pid_file(self) -> Path:
        return self.root / "pids"

    def _spawn(self, name: str, *args: str) -> subprocess.Popen:
        log = open(self.root / f"{name}.log", "ab")
        proc = subprocess.Popen([str(SPARK_HOME / "bin" / "spark-class"), *args],
                                stdout=log, stderr=subprocess.STDOUT, env=cluster_env(),
                                cwd=self.root, start_new_session=True)
        with open(self.pid_file, "a") as f:
            f.write(f"{proc.pid}\n")
        return proc

    def start_master(self) -> None:
        proc = self._spawn("master", "org.apache.spark.deploy.master.Master",
                           "--host", "127.0.0.1", "--port", str(self.port),
                           "--webui-port", str(free_port()))
        _wait_for_port(self.port, 120, proc, self.root / "master.log")

    def start_worker(self, n: int) -> int:
        """Start worker ``n`` (one core); its pid.  Registration takes a few seconds."""
        work = self.root / f"work-{n}-{time.monotonic_ns()}"
        work.mkdir()
        proc = self._spawn(f"worker-{n}", "org.apache.spark.deploy.worker.Worker", self.url,
                           "--host", "127.0.0.1", "--cores", "1", "--memory", "1g",
                           "--work-dir", str(work), "--webui-port", str(free_port()))
        return proc.pid

    def alive_workers(self) -> int:
        text = (self.root / "master.log").read_text(errors="replace")
        return text.count("Registering worker") - text.count("Removing worker")

    def wait_for_workers(self, n: int, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while self.alive_workers() < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.alive_workers()} of {n} workers registered")
            time.sleep(0.3)

    def stop(self) -> None:
        """End every process started for the cluster (and the executors the workers
        started, which are their children), by pid: TERM, then KILL."""
        pids = [int(x) for x in self.pid_file.read_text().split()] if \
            self.pid_file.exists() else []
        children = [c for p in pids for c in _children(p)]
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in [*reversed(pids), *children]:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + 10
            while any(_alive(p) for p in pids + children) and time.monotonic() < deadline:
                time.sleep(0.2)
        for pid in pids:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _children(pid: int) -> list[int]:
    """Children of ``pid``, whichever of its threads started them (a JVM's are not its
    main thread's)."""
    out = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            out += [int(x) for x in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
    except OSError:
        pass
    return out


def descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        kids = _children(todo.pop())
        out += kids
        todo += kids
    return out
