"""A local filesystem that fills up and fails writes on purpose: ``faulty://`` (tests, chaos).

Checkpoint storage that is full, or that fails in the middle of an upload, must decline the
checkpoint and never leave anything a restore would read.  ``faulty:///some/dir`` is the
local directory ``/some/dir`` whose writes (``open(..., "wb")``, ``pipe_file``,
``put_file``) obey its ``storage_options``, which travel to every task with the job, so
every process sees the same faults:

* ``capacity``: bytes the directory ``root`` may hold (every file under it counts); a write
  that would pass it writes what fits, then raises ``OSError(ENOSPC)``, as a full disk
  does: the partial file stays behind.
* ``rules``: a list of ``{"match": regex, "after": bytes, "nth": n, "error": "EIO"}``; a
  write whose path matches ``match`` (``re.search``) fails with ``error`` (an ``errno``
  name, default ``EIO``) once ``after`` bytes (default 0) are written, on every matching
  write or only on the ``nth`` (1-based, counted over all processes).
* ``journal``: a file every fired fault appends one line to (``<errno> <path>``), and
  where the ``nth`` counters live (``<journal>.count``, under a lock): what a test reads
  to check the fault fired.  Required with ``nth``.

Reads, listings and deletes are the local filesystem's.  Registered with fsspec by
:mod:`cutline.storage.fs` (no import needed in a task).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
from typing import Any

from fsspec.implementations.local import LocalFileOpener, LocalFileSystem

__all__ = ["FaultyFileSystem", "fired"]


class FaultyFileSystem(LocalFileSystem):
    protocol = ("faulty",)
    root_marker = "/"

    def __init__(self, *, capacity: int | None = None, root: str | None = None,
                 rules: list[dict] | None = None, journal: str | None = None,
                 **kwargs: Any) -> None:
        kwargs.pop("use_listings_cache", None)  # nothing cached here anyway
        super().__init__(auto_mkdir=True, **kwargs)
        if capacity is not None and root is None:
            raise ValueError("faulty:// capacity needs root (the directory it limits)")
        self.capacity, self.fault_root, self.journal = capacity, root, journal
        self.rules = [dict(r) for r in rules or ()]
        for r in self.rules:
            if r.get("nth") is not None and journal is None:
                raise ValueError("faulty:// rules with nth need a journal file")
            if not hasattr(errno, r.get("error", "EIO")):
                raise ValueError(f"faulty:// unknown errno name {r.get('error')!r}")

    @classmethod
    def _strip_protocol(cls, path: Any) -> str:
        path = str(path)
        if path.startswith("faulty://"):
            path = path[len("faulty://"):]
        return super()._strip_protocol(path)

    def unstrip_protocol(self, name: str) -> str:
        return f"faulty://{self._strip_protocol(name)}"

    def _open(self, path: str, mode: str = "rb", block_size: Any = None, **kwargs: Any) -> Any:
        path = self._strip_protocol(path)
        if "w" not in mode and "a" not in mode and "x" not in mode:
            return super()._open(path, mode, block_size, **kwargs)
        self.makedirs(self._parent(path), exist_ok=True)
        return _FaultyFile(path, mode, fs=self, limit=self._limit(path), **kwargs)

    def put_file(self, lpath: str, rpath: str, callback: Any = None, **kwargs: Any) -> None:
        with open(lpath, "rb") as src, self.open(rpath, "wb") as out:
            while chunk := src.read(1 << 20):
                out.write(chunk)

    def cp_file(self, path1: str, path2: str, **kwargs: Any) -> None:
        with self.open(path1, "rb") as src, self.open(path2, "wb") as out:
            while chunk := src.read(1 << 20):
                out.write(chunk)

    # ------------------------------------------------------------------ the faults

    def _limit(self, path: str) -> tuple[int, str] | None:
        """``(bytes this write may write, errno name)``, or None: no fault for it."""
        limits = []
        root = self.fault_root
        if self.capacity is not None and root and path.startswith(root.rstrip("/") + "/"):
            limits.append((max(self.capacity - _used(root), 0), "ENOSPC"))
        for i, rule in enumerate(self.rules):
            if re.search(rule["match"], path) and self._counts(i, rule):
                limits.append((int(rule.get("after", 0)), rule.get("error", "EIO")))
        return min(limits) if limits else None

    def _counts(self, i: int, rule: dict) -> bool:
        """Rule ``i`` applies to this matching write (its ``nth``, if it has one)."""
        nth = rule.get("nth")
        if nth is None:
            return True
        assert self.journal is not None
        with open(f"{self.journal}.count", "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            f.seek(0)
            counts = json.loads(f.read() or "{}")
            counts[str(i)] = seen = counts.get(str(i), 0) + 1
            f.seek(0)
            f.truncate()
            f.write(json.dumps(counts))
        return seen == int(nth)

    def _fired(self, name: str, path: str) -> None:
        if self.journal is not None:
            with open(self.journal, "a") as f:
                f.write(f"{name} {path}\n")


def _used(root: str) -> int:
    total = 0
    for parent, _, files in os.walk(root):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(parent, f))
            except OSError:
                pass
    return total


class _FaultyFile(LocalFileOpener):
    """A local file that writes ``limit[0]`` bytes at most, then raises."""

    def __init__(self, path: str, mode: str, *, fs: FaultyFileSystem,
                 limit: tuple[int, str] | None, **kwargs: Any) -> None:
        super().__init__(path, mode, fs=fs, **kwargs)
        self._faulty, self._limit, self._written = fs, limit, 0

    def write(self, data: Any) -> int:
        if self._limit is None:
            return super().write(data)
        room, name = self._limit
        data = memoryview(data).cast("B")
        if self._written + len(data) <= room:
            self._written += len(data)
            return super().write(data)
        fits = max(room - self._written, 0)
        if fits:
            super().write(data[:fits])
        self._written += fits
        self.flush()
        self._faulty._fired(name, self.path)
        code = getattr(errno, name)
        raise OSError(code, os.strerror(code), self.path)


def fired(journal: str) -> list[tuple[str, str]]:
    """The faults that fired so far: ``(errno name, path)`` in order."""
    try:
        with open(journal) as f:
            return [tuple(line.split(" ", 1)) for line in f.read().splitlines()]  # type: ignore
    except FileNotFoundError:
        return []
