"""Replayable file source: a directory (local or any fsspec URL) of jsonl, csv or parquet files."""

from __future__ import annotations

import bisect
import csv
import json
import json.scanner
import time
import zlib
from typing import Any

from ..protocol.watermarks import next_split
from .base import RecordError, get_fs
from .generator import Pacer

FORMATS = ("jsonl", "csv", "parquet")

try:  # jsonl: msgspec decodes UTF-8 lines about twice as fast as json (same values)
    import msgspec as _msgspec

    _FAST_ERRORS: tuple[type[Exception], ...] = (_msgspec.MsgspecError, ValueError)
except ImportError:  # pragma: no cover - msgspec is a dependency; json does the same work
    _msgspec = None  # type: ignore[assignment]
    _FAST_ERRORS = ()


def _fast_json_decoder(encoding: str) -> Any:
    """msgspec's ``decode`` for UTF-8 input, else None (lines then go through json)."""
    if _msgspec is None or encoding.lower().replace("_", "-") not in ("utf-8", "utf8"):
        return None
    return _msgspec.json.Decoder().decode
_BLOCK = 1 << 20  # jsonl: bytes read at a time
#: Files read aligned or ``files_at_once``: how many stay open between their batches (the
#: least recently read beyond that is closed; it reopens at its position when read again).
MAX_OPEN_FILES = 32


def listed_files(fs: Any, root: str) -> list[str]:
    """The files directly in directory ``root`` (full names), symbolic links to files
    included (fsspec's local ``ls`` gives a link the type "other": a directory of links
    to the data read nothing, silently)."""
    out = []
    for e in fs.ls(root, detail=True):
        if e.get("type") == "file" or (e.get("islink") and fs.isfile(e["name"])):
            out.append(e["name"])
    return out


class FileSource:
    """Read every file of a directory; files are the unit of partitioning.

    - Files whose names start with ``.`` or ``_`` are ignored (temporary files, ``_SUCCESS``).
      The directory is not descended into. ``path`` may also name a single file.
    - Bounded (``follow=False``): the files listed at ``open()``, sorted by name; file ``i``
      belongs to subtask ``i % p``; end of input once all of a subtask's files are read.
    - ``follow=True``: unbounded; re-lists every ``poll_interval`` seconds when idle. A file
      belongs to subtask ``crc32(name) % p`` so that the assignment does not change when new
      files arrive. Files must appear atomically (write elsewhere, then rename into the
      directory) and are read once: data appended to a file already read is not seen.
    - Position: ``{"file", "offset", "line", "done"}``; offset is a byte offset for jsonl / csv
      (line based) and a row number for parquet (read in row-group slices); ``done`` lists the
      finished files of this subtask.
    - jsonl: one JSON value per line (blank lines skipped). csv: records are dicts of strings
      keyed by the file's header line (or by ``fieldnames``, then files have no header);
      quoted fields may span lines. parquet: records are dicts (``Table.to_pylist``).
    - A record that does not parse raises ``RecordError`` naming file, line and byte offset;
      the position stays at the start of the bad record.
    - ``files_at_once``: how many of its files a subtask reads at a time, a batch from each
      in turn (default 1: one after the other).
    - ``rate``: at most that many records/s over all subtasks (each gets ``rate / p``), as
      ``GeneratorSource(rate=)``: to replay files at a set pace.  Default: as fast as the
      pipeline takes them.
    - Event time: files are the source's *splits*.  ``assign_timestamps`` right after the
      source keeps a watermark per file (a batch then comes from one file), and the
      subtask's watermark is the lowest over all its unfinished files, those not begun
      included: a file behind holds it back, a finished one stops holding it.  The files
      are then read *aligned* (Flink's split-level watermark alignment, FLIP-217): each
      batch from the file whose watermark is lowest, the others paused, so no file runs
      ahead of the slowest by more than a batch and a directory of files that each cover
      the same hours is replayed without late records, whatever ``files_at_once``.  A file
      not begun is read first, one record, so that it has a watermark: files that follow
      one another in time are then read one after the other, and what stays open
      downstream spans a batch, not the input.  At most :data:`MAX_OPEN_FILES` stay open
      between batches.  Positions and per-file
      watermarks are checkpointed and move with a file on a rescale.  With
      ``follow=True`` a file that arrives after the watermark passed its times is late.
    """

    def __init__(self, path: str, format: str = "jsonl", follow: bool = False,
                 poll_interval: float = 1.0, name: str | None = None, *,
                 encoding: str = "utf-8", fieldnames: list[str] | None = None,
                 delimiter: str = ",", step: float = 0.05, files_at_once: int = 1,
                 rate: float | None = None):
        if rate is not None and (isinstance(rate, bool) or not isinstance(rate, (int, float))
                                 or not rate > 0 or rate == float("inf")):
            raise ValueError(f"rate must be a positive, finite number of records/s or None, "
                             f"got {rate!r}")
        self.rate = rate
        if not isinstance(files_at_once, int) or files_at_once < 1:
            raise ValueError(f"files_at_once must be an int >= 1, got {files_at_once!r}")
        self.files_at_once = files_at_once
        if format not in FORMATS:
            raise ValueError(f"unknown file format {format!r}; supported: {', '.join(FORMATS)}")
        if poll_interval <= 0:
            raise ValueError(f"poll_interval must be > 0, got {poll_interval}")
        self.path, self.format, self.follow = str(path), format, follow
        self.poll_interval, self.encoding, self.step = poll_interval, encoding, step
        self.fieldnames = list(fieldnames) if fieldnames is not None else None
        self.delimiter = delimiter
        self.name = name or f"{format}:{self.path}"
        fs, root = get_fs(self.path)
        if not fs.exists(root):
            raise FileNotFoundError(f"input path {self.path} does not exist")

    def parallelism_hint(self) -> int | None:
        return None

    def check(self) -> str | None:
        """Before a run: a bounded source over no input files says so (it would read
        nothing, silently)."""
        if self.follow:
            return None
        fs, root = get_fs(self.path)
        if not fs.exists(root):
            raise FileNotFoundError(f"input path {self.path} does not exist")
        if fs.isfile(root):
            return None
        names = [e.rstrip("/").rsplit("/", 1)[-1] for e in listed_files(fs, root)]
        if any(not n.startswith((".", "_")) for n in names):
            return None
        ignored = f" ({len(names)} ignored: names starting with '.' or '_')" if names else ""
        return (f"input directory {self.path} holds no input files{ignored}: the source "
                "reads nothing (follow=True waits for files to arrive)")

    def create_reader(self) -> "FileReader":
        return FileReader(self)

    def batches(self, schema: Any = None, *, columns: list[str] | None = None,
                batch_bytes: int = 1 << 20) -> Any:
        """The same files read as Arrow record batches of about ``batch_bytes`` (a batch
        stream, like ``spark.read.schema(schema).json(path)``): pyarrow parses them, with
        ``schema`` (a ``pyarrow.Schema``) or inferring the types.  ``columns``: only these
        columns, in this order (Spark's column pruning): parquet reads nothing else, and
        takes nested fields as ``"bid.price"`` (the struct keeps those fields only).
        Positions stay exact (a restore resumes at the record).  See
        :mod:`cutline.connectors.arrow_files`."""
        from .arrow_files import ColumnarFileSource

        if self.rate is not None:
            raise ValueError("FileSource(rate=...) paces records; batches() reads whole blocks "
                             "of files: leave rate None")
        return ColumnarFileSource(self, schema, batch_bytes, columns)

    def __repr__(self) -> str:
        return f"FileSource({self.path!r}, format={self.format!r}, follow={self.follow})"


class FileReader:
    def __init__(self, source: FileSource):
        self._src = source
        self._parallelism: int | None = None

    # ------------------------------------------------------------------ lifecycle
    def open(self, subtask: int, parallelism: int) -> None:
        if not 0 <= subtask < parallelism:
            raise ValueError(f"subtask {subtask} out of range for parallelism {parallelism}")
        self._subtask, self._parallelism = subtask, parallelism
        self._fs, self._root = get_fs(self._src.path)
        if not self._fs.exists(self._root):
            raise FileNotFoundError(f"input path {self._src.path} does not exist")
        self._known: dict[str, str] = {}   # name -> full path, only files of this subtask
        self._done: set[str] = set()
        self._cur: str | None = None
        self._off = self._line = 0
        # files begun, not being read now (after a rescale, or read files_at_once at a
        # time): file -> position
        self._started: dict[str, tuple[int, int]] = {}
        self._last: str | None = None  # the file the last batch came from
        self._per_split = getattr(self, "_per_split", False)
        # read aligned: each split's watermark (split -> ts), set by watermark_per_split
        self._split_wm: Any = getattr(self, "_split_wm", None)
        # files parked between batches with their handle and read-ahead (least recent first)
        self._open_files: dict[str, dict[str, Any]] = {}
        self._probing = False  # this read is a file's first, aligned (a record or so)
        self._handle: Any = None
        self._header: list[str] | None = None
        # jsonl: C scanner of json.loads, called directly (one per reader: not shared by threads)
        self._scan = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[arg-type]
        # jsonl in UTF-8: msgspec's decoder, a slice of lines at a time (see _read_jsonl)
        self._fast_json = _fast_json_decoder(self._src.encoding)
        rate = getattr(self._src, "rate", None)
        self._pacer = None if rate is None else Pacer(rate / parallelism, self._src.step)
        self._reset_lines()
        self._list()
        self._next_poll = time.monotonic() + self._src.poll_interval

    def close(self) -> None:
        self._close_all()

    def snapshot(self) -> dict:
        return {"file": self._cur, "offset": self._off, "line": self._line,
                "done": sorted(self._done),
                "started": {f: list(pos) for f, pos in sorted(self._started.items())},
                "last": self._last}

    def rescale(self, states: list[dict]) -> None:
        """A rescaled restore: files finished by any old reader stay finished; this reader
        takes the files the new assignment gives it, resuming those an old reader had
        started at their positions."""
        self._close_all()
        self._list()
        done: set[str] = set()
        started: dict[str, tuple[int, int]] = {}
        for st in states:
            done.update(st.get("done") or ())
            for f, pos in (st.get("started") or {}).items():
                started[f] = (int(pos[0]), int(pos[1]))
            if st.get("file") is not None:
                started[st["file"]] = (int(st.get("offset") or 0), int(st.get("line") or 0))
        self._done = done
        self._started = {f: pos for f, pos in started.items()
                         if f in self._known and f not in done}
        self._cur, self._off, self._line = None, 0, 0

    def restore(self, state: dict) -> None:
        self._close_all()
        self._done = set(state.get("done") or ())
        cur = state.get("file")
        if cur is not None and cur not in self._known:
            self._list()
            if cur not in self._known:
                raise ValueError(
                    f"restored position refers to file {cur!r}, which is not (any more) an input "
                    f"of subtask {self._subtask}/{self._parallelism} under {self._src.path}")
        self._cur = cur
        self._off = int(state.get("offset") or 0) if cur is not None else 0
        self._line = int(state.get("line") or 0) if cur is not None else 0
        self._started = {f: (int(p[0]), int(p[1]))
                         for f, p in (state.get("started") or {}).items()}
        self._last = state.get("last")  # (round robin goes on after it)

    # ------------------------------------------------------------------ listing
    def _list(self) -> None:
        fs, root, p = self._fs, self._root, self._parallelism
        if p is None:
            raise RuntimeError("FileReader used before open()")
        if fs.isfile(root):
            entries = [root]
        else:
            entries = listed_files(fs, root)
        names = sorted({e.rstrip("/").rsplit("/", 1)[-1]: e for e in entries}.items())
        names = [(n, e) for n, e in names if not n.startswith((".", "_"))]
        for i, (n, full) in enumerate(names):
            owner = zlib.crc32(n.encode()) % p if self._src.follow else i % p
            if owner == self._subtask:
                self._known[n] = full

    def _active(self) -> list[str]:
        """The files read now: those begun (not finished), then the next ones by name up
        to ``files_at_once``."""
        begun = {n for n in self._started if n not in self._done}
        if self._cur is not None:
            begun.add(self._cur)
        room = self._src.files_at_once - len(begun)
        if room > 0:
            pending = sorted(n for n in self._known if n not in self._done and n not in begun)
            begun.update(pending[:room])
        return sorted(begun)

    def _pick(self) -> str | None:
        if self._split_wm is not None:  # aligned: the unfinished file furthest behind
            return next_split(self.split_keys(), self._split_wm)
        started = sorted(n for n in self._started if n not in self._done)
        if self._src.files_at_once > 1:  # round robin over the active files
            active, last = self._active(), self._last
            return next((n for n in active if last is None or n > last),
                        active[0] if active else None)
        if started:  # files an old reader had begun (rescaled restore) go first
            return started[0]
        pending = [n for n in self._known if n not in self._done]
        return min(pending) if pending else None

    # ------------------------------------------------------------------ splits (event time)
    def watermark_per_split(self, watermarks: Any = None) -> None:
        """``assign_timestamps`` keeps a watermark per file: from now on a batch comes from
        one file.  ``watermarks`` (each file's watermark, ``.get(file, default)``): read
        the files aligned, each batch from the unfinished file furthest behind."""
        self._per_split = True
        self._split_wm = watermarks

    def split_key(self) -> str | None:
        """The file the last batch came from."""
        return self._last

    def split_keys(self) -> list[str]:
        """The files that hold the watermark until they are finished: read aligned, every
        unfinished file of this subtask (those not begun too); else the files read now."""
        if self._split_wm is not None:
            done = self._done
            return [n for n in self._known if n not in done]
        return self._active()

    # ------------------------------------------------------------------ reading
    def read_batch(self, max_records: int) -> list | None:
        if self._parallelism is None:
            raise RuntimeError("FileReader.read_batch() before open()")
        if self._pacer is not None:
            max_records = self._pacer.allowance(max_records)
            if not max_records:
                return []  # none due yet (the end of input shows on a later call)
        # aligned: a file not begun is read first, a single record (a small block in
        # batches), so that it has a watermark before the files behind it go on: files
        # that follow one another in time are then read one after the other
        self._probing = False
        if self._split_wm is not None and self._cur is None:
            nxt = self._pick()
            if nxt is not None and nxt not in self._split_wm:
                max_records, self._probing = 1, True
        out: list = []
        # where each file's records in this batch start: (index in out, file, offset, line)
        self._marks: list[tuple[int, str, int, int]] = []
        if self._cur is not None:
            self._marks.append((0, self._cur, self._off, self._line))
        while len(out) < max_records:
            if self._cur is None:
                nxt = self._pick()
                if nxt is None:
                    if out:
                        return out
                    if not self._src.follow:
                        return None
                    now = time.monotonic()
                    if now >= self._next_poll:
                        self._list()
                        self._next_poll = now + self._src.poll_interval
                        if self._pick() is not None:
                            continue
                    time.sleep(max(0.0, min(self._src.step, self._next_poll - now)))
                    return []
                self._resume(nxt)
                self._cur = self._last = nxt
                self._marks.append((len(out), nxt, self._off, self._line))
            if self._handle is None:
                self._open_current()
            if self._read(max_records - len(out), out):  # end of this file
                self._close_handle()
                self._done.add(self._cur)
                self._cur, self._off, self._line = None, 0, 0
                if out and (self._per_split or self._src.files_at_once > 1):
                    return out  # a batch from one file
        if self._cur is not None and (self._src.files_at_once > 1 or
                                      self._split_wm is not None):
            self._park()  # the next batch may come from another file
        return out

    # ------------------------------------------------------------------ parked files
    # The state of the file read now (its handle, position and read-ahead) lives in the
    # attributes below; a file read a batch at a time among others is parked with them.
    _CURSOR: tuple[str, ...] = ("_handle", "_off", "_line", "_lines", "_li", "_rest", "_eof",
                                "_no_newline", "_header", "_pf", "_rg", "_starts", "_rows")

    def _park(self) -> None:
        """Set the current file aside at its position, its handle and read-ahead kept
        open (at most :data:`MAX_OPEN_FILES`; beyond that the least recent is closed)."""
        name = self._cur
        assert name is not None
        self._started[name] = (self._off, self._line)
        if self._handle is not None:
            self._open_files[name] = {a: getattr(self, a) for a in self._CURSOR
                                      if hasattr(self, a)}
            while len(self._open_files) > MAX_OPEN_FILES:
                oldest = next(iter(self._open_files))
                self._open_files.pop(oldest)["_handle"].close()
        self._forget_current()
        self._cur, self._off, self._line = None, 0, 0

    def _resume(self, name: str) -> None:
        """Make ``name`` the current file: parked open, as it was; else at its position
        (opened by the next read)."""
        cursor = self._open_files.pop(name, None)
        if cursor is not None:
            for a, v in cursor.items():
                setattr(self, a, v)
            self._started.pop(name, None)
        else:
            self._off, self._line = self._started.pop(name, (0, 0))

    def _close_all(self) -> None:
        self._close_handle()
        parked, self._open_files = getattr(self, "_open_files", {}), {}
        for cursor in parked.values():
            cursor["_handle"].close()

    def locate(self, index: int | None = None) -> str | None:
        """``file:line`` of record ``index`` of the last batch (``file row n`` for parquet);
        with no index, the file(s) the batch came from.  Reads the file again: for error
        messages only."""
        marks = getattr(self, "_marks", None)
        if not marks:
            return None
        if index is None:
            files = [self._known.get(f, f) for _, f, _, _ in marks]
            first = f"{files[0]}:{marks[0][3] + 1}" if self._src.format != "parquet" \
                else f"{files[0]} row {marks[0][2]}"
            return f"in the batch read from {first} on" + (
                f" (and {len(files) - 1} more file(s))" if len(files) > 1 else "")
        start, name, off, line = next(m for m in reversed(marks) if m[0] <= index)
        path, k = self._known.get(name, name), index - start
        if self._src.format == "parquet":
            return f"{path} row {off + k}"
        try:
            with self._fs.open(path, "rb") as f:
                f.seek(off)
                if self._src.format == "csv" and off == 0 and self._src.fieldnames is None:
                    f.readline()  # the header
                    line += 1
                for raw in f:
                    line += 1
                    if raw.strip():
                        if k == 0:
                            return f"{path}:{line}"
                        k -= 1
        except OSError:
            pass
        return f"{path} (from line {marks[0][3] + 1})"

    def _close_handle(self) -> None:
        h = self._handle
        self._forget_current()
        if h is not None:
            h.close()

    def _forget_current(self) -> None:
        """No current file any more (its handle closed or parked)."""
        self._handle = None
        self._reset_lines()

    def _reset_lines(self) -> None:
        """Forget the lines read ahead (jsonl): the next read starts at ``self._off``."""
        self._lines: list[bytes] = []  # whole lines read ahead, without their newline
        self._li = 0  # next line of ``_lines``, starting at byte ``self._off``
        self._rest = b""  # a line whose end is not read yet
        self._eof = False
        self._no_newline = False  # the file's last line has no newline (it is in _lines)

    def _current_path(self) -> str:
        if self._cur is None:
            raise RuntimeError("FileReader has no current file")
        return self._known[self._cur]

    def _open_current(self) -> None:
        full = self._current_path()
        if self._src.format == "parquet":
            import pyarrow.parquet as pq
            f = self._fs.open(full, "rb")
            try:
                pf = pq.ParquetFile(f)
            except Exception as e:
                f.close()
                raise RecordError(full, 0, f"not a readable parquet file: {e}") from e
            self._handle, self._pf = f, pf
            self._rg: tuple[int, Any] | None = None  # the row group read last: (index, table)
            sizes = [pf.metadata.row_group(i).num_rows for i in range(pf.num_row_groups)]
            self._starts = [sum(sizes[:i]) for i in range(len(sizes))]
            self._rows = sum(sizes)
            return
        self._handle = self._fs.open(full, "rb")
        if self._src.format == "csv":
            self._header = self._src.fieldnames
            if self._header is None:
                off, line = self._off, self._line
                self._off = self._line = 0
                header = self._next_text_record()
                self._header = header[2] if header else []
                if off > 0:  # restoring mid-file: header known, jump back to the position
                    self._handle.seek(off)
                    self._off, self._line = off, line
        elif self._off:
            self._handle.seek(self._off)

    def _read(self, n: int, out: list) -> bool:
        """Append up to ``n`` records of the current file to ``out``; True at end of file."""
        if self._src.format == "parquet":
            return self._read_parquet(n, out)
        if self._src.format == "jsonl":
            return self._read_jsonl(n, out)
        while n > 0:
            rec = self._next_text_record()
            if rec is None:
                return True
            out.append(rec[2])
            n -= 1
        return False

    def _fill(self) -> bool:
        """Read the next block of the current jsonl file as whole lines; False at its end."""
        if self._eof:
            return False
        block = self._handle.read(_BLOCK)
        data = self._rest + block if self._rest else block
        if not block:
            self._eof, self._rest = True, b""
            self._lines, self._li = ([data], 0) if data else ([], 0)
            self._no_newline = bool(data)
            return bool(data)
        lines = data.split(b"\n")
        self._rest = lines.pop()
        self._lines, self._li = lines, 0
        return True

    def _read_jsonl(self, n: int, out: list) -> bool:
        """Append up to ``n`` records of the current jsonl file to ``out``; True at its end.

        A block at a time, split into lines in one call.  UTF-8 lines are decoded by
        msgspec's JSON decoder, a slice of lines in one ``map`` (about twice the speed of
        ``json``; the same values: big integers exact, duplicate keys the last).  A slice
        it refuses (a blank line, ``NaN``, a lone surrogate, a malformed record) and other
        encodings go line by line: each line decoded and handed to the C scanner of
        ``json.loads`` directly; ``json.loads`` itself (same result, same errors) only sees
        lines the scanner does not take whole: surrounding whitespace, blank lines,
        malformed records.
        """
        scan, enc, loads = self._scan, self._src.encoding, json.loads
        fast = self._fast_json
        while n > 0:
            if self._li >= len(self._lines):
                if not self._fill():
                    return True
                continue
            i = self._li
            take = self._lines[i:i + n]
            got = len(out)
            done = 0
            if fast is not None:
                try:
                    out.extend(map(fast, take))
                except _FAST_ERRORS:
                    del out[got:]  # (those before the refused line: again, line by line)
                else:
                    self._li = i + len(take)
                    self._off += sum(map(len, take)) + len(take)
                    if self._no_newline and self._li == len(self._lines):
                        self._off -= 1
                    self._line += len(take)
                    n -= len(take)
                    continue
            try:
                for raw in take:
                    text = raw.decode(enc)
                    try:
                        rec, end = scan(text, 0)
                    except StopIteration:
                        end = -1
                    if end != len(text):
                        if not text.strip():
                            done += 1
                            continue
                        rec = loads(text)
                    out.append(rec)
                    done += 1
            except ValueError as e:
                # Leave the position at the bad record, so a retry fails the same way.
                start = self._off + sum(map(len, take[:done])) + done
                line = self._line + done + 1
                self._handle.seek(start)
                self._reset_lines()
                self._off, self._line = start, line - 1
                raise RecordError(self._current_path(), start, str(e), line=line) from e
            self._li = i + done
            self._off += sum(map(len, take)) + done
            if self._no_newline and self._li == len(self._lines):
                self._off -= 1
            self._line += done
            n -= len(out) - got
        return False

    def _next_text_record(self) -> tuple[int, int, Any] | None:
        """(offset, line, record) of the next non-blank record, or None at end of file."""
        f, fmt = self._handle, self._src.format
        while True:
            start, start_line = self._off, self._line + 1
            raw = f.readline()
            if not raw:
                return None
            lines = 1
            if fmt == "csv":  # a quoted field may contain newlines: keep reading until balanced
                while raw.count(b'"') % 2 == 1:
                    more = f.readline()
                    if not more:
                        break
                    raw += more
                    lines += 1
            self._off, self._line = start + len(raw), self._line + lines
            try:
                text = raw.decode(self._src.encoding)
                if not text.strip():
                    continue
                rec = self._parse(text)
            except (ValueError, csv.Error) as e:
                # Leave the position at the bad record, so a retry fails the same way.
                f.seek(start)
                self._off, self._line = start, start_line - 1
                raise RecordError(self._current_path(), start, str(e), line=start_line) from e
            return start, start_line, rec

    def _parse(self, text: str) -> Any:
        if self._src.format == "jsonl":
            return json.loads(text)
        row = next(csv.reader([text], delimiter=self._src.delimiter, strict=True))
        header = self._header
        if header is None:  # this is the header line itself
            return row
        if len(row) != len(header):
            raise ValueError(f"expected {len(header)} fields {header}, got {len(row)}: {row}")
        return dict(zip(header, row))

    def _read_parquet(self, n: int, out: list) -> bool:
        while n > 0 and self._off < self._rows:
            idx = bisect.bisect_right(self._starts, self._off) - 1
            if self._rg is None or self._rg[0] != idx:
                self._rg = (idx, self._pf.read_row_group(idx))
            table = self._rg[1]
            local = self._off - self._starts[idx]
            k = min(n, table.num_rows - local)
            out.extend(table.slice(local, k).to_pylist())
            self._off += k
            n -= k
        if self._off >= self._rows:
            self._rg = None
            return True
        return False
