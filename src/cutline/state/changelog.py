"""Incremental snapshots of the in-memory state backend: a chain of key-group files.

A checkpoint of :class:`~cutline.state.memory.MemoryStateBackend` (when it has checkpoint
storage) is a small manifest naming a chain of files in the job's shared storage
(``shared/<operator>.<subtask>/``, :meth:`~cutline.storage.checkpoints.CheckpointStorage.
upload_shared_bytes`): a full snapshot, then the deltas of the checkpoints after it.  Every
file is a pickled ``{key group: {(state name, key): value}}``; in a delta a value of
:data:`TOMBSTONE` says the entry was deleted.  The state at the checkpoint is the full
snapshot with the deltas applied in order.  This is Flink's changelog state backend
(FLIP-158) in its simplest form: each checkpoint writes what changed since the last one,
and a new full snapshot (a *materialisation*) starts a new chain once the deltas hold as
many entries as the state (so a restore reads at most about twice the state), when one
checkpoint changed half of it, or when the chain is :data:`CHAIN_MAX` files long.  A
checkpoint's cost follows what changed, not the size of the state: a state that only
grows costs linear time over a run, not quadratic.

Deltas and full snapshots share files across checkpoints the way RocksDB's SST files do,
so :mod:`cutline.storage.checkpoints` keeps them by the same rules: every ``_metadata``
lists the shared files its checkpoint references, and retention deletes a file no
retained checkpoint references.

Here: the manifest format and the reading side (both backends and the state reader restore
from it); the writing side is :mod:`cutline.state.memory`'s.
"""

from __future__ import annotations

import os
import pickle
import tempfile
from collections.abc import Iterator
from typing import Any

import msgpack

__all__ = ["CHAIN_MAX", "MAGIC", "TOMBSTONE", "apply_file", "encode_manifest",
           "is_changelog_snapshot", "iter_entries", "manifest", "read_groups"]

MAGIC = b"cutline-memlog\x00\x00"
FORMAT_VERSION = 1
#: Files in a chain (one full snapshot and its deltas) before a new full snapshot
CHAIN_MAX = 64


class _Tombstone:
    """A deleted entry in a delta (pickled by name: the same object when loaded)."""

    __slots__ = ()

    def __reduce__(self) -> str:
        return "TOMBSTONE"

    def __repr__(self) -> str:
        return "TOMBSTONE"


TOMBSTONE = _Tombstone()


def is_changelog_snapshot(blob: Any) -> bool:
    return bytes(blob[:len(MAGIC)]) == MAGIC


def encode_manifest(*, key_groups: range, max_parallelism: int, base: str,
                    files: list[list], since_full: int) -> bytes:
    """The state blob of one checkpoint: ``files`` is the chain, ``[path, size, sha256]``
    each (paths relative to the job directory ``base``), full snapshot first;
    ``since_full``: entries the deltas hold (what decides the next materialisation)."""
    return MAGIC + msgpack.packb({
        "format": "cutline-memory-changelog", "version": FORMAT_VERSION,
        "key_groups": [key_groups.start, key_groups.stop], "max_parallelism": max_parallelism,
        "base": base, "files": files, "since_full": since_full}, use_bin_type=True)


def manifest(blob: Any) -> dict:
    m = msgpack.unpackb(bytes(blob[len(MAGIC):]), raw=False)
    if m.get("version") != FORMAT_VERSION:
        raise ValueError(f"in-memory state changelog of unsupported version {m.get('version')!r}")
    return m


def apply_file(groups: dict[int, dict], data: bytes, key_groups: range | None) -> None:
    """Apply one file of a chain (full or delta) to ``groups``, for the key groups in
    ``key_groups`` (``None``: all)."""
    for g, table in pickle.loads(data).items():
        if key_groups is not None and g not in key_groups:
            continue
        d = groups.get(g)
        if d is None:
            d = groups[g] = {}
        for slot, value in table.items():
            if value is TOMBSTONE:
                d.pop(slot, None)
            else:
                d[slot] = value


def read_groups(blob: Any, key_groups: range | None = None, storage: Any = None
                ) -> dict[int, dict]:
    """The state a manifest describes, ``{key group: {(state name, key): value}}``, for the
    key groups in ``key_groups`` (``None``: all it holds).  Every file is verified (size and
    sha256); a missing or changed one is a :class:`~cutline.storage.checkpoints.
    CorruptCheckpointError` naming it.  ``storage``: the job's, whose filesystem opens the
    manifest's base when it is the same job directory."""
    from ..storage.checkpoints import fetch_shared

    m = manifest(blob)
    lo, hi = m["key_groups"]
    if key_groups is not None and (min(hi, key_groups.stop) <= max(lo, key_groups.start)):
        return {}
    groups: dict[int, dict] = {}
    with tempfile.TemporaryDirectory(prefix="cutline-memlog-") as tmp:
        dest = os.path.join(tmp, "file")
        for rel, size, sha in m["files"]:
            fetch_shared(m["base"], rel, dest, size, sha, storage=storage)
            with open(dest, "rb") as f:
                data = f.read()
            apply_file(groups, data, key_groups)
    return groups


def iter_entries(blob: Any, key_groups: range | None = None, storage: Any = None
                 ) -> Iterator[tuple[int, tuple[str, Any], Any]]:
    """``(key group, (state name, key), value)`` of a manifest's state."""
    for g, table in read_groups(blob, key_groups, storage).items():
        for slot, value in table.items():
            yield g, slot, value
