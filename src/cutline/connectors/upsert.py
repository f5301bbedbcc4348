"""Exactly-once key-value upserts into a SQLite table, last writer wins per key.

A table ``<table>(key TEXT PRIMARY KEY, value TEXT, checkpoint INTEGER, job TEXT,
subtask INTEGER)``; keys and values are stored as JSON, a ``None`` value is a tombstone
(the key reads as deleted).  Two-phase commit, all inside the database file:

- ``write``: per key, the latest value since the last checkpoint (in memory).
- ``pre_commit(n)``: those upserts go to ``_cutline_staged`` in one SQLite transaction.
- ``commit``: in one transaction per call, each handle's staged rows are upserted into the
  table (``ON CONFLICT(key) DO UPDATE ... WHERE excluded.checkpoint >= checkpoint``: a
  newer checkpoint's value wins, an older one never overwrites it), its staged rows are
  deleted and the high-water mark of ``(table, job/subtask)`` in ``_cutline_txn`` moves to
  the checkpoint id, all-or-nothing.  A handle at or below the mark is already applied and
  skipped; re-applying one would be harmless anyway (same values, same checkpoint).
- ``recover``: re-commit the checkpoint's handles, delete staged rows no handle covers.

Window results need no ``key=``: a :class:`~cutline.protocol.windows.WindowResult` upserts
its ``value`` under ``(key, start, end)`` (``start`` / ``end`` as float seconds), so a
window re-emitted under ``allowed_lateness`` replaces its row.  A record the sink cannot
key (no ``key=`` for it) or encode (a key or value that is not JSON) fails the job at once,
never retried, naming the sink, the type and what it accepts.

Last-writer-wins is per sink subtask and checkpoint: route every key to one subtask (a
keyed operator before the sink, at the sink's parallelism) so "later" is well defined.
SQLite is a local file: fine for one machine (Spark local mode) or a shared volume with
working POSIX locks; not for a cluster of hosts without one.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sqlite3
from collections.abc import Callable
from typing import Any

from ..protocol.windows import WindowResult
from ..storage.fs import scheme
from .base import CommitError, UnsupportedRecordError, _short, sink_label

__all__ = ["UpsertSink"]

log = logging.getLogger(__name__)

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")

ACCEPTS = ("records whose key and value are JSON (dict, list, tuple, str, int, float, bool, "
           "None); WindowResult with no key= (keyed by (key, start, end), its value "
           "upserted), other records with key= (a field name of dicts or named tuples, or "
           "a function)")


def _tuples(v: Any) -> Any:
    """JSON lists back to tuples, so a decoded key is hashable."""
    return tuple(_tuples(x) for x in v) if isinstance(v, list) else v


class UpsertSink:
    """Upsert ``key(record) -> value(record)`` into SQLite table ``table`` of ``path``.

    ``key``: a field name of dict records (or of named tuples), or a function; ``None``
    (the default) takes window results only: a ``WindowResult`` upserts under ``(key,
    start, end)``.  ``value``: a function (default: the record itself; a ``WindowResult``'s
    ``value``); both must be JSON-serialisable.  ``timeout``: seconds to wait for another
    writer's lock.
    """

    def __init__(self, path: str, key: str | Callable[[Any], Any] | None = None, *,
                 value: Callable[[Any], Any] | None = None, table: str = "kv",
                 name: str | None = None, timeout: float = 60.0):
        if scheme(str(path)) != "file":
            raise ValueError(f"UpsertSink needs a local SQLite file path, got {path!r}")
        if not (key is None or isinstance(key, str) or callable(key)):
            raise TypeError(f"key must be a field name, a function or None (window results), "
                            f"got {key!r}")
        if value is not None and not callable(value):
            raise TypeError(f"value must be a function or None, got {value!r}")
        if not isinstance(table, str) or not _NAME.match(table) or table.startswith("_cutline"):
            raise ValueError(f"table must be a SQL identifier (letters, digits, '_'), not "
                             f"starting with '_cutline', got {table!r}")
        p = str(path)
        self.path = p[len("file://"):] if p.startswith("file://") else p
        self.key, self.value, self.table, self.timeout = key, value, table, timeout
        self.name = name or f"upsert:{self.path}:{table}"

    def create_writer(self) -> "UpsertWriter":
        return UpsertWriter(self)

    def connect(self) -> sqlite3.Connection:
        # A writer is opened on one thread and used on its subtask's (one at a time).
        conn = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None,
                               check_same_thread=False)
        _create(conn, self.table)
        return conn

    def read(self) -> dict:
        """The table as ``{key: value}`` (tombstones left out)."""
        if not os.path.exists(self.path):
            return {}
        conn = self.connect()
        try:
            rows = conn.execute(f'SELECT key, value FROM "{self.table}" '
                                "WHERE value IS NOT NULL").fetchall()
        finally:
            conn.close()
        return {_tuples(json.loads(k)): json.loads(v) for k, v in rows}

    def __repr__(self) -> str:
        return f"UpsertSink({self.path!r}, table={self.table!r})"


def _create(conn: sqlite3.Connection, table: str) -> None:
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(f'CREATE TABLE IF NOT EXISTS "{table}" (key TEXT PRIMARY KEY, value TEXT, '
                     "checkpoint INTEGER NOT NULL, job TEXT NOT NULL, subtask INTEGER NOT NULL)")
        conn.execute("CREATE TABLE IF NOT EXISTS _cutline_staged (tbl TEXT NOT NULL, "
                     "job TEXT NOT NULL, subtask INTEGER NOT NULL, checkpoint INTEGER NOT NULL, "
                     "key TEXT NOT NULL, value TEXT, "
                     "PRIMARY KEY (tbl, job, subtask, checkpoint, key))")
        conn.execute("CREATE TABLE IF NOT EXISTS _cutline_txn (tbl TEXT NOT NULL, "
                     "app TEXT NOT NULL, version INTEGER NOT NULL, PRIMARY KEY (tbl, app))")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


class UpsertWriter:
    def __init__(self, sink: UpsertSink) -> None:
        self._sink = sink
        self._conn: sqlite3.Connection | None = None
        self._buf: dict[str, str | None] = {}

    def open(self, subtask: int, parallelism: int, job: str) -> None:
        if not 0 <= subtask < parallelism:
            raise ValueError(f"subtask {subtask} out of range for parallelism {parallelism}")
        self._subtask, self._parallelism, self._job = subtask, parallelism, job
        self._conn = self._sink.connect()
        self._buf = {}

    def write(self, batch: list) -> None:
        if self._conn is None:
            raise RuntimeError("UpsertWriter.write() before open()")
        key, value_fn, buf = self._sink.key, self._sink.value, self._buf
        for r in batch:
            if type(r) is WindowResult:
                k = (r.key, float(r.start), float(r.end)) if key is None else self._key(key, r)
                v = r.value if value_fn is None else value_fn(r)
            else:
                k = self._key(key, r)
                v = r if value_fn is None else value_fn(r)
            try:
                buf[json.dumps(k, separators=(",", ":"))] = \
                    None if v is None else json.dumps(v, separators=(",", ":"))
            except (TypeError, ValueError) as e:
                which, part = ("key", k) if not _is_json(k) else ("value", v)
                bad = _not_json(part)
                raise UnsupportedRecordError(
                    sink_label(self), r, ACCEPTS,
                    f"its {which} {_short(part)} holds a {type(bad).__qualname__}, which is "
                    f"not JSON ({e})", value=bad) from e

    def _key(self, key: Any, r: Any) -> Any:
        if callable(key):
            return key(r)
        if key is None:
            raise UnsupportedRecordError(sink_label(self), r, ACCEPTS,
                                         "UpsertSink(key=None) takes WindowResult records only")
        if isinstance(r, dict):
            if key in r:
                return r[key]
        elif key in getattr(type(r), "_fields", ()):
            return getattr(r, key)
        raise UnsupportedRecordError(sink_label(self), r, ACCEPTS, f"it has no field {key!r}")

    def pre_commit(self, checkpoint_id: int) -> dict:
        cid, t = int(checkpoint_id), self._sink.table
        rows = [(t, self._job, self._subtask, cid, k, v) for k, v in self._buf.items()]
        if rows:
            with self._tx() as c:
                c.executemany("INSERT OR REPLACE INTO _cutline_staged VALUES (?, ?, ?, ?, ?, ?)",
                              rows)
        self._buf = {}
        return {"checkpoint_id": cid, "subtask": self._subtask, "job": self._job,
                "table": t, "rows": len(rows)}

    def commit(self, handles: list[dict]) -> None:
        self._apply(handles, strict=True)

    def abort(self, handles: list[dict]) -> None:
        with self._tx() as c:
            for h in handles:
                c.execute("DELETE FROM _cutline_staged WHERE tbl=? AND job=? AND subtask=? "
                          "AND checkpoint=?", (h["table"], h["job"], h["subtask"],
                                               h["checkpoint_id"]))

    def recover(self, handles: list[dict]) -> None:
        self._apply(handles, strict=False)
        keep = {(h["job"], h["subtask"], h["checkpoint_id"]) for h in handles}
        mine = [s for s in self._staged_subtasks()
                if s == self._subtask or (s >= self._parallelism
                                          and s % self._parallelism == self._subtask)]
        with self._tx() as c:
            for s in mine:
                for (cid,) in c.execute(
                        "SELECT DISTINCT checkpoint FROM _cutline_staged WHERE tbl=? AND job=? "
                        "AND subtask=?", (self._sink.table, self._job, s)).fetchall():
                    if (self._job, s, cid) not in keep:
                        c.execute("DELETE FROM _cutline_staged WHERE tbl=? AND job=? AND "
                                  "subtask=? AND checkpoint=?",
                                  (self._sink.table, self._job, s, cid))
        self._buf = {}

    def close(self) -> None:
        self._buf = {}
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # ------------------------------------------------------------------ internals

    def _staged_subtasks(self) -> list[int]:
        return [s for (s,) in self._db().execute(
            "SELECT DISTINCT subtask FROM _cutline_staged WHERE tbl=? AND job=?",
            (self._sink.table, self._job)).fetchall()]

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            raise RuntimeError("UpsertWriter used before open()")
        return self._conn

    def _tx(self) -> "_Tx":
        return _Tx(self._db())

    def _apply(self, handles: list[dict], strict: bool) -> None:
        if not handles:
            return
        with self._tx() as c:
            for h in sorted(handles, key=lambda h: h["checkpoint_id"]):
                self._apply_one(c, h, strict)

    def _apply_one(self, c: sqlite3.Connection, h: dict, strict: bool) -> None:
        t, job, sub, cid = h["table"], h["job"], h["subtask"], h["checkpoint_id"]
        app = f"{job}/{sub}"
        where = (t, job, sub, cid)
        row = c.execute("SELECT version FROM _cutline_txn WHERE tbl=? AND app=?",
                        (t, app)).fetchone()
        staged = c.execute("SELECT count(*) FROM _cutline_staged WHERE tbl=? AND job=? AND "
                           "subtask=? AND checkpoint=?", where).fetchone()[0]
        if row is not None and cid <= row[0]:  # applied already
            if staged:
                raise CommitError(
                    f"table {t!r} of {self._sink.path} has upserts of {app} up to checkpoint "
                    f"{row[0]}, but checkpoint {cid} of this run was never applied: an "
                    "earlier run of a job with the same name wrote this table. Restore that "
                    "job from its checkpoints, or use another job name or table")
            return
        if staged != h["rows"]:
            msg = (f"checkpoint {cid} of {app}: {h['rows']} staged upserts expected in "
                   f"{self._sink.path}, {staged} found")
            if strict:
                raise CommitError(msg + ": the transaction was aborted or its staging lost")
            log.warning("%s; committing what is there", msg)
        c.execute(f'INSERT INTO "{t}" (key, value, checkpoint, job, subtask) '
                  "SELECT key, value, checkpoint, job, subtask FROM _cutline_staged "
                  "WHERE tbl=? AND job=? AND subtask=? AND checkpoint=? "
                  "ON CONFLICT(key) DO UPDATE SET value=excluded.value, "
                  "checkpoint=excluded.checkpoint, job=excluded.job, subtask=excluded.subtask "
                  f'WHERE excluded.checkpoint >= "{t}".checkpoint', where)
        c.execute("DELETE FROM _cutline_staged WHERE tbl=? AND job=? AND subtask=? AND "
                  "checkpoint=?", where)
        c.execute("INSERT INTO _cutline_txn (tbl, app, version) VALUES (?, ?, ?) "
                  "ON CONFLICT(tbl, app) DO UPDATE SET version=excluded.version "
                  "WHERE excluded.version > _cutline_txn.version", (t, app, cid))


def _is_json(x: Any) -> bool:
    try:
        json.dumps(x)
    except (TypeError, ValueError):
        return False
    return True


def _not_json(x: Any) -> Any:
    """The innermost part of ``x`` that is not JSON (whose type to name)."""
    if isinstance(x, dict):
        for k, v in x.items():
            if not (k is None or isinstance(k, (str, int, float, bool))):
                return k
            if not _is_json(v):
                return _not_json(v)
    elif isinstance(x, (list, tuple)):
        for v in x:
            if not _is_json(v):
                return _not_json(v)
    return x


class _Tx:
    """``BEGIN IMMEDIATE`` ... ``COMMIT`` (``ROLLBACK`` on error): one writer at a time."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def __enter__(self) -> sqlite3.Connection:
        self.conn.execute("BEGIN IMMEDIATE")
        return self.conn

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        self.conn.execute("ROLLBACK" if exc_type is not None else "COMMIT")
