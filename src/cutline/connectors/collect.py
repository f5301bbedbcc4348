"""Sinks for tests and notebooks: ``CollectSink`` (exactly-once, file based) and ``PrintSink``."""

from __future__ import annotations

import pickle
import re
import sys
import tempfile

from .base import clean_staging, commit_file, get_fs, join, owned_staging_dirs, rm_quiet

_PART = re.compile(r"^part-(\d+)-(\d+)\.pkl$")


class CollectSink:
    """Collect records exactly once into a directory, to read them back with ``results()``.

    Works across processes (the writer runs in a Spark Python worker, ``results()`` in the
    driver) because it is file based: each non-empty pre-commit pickles the records written
    since the previous one to ``<dir>/_staging/<job>/<subtask>/chk-<id>.pkl``; commit renames it
    to ``<dir>/committed/<job>/part-<subtask>-<id>.pkl``. ``path`` defaults to a fresh temporary
    directory created at construction: fine for local mode, but on a cluster pass a path (or
    fsspec URL) that the driver and all executors share.
    """

    def __init__(self, path: str | None = None, name: str = "collect"):
        self.path = str(path) if path is not None else tempfile.mkdtemp(prefix="cutline-collect-")
        self.name = name

    def create_writer(self) -> "CollectWriter":
        return CollectWriter(self)

    def _parts(self, job: str | None = None) -> list[tuple[tuple, str]]:
        fs, root = get_fs(self.path)
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
        fs, _ = get_fs(self.path)
        out: list = []
        for _, f in self._parts(job):
            with fs.open(f, "rb") as fh:
                out.extend(pickle.load(fh)["records"])
        return out

    def clear(self) -> None:
        """Delete everything collected so far (committed and staged)."""
        fs, root = get_fs(self.path)
        for sub in ("committed", "_staging"):
            if fs.exists(join(root, sub)):
                fs.rm(join(root, sub), recursive=True)

    def __repr__(self) -> str:
        return f"CollectSink({self.path!r})"


class CollectWriter:
    def __init__(self, sink: CollectSink):
        self._sink = sink
        self._dir = None

    def open(self, subtask: int, parallelism: int, job: str) -> None:
        if not job or "/" in job:
            raise ValueError(f"job name must be non-empty and contain no '/', got {job!r}")
        self._subtask, self._parallelism, self._job = subtask, parallelism, job
        self._fs, self._root = get_fs(self._sink.path)
        self._job_staging = join(self._root, "_staging", job)
        self._dir = join(self._job_staging, str(subtask))
        self._fs.makedirs(self._dir, exist_ok=True)
        self._buf: list = []

    def write(self, batch: list) -> None:
        if self._dir is None:
            raise RuntimeError("CollectWriter.write() before open()")
        self._buf.extend(batch)

    def pre_commit(self, checkpoint_id: int) -> dict:
        cid, files = int(checkpoint_id), []
        if self._buf:
            path = join(self._dir, f"chk-{cid}.pkl")
            payload = {"job": self._job, "subtask": self._subtask, "checkpoint_id": cid,
                       "records": self._buf}
            with self._fs.open(path, "wb") as f:
                pickle.dump(payload, f, protocol=pickle.HIGHEST_PROTOCOL)
            files.append(path[len(self._root):].lstrip("/"))
            self._buf = []
        return {"files": files, "checkpoint_id": cid, "subtask": self._subtask, "job": self._job}

    def _commit(self, handles: list[dict], strict: bool) -> None:
        for h in handles:
            job = h.get("job", self._job)
            cdir = join(self._root, "committed", job)
            for rel in h["files"]:
                self._fs.makedirs(cdir, exist_ok=True)
                dest = join(cdir, f"part-{h['subtask']}-{h['checkpoint_id']}.pkl")
                commit_file(self._fs, join(self._root, rel), dest, strict=strict)

    def commit(self, handles: list[dict]) -> None:
        self._commit(handles, strict=True)

    def abort(self, handles: list[dict]) -> None:
        for h in handles:
            for rel in h["files"]:
                if rel.startswith("_staging/"):
                    rm_quiet(self._fs, join(self._root, rel))

    def recover(self, handles: list[dict]) -> None:
        self._commit(handles, strict=False)
        keep = {join(self._root, rel) for h in handles for rel in h["files"]}
        dirs = owned_staging_dirs(self._fs, self._job_staging, self._subtask, self._parallelism)
        clean_staging(self._fs, dirs, keep)
        self._buf = []

    def close(self) -> None:
        self._buf = []


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
