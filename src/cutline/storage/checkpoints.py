"""Checkpoint storage over fsspec URLs: layout, ``_metadata`` written last, retention.

Layout under ``<root>/<job>/``::

    chk-<id>/<task>.state                 one file per task, written by the task
    chk-<id>/_metadata                    written last: the commit point
    savepoint-<id>-<suffix>/...           same format, never deleted by retention
    shared/<owner>/<id>-<sha256><ext>     immutable files shared between checkpoints
                                          (RocksDB SST files of incremental checkpoints,
                                          the in-memory backend's full and delta files)

A directory without a valid ``_metadata`` is not a checkpoint (partial, in progress or
abandoned).  ``_metadata`` is msgpack: an envelope ``{format, version, sha256, body}`` whose
``body`` (msgpack again) lists every state file with its size and sha256, plus the caller's
metadata.  It is written to a temporary name and renamed where rename is atomic (local,
HDFS); on object stores (s3, gcs, ...) it is written directly, and the single object
appearing is the commit point.  Never pickle: a checkpoint must not run code when read.

Shared files are uploaded once (:meth:`CheckpointStorage.upload_shared`) and referenced by
every checkpoint that still needs them: each ``_metadata`` lists the shared files it
references, with size and sha256, so a checkpoint is restorable on its own and the
reference counts are a function of the ``_metadata`` files present (no refcount file to
keep in sync; :meth:`CheckpointStorage.shared_references` rebuilds them after a restart).
Retention deletes a shared file when no completed checkpoint or savepoint references it
and the checkpoint it was uploaded for (the ``<id>`` in its name) is not newer than the
newest completed checkpoint.  Why that is safe while newer checkpoints are still uploading:
a task reuses only files of its own live database, and a file live at checkpoints ``k`` and
``p`` is live at every checkpoint between them, so the newest completed one (retained)
references it; files uploaded for checkpoints newer than it are never touched.  The
in-memory backend's chains keep the same invariant: a delta or full file belongs to every
snapshot of its subtask from the one whose changes it holds to the next full one.

The module is longer than most on purpose: layout, the commit point, verification,
shared-file references and retention are one set of invariants over one directory tree
(what a ``_metadata`` lists is exactly what retention keeps and a restore verifies), so
they are read together.  What a task's state file holds is :mod:`cutline.storage.schema`.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from typing import Any

import fsspec
import msgpack
from fsspec.core import url_to_fs

from .fs import check_storage_options, describe_open_error, scheme as _scheme
from .fs import url_to_fs as _open_url

__all__ = [
    "CheckpointHandle", "CheckpointNotFoundError", "CheckpointStorage", "CheckpointStorageError",
    "CorruptCheckpointError",
]

log = logging.getLogger(__name__)

METADATA = "_metadata"
SHARED = "shared"
FORMAT, VERSION = "cutline-checkpoint", 1
_CHUNK = 4 << 20
_ATOMIC_RENAME = {"file", "local", "hdfs", "viewfs", "memory"}
_CHK = re.compile(r"chk-(\d+)\Z")
_SAVEPOINT = re.compile(r"savepoint-(\d+)-[0-9A-Za-z_.-]+\Z")
# shared/<owner>/<id>-<sha256><ext>, and the temporary .<id>-<uuid>.tmp of an upload
_SHARED_FILE = re.compile(r"(\d+)-([0-9a-f]{64})(\.[A-Za-z0-9]{1,16})?\Z")
_SHARED_TMP = re.compile(r"\.(\d+)-[0-9a-f]{32}\.tmp\Z")


class CheckpointStorageError(Exception):
    """Checkpoint storage is unusable, or an operation on it is refused."""


class CheckpointNotFoundError(CheckpointStorageError):
    """No completed checkpoint there: missing, or partial (no ``_metadata``)."""


class CorruptCheckpointError(CheckpointStorageError):
    """A checkpoint's ``_metadata`` or state file fails verification; the message names it."""


def _name(kind: str, value: str) -> str:
    if (not isinstance(value, str) or not value or value in {".", ".."}
            or any(c in value for c in "/\\\0")):
        raise ValueError(f"{kind} must be a non-empty name without '/', '\\' or NUL, got {value!r}")
    return value


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _pack(obj: Any, what: str) -> bytes:
    try:
        return msgpack.packb(obj, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as e:
        raise TypeError(f"{what} must be msgpack-serialisable (dict/list/str/bytes/int/float/"
                        f"bool/None): {e}") from None


def _is_local(fs: fsspec.AbstractFileSystem) -> bool:
    protocols = {fs.protocol} if isinstance(fs.protocol, str) else set(fs.protocol)
    return "file" in protocols or "local" in protocols


def _write(fs: fsspec.AbstractFileSystem, path: str, data: bytes, *, atomic: bool) -> None:
    """Write ``path`` (durably on local disks: fsync file and directory)."""
    protocols = {fs.protocol} if isinstance(fs.protocol, str) else set(fs.protocol)
    renames = atomic and bool(protocols & _ATOMIC_RENAME)
    parent, base = path.rsplit("/", 1)
    target = f"{parent}/.{base}.{uuid.uuid4().hex}.tmp" if renames else path
    if _is_local(fs):
        with open(target, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if renames:
            os.replace(target, path)
        dir_fd = os.open(parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        return
    fs.pipe_file(target, data)
    if renames:
        fs.mv(target, path)


def _cause(exc: BaseException) -> str:
    """One line: the exception's type and the first line of its message (an OSError's
    without the file name: the caller names the file)."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{type(exc).__name__}: [Errno {exc.errno}] {exc.strerror}"
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def _file_sha256(path: str) -> tuple[int, str]:
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def _fs_sha256(fs: fsspec.AbstractFileSystem, path: str) -> tuple[int, str]:
    digest, size = hashlib.sha256(), 0
    with fs.open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def fetch_shared(base_url: str, rel: str, dest: str, size: int, sha256: str, *,
                 storage: "CheckpointStorage | None" = None, label: str = "") -> int:
    """Copy shared file ``rel`` of the job directory ``base_url`` to the local path ``dest``,
    verifying size and sha256 as it streams; :class:`CorruptCheckpointError` names the file.
    ``storage``: the job's storage, whose filesystem (and options, for a URL of the same
    scheme) open ``base_url``.  Returns the bytes copied."""
    if storage is not None and base_url == storage.job_url:
        fs, base = storage.fs, storage.dir
    else:
        opts = None  # a URL of the storage's scheme opens with its options
        if storage is not None and _scheme(base_url) == _scheme(storage.url):
            opts = storage.storage_options
        fs, base = _open_url(base_url, opts)
    where = f"shared file {rel}" + (f" referenced by {label}" if label else "")
    digest, got = hashlib.sha256(), 0
    try:
        with fs.open(f"{base.rstrip('/')}/{rel}", "rb") as src, open(dest, "wb") as out:
            while chunk := src.read(_CHUNK):
                digest.update(chunk)
                out.write(chunk)
                got += len(chunk)
    except FileNotFoundError:
        raise CorruptCheckpointError(f"missing {where} ({base_url}/{rel})") from None
    if got != size:
        raise CorruptCheckpointError(f"size mismatch in {where}: expected {size} bytes, "
                                     f"found {got}")
    if digest.hexdigest() != sha256:
        raise CorruptCheckpointError(f"checksum mismatch in {where}: expected sha256 "
                                     f"{sha256[:12]}..., got {digest.hexdigest()[:12]}...")
    return got


def _check_file(where: str, info: dict, size: int | None, sha: str) -> None:
    """A state or shared file against the size and sha256 its ``_metadata`` lists."""
    if size != info["size"]:
        raise CorruptCheckpointError(
            f"size mismatch in {where}: expected {info['size']} bytes, found {size}")
    if sha != info["sha256"]:
        raise CorruptCheckpointError(
            f"checksum mismatch in {where}: expected sha256 {info['sha256'][:12]}..., "
            f"got {sha[:12]}...")


class CheckpointHandle:
    """A completed checkpoint or savepoint whose ``_metadata`` verified."""

    def __init__(self, fs: fsspec.AbstractFileSystem, path: str, label: str, body: dict) -> None:
        self._fs, self._path, self._label = fs, path, label
        self.id: int = body["id"]
        self.is_savepoint: bool = body["savepoint"]
        self.job: str = body["job"]
        self.metadata: dict = body["metadata"]
        self.states: dict[str, dict] = body["states"]  # task -> {file, size, sha256}
        # shared file (relative to the job directory) -> {size, sha256}
        self.shared: dict[str, dict] = body.get("shared") or {}
        self.path: str = fs.unstrip_protocol(path)
        self._job_dir = path.rstrip("/").rsplit("/", 1)[0]

    def __repr__(self) -> str:
        return f"CheckpointHandle({self.path!r}, id={self.id}, savepoint={self.is_savepoint})"

    @property
    def tasks(self) -> list[str]:
        return sorted(self.states)

    def read_task_state(self, task: str) -> bytes:
        info = self._info(task)
        try:
            data = self._fs.cat_file(f"{self._path}/{info['file']}")
        except FileNotFoundError:
            raise CorruptCheckpointError(
                f"missing state file {self._label}/{info['file']}") from None
        self._check(info, len(data), _sha256(data))
        return data

    def state_path(self, task: str) -> str:
        """The URL of ``task``'s state file (what errors about its content name)."""
        return f"{self.path}/{self._info(task)['file']}"

    def verify(self, *, deep: bool = True) -> None:
        """Check every state file and every shared file it references: size and sha256
        (``deep``, reads them all) or size only."""
        sizes: dict[str, int] = {}
        try:
            for entry in self._fs.ls(self._path, detail=True):
                sizes[entry["name"].rstrip("/").rsplit("/", 1)[-1]] = entry.get("size")
        except FileNotFoundError:
            pass
        for task in self.tasks:
            info = self.states[task]
            if info["file"] not in sizes:
                raise CorruptCheckpointError(f"missing state file {self._label}/{info['file']}")
            if not deep:
                self._check(info, sizes[info["file"]], info["sha256"])
                continue
            size, sha = _fs_sha256(self._fs, f"{self._path}/{info['file']}")
            self._check(info, size, sha)
        if self.shared:
            self._verify_shared(deep)

    def _verify_shared(self, deep: bool) -> None:
        sizes = {}
        try:
            for entry in self._fs.find(f"{self._job_dir}/{SHARED}", detail=True).values():
                sizes[self._fs._strip_protocol(entry["name"]).rstrip("/")] = entry.get("size")
        except FileNotFoundError:
            pass
        for rel, info in sorted(self.shared.items()):
            full = f"{self._job_dir}/{rel}"
            where = f"shared file {rel} referenced by {self._label}"
            if full not in sizes:
                raise CorruptCheckpointError(f"missing {where}")
            size, sha = (sizes[full], info["sha256"]) if not deep else \
                _fs_sha256(self._fs, full)
            _check_file(where, info, size, sha)

    def _info(self, task: str) -> dict:
        try:
            return self.states[task]
        except KeyError:
            raise KeyError(f"task {task!r} has no state in {self._label} "
                           f"(tasks: {', '.join(self.tasks) or 'none'})") from None

    def _check(self, info: dict, size: int | None, sha: str) -> None:
        _check_file(f"{self._label}/{info['file']}", info, size, sha)


class CheckpointStorage:
    """Checkpoints and savepoints of one job under a URL (``file://``, a path, ``s3://`` ...).

    Tasks call :meth:`write_task_state`; the coordinator's driver calls :meth:`commit` with
    the collected results, then :meth:`retain`.  On restart, :meth:`latest` or :meth:`open`.
    """

    def __init__(self, url: str, job: str, storage_options: Mapping[str, Any] | None = None,
                 *, read_only: bool = False) -> None:
        """``storage_options``: keyword arguments of the fsspec filesystem (for ``s3://``:
        ``endpoint_url``, ``key``, ``secret``, ``client_kwargs`` ...), also used to open
        checkpoint URLs of the same scheme given to :meth:`open`.  ``read_only``: for tools
        that only look (``cutline checkpoints list``, ``cutline savepoint``): nothing is
        created or written, and a missing job directory is an error."""
        self.url, self.job = url, _name("job", job)
        self.storage_options = check_storage_options(storage_options,
                                                     "checkpoint storage_options")
        try:
            self.fs, root = _open_url(url, self.storage_options)
        except ImportError as e:
            raise ImportError(f"checkpoint storage URL {url!r} needs an extra package: "
                              f"{describe_open_error(url, e)}") from e
        except ValueError as e:
            scheme = url.split("://", 1)[0] if "://" in url else "?"
            raise ValueError(f"checkpoint storage URL {url!r}: no fsspec implementation for "
                             f"scheme {scheme!r} ({e})") from None
        except Exception as e:  # e.g. hdfs without a JVM: a page of dlopen errors
            raise CheckpointStorageError(f"cannot open checkpoint storage {url!r}: "
                                         f"{describe_open_error(url, e)}") from e
        self.root = root.rstrip("/") or "/"
        self.dir = f"{self.root.rstrip('/')}/{job}"
        if read_only:
            self._check_exists()
        else:
            self._check_writable()

    def __repr__(self) -> str:
        return f"CheckpointStorage({self.url!r}, job={self.job!r})"

    def _check_exists(self) -> None:
        try:
            found = self.fs.isdir(self.dir)
            root = found or self.fs.isdir(self.root)
        except Exception as e:  # noqa: BLE001 - unreachable: say so in one line
            raise CheckpointStorageError(f"cannot read checkpoint storage {self.url!r}: "
                                         f"{describe_open_error(self.url, e)}") from e
        if found:
            return
        if not root:
            raise CheckpointNotFoundError(
                f"checkpoint storage {self.url!r} does not exist (no directory "
                f"{self.fs.unstrip_protocol(self.root)})")
        jobs = sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in self._ls_names(self.root))
        raise CheckpointNotFoundError(
            f"no job {self.job!r} in checkpoint storage {self.url!r}"
            + (f" (jobs there: {', '.join(jobs)})" if jobs else " (it holds no jobs)"))

    def _ls_names(self, directory: str) -> list[str]:
        try:
            return [e["name"] for e in self.fs.ls(directory, detail=True)
                    if e.get("type") == "directory"]
        except FileNotFoundError:
            return []

    def _check_writable(self) -> None:
        for path, what in ((self.root, "root"), (self.dir, "job directory")):
            if self.fs.isfile(path):
                raise CheckpointStorageError(
                    f"checkpoint storage {what} {self.fs.unstrip_protocol(path)!r} (from URL "
                    f"{self.url!r}) is a file, not a directory")
        probe = f"{self.dir}/.probe-{uuid.uuid4().hex}"
        try:
            self.fs.makedirs(self.dir, exist_ok=True)
            self.fs.pipe_file(probe, b"")
            self.fs.rm_file(probe)
        except Exception as e:
            raise CheckpointStorageError(
                f"checkpoint storage URL {self.url!r} is not writable "
                f"({type(e).__name__}: {e})") from e

    @contextmanager
    def _writing(self, path: str, what: str, final: str | None = None) -> Iterator[None]:
        """Whatever fails while writing ``path`` (a full disk, an upload cut short, an
        object store's 5xx) becomes a :class:`CheckpointStorageError` naming the file's URL
        and the cause; what was written of it is deleted (best effort: a partial file is
        never listed by a ``_metadata``, so no restore reads it either way)."""
        try:
            yield
        except CheckpointStorageError:
            raise
        except Exception as exc:
            for leftover in {path, final or path}:
                with suppress(Exception):
                    self.fs.rm_file(leftover)
            url = self.fs.unstrip_protocol(final or path)
            raise CheckpointStorageError(
                f"cannot write {what} {url} to checkpoint storage {self.url!r}: "
                f"{_cause(exc)}") from exc

    # ------------------------------------------------------------------ layout

    def _dirname(self, checkpoint_id: int, savepoint: bool) -> str:
        if type(checkpoint_id) is not int or checkpoint_id < 0:
            raise ValueError(f"checkpoint id must be an integer >= 0, got {checkpoint_id!r}")
        if not savepoint:
            return f"chk-{checkpoint_id}"
        # Every process must find the same directory without talking: derive the suffix.
        suffix = _sha256(f"{self.job}/{checkpoint_id}".encode())[:8]
        return f"savepoint-{checkpoint_id}-{suffix}"

    def _entries(self) -> dict[str, str]:
        """Directory name -> path of every entry in the job directory."""
        try:
            listing = self.fs.ls(self.dir, detail=False)
        except FileNotFoundError:
            return {}
        return {p.rstrip("/").rsplit("/", 1)[-1]: p.rstrip("/") for p in listing}

    def _checkpoint_dirs(self) -> dict[int, str]:
        return {int(m.group(1)): p for name, p in self._entries().items()
                if (m := _CHK.match(name))}

    # ------------------------------------------------------------------ writing

    def write_task_state(
        self, checkpoint_id: int, task: str, data: bytes, *, savepoint: bool = False
    ) -> dict:
        """Write ``task``'s state; returns ``{"path", "size", "sha256"}`` to acknowledge with."""
        file = f"{_name('task', task)}.state"
        directory = f"{self.dir}/{self._dirname(checkpoint_id, savepoint)}"
        if self.fs.exists(f"{directory}/{METADATA}"):
            raise CheckpointStorageError(
                f"{self.fs.unstrip_protocol(directory)} is committed; refusing to change it")
        data = bytes(data)
        with self._writing(f"{directory}/{file}", "state file"):
            self.fs.makedirs(directory, exist_ok=True)
            _write(self.fs, f"{directory}/{file}", data, atomic=False)
        return {"path": self.fs.unstrip_protocol(f"{directory}/{file}"),
                "size": len(data), "sha256": _sha256(data)}

    def commit(
        self,
        checkpoint_id: int,
        metadata: dict,
        *,
        savepoint: bool = False,
        states: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> str:
        """Write ``_metadata`` last and atomically; returns the checkpoint's path.

        ``states``: task -> the dict its :meth:`write_task_state` returned (what the
        coordinator's ``Complete.stats_by_task`` carries).  They are checked against the
        files present (existence and size).  Without it every ``*.state`` file in the
        directory is read and hashed.

        ``savepoint``: commit it as a savepoint, in its own directory that retention never
        deletes.  Tasks write a savepoint's states under ``chk-<id>`` (a barrier does not
        say whether it is a savepoint's): those files move into the savepoint's directory
        first, and ``chk-<id>`` is removed once the savepoint is committed.
        """
        name = self._dirname(checkpoint_id, savepoint)
        directory = f"{self.dir}/{name}"
        if self.fs.exists(f"{directory}/{METADATA}"):
            raise CheckpointStorageError(f"{name} of job {self.job!r} is already committed")
        promoted = self._promote(checkpoint_id, directory) if savepoint else None
        present = {e["name"].rstrip("/").rsplit("/", 1)[-1]: e.get("size")
                   for e in self._ls(directory) if e["name"].endswith(".state")}
        if states is None:
            states = {}
            for file in present:
                data = self.fs.cat_file(f"{directory}/{file}")
                states[file[: -len(".state")]] = {"size": len(data), "sha256": _sha256(data)}
        table: dict[str, dict] = {}
        for task, info in states.items():
            file = f"{_name('task', task)}.state"
            if file not in present:
                raise CheckpointStorageError(f"cannot commit {name}: missing state file {file}")
            if present[file] is not None and present[file] != info["size"]:
                raise CheckpointStorageError(
                    f"cannot commit {name}: {file} has {present[file]} bytes, "
                    f"acknowledged {info['size']}")
            table[task] = {"file": file, "size": int(info["size"]), "sha256": str(info["sha256"])}
        shared = self._check_shared(name, states)
        body = _pack({"id": checkpoint_id, "job": self.job, "savepoint": savepoint,
                      "states": table, "shared": shared, "metadata": metadata},
                     "checkpoint metadata")
        envelope = _pack({"format": FORMAT, "version": VERSION, "sha256": _sha256(body),
                          "body": body}, "envelope")
        with self._writing(f"{directory}/{METADATA}", "checkpoint metadata"):
            self.fs.makedirs(directory, exist_ok=True)
            _write(self.fs, f"{directory}/{METADATA}", envelope, atomic=True)
        if promoted is not None:
            self.fs.rm(promoted, recursive=True)
        return self.fs.unstrip_protocol(directory)

    def _promote(self, checkpoint_id: int, directory: str) -> str | None:
        """Move the state files tasks wrote under ``chk-<id>`` into the savepoint
        ``directory``; returns the emptied ``chk-<id>`` (None: there was none)."""
        source = f"{self.dir}/{self._dirname(checkpoint_id, False)}"
        files = [e for e in self._ls(source) if e["name"].rstrip("/").endswith(".state")]
        if not files:
            return None
        if self.fs.exists(f"{source}/{METADATA}"):
            raise CheckpointStorageError(
                f"cannot commit savepoint {checkpoint_id} of job {self.job!r}: chk-"
                f"{checkpoint_id} is a committed checkpoint")
        self.fs.makedirs(directory, exist_ok=True)
        for entry in files:
            path = entry["name"].rstrip("/")
            self.fs.mv(path, f"{directory}/{path.rsplit('/', 1)[-1]}")
        return source

    def _check_shared(self, name: str, states: Mapping[str, Mapping[str, Any]]) -> dict:
        shared: dict[str, dict] = {}
        for info in states.values():
            for rel, ref in (info.get("shared") or {}).items():
                parts = rel.split("/")
                if len(parts) != 3 or parts[0] != SHARED or not _SHARED_FILE.match(parts[2]):
                    raise CheckpointStorageError(f"cannot commit {name}: {rel!r} is not a "
                                                 f"shared file name")
                shared[rel] = {"size": int(ref["size"]), "sha256": str(ref["sha256"])}
        if shared:
            present = self._shared_files()
            for rel, ref in sorted(shared.items()):
                if rel not in present:
                    raise CheckpointStorageError(f"cannot commit {name}: missing shared file "
                                                 f"{rel}")
                if present[rel] is not None and present[rel] != ref["size"]:
                    raise CheckpointStorageError(
                        f"cannot commit {name}: shared file {rel} has {present[rel]} bytes, "
                        f"acknowledged {ref['size']}")
        return shared

    # ------------------------------------------------------------------ shared files

    @property
    def job_url(self) -> str:
        """The job directory as a URL: shared file paths are relative to it."""
        return self.fs.unstrip_protocol(self.dir)

    def upload_shared(self, owner: str, checkpoint_id: int, local_path: str) -> dict:
        """Copy the immutable local file ``local_path`` to ``shared/<owner>/`` under a name
        made of ``checkpoint_id`` (the checkpoint it is uploaded for) and its sha256.

        Returns ``{"path", "size", "sha256", "uploaded"}``: ``path`` relative to the job
        directory (what ``_metadata`` lists), ``uploaded`` the bytes written (0 when the same
        file was there already)."""
        size, sha = _file_sha256(local_path)
        return self._put_shared(owner, checkpoint_id, os.path.splitext(local_path)[1], size,
                                sha, local_path=local_path)

    def upload_shared_bytes(self, owner: str, checkpoint_id: int, data: bytes,
                            ext: str = "") -> dict:
        """:meth:`upload_shared` of bytes held in memory (the in-memory state backend's
        incremental snapshots)."""
        return self._put_shared(owner, checkpoint_id, ext, len(data), _sha256(data),
                                data=data)

    def _put_shared(self, owner: str, checkpoint_id: int, ext: str, size: int, sha: str, *,
                    local_path: str | None = None, data: bytes | None = None) -> dict:
        if type(checkpoint_id) is not int or checkpoint_id < 0:
            raise ValueError(f"checkpoint id must be an integer >= 0, got {checkpoint_id!r}")
        if ext and not re.fullmatch(r"\.[A-Za-z0-9]{1,16}", ext):
            ext = ""
        rel = f"{SHARED}/{_name('owner', owner)}/{checkpoint_id}-{sha}{ext}"
        path = f"{self.dir}/{rel}"
        parent = path.rsplit("/", 1)[0]
        try:
            if self.fs.size(path) == size:  # content-addressed: the same bytes are there
                return {"path": rel, "size": size, "sha256": sha, "uploaded": 0}
        except FileNotFoundError:
            pass
        tmp = f"{parent}/.{checkpoint_id}-{uuid.uuid4().hex}.tmp"
        local = _is_local(self.fs)
        with self._writing(tmp if local else path, "shared file", final=path):
            self.fs.makedirs(parent, exist_ok=True)
            if local:
                with open(tmp, "wb") as out:
                    if data is not None:
                        out.write(data)
                    else:
                        assert local_path is not None
                        with open(local_path, "rb") as src:
                            while chunk := src.read(_CHUNK):
                                out.write(chunk)
                    out.flush()
                    os.fsync(out.fileno())
                os.replace(tmp, path)
            elif data is not None:  # object stores: the object appearing is atomic
                self.fs.pipe_file(path, data)
            else:
                self.fs.put_file(local_path, path)
        return {"path": rel, "size": size, "sha256": sha, "uploaded": size}

    def _shared_files(self) -> dict[str, int | None]:
        """Every file under ``shared/`` (relative path -> size), temporary ones included."""
        base = f"{self.dir}/{SHARED}"
        try:
            found = self.fs.find(base, detail=True)
        except FileNotFoundError:
            return {}
        out = {}
        for entry in found.values():
            name = self.fs._strip_protocol(entry["name"]).rstrip("/")
            if name.startswith(base + "/"):
                out[f"{SHARED}/{name[len(base) + 1:]}"] = entry.get("size")
        return out

    def shared_references(self) -> dict[str, int]:
        """Reference counts of shared files: how many completed checkpoints and savepoints
        list each in their ``_metadata`` (rebuilt from them, nothing else is stored)."""
        counts: dict[str, int] = {}
        for handle in self._handles(savepoints=True):
            for rel in handle.shared:
                counts[rel] = counts.get(rel, 0) + 1
        return counts

    def _handles(self, *, savepoints: bool) -> list[CheckpointHandle]:
        out = []
        for name, path in sorted(self._entries().items()):
            if _CHK.match(name) or (savepoints and _SAVEPOINT.match(name)):
                try:
                    out.append(self._load(path, name))
                except CheckpointStorageError:
                    continue
        return out

    def _sweep_shared(self, newest: int | None) -> list[str]:
        """Delete shared files no completed checkpoint or savepoint references, uploaded for
        checkpoints up to ``newest`` (``None``: any).  Returns the deleted paths."""
        files = self._shared_files()
        if not files:
            return []
        referenced = self.shared_references()
        doomed = []
        for rel in files:
            if rel in referenced:
                continue
            base = rel.rsplit("/", 1)[-1]
            m = _SHARED_FILE.match(base) or _SHARED_TMP.match(base)
            if m is None:
                continue  # not ours
            if newest is None or int(m.group(1)) <= newest:
                doomed.append(rel)
        for rel in doomed:
            try:
                self.fs.rm_file(f"{self.dir}/{rel}")
            except FileNotFoundError:
                pass
        if doomed:
            log.info("job %r: deleted %d shared file(s) no checkpoint references",
                     self.job, len(doomed))
        return doomed

    def _ls(self, directory: str) -> list[dict]:
        try:
            return self.fs.ls(directory, detail=True)
        except FileNotFoundError:
            return []

    # ------------------------------------------------------------------ reading

    def completed(self) -> list[int]:
        """Ids of checkpoints (not savepoints) with a valid ``_metadata``, ascending."""
        return [n for n, p in sorted(self._checkpoint_dirs().items()) if self._valid(p, n)]

    def next_id(self) -> int:
        """1 + the largest id under this job, in any state (checkpoint or savepoint, complete
        or partial): the coordinator's ``first_id`` that never reuses an id."""
        ids = [int(m.group(1)) for name in self._entries()
               if (m := _CHK.match(name) or _SAVEPOINT.match(name))]
        return max(ids, default=0) + 1

    def latest(self, *, deep: bool = True) -> CheckpointHandle | None:
        """The newest checkpoint whose ``_metadata`` and state files verify (``deep``: by
        sha256, else by size).  Corrupt ones are skipped with a warning.  I/O errors other
        than missing files propagate: a checkpoint is never skipped for a flaky network."""
        for n, path in sorted(self._checkpoint_dirs().items(), reverse=True):
            try:
                handle = self._load(path, f"chk-{n}")
                handle.verify(deep=deep)
                return handle
            except CheckpointNotFoundError:
                continue  # partial: not a checkpoint
            except CorruptCheckpointError as e:
                log.warning("skipping corrupt checkpoint chk-%d of job %r, falling back to an "
                            "older one: %s", n, self.job, e)
        return None

    def open(self, path_or_id: int | str) -> CheckpointHandle:
        """A checkpoint by id, by name (``chk-7``, ``savepoint-8-ab12cd34``) or by path/URL
        (any job, any filesystem: a run may start from it).  Its state files are checked by
        :meth:`CheckpointHandle.read_task_state` as they are read."""
        fs = self.fs
        if isinstance(path_or_id, int) and not isinstance(path_or_id, bool):
            path = f"{self.dir}/{self._dirname(path_or_id, False)}"
        elif isinstance(path_or_id, str) and path_or_id and "/" not in path_or_id:
            path = f"{self.dir}/{path_or_id}"
        elif isinstance(path_or_id, str) and path_or_id:
            if "://" in path_or_id:  # same scheme: same endpoint and credentials
                same = _scheme(path_or_id) == _scheme(self.url)
                fs, path = _open_url(path_or_id, self.storage_options if same else None)
            else:
                path = path_or_id
            path = fs._strip_protocol(path).rstrip("/")
        else:
            raise TypeError(f"expected a checkpoint id or path, got {path_or_id!r}")
        return self._load(path, path.rsplit("/", 1)[-1], fs)

    def _valid(self, path: str, n: int) -> bool:
        try:
            self._load(path, f"chk-{n}")
            return True
        except CheckpointStorageError:
            return False

    def _load(self, path: str, label: str, fs: fsspec.AbstractFileSystem | None = None
              ) -> CheckpointHandle:
        fs = fs or self.fs
        where = fs.unstrip_protocol(path)
        try:
            raw = fs.cat_file(f"{path}/{METADATA}")
        except (FileNotFoundError, NotADirectoryError):
            state = "partial: no _metadata" if fs.isdir(path) else "no such directory"
            raise CheckpointNotFoundError(f"no completed checkpoint at {where} ({state})") from None
        try:
            env = msgpack.unpackb(raw, raw=False)
            if not isinstance(env, dict) or env.get("format") != FORMAT:
                raise ValueError("not a cutline checkpoint envelope")
            if env.get("version") != VERSION:
                raise ValueError(f"unsupported format version {env.get('version')!r}")
            body_bytes = env["body"]
            if _sha256(body_bytes) != env["sha256"]:
                raise CorruptCheckpointError(f"checksum mismatch in {label}/{METADATA}")
            body = msgpack.unpackb(body_bytes, raw=False, strict_map_key=False)
            return CheckpointHandle(fs, path, label, body)
        except CorruptCheckpointError:
            raise
        except Exception as e:
            raise CorruptCheckpointError(
                f"unreadable {label}/{METADATA} at {where}: {type(e).__name__}: {e}") from None

    # ------------------------------------------------------------------ retention

    def discard_all(self) -> list[int]:
        """Delete every checkpoint of the job (a cancelled job that does not retain them),
        and the shared files only they referenced; never savepoints (nor what they
        reference).  Returns the deleted ids."""
        dirs = self._checkpoint_dirs()
        for i in sorted(dirs):
            if self.fs.exists(f"{dirs[i]}/{METADATA}"):
                self.fs.rm_file(f"{dirs[i]}/{METADATA}")
            self.fs.rm(dirs[i], recursive=True)
        self._sweep_shared(None)
        return sorted(dirs)

    def retain(self, n: int) -> list[int]:
        """Delete all but the newest ``n`` completed checkpoints, and partial directories
        older than the newest completed one; never savepoints.  Then delete the shared files
        nothing references any more (see the module docstring).  Returns the deleted ids."""
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"retain(n) keeps at least one checkpoint; got n={n!r}")
        dirs = self._checkpoint_dirs()
        done = [i for i, p in sorted(dirs.items()) if self._valid(p, i)]
        if not done:
            return []
        keep = set(done[-n:])
        doomed = [i for i in sorted(dirs) if i not in keep and (i in done or i < done[-1])]
        for i in doomed:
            # _metadata first: a half-deleted checkpoint must read as partial, not corrupt.
            if self.fs.exists(f"{dirs[i]}/{METADATA}"):
                self.fs.rm_file(f"{dirs[i]}/{METADATA}")
            self.fs.rm(dirs[i], recursive=True)
        self._sweep_shared(done[-1])
        return doomed


def open_checkpoint(path: str) -> CheckpointHandle:
    """A completed checkpoint or savepoint by path or URL, read-only (no job storage needed:
    tools that inspect or read a checkpoint use this)."""
    fs, root = url_to_fs(path)
    root = fs._strip_protocol(root).rstrip("/")
    reader = CheckpointStorage.__new__(CheckpointStorage)  # no probe write: read-only use
    reader.url, reader.job, reader.fs = path, "", fs
    reader.root = reader.dir = root.rsplit("/", 1)[0]
    return reader._load(root, root.rsplit("/", 1)[-1], fs)
