"""Exactly-once parquet output through two-phase commit (stage, pre-commit, rename on commit)."""

from __future__ import annotations

import re
from typing import Any

from ..storage.fs import check_storage_options
from .base import SchemaMismatchError, StagedWriter, get_fs, join

_PART = re.compile(r"^part-(\d+)-(\d+)-(\d+)\.parquet$")


def table_of(records: list, path: str) -> Any:
    """The Arrow table of a file's records: dicts, or a batch stream's record batches (one
    schema, checked as they were written: no conversion)."""
    import pyarrow as pa

    if records and isinstance(records[0], pa.RecordBatch):
        return pa.Table.from_batches(records)
    # Table.from_pylist takes the columns from the first record only: build from the union of
    # keys (first-seen order) so a key missing in early records is not dropped.
    keys = dict.fromkeys(k for r in records for k in r)
    try:
        return pa.Table.from_pydict({k: [r.get(k) for r in records] for k in keys})
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise TypeError(f"cannot convert records to a parquet table for {path}: {e}") from e


def _write_parquet(fs: Any, path: str, records: list, compression: str) -> None:
    import pyarrow.parquet as pq

    table = table_of(records, path)
    with fs.open(path, "wb") as f:
        pq.write_table(table, f, compression=compression)


class ParquetSink:
    """Write records as parquet files under ``path`` (local or any fsspec URL), exactly once.

    Layout: ``<path>/_staging/<job>/<subtask>/chk-<id>-<n>.parquet`` while staged,
    ``<path>/part-<subtask>-<checkpoint_id>-<n>.parquet`` once committed. Readers must only read
    ``part-*`` files (pyarrow / Spark skip ``_``-prefixed directories on their own).

    A batch stream's record batches are written as they are (no conversion to dicts and
    back); every batch must have the schema of the first one the subtask wrote, or the job
    fails naming the sink and both schemas.

    Records are dicts (other values are wrapped as ``{"value": record}``); the schema is inferred
    per file by pyarrow over all of the file's records (union of keys, a missing key = null;
    ``Table.from_pylist`` would keep only the first record's keys). Records are buffered in memory
    and written at ``pre_commit``; more than ``roll_records`` records in one checkpoint are rolled
    into extra staging files (``n`` = 0, 1, ...). A pre-commit with nothing written: no file.
    ``storage_options``: fsspec options for ``path`` (for ``s3://``: ``endpoint_url``, ``key``,
    ``secret``, ...); they travel to the executors with the sink.

    Commit renames; an existing destination whose source is gone is "already committed". A
    destination that exists while its source does too (and the sizes differ) raises
    ``CommitError``: the directory holds output of an earlier run (like Spark's default
    ``ErrorIfExists``); use a fresh output path per run or restore the job from its checkpoint.
    """

    def __init__(self, path: str, name: str | None = None, *, roll_records: int = 100_000,
                 compression: str = "snappy", storage_options: dict | None = None):
        if roll_records < 1:
            raise ValueError(f"roll_records must be >= 1, got {roll_records}")
        self.storage_options = check_storage_options(storage_options)
        self.path, self.roll_records, self.compression = str(path), roll_records, compression
        self.name = name or f"parquet:{self.path}"

    def create_writer(self) -> "ParquetWriter":
        return ParquetWriter(self)

    def committed_files(self) -> list[str]:
        """Committed part files, ordered by (subtask, checkpoint id, n)."""
        fs, root = get_fs(self.path, self.storage_options)
        if not fs.exists(root):
            return []
        parts = []
        for f in fs.ls(root, detail=False):
            m = _PART.match(f.rstrip("/").rsplit("/", 1)[-1])
            if m:
                parts.append((tuple(int(g) for g in m.groups()), f))
        return [f for _, f in sorted(parts)]

    def read_records(self) -> list[dict]:
        """All committed records (a convenience for tests and notebooks)."""
        import pyarrow.parquet as pq
        fs, _ = get_fs(self.path, self.storage_options)
        out: list[dict] = []
        for f in self.committed_files():
            with fs.open(f, "rb") as fh:
                out.extend(pq.read_table(fh).to_pylist())
        return out

    def __repr__(self) -> str:
        return f"ParquetSink({self.path!r})"


class ParquetWriter(StagedWriter):
    def _reset(self) -> None:
        self._buf: list = []  # dicts, or a batch stream's record batches
        self._rows = 0  # rows of record batches in _buf
        self._rolled: list[str] = []  # staging files of the open transaction (already written)

    def _write_batches(self, batch: list) -> None:
        """A batch stream's record batches: buffered as they are, schema checked."""
        want = getattr(self, "_batch_schema", None)
        if want is None:
            want = self._batch_schema = self._expected_schema(batch[0].schema)
        for rb in batch:
            if rb.schema is not want and not rb.schema.equals(want):
                name = getattr(self, "operator", None)
                raise SchemaMismatchError(
                    f"{name!r} ({self._sink!r})" if name else repr(self._sink), rb.schema,
                    want)
        self._buf.extend(batch)
        self._rows += sum(rb.num_rows for rb in batch)
        if self._rows >= self._sink.roll_records:
            path = join(self._dir, f"open-{len(self._rolled)}.parquet")
            self._write_file(path, self._buf)
            self._rolled.append(path)
            self._buf, self._rows = [], 0

    def _expected_schema(self, first: Any) -> Any:
        """The schema every record batch must have: the first one's."""
        return first

    def _write_file(self, path: str, records: list[dict]) -> None:
        _write_parquet(self._fs, path, records, self._sink.compression)

    def write(self, batch: list) -> None:
        if self._dir is None:
            raise RuntimeError(f"{type(self).__name__}.write() before open()")
        if batch and type(batch[0]).__module__ == "pyarrow.lib":
            return self._write_batches(batch)
        buf = self._buf
        for r in batch:
            buf.append(r if isinstance(r, dict) else {"value": r})
            if len(buf) >= self._sink.roll_records:
                path = join(self._dir, f"open-{len(self._rolled)}.parquet")
                self._write_file(path, buf)
                self._rolled.append(path)
                buf = self._buf = []

    def pre_commit(self, checkpoint_id: int) -> dict:
        cid = int(checkpoint_id)
        files = []
        for n, src in enumerate(self._rolled):
            dest = join(self._open_dir, f"chk-{cid}-{n}.parquet")
            self._fs.mv(src, dest)
            files.append(self._rel(dest))
        if self._buf:
            dest = join(self._open_dir, f"chk-{cid}-{len(files)}.parquet")
            self._write_file(dest, self._buf)
            files.append(self._rel(dest))
        self._buf, self._rolled, self._rows = [], [], 0
        return {"files": files, "checkpoint_id": cid, "subtask": self._subtask,
                "job": self._job}

    def _destination(self, handle: dict, n: int) -> str:
        return join(self._root, f"part-{handle['subtask']}-{handle['checkpoint_id']}-{n}.parquet")

