"""Where the long stories go: log files for what a user should not have to read on a failure.

A failing job prints cutline's cause in a few lines.  Everything behind it goes to the
run's own log file, whose path the failure message names (:class:`RunLog`):

- **one file per run of a job**: ``<job dir>/logs/<time>-<run>.log`` beside the job's
  checkpoints when they are on a local disk, else ``<per-user dir>/<job>/<time>-<run>.log``
  (``$CUTLINE_LOG_DIR`` when set, else ``$XDG_STATE_HOME/cutline/logs``, by default
  ``~/.local/state/cutline/logs``).  The newest :data:`RUNS_KEPT` runs of each job are kept;
  another job's runs never rotate them out.
- **what it holds**: the driver's log records (INFO and up when the program configured no
  logging itself; tasks on the threads engine log into it too), the failing task's Python
  traceback, and what an embedded Spark session and its Python workers wrote during the run
  (log4j, worker stderr).

The embedded Spark session's JVM writes to one file for the session's life, under
``$CUTLINE_LOG_DIR`` (default ``<temp dir>/cutline-logs``, the newest :data:`KEEP` kept):
each run copies its own part of it into its run log.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["KEEP", "RUNS_KEPT", "RunLog", "append", "job_log_dir", "log_dir", "new_log_file",
           "redirect_output", "run_log_dir"]

KEEP = 20
RUNS_KEPT = 20  # run logs kept per job
_RUN_LOG = re.compile(r"^\d{8}-\d{6}-[0-9a-f]+\.log$")


def log_dir() -> Path:
    return Path(os.environ.get("CUTLINE_LOG_DIR") or
                Path(tempfile.gettempdir()) / "cutline-logs")


def _mtime(p: Path) -> float | None:
    """``p``'s modification time, or None when another process deleted it meanwhile (two
    drivers starting at once both prune the directory)."""
    try:
        return p.stat().st_mtime
    except OSError:
        return None


def new_log_file(kind: str) -> Path:
    """A new, empty log file ``<log dir>/<kind>-<time>-<pid>.log``; older ones beyond the
    newest :data:`KEEP` are deleted."""
    d = log_dir()
    d.mkdir(parents=True, exist_ok=True)
    old = sorted((m, p) for p in d.glob("*.log") if (m := _mtime(p)) is not None)
    for _, p in old[:max(0, len(old) - KEEP + 1)]:
        with contextlib.suppress(OSError):
            p.unlink()
    path = d / f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    path.touch()
    return path


def append(path: Path, title: str, text: str) -> None:
    """Add a section to a log file (a failure's traceback); never raises."""
    with contextlib.suppress(OSError), open(path, "a", encoding="utf-8") as f:
        f.write(f"\n===== {time.strftime('%Y-%m-%d %H:%M:%S')} {title}\n{text.rstrip()}\n")


@contextlib.contextmanager
def redirect_output(path: Path) -> Iterator[None]:
    """While inside, this process's file descriptors 1 and 2 write to ``path``: a child
    process started meanwhile (Spark's JVM, and the Python workers it forks) keeps writing
    there for its whole life.  Python's own ``sys.stdout`` / ``sys.stderr`` are back on
    the terminal afterwards."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    try:
        saved = [os.dup(1), os.dup(2)]
    except OSError:  # no real descriptors (an embedding host): leave output alone
        yield
        return
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for f in (fd, *saved):
            os.close(f)


def run_log_dir(storage: Any) -> Path:
    """Where the run logs of ``storage``'s job go (see the module docstring)."""
    return job_log_dir(storage.fs, storage.dir, storage.job)


def job_log_dir(fs: Any, job_dir: str, job: str) -> Path:
    """Where the run logs of job ``job``, whose checkpoints are in ``job_dir`` on ``fs``, go."""
    from ..storage.checkpoints import _is_local  # storage is below the driver

    base = os.environ.get("CUTLINE_LOG_DIR")
    if not base and _is_local(fs):
        return Path(fs._strip_protocol(job_dir)) / "logs"
    if not base:
        state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
        base = str(Path(state) / "cutline" / "logs")
    return Path(base) / job


class _Console(logging.StreamHandler):
    """What Python prints with no logging configured (its last-resort handler: WARNING and
    up, the bare message, on stderr), kept while a run log takes cutline's records."""

    def __init__(self) -> None:
        super().__init__()
        self.setLevel(logging.WARNING)

    @property
    def stream(self) -> Any:  # sys.stderr as it is now (pytest and redirect_output swap it)
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


_COPIED: dict[str, int] = {}  # a session log -> how far runs have copied it
_LOCK = threading.Lock()
_runs = 0  # run logs open in this process
_console: logging.Handler | None = None  # the console handler they added, if any
_saved_level = logging.NOTSET  # the cutline logger's level before they changed it


class RunLog:
    """The log file of one run of one job: opened when the run starts, :meth:`close` d when
    it ends.  ``spark_log``: the embedded Spark session's log file, whose part written
    during the run is copied in (at a failure, and at the end)."""

    def __init__(self, storage: Any, run: str, spark_log: Path | None = None) -> None:
        directory = run_log_dir(storage)
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"{time.strftime('%Y%m%d-%H%M%S')}-{run}.log"
        self.path.touch()
        _prune(directory, keep=self.path)
        self._spark_log = spark_log
        self._closed = False
        # from where the previous run of this session stopped copying: the first run gets
        # the session's start (Spark's warnings about its set-up) too
        self._spark_from = _COPIED.get(str(spark_log), 0) if spark_log is not None else 0
        self._handler = logging.FileHandler(self.path, encoding="utf-8")
        self._handler.setFormatter(logging.Formatter(
            "%(asctime)s %(levelname)s %(name)s [%(threadName)s] %(message)s"))
        self._logger = logging.getLogger("cutline")
        with _LOCK:  # runs in one process share the logger: the first sets it up, the last
            global _console, _saved_level, _runs  # puts it back
            if _runs == 0 and not self._logger.hasHandlers():  # nothing configured
                _console = _Console()  # the console as before; INFO and up to the file
                self._logger.addHandler(_console)
                _saved_level = self._logger.level
                if self._logger.getEffectiveLevel() > logging.INFO:
                    self._logger.setLevel(logging.INFO)
            _runs += 1
            self._logger.addHandler(self._handler)

    def failure(self, title: str, text: str) -> None:
        """A failure's long story: its traceback, and Spark's output so far."""
        append(self.path, title, text)
        self._copy_spark()

    def _copy_spark(self) -> None:
        if self._spark_log is None:
            return
        end = _size(self._spark_log)
        if end <= self._spark_from:
            return
        with contextlib.suppress(OSError), open(self._spark_log, "rb") as f:
            f.seek(self._spark_from)
            text = f.read(end - self._spark_from).decode("utf-8", "replace")
            append(self.path, f"Spark and its Python workers ({self._spark_log})", text)
        self._spark_from = end
        _COPIED[str(self._spark_log)] = end

    def close(self) -> None:
        """(Idempotent.)  Two runs at once in one process each get both runs' records."""
        if self._closed:
            return
        self._closed = True
        self._copy_spark()
        with _LOCK:
            global _console, _runs
            self._logger.removeHandler(self._handler)
            self._handler.close()
            _runs -= 1
            if _runs == 0 and _console is not None:
                self._logger.removeHandler(_console)
                self._logger.setLevel(_saved_level)
                _console = None


def _size(path: Path | None) -> int:
    try:
        return path.stat().st_size if path is not None else 0
    except OSError:
        return 0


def _prune(directory: Path, keep: Path) -> None:
    """The newest :data:`RUNS_KEPT` run logs of the job stay (names sort by time)."""
    runs = sorted(p for p in directory.iterdir() if _RUN_LOG.match(p.name) and p != keep)
    for p in runs[:max(0, len(runs) - RUNS_KEPT + 1)]:
        with contextlib.suppress(OSError):
            p.unlink()
