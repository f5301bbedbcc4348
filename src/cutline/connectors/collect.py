"""Sinks for tests and notebooks: ``CollectSink`` (exactly-once, file based) and ``PrintSink``."""

from __future__ import annotations

import pickle
import re
import shutil
import sys
import tempfile
import weakref

from ..storage.fs import check_storage_options
from .base import PICKLING_ERRORS, StagedWriter, get_fs, join, unpicklable

_PART = re.compile(r"^part-(\d+)-(\d+)\.pkl$")


class CollectSink:
    """Collect records exactly once into a directory, to read them back with ``results()``.

    Works across processes (the writer runs in a Spark Python worker, ``results()`` in the
    driver) because it is file based: each non-empty pre-commit pickles the records written
    since the previous one to ``<dir>/_staging/<job>/<subtask>/chk-<id>.pkl``; commit renames it
    to ``<dir>/committed/<job>/part-<subtask>-<id>.pkl``. ``path`` defaults to a fresh temporary
    directory created at construction: fine for local mode, but on a cluster pass a path (or
    fsspec URL) that the driver and all executors share.  A temporary directory the sink
    created goes when the sink does (garbage collected, or at the process's exit); a
    ``path`` given stays.
    """

    def __init__(self, path: str | None = None, name: str = "collect", *,
                 storage_options: dict | None = None):
        if path is None:
            self.path = tempfile.mkdtemp(prefix="cutline-collect-")
            # only here: a copy unpickled in a worker (no ``__init__``) removes nothing
            weakref.finalize(self, shutil.rmtree, self.path, True)
        else:
            self.path = str(path)
        self.name = name
        self.storage_options = check_storage_options(storage_options)

    def create_writer(self) -> "CollectWriter":
        return CollectWriter(self)

    def _parts(self, job: str | None = None) -> list[tuple[tuple, str]]:
        fs, root = get_fs(self.path, self.storage_options)
        base = join(root, "committed")
        if not fs.exists(base):
            return []
        jobs = [job] if job is not None else [
            d.rstrip("/").rsplit("/", 1)[-1] for d in fs.ls(base, detail=False)]
        parts = []
        for j in jobs:
            jdir = join(base, j)
            if not fs.exists(jdir):
                continue
            for f in fs.ls(jdir, detail=False):
                m = _PART.match(f.rstrip("/").rsplit("/", 1)[-1])
                if m:
                    parts.append(((int(m.group(1)), int(m.group(2)), j), f))
        return sorted(parts)

    def results(self, job: str | None = None) -> list:
        """All committed records ordered by (subtask, checkpoint id, sequence); one job or all."""
        fs, _ = get_fs(self.path, self.storage_options)
        out: list = []
        for _, f in self._parts(job):
            with fs.open(f, "rb") as fh:
                out.extend(pickle.load(fh)["records"])
        return out

    def clear(self) -> None:
        """Delete everything collected so far (committed and staged)."""
        fs, root = get_fs(self.path, self.storage_options)
        for sub in ("committed", "_staging"):
            if fs.exists(join(root, sub)):
                fs.rm(join(root, sub), recursive=True)

    def __repr__(self) -> str:
        return f"CollectSink({self.path!r})"


class CollectWriter(StagedWriter):
    def _reset(self) -> None:
        self._buf: list = []

    def write(self, batch: list) -> None:
        if self._dir is None:
            raise RuntimeError("CollectWriter.write() before open()")
        self._buf.extend(batch)

    def pre_commit(self, checkpoint_id: int) -> dict:
        cid, files = int(checkpoint_id), []
        if self._buf:
            path = join(self._open_dir, f"chk-{cid}.pkl")
            payload = {"job": self._job, "subtask": self._subtask, "checkpoint_id": cid,
                       "records": self._buf}
            try:
                data = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
            except PICKLING_ERRORS as exc:
                raise unpicklable(self._buf, exc, repr(self._sink)) from None
            with self._fs.open(path, "wb") as f:
                f.write(data)
            files.append(self._rel(path))
            self._buf = []
        return {"files": files, "checkpoint_id": cid, "subtask": self._subtask, "job": self._job}

    def _destination(self, handle: dict, n: int) -> str:
        job = handle.get("job", self._job)
        return join(self._root, "committed", job,
                    f"part-{handle['subtask']}-{handle['checkpoint_id']}.pkl")


class PrintSink:
    """Print records when their checkpoint commits. At-least-once, not exactly-once.

    The printed lines (``str(record)``) travel in the transaction handle, so ``recover()`` can
    print a restored checkpoint's lines that may or may not have been printed before the
    failure: after a restore some lines can appear twice, none is lost. In Spark the output goes
    to the executor's stdout (its log), not to the driver's console.
    """

    def __init__(self, name: str = "print", prefix: str = ""):
        self.name, self.prefix = name, prefix

    def create_writer(self) -> "PrintWriter":
        return PrintWriter(self)


class PrintWriter:
    def __init__(self, sink: PrintSink):
        self._sink = sink
        self._buf: list[str] = []
        self._printed: set[tuple] = set()

    def open(self, subtask: int, parallelism: int, job: str) -> None:
        self._subtask = subtask

    def write(self, batch: list) -> None:
        self._buf.extend(str(r) for r in batch)

    def pre_commit(self, checkpoint_id: int) -> dict:
        lines, self._buf = self._buf, []
        return {"lines": lines, "checkpoint_id": int(checkpoint_id), "subtask": self._subtask}

    def commit(self, handles: list[dict]) -> None:
        for h in handles:
            key = (h["subtask"], h["checkpoint_id"])
            if key in self._printed:  # idempotent within one process lifetime
                continue
            for line in h["lines"]:
                print(self._sink.prefix + line, file=sys.stdout)
            sys.stdout.flush()
            self._printed.add(key)

    def abort(self, handles: list[dict]) -> None:
        pass

    def recover(self, handles: list[dict]) -> None:
        self._buf = []
        self.commit(handles)

    def close(self) -> None:
        pass
