"""Columnar file source: the files of a :class:`~.files.FileSource` read as Arrow record batches.

``FileSource(path, format).batches(schema=None, batch_bytes=1 MiB)`` is this source: the
same files, the same assignment of files to subtasks, the same positions (``{"file",
"offset", "line", "done", "started"}``), the same rescaling; only a read returns Arrow
record batches (a *batch stream*) instead of one Python object per record.

- jsonl: blocks of about ``batch_bytes`` cut at a newline, parsed by pyarrow's JSON reader
  (one batch per block).  With a ``schema`` its fields are the columns, in its order, and
  other fields of a line are skipped unparsed (as ``spark.read.schema(s).json``).
  ``offset`` is the byte offset after the last whole line read, ``line`` its line number:
  a restore resumes at the next record.  Without a ``schema``
  the types are inferred from each file's first block (read again when a restore starts
  mid-file), so a file's batches have one schema whatever the restore point.  A line that
  does not parse fails the read with :class:`~.base.RecordError` naming ``file:line``, as
  the per-record reader does; the position stays before the block.
- csv: pyarrow's streaming CSV reader, blocks of ``batch_bytes``; ``offset`` and ``line``
  are the number of data rows read (a restore skips that many rows).  Types are pyarrow's
  inference over the first block unless ``schema`` gives them (the per-record reader
  yields strings).
- parquet: row groups sliced to about ``batch_bytes`` (zero copy); ``offset`` is the row.

A batch is never cut by a checkpoint: barriers pass between reads, so a position is always
at a batch end, which is a record boundary.
"""

from __future__ import annotations

import json
from typing import Any

from .base import MissingColumnError, RecordError
from .files import FileReader, FileSource

__all__ = ["ColumnarFileSource", "batch_of"]

DEFAULT_BATCH_BYTES = 1 << 20
_PROBE_BYTES = 1 << 12  # a file's first read when files are read aligned (its watermark)


def _newlines(chunk: bytes | memoryview) -> int:
    """How many newlines ``chunk`` holds: numpy counts a block of megabytes 2-3x faster
    than ``bytes.count`` (1.3 against 3.1 ms for 8 MB), which is faster on small ones."""
    if len(chunk) < 1 << 16:
        return (chunk if isinstance(chunk, bytes) else bytes(chunk)).count(b"\n")
    import numpy as np

    return int(np.count_nonzero(np.frombuffer(chunk, dtype=np.uint8) == 10))


class ColumnarFileSource:
    """:meth:`FileSource.batches`: the files of ``files`` as Arrow record batches."""

    columnar = True

    def __init__(self, files: FileSource, schema: Any = None,
                 batch_bytes: int = DEFAULT_BATCH_BYTES,
                 columns: list[str] | None = None) -> None:
        import pyarrow as pa

        if schema is not None and not isinstance(schema, pa.Schema):
            raise TypeError(f"batches(schema=...) takes a pyarrow.Schema or None, "
                            f"got {type(schema).__name__}: {schema!r}")
        if columns is not None:
            if isinstance(columns, str) or not all(isinstance(c, str) and c for c in columns) \
                    or not columns:
                raise TypeError(f"batches(columns=...) takes a list of column names, got "
                                f"{columns!r}")
            if schema is not None:
                raise ValueError("batches(): give schema= (its fields are the columns read) "
                                 "or columns=, not both")
            if len(set(columns)) != len(columns):
                raise ValueError(f"batches(columns=...) names a column twice: {columns!r}")
            columns = list(columns)
        self.columns: list[str] | None = columns
        if not isinstance(batch_bytes, int) or isinstance(batch_bytes, bool) or \
                batch_bytes < 1024:
            raise ValueError(f"batches(batch_bytes=...) must be a whole number >= 1024, "
                             f"got {batch_bytes!r}")
        self.files, self.schema, self.batch_bytes = files, schema, batch_bytes
        self.name = files.name
        self.path, self.format = files.path, files.format

    def parallelism_hint(self) -> int | None:
        return None

    def check(self) -> str | None:
        return self.files.check()

    def create_reader(self) -> "ColumnarFileReader":
        return ColumnarFileReader(self)

    def __repr__(self) -> str:
        cols = f", columns={self.columns!r}" if self.columns else ""
        return f"{self.files!r}.batches(schema={self.schema!r}{cols})"


class _Chunk:
    """Whole lines of one jsonl file (``data``: bytes or a memoryview of them), from byte
    ``off`` and line ``line`` on: what a read of a block yields before it is parsed."""

    __slots__ = ("data", "path", "off", "line")

    def __init__(self, data: Any, path: str, off: int, line: int) -> None:
        self.data, self.path, self.off, self.line = data, path, off, line


class ColumnarFileReader(FileReader):
    """A :class:`FileReader` whose reads return Arrow record batches."""

    def __init__(self, source: ColumnarFileSource) -> None:
        super().__init__(source.files)
        self._columnar = source
        self._schema: Any = None  # jsonl: the current file's schema (given or inferred)
        self._csv: Any = None  # csv: pyarrow's streaming reader of the current file

    def read_batch(self, max_records: int) -> list | None:
        """About ``batch_bytes`` of input as a list of record batches; ``[]`` nothing now;
        ``None`` the end of input.  jsonl with a schema: blocks of several small files are
        parsed as one (one JSON reader call and one record batch, not one per file), unless
        batches must come from one file (a watermark per file, ``files_at_once``)."""
        got = self._read_batches()
        columns = self._columnar.columns
        if not got or columns is None or self._src.format != "jsonl":
            return got  # parquet and csv read only the columns
        out = []
        for b in got:
            missing = [c for c in columns if c not in b.schema.names]
            if missing:
                raise MissingColumnError(self._last_path(), missing[0], b.schema.names)
            out.append(b.select(columns))
        return out

    def _last_path(self) -> str:
        last = self._last or self._cur
        return self._known.get(last, self._src.path) if last else self._src.path

    def _read_batches(self) -> list | None:
        if self._src.format != "jsonl" or self._columnar.schema is None or \
                self._per_split or self._src.files_at_once > 1:
            return super().read_batch(1)
        before = self.snapshot()
        chunks: list[_Chunk] = []
        marks: list = []
        size, got = 0, None
        while size < self._columnar.batch_bytes:
            got = super().read_batch(1)
            marks.extend(self._marks)
            if not got:
                break
            chunks.extend(got)
            size += sum(len(c.data) for c in got)
        self._marks = marks
        if not chunks:
            return got
        data = chunks[0].data if len(chunks) == 1 else b"".join(c.data for c in chunks)
        try:
            table = self._parse_jsonl(data, self._columnar.schema, None)
        except RecordError:
            self.restore(before)  # the position stays before the block: a retry fails alike
            for c in chunks:  # the first chunk that does not parse, named by file and line
                self._parse_jsonl(c.data, self._columnar.schema, c)
            raise
        return [b for b in table.to_batches() if b.num_rows]

    def locate(self, index: int | None = None) -> str | None:
        return super().locate(None)  # an index counts batches here, not records

    _CURSOR = FileReader._CURSOR + ("_schema", "_csv")

    def _forget_current(self) -> None:
        super()._forget_current()
        self._schema = None
        self._csv = None

    def _open_current(self) -> None:
        fmt = self._src.format
        if fmt == "parquet":
            super()._open_current()
            self._check_columns()
            return
        self._handle = self._fs.open(self._current_path(), "rb")
        if fmt == "csv":
            self._open_csv()
        else:
            self._schema = self._columnar.schema
            if self._off:
                if self._schema is None:
                    self._schema = self._infer_jsonl()
                self._handle.seek(self._off)

    # ------------------------------------------------------------------ jsonl

    def _json_options(self, schema: Any) -> tuple[Any, Any]:
        import pyarrow.json as pj

        ro = pj.ReadOptions(use_threads=False, block_size=self._columnar.batch_bytes * 2 + 64)
        # with the user's schema, its fields are the columns read and other fields are
        # skipped unparsed (``spark.read.schema(s).json``); without, every field is read
        # (a file's later fields too, beside the types its first block gave)
        po = pj.ParseOptions(explicit_schema=schema, newlines_in_values=False,
                             unexpected_field_behavior="infer" if self._columnar.schema is None
                             else "ignore")
        return ro, po

    def _infer_jsonl(self) -> Any:
        """The schema of the current file's first block (a restore that starts mid-file
        infers what the first read of the file did)."""
        with self._fs.open(self._current_path(), "rb") as f:
            block = f.read(self._columnar.batch_bytes)
            cut = block.rfind(b"\n")
            if cut < 0 or len(block) < self._columnar.batch_bytes:
                block += f.readline() if cut < 0 else b""
                cut = len(block) - 1
        return self._parse_jsonl(block[:cut + 1], None,
                                 _Chunk(b"", self._current_path(), 0, 0)).schema

    def _read(self, n: int, out: list) -> bool:
        fmt = self._src.format
        if fmt == "parquet":
            return self._read_parquet_batches(out)
        if fmt == "csv":
            return self._read_csv(out)
        return self._read_jsonl_block(out)

    def _read_jsonl_block(self, out: list) -> bool:
        """One block of whole lines of the current file into ``out``; True at its end (a
        small one for a file's first, aligned read: :attr:`_probing`)."""
        size = self._columnar.batch_bytes
        if self._probing:
            size = _PROBE_BYTES
            if self._schema is None and not self._off:  # the schema a whole first block
                self._schema = self._infer_jsonl()     # gives (as a restore infers it)
        data = self._handle.read(size)
        if self._rest:  # (a copy only to join the line a block cut)
            data = self._rest + data
        cut = data.rfind(b"\n")
        while cut < 0:  # a line longer than a block: read on to its end
            more = self._handle.read(size)
            if not more:
                break
            data += more
            cut = data.rfind(b"\n")
        if not data:
            return True
        if cut < 0:  # the last line, without a newline
            chunk, self._rest = data + b"\n", b""
            lines = _newlines(data) + 1
        else:  # the whole lines, without a copy (the parser copies what it keeps)
            chunk, self._rest = memoryview(data)[:cut + 1], data[cut + 1:]
            lines = _newlines(chunk)
        size = len(data) - len(self._rest)
        if self._columnar.schema is not None and not self._per_split and \
                self._src.files_at_once == 1:  # parsed with other blocks by read_batch
            out.append(_Chunk(bytes(chunk), self._current_path(), self._off, self._line))
        else:
            here = _Chunk(chunk, self._current_path(), self._off, self._line)
            table = self._parse_jsonl(chunk, self._schema, here)
            if self._schema is None:
                self._schema = table.schema
            if table.num_rows:
                out.extend(table.to_batches())
        self._off += size
        self._line += lines
        return not self._rest and cut < 0

    def _parse_jsonl(self, chunk: Any, schema: Any, at: "_Chunk | None") -> Any:
        """``chunk`` parsed; a line that does not parse fails naming the file and line
        (``at``: where ``chunk`` starts; ``None``: raise a bare :class:`RecordError`, the
        caller finds the line)."""
        import pyarrow as pa
        import pyarrow.json as pj

        ro, po = self._json_options(schema)
        try:
            return pj.read_json(pa.BufferReader(chunk), read_options=ro, parse_options=po)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
            if at is None:
                raise RecordError(self._src.path, 0, str(exc)) from None
            raise self._bad_jsonl(chunk, at, exc) from None

    def _bad_jsonl(self, chunk: Any, at: "_Chunk", exc: Exception) -> RecordError:
        """The first line of ``chunk`` (from ``at``) that does not parse, named by file and
        line (the position stays at the block's start: a retry fails the same way)."""
        import re

        chunk = bytes(chunk)  # (a block's lines may come as a memoryview)
        path, off, line = at.path, at.off, at.line
        if self._handle is not None and path == self._current_path():
            self._handle.seek(off)
        self._rest = b""
        pos, rows = off, 0
        wanted = re.search(r"in row (\d+)", str(exc))
        for i, raw in enumerate(chunk.split(b"\n")):
            text = raw.decode(self._src.encoding, "replace")
            if text.strip():
                try:
                    value = json.loads(text)
                    if not isinstance(value, dict):
                        raise ValueError(f"a JSON object per line expected, got "
                                         f"{type(value).__name__}")
                    if wanted and rows == int(wanted.group(1)):
                        raise ValueError(str(exc))
                except ValueError as bad:
                    return RecordError(path, pos, str(bad), line=line + i + 1)
                rows += 1
            pos += len(raw) + 1
        return RecordError(path, off, str(exc), line=line + 1)

    # ------------------------------------------------------------------ csv

    def _open_csv(self) -> None:
        import pyarrow.csv as pc

        src, schema = self._src, self._columnar.schema
        ro = pc.ReadOptions(use_threads=False, block_size=self._columnar.batch_bytes,
                            column_names=src.fieldnames, skip_rows_after_names=self._off)
        co = pc.ConvertOptions(column_types=schema, include_columns=(
            self._columnar.columns or (schema.names if schema is not None else None)))
        po = pc.ParseOptions(delimiter=src.delimiter, newlines_in_values=True)
        try:
            self._csv = pc.open_csv(self._handle, read_options=ro, parse_options=po,
                                    convert_options=co)
        except Exception as exc:  # noqa: BLE001 - named by file and row
            import re

            missing = re.search(r"Column '(.*)' in include_columns", str(exc))
            if missing and self._columnar.columns:
                with self._fs.open(self._current_path(), "rb") as f:
                    have = pc.open_csv(f, read_options=pc.ReadOptions(
                        use_threads=False, column_names=src.fieldnames),
                        parse_options=po).schema.names
                raise MissingColumnError(self._current_path(), missing.group(1),
                                         have) from None
            raise RecordError(self._current_path(), self._off, str(exc)) from None

    def _read_csv(self, out: list) -> bool:
        assert self._csv is not None  # opened with the file
        try:
            batch = self._csv.read_next_batch()
        except StopIteration:
            return True
        except Exception as exc:  # noqa: BLE001 - named by file and row
            raise RecordError(self._current_path(), self._off,
                              f"{exc} (in the rows after row {self._off})") from None
        if batch.num_rows:
            out.append(batch)
        self._off += batch.num_rows
        self._line += batch.num_rows
        return False

    # ------------------------------------------------------------------ parquet

    def _check_columns(self) -> None:
        """``columns`` all in the current parquet file (pyarrow skips names it lacks);
        nested ``a.b`` names a field of struct column ``a``."""
        columns = self._columnar.columns
        if columns is None:
            return
        import pyarrow as pa

        schema = self._pf.schema_arrow
        for name in columns:
            fields = schema
            for part in [name] if name in schema.names else name.split("."):
                idx = fields.get_field_index(part) if fields is not None else -1
                if idx < 0:
                    raise MissingColumnError(self._current_path(), name, schema.names)
                t = fields.field(idx).type
                fields = pa.schema(list(t)) if pa.types.is_struct(t) else None

    def _read_parquet_batches(self, out: list) -> bool:
        import bisect

        if self._off >= self._rows:
            self._rg = None
            return True
        idx = bisect.bisect_right(self._starts, self._off) - 1
        if self._rg is None or self._rg[0] != idx:
            columns = self._columnar.columns
            self._rg = (idx, self._pf.read_row_group(idx, columns=columns or (
                self._columnar.schema.names if self._columnar.schema is not None else None)))
        table = self._rg[1]
        per_row = max(1, table.nbytes // max(1, table.num_rows))
        local = self._off - self._starts[idx]
        k = min(table.num_rows - local, max(1, (
            _PROBE_BYTES if self._probing else self._columnar.batch_bytes) // per_row))
        part = table.slice(local, k)
        if self._columnar.schema is not None:
            part = part.cast(self._columnar.schema)
        out.extend(part.to_batches())
        self._off += k
        if self._off >= self._rows:
            self._rg = None
            return True
        return False


def batch_of(batch_fn: Any, start: int, stride: int, n: int) -> list:
    """``GeneratorSource(batch_fn=...)``: the record batches of indices ``start``,
    ``start + stride``, ... (``n`` of them); a function returning anything else fails
    naming the source and the type."""
    import numpy as np
    import pyarrow as pa

    got = batch_fn(np.arange(start, start + n * stride, stride, dtype=np.int64))
    if isinstance(got, pa.RecordBatch):
        batches = [got]
    elif isinstance(got, pa.Table):
        batches = got.to_batches()
    else:
        raise TypeError(f"GeneratorSource batch_fn returned a {type(got).__module__}."
                        f"{type(got).__qualname__}: it must return a pyarrow.RecordBatch or "
                        "Table (one row per index)")
    rows = sum(b.num_rows for b in batches)
    if rows != n:
        raise ValueError(f"GeneratorSource batch_fn returned {rows} rows for {n} indices "
                         "(one row per index keeps positions exact)")
    return [b for b in batches if b.num_rows]
