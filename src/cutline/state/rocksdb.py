"""Keyed state in an embedded RocksDB (``rocksdict``) on local disk, checkpointed
incrementally.

Layout: one database per keyed operator subtask, in a working directory of its own under
``$SPARK_LOCAL_DIRS`` (its first entry) or the system temp directory, removed on
:meth:`~RocksDBStateBackend.close` (and, after a ``kill -9``, by the next backend created on
that machine: a directory whose lock nobody holds is stale).  Entries are keyed by
:func:`cutline.state.keys.encode_slot`: key group first, so a key-group range is one range
of the key space.  Values are pickled.  The write-ahead log is off: after a failure the
job restores a checkpoint, never the local database.

In front of the database sit two bounded dicts, so hot keys cost a dict lookup:

* ``dirty``: entries written since the last spill (``_DELETED`` marks a delete), and
* ``clean``: entries read from or spilled to the database (the oldest half is dropped
  when it is full).

A read looks in ``dirty``, then ``clean``, then the database.  ``dirty`` is written to the
database in one batch when it passes its bound and at every snapshot.  List and map state
are stored whole (one entry each) and count as written whenever a function asks for them;
a value-state object changed in place without ``update()`` is not written back (as in
Flink's RocksDB backend: state values are copies).

Snapshots (Flink's asynchronous incremental checkpoints):

* synchronous part, :meth:`~RocksDBStateBackend.snapshot`: spill ``dirty`` (bounded) and
  create a RocksDB checkpoint (flush the memtable, hard-link the SST files into a local
  directory);
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
from collections.abc import Iterable, Iterator
from typing import Any

import msgpack

from ..plan import key_group
from .keys import decode_slot, encode_key, encode_slot

__all__ = ["RocksDBStateBackend", "RocksDBSnapshot", "is_rocksdb_snapshot", "read_entries"]

log = logging.getLogger(__name__)

MAGIC = b"cutline-rocksdb\x00"
FORMAT_VERSION = 1
_MISSING = object()
_DELETED = object()  # a delete waiting in ``dirty``
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


class RocksDBStateBackend:
    """State of one keyed operator subtask in RocksDB; the same role (and, with
    :meth:`get` / :meth:`put` / :meth:`delete`, the same interface) as
    :class:`~cutline.state.memory.MemoryStateBackend`.

    ``name`` names the working directory and the shared files (``<operator uid>.<subtask>``).
    ``cache_entries`` bounds ``clean`` and ``dirty_entries`` bounds ``dirty`` (what a snapshot
    writes to the database in its synchronous part).  ``incremental=False``
    uploads every file at every checkpoint (a full checkpoint; for comparison).
    ``directory``: where working directories go (default: see the module docstring).
    ``storage``: the job's checkpoint storage, to fetch a restored snapshot's files with
    its filesystem options (without it, the snapshot's URL is opened as it is).
    """

    complete_tables = False  # table() is a write-back cache, not the whole state

    def __init__(self, key_groups: range, max_parallelism: int, *, name: str = "state",
                 directory: str | None = None, cache_entries: int = 100_000,
                 dirty_entries: int = 20_000, incremental: bool = True,
                 storage: Any = None) -> None:
        self.key_groups = key_groups
        self.max_parallelism = max_parallelism
        self.name = name
        self.incremental = incremental
        self.storage = storage  # the job's CheckpointStorage: opens what restore fetches
        self._r = _rocksdict()
        self._opts, self._wopt = _options(), _write_options()
        self._work, self._lock_fd = _make_workdir(name, directory)
        self._db_path = os.path.join(self._work, "db")
        self._db = self._r.Rdict(self._db_path, self._opts)
        self._closed = False
        self.dirty: dict[tuple[str, Any], Any] = {}
        self._clean: dict[tuple[str, Any], Any] = {}
        self._enc: dict[tuple[str, Any], bytes] = {}  # slot -> its database key
        self._names: dict[str, bytes] = {}  # state name -> its part of a database key
        self._prefix = [_GROUP.pack(g) for g in range(max_parallelism)]
        self._dirty_max, self._clean_max = dirty_entries, cache_entries
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

    def table(self, key: Any) -> dict:
        """The dict that takes writes (``dirty``); reads that miss it go to :meth:`load`."""
        return self.dirty

    def _encode(self, slot: tuple[str, Any]) -> bytes:
        enc = self._enc
        try:
            return enc[slot]
        except KeyError:
            pass
        name, key = slot
        g = key_group(key, self.max_parallelism)
        if g not in self.key_groups:
            raise RuntimeError(f"key {key!r} (key group {g}) is not owned by this subtask "
                               f"(groups {self.key_groups.start}..{self.key_groups.stop - 1})")
        part = self._names.get(name)
        if part is None:
            part = self._names[name] = encode_slot(0, name, None)[2:-1]
        data = self._prefix[g] + part + encode_key(key)
        if len(enc) >= self._enc_max:
            enc.clear()
        enc[slot] = data
        return data

    def load(self, slot: tuple[str, Any], default: Any = None) -> Any:
        """``slot``'s value from ``clean`` or the database (not from ``dirty``)."""
        v = self._clean.get(slot, _MISSING)
        if v is not _MISSING:
            return v
        raw = self._db.get(self._encode(slot))
        if raw is None:
            return default
        v = pickle.loads(raw)
        clean = self._clean
        if len(clean) >= self._clean_max:
            self._evict()
        clean[slot] = v
        return v

    def get(self, name: str, key: Any, default: Any = None) -> Any:
        slot = (name, key)
        v = self.dirty.get(slot, _MISSING)
        if v is _MISSING:
            return self.load(slot, default)
        return default if v is _DELETED else v

    def put(self, name: str, key: Any, value: Any) -> None:
        self.dirty[(name, key)] = value

    def delete(self, name: str, key: Any) -> None:
        self.dirty[(name, key)] = _DELETED

    def mutable(self, slot: tuple[str, Any], factory: type) -> Any:
        """A list / dict state object: created if absent, and dirty from now on (the
        caller may change it in place)."""
        dirty = self.dirty
        v = dirty.get(slot, _MISSING)
        if v is _MISSING:
            v = self.load(slot, _MISSING)
            dirty[slot] = v = factory() if v is _MISSING else v
        elif v is _DELETED:
            dirty[slot] = v = factory()
        return v

    def value_state(self, name: str, key: Any, default: Any) -> "ValueState":
        return ValueState(self, (name, key), default)

    def after_batch(self) -> None:
        if len(self.dirty) > self._dirty_max:
            self.spill()

    def spill(self) -> None:
        """Write ``dirty`` to the database in one batch; it becomes ``clean``."""
        dirty = self.dirty
        if not dirty:
            return
        wb = self._r.WriteBatch(raw_mode=True)
        enc, dumps, clean = self._encode, pickle.dumps, self._clean
        for slot, v in dirty.items():
            if v is _DELETED:
                wb.delete(enc(slot))
                clean.pop(slot, None)
            else:
                wb.put(enc(slot), dumps(v, 5))
                clean[slot] = v
        self._db.write(wb, self._wopt)
        dirty.clear()
        if len(clean) > self._clean_max:
            self._evict()

    def _evict(self) -> None:
        clean = self._clean
        for slot in list(itertools.islice(clean, len(clean) // 2 + 1)):
            del clean[slot]

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
        self.dirty.clear()
        self._clean.clear()
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
            from .memory import iter_memory_entries

            self._put_entries((encode_slot(g, name, key), pickle.dumps(v, 5))
                              for g, (name, key), v in iter_memory_entries(memory)
                              if g in self.key_groups)

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


class ValueState:
    """One value per key over a :class:`RocksDBStateBackend`: ``.value``, ``.update(v)``,
    ``.clear()``."""

    __slots__ = ("_backend", "_slot", "_default")

    def __init__(self, backend: RocksDBStateBackend, slot: tuple[str, Any], default: Any):
        self._backend, self._slot, self._default = backend, slot, default

    @property
    def value(self) -> Any:
        b = self._backend
        v = b.dirty.get(self._slot, _MISSING)
        if v is _MISSING:
            return b.load(self._slot, self._default)
        return self._default if v is _DELETED else v

    def update(self, value: Any) -> None:
        self._backend.dirty[self._slot] = value

    def clear(self) -> None:
        self._backend.dirty[self._slot] = _DELETED


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

def is_rocksdb_snapshot(blob: bytes) -> bool:
    return bytes(blob[:len(MAGIC)]) == MAGIC


def _manifest(blob: bytes) -> dict:
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


def read_entries(blob: bytes, key_groups: range | None = None, storage: Any = None
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
