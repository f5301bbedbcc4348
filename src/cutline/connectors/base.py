"""Connector contracts (sources, two-phase-commit sinks) and shared file-system helpers.

Everything a reader's ``snapshot()`` or a writer's ``pre_commit()`` returns is plain data
(dict / list / str / int / float / bytes / bool / None) so it can be stored with msgpack in a
checkpoint. Nothing in this package imports pyspark.
"""

from __future__ import annotations

import logging
import pickle
from typing import Any, Protocol, runtime_checkable

from ..storage.fs import url_to_fs

log = logging.getLogger(__name__)


@runtime_checkable
class SourceReader(Protocol):
    """One per source subtask."""

    def open(self, subtask: int, parallelism: int) -> None: ...

    def read_batch(self, max_records: int) -> list | None:
        """Up to ``max_records`` records; ``[]`` = nothing right now; ``None`` = end of input."""

    def snapshot(self) -> dict:
        """Position after the last record returned (msgpack-able)."""

    def restore(self, state: dict) -> None:
        """Called after ``open()``, before any read: continue from ``state``."""

    def close(self) -> None: ...


@runtime_checkable
class Source(Protocol):
    """What the user passes to ``Pipeline.source()``; picklable (travels to executors)."""

    name: str

    def parallelism_hint(self) -> int | None: ...

    def create_reader(self) -> SourceReader: ...


@runtime_checkable
class SinkWriter(Protocol):
    """One per sink subtask; exactly-once through two-phase commit."""

    def open(self, subtask: int, parallelism: int, job: str) -> None: ...

    def write(self, batch: list) -> None: ...

    def pre_commit(self, checkpoint_id: int) -> dict:
        """Flush and stage everything written since the last pre_commit; return a handle."""

    def commit(self, handles: list[dict]) -> None:
        """Make staged transactions visible; committing a committed handle is a no-op."""

    def abort(self, handles: list[dict]) -> None:
        """Discard staged transactions that will never commit."""

    def recover(self, handles: list[dict]) -> None:
        """On restore: re-commit ``handles`` idempotently, discard staged data not covered."""

    def close(self) -> None: ...


@runtime_checkable
class Sink(Protocol):
    name: str

    def create_writer(self) -> SinkWriter: ...


class RecordError(ValueError):
    """A record in an input could not be parsed.

    ``file``: the input file; ``position``: byte offset (jsonl / csv) or row (parquet) where the
    bad record starts; ``reason``: the parser's message; ``line``: 1-based line number (text).
    """

    def __init__(self, file: str, position: int, reason: str, line: int | None = None):
        self.file, self.position, self.reason, self.line = file, position, reason, line
        where = f"line {line}, byte offset {position}" if line is not None else f"row {position}"
        super().__init__(f"malformed record in {file} ({where}): {reason}")


class MissingColumnError(RecordError):
    """``FileSource(...).batches(columns=...)`` names a column an input file does not have:
    fails the job at once, naming the file, the column and the file's columns."""

    def __init__(self, file: str, column: str, have: list[str]) -> None:
        super().__init__(file, 0, f"no column {column!r}")
        self.column = column
        ValueError.__init__(self, f"{file} has no column {column!r} (batches(columns=...)); "
                                  f"its columns: {', '.join(have)}")


class SchemaMismatchError(TypeError):
    """A sink got record batches whose schema differs from the one it writes (the first
    batch's, or the table's): it fails the job at once, naming the sink and both schemas."""

    def __init__(self, sink: str, got: Any, want: Any) -> None:
        self.sink, self.got, self.want = sink, got, want
        super().__init__(f"sink {sink}: a record batch with schema ({_schema_text(got)}) "
                         f"does not match the schema it writes ({_schema_text(want)})")


def _schema_text(schema: Any) -> str:
    return ", ".join(f"{f.name}: {f.type}" for f in schema)


class UnsupportedRecordError(TypeError):
    """A sink got a record it cannot convert to what it writes (a set, an arbitrary object,
    a column Arrow cannot type, a key that is not JSON): the same record fails the same way
    on every retry, so the job fails at once, naming the sink, the Python type and what
    the sink accepts.  ``type_name``: the type at fault (the record's, or the offending
    value's when ``reason`` names a column or a key)."""

    def __init__(self, sink: str, record: Any, accepts: str, reason: str = "",
                 value: Any = None) -> None:
        self.sink, self.record, self.accepts, self.reason = sink, record, accepts, reason
        self.type_name = type(record if value is None else value).__qualname__
        what = f"the record {_short(record)}: {reason}" if reason else \
            f"a record of type {self.type_name} ({_short(record)})"
        super().__init__(f"sink {sink} cannot write {what}. It accepts {accepts}")


def sink_label(writer: Any) -> str:
    """How a sink writer's errors name its sink: the operator's uid and the sink."""
    name = getattr(writer, "operator", None)
    sink = getattr(writer, "_sink", None)
    return f"{name!r} ({sink!r})" if name else repr(sink)


class UnavailableError(RuntimeError):
    """An external system a connector needs (a Kafka broker) did not answer for the
    connector's configured timeout: the job fails, naming it (a retry would wait as long
    again), rather than hang."""


class CommitError(RuntimeError):
    """A staged transaction cannot be committed (its files are gone, or the target is taken)."""


class UnpicklableRecordError(TypeError):
    """A record cannot be pickled where it must be: written by a sink that pickles (e.g.
    ``CollectSink``) or sent to another task (``key_by``, ``rebalance``, a parallelism
    change).  It fails the same way on every retry, so the job fails with it, named."""

    def __init__(self, where: str, record: Any, error: BaseException) -> None:
        self.where, self.record, self.error = where, record, error
        super().__init__(f"{where} cannot pickle record {_short(record)}: "
                         f"{type(error).__name__}: {error} (records that leave a task or "
                         "reach a pickling sink must be picklable: plain data, not locks, "
                         "sockets, generators or open files)")


def _short(obj: Any, limit: int = 200) -> str:
    text = repr(obj)
    return text if len(text) <= limit else text[:limit] + "..."


def unpicklable(records: list, error: BaseException, where: str) -> UnpicklableRecordError:
    """The error naming the first record of ``records`` that does not pickle (``records``
    failed to pickle as a whole with ``error``)."""
    for r in records:
        try:
            pickle.dumps(r, protocol=5)
        except Exception as exc:  # noqa: BLE001 - any pickling failure names the record
            return UnpicklableRecordError(where, r, exc)
    return UnpicklableRecordError(where, records, error)


PICKLING_ERRORS = (TypeError, AttributeError, pickle.PicklingError, RecursionError)
"""What ``pickle.dumps`` raises on an object it cannot pickle."""


# --------------------------------------------------------------------------- file helpers

def get_fs(path: str, storage_options: dict | None = None) -> tuple[Any, str]:
    """``(fsspec filesystem, path without protocol)`` for a local path or any fsspec URL,
    opened with ``storage_options`` (s3fs: ``endpoint_url``, ``key``, ``secret`` ...)."""
    fs, root = url_to_fs(str(path), storage_options)
    return fs, root.rstrip("/") or "/"


def join(*parts: str) -> str:
    return "/".join(p.strip("/") if i else p.rstrip("/") for i, p in enumerate(parts) if p != "")


def commit_file(fs: Any, src: str, dest: str, *, strict: bool) -> bool:
    """Move ``src`` to ``dest`` idempotently. Returns True if this call moved the file.

    - src present, dest absent: move.
    - src absent, dest present: already committed -> no-op.
    - both present: an interrupted non-atomic move (copy done, delete not) if the sizes agree ->
      delete src; otherwise ``dest`` belongs to something else -> CommitError.
    - both absent: the staged data is gone. ``strict`` (a normal commit) raises CommitError;
      during recovery it is logged and ignored, assuming the output was committed and later
      moved away by a consumer (the behaviour of Flink's file committer after recovery).
    """
    if fs.exists(src):
        if fs.exists(dest):
            if fs.size(src) == fs.size(dest):
                fs.rm(src)
                return False
            raise CommitError(
                f"cannot commit {src}: {dest} already exists with different content "
                "(output of an earlier run in the same directory? use a fresh output path)")
        try:
            fs.mv(src, dest)
        except FileNotFoundError:
            if not fs.exists(dest):  # somebody else moved it concurrently: fine if dest exists
                raise
            return False
        return True
    if fs.exists(dest):
        return False
    msg = f"staged file {src} is missing and {dest} does not exist"
    if strict:
        raise CommitError(msg + ": the transaction was aborted or its staging data was lost")
    log.warning("%s; assuming it was committed earlier and moved away", msg)
    return False


def check_open(subtask: int, parallelism: int, job: str) -> None:
    """A sink writer's ``open`` arguments: a subtask in range, a job name without ``/``."""
    if not 0 <= subtask < parallelism:
        raise ValueError(f"subtask {subtask} out of range for parallelism {parallelism}")
    if not job or "/" in job:
        raise ValueError(f"job name must be non-empty and contain no '/', got {job!r}")


def rm_quiet(fs: Any, path: str) -> None:
    try:
        fs.rm(path)
    except FileNotFoundError:
        pass


def owned_staging_dirs(fs: Any, job_staging: str, subtask: int, parallelism: int) -> list[str]:
    """Staging directories this subtask is responsible for cleaning on recovery.

    Its own ``<job_staging>/<subtask>`` plus, after a scale-down, the directories of old subtasks
    ``s >= parallelism`` with ``s % parallelism == subtask`` (nobody else would clean them).
    """
    dirs = [join(job_staging, str(subtask))]
    try:
        entries = fs.ls(job_staging, detail=False)
    except FileNotFoundError:
        return dirs
    for entry in entries:
        name = entry.rstrip("/").rsplit("/", 1)[-1]
        if name.isdigit() and int(name) >= parallelism and int(name) % parallelism == subtask:
            dirs.append(join(job_staging, name))
    return dirs


def clean_staging(fs: Any, dirs: list[str], keep: set[str]) -> list[str]:
    """Delete every file under ``dirs`` whose path is not in ``keep``; return what was deleted."""
    deleted, keep = [], {_norm(k) for k in keep}
    for d in dirs:
        try:
            files = fs.find(d)
        except FileNotFoundError:
            continue
        for f in files:
            if _norm(f) not in keep:
                rm_quiet(fs, f)
                deleted.append(f)
    return deleted


def _norm(path: str) -> str:
    return "/" + path.strip("/") if path.startswith("/") else path.strip("/")


class StagedWriter:
    """Two-phase commit over staged files, shared by the file-based sinks.

    A subclass writes staged files under ``self._dir`` and returns their paths (relative
    to the sink root) in its ``pre_commit`` handle; it names where a committed file goes
    (:meth:`_destination`) and what to forget on restore (:meth:`_reset`).
    """

    _sink: Any

    def __init__(self, sink: Any) -> None:
        self._sink = sink
        self._dir: str | None = None

    def open(self, subtask: int, parallelism: int, job: str) -> None:
        check_open(subtask, parallelism, job)
        self._subtask, self._parallelism, self._job = subtask, parallelism, job
        self._fs, self._root = get_fs(self._sink.path,
                                      getattr(self._sink, "storage_options", None))
        self._job_staging = join(self._root, "_staging", job)
        self._dir = join(self._job_staging, str(subtask))
        self._fs.makedirs(self._dir, exist_ok=True)
        self._reset()

    @property
    def _open_dir(self) -> str:
        """This subtask's staging directory (there is one once the writer is open)."""
        if self._dir is None:
            raise RuntimeError(f"{type(self).__name__} used before open()")
        return self._dir

    def _rel(self, full: str) -> str:
        return full[len(self._root):].lstrip("/")

    def _destination(self, handle: dict, n: int) -> str:
        raise NotImplementedError

    def _reset(self) -> None:
        raise NotImplementedError

    def _commit(self, handles: list[dict], strict: bool) -> None:
        for h in handles:
            for n, rel in enumerate(h["files"]):
                dest = self._destination(h, n)
                self._fs.makedirs(dest.rsplit("/", 1)[0], exist_ok=True)
                commit_file(self._fs, join(self._root, rel), dest, strict=strict)

    def commit(self, handles: list[dict]) -> None:
        self._commit(handles, strict=True)

    def abort(self, handles: list[dict]) -> None:
        for h in handles:
            for rel in h["files"]:
                if rel.startswith("_staging/"):  # never touch committed output
                    rm_quiet(self._fs, join(self._root, rel))

    def recover(self, handles: list[dict]) -> None:
        self._commit(handles, strict=False)
        keep = {join(self._root, rel) for h in handles for rel in h["files"]}
        dirs = owned_staging_dirs(self._fs, self._job_staging, self._subtask, self._parallelism)
        clean_staging(self._fs, dirs, keep)
        self._reset()

    def close(self) -> None:
        # Uncommitted buffered records are dropped on purpose: they are replayed after restore.
        self._reset()
