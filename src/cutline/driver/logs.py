"""Where the long stories go: log files for what a user should not have to read on a failure.

A failing job prints cutline's cause in a few lines.  Everything behind it (the failing
task's Python traceback, the log4j output of an embedded Spark session and the stderr of
its Python workers) goes to a log file under ``$CUTLINE_LOG_DIR`` (default:
``<temp dir>/cutline-logs``), whose path the failure message names.  The newest
:data:`KEEP` files are kept.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = ["KEEP", "append", "log_dir", "new_log_file", "redirect_output"]

KEEP = 20


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
