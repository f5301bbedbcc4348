"""Exactly-once parquet output through two-phase commit (stage, pre-commit, rename on commit).

Records become rows (:func:`row_of`, shared with :mod:`.delta`):

- a dict: one column per key;
- a :class:`~cutline.protocol.windows.WindowResult`: ``key`` (a tuple key: ``key_0``,
  ``key_1``, ...), ``start``, ``end`` (float64 seconds of event time, as the rows of a
  batch stream's windows), ``value`` (a dict value with str keys: one column per key,
  ``value_<name>`` where a name is already a key / start / end column; a tuple value:
  ``value_0``, ``value_1``, ...);
- a tuple (``("u1", 3.0)``, a late record of the docs' examples): ``value_0``,
  ``value_1``, ...;
- another named tuple or a dataclass: one column per field;
- a scalar or a list: one column ``value``.

Anything else (a set, an arbitrary object), or a column Arrow cannot type, fails the job at
once (:class:`~.base.UnsupportedRecordError`, never retried), naming the sink, the type and
what the sink accepts.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import re
from decimal import Decimal
from typing import Any

from ..protocol.windows import WindowResult
from ..storage.fs import check_storage_options
from .base import (
    SchemaMismatchError,
    StagedWriter,
    UnsupportedRecordError,
    _short,
    get_fs,
    join,
    sink_label,
)

_PART = re.compile(r"^part-(\d+)-(\d+)-(\d+)\.parquet$")

ACCEPTS = ("dicts (a column per key), WindowResult (columns key or key_0, key_1, ..., "
           "start, end, value or the value dict's keys), named tuples and dataclasses (a "
           "column per field), tuples (value_0, value_1, ...), and None, bool, int, float, "
           "str, bytes, Decimal, dates, times and lists (one column 'value'), with values "
           "Arrow can type")

_VALUES = (str, int, float, bool, bytes, bytearray, Decimal, _dt.date, _dt.time,
           _dt.timedelta, list, tuple, type(None))
_CHECK_ROWS = 1_000  # rows of a writer's first batch converted at once (fail before a commit)


def window_row(r: WindowResult) -> dict:
    """A window result's row: key column(s), ``start``, ``end``, value column(s)."""
    key, value = r.key, r.value
    row = ({f"key_{i}": k for i, k in enumerate(key)} if isinstance(key, tuple)
           else {"key": key})
    row["start"], row["end"] = float(r.start), float(r.end)
    if type(value) is dict and value and all(type(n) is str for n in value):
        for n, v in value.items():
            row[f"value_{n}" if n in row else n] = v
    elif type(value) is tuple:
        row.update(_tuple_row(value))
    else:
        row["value"] = value
    return row


def _tuple_row(t: tuple) -> dict:
    return {f"value_{i}": v for i, v in enumerate(t)}


def row_of(record: Any) -> dict | None:
    """``record`` as a row (a dict of columns), or None: a type the sink does not take."""
    if isinstance(record, dict):
        return record
    if type(record) is WindowResult:
        return window_row(record)
    if type(record) is tuple:
        return _tuple_row(record)
    if isinstance(record, tuple) and hasattr(type(record), "_fields"):
        return record._asdict()  # type: ignore[attr-defined]
    if isinstance(record, _VALUES) or type(record).__module__ == "numpy":
        return {"value": record}
    if dataclasses.is_dataclass(record) and not isinstance(record, type):
        return {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}
    return None


def table_of(records: list, sink: str, accepts: str = ACCEPTS) -> Any:
    """The Arrow table of a file's records: rows (dicts), or a batch stream's record batches
    (one schema, checked as they were written: no conversion).  A column Arrow cannot type
    raises :class:`UnsupportedRecordError` naming ``sink``, the value's type and the row."""
    import pyarrow as pa

    if records and isinstance(records[0], pa.RecordBatch):
        return pa.Table.from_batches(records)
    # Table.from_pylist takes the columns from the first record only: build from the union of
    # keys (first-seen order) so a key missing in early records is not dropped.
    keys = dict.fromkeys(k for r in records for k in r)
    columns = {}
    for k in keys:
        values = [r.get(k) for r in records]
        try:
            columns[k] = pa.array(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError,
                OverflowError) as e:
            i = _culprit(values)
            bad = values[i]
            raise UnsupportedRecordError(
                sink, records[i], accepts, f"its column {k!r} holds a {type(bad).__qualname__} "
                f"({_short(bad)}) that Arrow cannot put in one column with the others ({e})",
                value=bad) from e
    return pa.Table.from_pydict(columns)


def _culprit(values: list) -> int:
    """The index of the value that makes a column fail to convert: one that fails alone,
    else the first whose type differs from the first value's (skipping nulls)."""
    import pyarrow as pa

    for i, v in enumerate(values):
        try:
            pa.array([v])
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError,
                OverflowError):
            return i
    present = [i for i, v in enumerate(values) if v is not None]
    first = type(values[present[0]]) if present else None
    return next((i for i in present if type(values[i]) is not first), 0)


def _write_parquet(fs: Any, path: str, table: Any, compression: str) -> None:
    import pyarrow.parquet as pq

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

    Records become rows as the module docstring says: dicts as they are, ``WindowResult``
    as ``key, start, end, value`` (no ``map`` needed), named tuples and dataclasses by
    field, tuples as ``value_0, value_1, ...``, other values as ``{"value": record}``; a
    record of another type (a set, an arbitrary object) fails the job at once, naming the
    sink, the type and what it accepts. The schema is inferred per file by pyarrow over all
    of the file's records (union of keys, a missing key = null; ``Table.from_pylist`` would
    keep only the first record's keys); a writer converts its first batch at once, so a
    column Arrow cannot type fails before the first checkpoint (a later one: at the
    pre-commit), never retried. Records are buffered in memory
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
        self._checked = False  # the first rows were converted: their columns have types

    def _write_batches(self, batch: list) -> None:
        """A batch stream's record batches: buffered as they are, schema checked."""
        want = getattr(self, "_batch_schema", None)
        if want is None:
            want = self._batch_schema = self._expected_schema(batch[0].schema)
        for rb in batch:
            if rb.schema is not want and not rb.schema.equals(want):
                raise SchemaMismatchError(sink_label(self), rb.schema, want)
        self._buf.extend(batch)
        self._rows += sum(rb.num_rows for rb in batch)
        if self._rows >= self._sink.roll_records:
            path = join(self._open_dir, f"open-{len(self._rolled)}.parquet")
            self._write_file(path, self._buf)
            self._rolled.append(path)
            self._buf, self._rows = [], 0

    def _expected_schema(self, first: Any) -> Any:
        """The schema every record batch must have: the first one's."""
        return first

    def _table(self, records: list) -> Any:
        """The Arrow table a file of ``records`` holds."""
        return table_of(records, sink_label(self))

    def _write_file(self, path: str, records: list[dict]) -> None:
        _write_parquet(self._fs, path, self._table(records), self._sink.compression)

    def write(self, batch: list) -> None:
        if self._dir is None:
            raise RuntimeError(f"{type(self).__name__}.write() before open()")
        if not batch:
            return
        if type(batch[0]).__module__ == "pyarrow.lib":
            return self._write_batches(batch)
        buf, roll = self._buf, self._sink.roll_records
        start = len(buf)
        for r in batch:
            row = r if type(r) is dict else row_of(r)
            if row is None:
                raise UnsupportedRecordError(sink_label(self), r, ACCEPTS)
            buf.append(row)
            if len(buf) >= roll:
                path = join(self._dir, f"open-{len(self._rolled)}.parquet")
                self._write_file(path, buf)
                self._rolled.append(path)
                buf = self._buf = []
                self._checked = True
        if not self._checked:  # a column Arrow cannot type fails now, not at the commit
            self._checked = True
            self._table(buf[start:start + _CHECK_ROWS])

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

