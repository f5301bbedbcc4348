"""Keyed state in an embedded RocksDB (``rocksdict``) on local disk, checkpointed
incrementally.

Layout: one database per keyed operator subtask, in a working directory of its own under
``$SPARK_LOCAL_DIRS`` (its first entry) or the system temp directory, removed on
:meth:`~RocksDBStateBackend.close` (and, after a ``kill -9``, by the next backend created on
that machine: a directory whose lock nobody holds is stale).  Entries are keyed by
:func:`cutline.state.keys.encode_slot`: key group first, so a key-group range is one range
of the key space.  Values are pickled.  The write-ahead log is off: after a failure the
job restores a checkpoint, never the local database.

In front of the database sit, per state name, two bounded dicts, so hot keys cost a dict
lookup:

* ``fast`` (:mod:`cutline.state.backend`): entries written since the last spill (and
  ``deleted``, the keys deleted since), and
* ``clean``: entries read from or spilled to the database (the oldest half is dropped
  when it is full).

A read looks in ``fast``, then ``clean``, then the database.  ``fast`` is written to the
database in one batch when the tables pass their bound and at every snapshot.  List and
map state are stored whole (one entry each) and count as written whenever a function asks
for them; a value-state object changed in place without ``update()`` is not written back
(as in Flink's RocksDB backend: state values are copies).

Snapshots (Flink's asynchronous incremental checkpoints):

* synchronous part, :meth:`~RocksDBStateBackend.snapshot`: spill the ``fast`` dicts
  (bounded) and create a RocksDB checkpoint (flush the memtable, hard-link the SST files
  into a local directory);
* asynchronous part, :meth:`RocksDBSnapshot.finish`, on the task's upload thread while
  records keep flowing: upload the SST files the previous checkpoints have not uploaded to
  ``shared/<operator>.<subtask>/`` of the checkpoint storage, and return a small manifest
  (the SST files by shared path, size and sha256, plus the few small files a RocksDB
  checkpoint also holds, inline).  The task acknowledges the checkpoint after that.

Restore downloads (and verifies) the files of the snapshot that covers the most of this
subtask's key groups and opens them as its database, range-deleting key groups it does not
own; entries of the other snapshots' owned key groups are copied in (rescaling).
"""

from __future__ import annotations

import fcntl
import itertools
import logging
import os
import pickle
import shutil
import struct
import tempfile
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import msgpack

from .backend import MISSING, KeyedStateBackend, StateTable, iter_memory_entries
from .keys import decode_key, decode_slot, encode_key, encode_slot
from .timers import RocksDBTimerQueue, scan

__all__ = ["RocksDBStateBackend", "RocksDBSnapshot", "is_rocksdb_snapshot", "read_entries"]

log = logging.getLogger(__name__)

MAGIC = b"cutline-rocksdb\x00"
FORMAT_VERSION = 1
_GROUP = struct.Struct(">H")
_BATCH = 10_000  # entries per write batch when copying


def _rocksdict():
    try:
        import rocksdict
    except ImportError as e:  # pragma: no cover - a dependency of cutline
        raise ImportError("state_backend='rocksdb' needs the rocksdict package "
                          "(pip install rocksdict)") from e
    return rocksdict


def _options():
    r = _rocksdict()
    opts = r.Options(raw_mode=True)
    opts.create_if_missing(True)
    table = r.BlockBasedOptions()
    table.set_bloom_filter(10, False)  # point reads of keys not there (new keys) skip files
    opts.set_block_based_table_factory(table)
    # A snapshot flushes the memtable in its synchronous part: keep that bounded (RocksDB
    # flushes a full one in the background).
    opts.set_write_buffer_size(16 << 20)
    # Universal (tiered) compaction merges the small recent files among themselves and
    # rewrites the big old ones rarely: with keys spread over the key space by their key
    # group, leveled compaction rewrites most files every few flushes, and an incremental
    # checkpoint would upload them all again (measured in bench/state.py: at 1% of keys
    # changed per checkpoint, ~0.2x of a full checkpoint leveled, ~0.03x universal).
    opts.set_compaction_style(r.DBCompactionStyle.universal())
    opts.set_keep_log_file_num(2)
    opts.set_max_log_file_size(1 << 20)
    return opts


def _write_options():
    w = _rocksdict().WriteOptions()
    w.disable_wal = True
    return w


def _state_root() -> str:
    local = os.environ.get("SPARK_LOCAL_DIRS", "").split(",")[0].strip()
    return os.path.join(local or tempfile.gettempdir(), "cutline-state")


def _remove_stale(root: str) -> None:
    """Remove working directories whose owner is gone (its lock is free)."""
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return
    for name in names:
        lock = os.path.join(root, name, ".lock")
        try:
            fd = os.open(lock, os.O_RDWR)
        except OSError:
            continue  # no lock yet (being created) or not ours
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue  # alive
        try:
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
            log.info("removed stale state directory %s", os.path.join(root, name))
        finally:
            os.close(fd)


def _make_workdir(name: str, root: str | None) -> tuple[str, int]:
    """A fresh directory under ``root`` and the fd of the lock held for its lifetime."""
    root = root or _state_root()
    os.makedirs(root, exist_ok=True)
    _remove_stale(root)
    path = tempfile.mkdtemp(prefix=f"{name}-", dir=root)
    # Lock a file under a temporary name, then rename: the lock is held before the name
    # exists, so no other process can take the directory for stale.
    tmp = os.path.join(path, f".lock-{uuid.uuid4().hex}")
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.rename(tmp, os.path.join(path, ".lock"))
    return path, fd


class RocksDBStateBackend(KeyedStateBackend):
    """State of one keyed operator subtask in RocksDB, behind the tables of
    :mod:`cutline.state.backend` (as :class:`~cutline.state.memory.MemoryStateBackend`).

    ``name`` names the working directory and the shared files (``<operator uid>.<subtask>``).
    ``cache_entries`` bounds ``clean`` (shared out between the state names) and
    ``dirty_entries`` the tables' ``fast`` dicts (what a snapshot writes to the database in
    its synchronous part).  ``incremental=False`` uploads every file at every checkpoint (a
    full checkpoint; for comparison).  ``directory``: where working directories go (default:
    see the module docstring).  ``storage``: the job's checkpoint storage, to fetch a
    restored snapshot's files with its filesystem options (without it, the snapshot's URL is
    opened as it is).
    """

    def __init__(self, key_groups: range, max_parallelism: int, *, name: str = "state",
                 directory: str | None = None, cache_entries: int = 100_000,
                 dirty_entries: int = 20_000, incremental: bool = True,
                 storage: Any = None) -> None:
        super().__init__(key_groups, max_parallelism, dirty_entries)
        self.name = name
        self.incremental = incremental
        self.storage = storage  # the job's CheckpointStorage: opens what restore fetches
        self._r = _rocksdict()
        self._opts, self._wopt = _options(), _write_options()
        self._work, self._lock_fd = _make_workdir(name, directory)
        self._db_path = os.path.join(self._work, "db")
        self._db = self._r.Rdict(self._db_path, self._opts)
        self._closed = False
        self._prefix = [_GROUP.pack(g) for g in range(max_parallelism)]
        self._clean_max = cache_entries
        self._enc_max = cache_entries + 2 * dirty_entries
        self._seq = 0
        # local SST file -> {"path", "size", "sha256"} in shared storage, for the files of the
        # last uploaded checkpoint (or of the restored snapshot); valid under _upload_base
        self._uploaded: dict[str, dict] = {}
        self._upload_base: str | None = None

    def __repr__(self) -> str:
        return f"RocksDBStateBackend({self.name!r}, {self._db_path!r})"

    @property
    def directory(self) -> str:
        return self._work

    # ------------------------------------------------------------------ access

    def _new_table(self, name: str) -> StateTable:
        new = _RocksTable(self, name)
        tables = [*self._tables.values(), new]
        for t in tables:  # the caches' bounds are shared out between the state names
            assert isinstance(t, _RocksTable)
            t.clean_max = max(1, self._clean_max // len(tables))
            t.enc_max = max(1, self._enc_max // len(tables))
        return new

    def _write(self, tables: list[StateTable]) -> None:
        """One write batch; what it writes becomes ``clean``."""
        wb = self._r.WriteBatch(raw_mode=True)
        dumps = pickle.dumps
        for t in tables:
            assert isinstance(t, _RocksTable)
            enc, clean, fast = t.encode, t.clean, t.fast
            for k in t.deleted:
                if k not in fast:
                    wb.delete(enc(k))
                    clean.pop(k, None)
            for k, v in fast.items():
                wb.put(enc(k), dumps(v, 5))
                clean[k] = v
        self._db.write(wb, self._wopt)
        for t in tables:
            assert isinstance(t, _RocksTable)
            if len(t.clean) > t.clean_max:
                t.evict()

    def _new_timers(self, name: str) -> RocksDBTimerQueue:
        return RocksDBTimerQueue(self, name)

    def put_group_value(self, name: str, value: Any) -> None:
        wb = self._r.WriteBatch(raw_mode=True)
        raw = pickle.dumps(value, 5)
        for g in self.key_groups:
            wb.put(encode_slot(g, name, b""), raw)
        self._db.write(wb, self._wopt)

    def group_values(self, name: str) -> list[Any]:
        out = []
        for g in self.key_groups:
            raw = self._db.get(encode_slot(g, name, b""))
            if raw is not None:
                out.append(pickle.loads(raw))
        return out

    def clean_step(self, name: str, fix: Callable[[Any], Any], budget: int) -> None:
        """Seeks where the last step stopped (the last entry visited) in each key group."""
        t = self.table(name)
        assert isinstance(t, _RocksTable)
        fast, deleted, clean = t.fast, t.deleted, t.clean
        groups = self.key_groups
        i, last = self._cursors.get(name) or (0, None)
        wb = self._r.WriteBatch(raw_mode=True)
        dumps, loads = pickle.dumps, pickle.loads
        while budget > 0 and i < len(groups):
            start = self._prefix[groups[i]] + t._part
            end = start + b"\xff"  # (an encoded key's first byte is a tag < 0xff)
            finished = True
            for entry, raw in scan(self._db, start if last is None else last, end):
                if entry == last:
                    continue
                if not entry.startswith(start):
                    break
                last = entry
                budget -= 1
                key = decode_key(entry[len(start):])
                if key not in fast and key not in deleted:
                    v = loads(raw)
                    new = fix(v)
                    if new is MISSING:
                        wb.delete(entry)
                        clean.pop(key, None)
                    elif new is not v:
                        wb.put(entry, dumps(new, 5))
                        clean.pop(key, None)
                if budget <= 0:
                    finished = False
                    break
            if finished:
                i, last = i + 1, None
        if len(wb):
            self._db.write(wb, self._wopt)
        if i < len(groups):
            self._cursors[name] = (i, last)
        else:
            self._cursors.pop(name, None)

    def keys(self) -> int:
        """Number of entries (reads the whole database: for tests and tools)."""
        self.spill()
        return sum(1 for _ in self._db.keys())

    def entries(self) -> Iterator[tuple[int, str, Any, Any]]:
        """Every ``(key group, state name, key, value)``, in key order."""
        self.spill()
        for k, v in self._db.items():
            g, name, key = decode_slot(k)
            yield g, name, key, pickle.loads(v)

    # ------------------------------------------------------------------ snapshots

    def snapshot(self) -> "RocksDBSnapshot":
        """The synchronous part: spill, then a RocksDB checkpoint (flush + hard links)."""
        self.spill()
        self._seq += 1
        path = os.path.join(self._work, f"chk-{self._seq}")
        self._r.Checkpoint(self._db).create_checkpoint(path)
        return RocksDBSnapshot(self, path)

    def restore(self, blobs: Iterable[bytes]) -> None:
        """Load the key groups this subtask owns from any number of snapshots (rescaling):
        RocksDB snapshots of this backend and in-memory ones (a job may switch backends)."""
        self._reset()
        manifests, memory = [], []
        for blob in blobs:
            if is_rocksdb_snapshot(blob):
                m = _manifest(blob)
                if _overlap(m, self.key_groups):
                    manifests.append(m)
            else:
                memory.append(blob)
        if manifests:
            base = max(manifests, key=lambda m: (_overlap(m, self.key_groups),
                                                 sum(f[2] for f in m["files"])))
            self._restore_base(base)
            for m in manifests:
                if m is not base:
                    self._copy_from(m)
        if memory:
            self._put_entries((encode_slot(g, name, key), pickle.dumps(v, 5))
                              for g, (name, key), v in iter_memory_entries(
                                  memory, self.key_groups, self.storage))
        self._restored()

    def _restore_base(self, m: dict) -> None:
        self._db.close()
        shutil.rmtree(self._db_path, ignore_errors=True)
        _download(m, self._db_path, self.storage)
        self._db = self._r.Rdict(self._db_path, self._opts)
        lo, hi = self.key_groups.start, self.key_groups.stop
        mlo, mhi = m["key_groups"]
        if mlo < lo:
            self._db.delete_range(_GROUP.pack(0), _GROUP.pack(lo), self._wopt)
        if mhi > hi:
            self._db.delete_range(_GROUP.pack(hi), _GROUP.pack(0xFFFF) + b"\xff", self._wopt)
        self._uploaded = {name: {"path": rel, "size": size, "sha256": sha}
                          for name, rel, size, sha in m["files"]}
        self._upload_base = m["base"]

    def _copy_from(self, m: dict) -> None:
        lo = max(self.key_groups.start, m["key_groups"][0])
        hi = min(self.key_groups.stop, m["key_groups"][1])
        tmp = os.path.join(self._work, f"restore-{uuid.uuid4().hex[:8]}")
        try:
            _download(m, tmp, self.storage)
            src = self._r.Rdict(tmp, self._opts)
            try:
                self._put_entries(_range_items(src, lo, hi))
            finally:
                src.close()
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _put_entries(self, items: Iterable[tuple[bytes, bytes]]) -> None:
        wb = self._r.WriteBatch(raw_mode=True)
        for k, v in items:
            wb.put(k, v)
            if len(wb) >= _BATCH:
                self._db.write(wb, self._wopt)
                wb = self._r.WriteBatch(raw_mode=True)
        if len(wb):
            self._db.write(wb, self._wopt)

    def close(self) -> None:
        """Close the database and remove the working directory."""
        if self._closed:
            return
        self._closed = True
        try:
            self._db.close()
        finally:
            shutil.rmtree(self._work, ignore_errors=True)
            os.close(self._lock_fd)


class _RocksTable(StateTable):
    """A state name's entries: ``fast`` (written since the last spill), ``clean`` (read
    from or spilled to the database; the oldest half dropped when full), then the
    database."""

    __slots__ = ("_backend", "clean", "clean_max", "_enc", "enc_max", "_part")

    def __init__(self, backend: RocksDBStateBackend, name: str) -> None:
        super().__init__(name)
        self._backend = backend
        self.clean: dict[Any, Any] = {}
        self._enc: dict[Any, bytes] = {}  # key -> its database key
        self.clean_max = self.enc_max = 1  # set by the backend: its bounds shared out
        self._part = encode_slot(0, name, None)[2:-1]  # the name's part of a database key

    def encode(self, key: Any) -> bytes:
        enc = self._enc
        data = enc.get(key)
        if data is None:
            b = self._backend
            data = b._prefix[b.owned_group(key)] + self._part + encode_key(key)
            if len(enc) >= self.enc_max:
                enc.clear()
            enc[key] = data
        return data

    def prime(self, keys: list, groups: Any, encoded: list[bytes]) -> None:
        """The database keys of ``keys`` from their key groups (``groups``, numpy) and
        :func:`~cutline.state.keys.encode_key` bytes (``encoded``), computed for many keys
        at once (``cutline.state.arrow_keys``): the next writes and reads of them do not
        build them one by one."""
        b = self._backend
        owned = b.key_groups
        if len(groups) and (int(groups.min()) < owned.start or
                            int(groups.max()) >= owned.stop):
            outside = (groups < owned.start) | (groups >= owned.stop)
            b.owned_group(keys[int(outside.argmax())])  # raises, naming the key
        pre, part = b._prefix, self._part
        self._enc.update(zip(keys, [pre[g] + part + e
                                    for g, e in zip(groups.tolist(), encoded)]))

    def read(self, key: Any, default: Any = None) -> Any:
        if self.deleted and key in self.deleted:
            return default
        v = self.clean.get(key, MISSING)
        if v is not MISSING:
            return v
        raw = self._backend._db.get(self.encode(key))
        if raw is None:
            return default
        v = pickle.loads(raw)
        clean = self.clean
        if len(clean) >= self.clean_max:
            self.evict()
        clean[key] = v
        return v

    def evict(self) -> None:
        clean = self.clean
        for key in list(itertools.islice(clean, len(clean) // 2 + 1)):
            del clean[key]

    def reset(self) -> None:
        super().reset()
        self.clean.clear()


class RocksDBSnapshot:
    """A taken snapshot whose files are not uploaded yet.

    :meth:`finish` (on an upload thread) uploads them and returns the operator's state blob;
    then :attr:`shared` lists the shared files it references and :attr:`uploaded` the bytes
    it uploaded.  The local checkpoint directory is removed by :meth:`finish`, or when the
    snapshot is dropped unfinished (an aborted checkpoint)."""

    def __init__(self, backend: RocksDBStateBackend, path: str) -> None:
        self._backend = backend
        self.path = path
        self.shared: dict[str, dict] = {}
        self.uploaded = 0
        self._cleanup = weakref.finalize(self, shutil.rmtree, path, True)

    def finish(self, storage: Any, checkpoint_id: int) -> bytes:
        b = self._backend
        try:
            base = storage.job_url
            known = b._uploaded if b.incremental and b._upload_base == base else {}
            files, inline, uploaded = [], {}, {}
            for name in sorted(os.listdir(self.path)):
                full = os.path.join(self.path, name)
                if not name.endswith(".sst"):
                    if not name.startswith("OPTIONS-"):  # 7 kB of text, rewritten on open
                        with open(full, "rb") as f:
                            inline[name] = f.read()
                    continue
                ref = known.get(name)
                if ref is None or ref["size"] != os.path.getsize(full):
                    info = storage.upload_shared(b.name, checkpoint_id, full)
                    self.uploaded += info["uploaded"]
                    ref = {"path": info["path"], "size": info["size"], "sha256": info["sha256"]}
                uploaded[name] = ref
                files.append([name, ref["path"], ref["size"], ref["sha256"]])
                self.shared[ref["path"]] = {"size": ref["size"], "sha256": ref["sha256"]}
            blob = MAGIC + msgpack.packb({
                "format": "cutline-rocksdb", "version": FORMAT_VERSION,
                "key_groups": [b.key_groups.start, b.key_groups.stop],
                "max_parallelism": b.max_parallelism, "base": base,
                "files": files, "inline": inline}, use_bin_type=True)
            # Only now: a failed upload must not make later checkpoints reuse its files.
            b._uploaded, b._upload_base = uploaded, base
            return blob
        finally:
            self._cleanup()

    @property
    def size(self) -> int:
        """Bytes of state this snapshot references (after :meth:`finish`)."""
        return sum(ref["size"] for ref in self.shared.values())


# ---------------------------------------------------------------------- snapshot files

#: A snapshot's bytes as a backend or a checkpoint file hands them over.
Blob = bytes | bytearray | memoryview


def is_rocksdb_snapshot(blob: Blob) -> bool:
    return bytes(blob[:len(MAGIC)]) == MAGIC


def _manifest(blob: Blob) -> dict:
    m = msgpack.unpackb(bytes(blob[len(MAGIC):]), raw=False)
    if m.get("version") != FORMAT_VERSION:
        raise ValueError(f"RocksDB state snapshot of unsupported version {m.get('version')!r}")
    return m


def _overlap(m: dict, groups: range) -> int:
    lo, hi = m["key_groups"]
    return max(0, min(hi, groups.stop) - max(lo, groups.start))


def _download(m: dict, dest: str, storage: Any = None) -> None:
    """The snapshot's files into the directory ``dest``, each verified by size and sha256."""
    from ..storage.checkpoints import fetch_shared

    os.makedirs(dest)
    for name, rel, size, sha in m["files"]:
        fetch_shared(m["base"], rel, os.path.join(dest, name), size, sha, storage=storage)
    for name, data in m["inline"].items():
        with open(os.path.join(dest, name), "wb") as f:
            f.write(data)


def _range_items(db: Any, lo: int, hi: int) -> Iterator[tuple[bytes, bytes]]:
    """Entries of key groups ``lo <= g < hi``."""
    end = _GROUP.pack(hi) if hi <= 0xFFFF else None
    for k, v in db.items(from_key=_GROUP.pack(lo)):
        if end is not None and k >= end:
            return
        yield k, v


def read_entries(blob: Blob, key_groups: range | None = None, storage: Any = None
                 ) -> Iterator[tuple[int, tuple[str, Any], Any]]:
    """``(key group, (state name, key), value)`` of a RocksDB snapshot, for the given key
    groups (default: all it holds).  The in-memory backend restores RocksDB snapshots with
    it, and tools read checkpoints with it."""
    m = _manifest(blob)
    if key_groups is None:
        key_groups = range(*m["key_groups"])
    if not _overlap(m, key_groups):
        return
    r = _rocksdict()
    tmp = tempfile.mkdtemp(prefix="cutline-read-")
    try:
        _download(m, os.path.join(tmp, "db"), storage)
        db = r.Rdict(os.path.join(tmp, "db"), _options())
        try:
            for k, v in _range_items(db, key_groups.start, key_groups.stop):
                g, name, key = decode_slot(k)
                yield g, (name, key), pickle.loads(v)
        finally:
            db.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
