"""In-memory keyed state, organised by key group so it can move between subtasks.

Behind the tables' ``fast`` dicts (:mod:`cutline.state.backend`) the state is
``{key group: {(state name, key): value}}``: a hot key costs one dict lookup and one store
per record, and its key group is found once per merge, not per record.

Snapshots: with the job's checkpoint storage (as in a running job) they are incremental
(:mod:`cutline.state.changelog`): the backend logs which entries change between
checkpoints (the keys of each spill, the timers and the per-key-group values it writes in
place, what TTL cleanup drops), and a checkpoint pickles only those entries, on the task's
thread, as a delta on the previous checkpoint's chain; its upload thread stores it as a
shared file.  A full snapshot starts a new chain when the deltas since the last one hold as
many entries as the state (the rules: :mod:`cutline.state.changelog`).  Without storage a
snapshot is the pickled key-group dicts.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from .backend import MISSING, KeyedStateBackend, StateTable
from .changelog import (
    CHAIN_MAX, TOMBSTONE, apply_file, encode_manifest, is_changelog_snapshot, manifest,
    read_groups,
)
from .keygroups import key_group
from .timers import MemoryTimerQueue

__all__ = ["MemoryStateBackend"]


class MemoryStateBackend(KeyedStateBackend):
    """State of one keyed operator subtask: ``{key group: {(state name, key): value}}``
    behind one ``fast`` dict per state name.

    ``dirty_entries`` bounds what the ``fast`` dicts hold before they are merged into the
    key-group dicts (a snapshot merges what they hold in its synchronous part).  A key read
    from behind ``fast`` remembers where it lives (its key group's dict and its
    ``(name, key)`` slot) until the next merge, so the merge, on the snapshot's synchronous
    path, neither hashes the key nor allocates.

    ``storage`` (the job's checkpoint storage) makes snapshots incremental, stored as
    shared files under ``name`` (``<operator uid>.<subtask>``); without it a snapshot is
    the pickled key-group dicts.
    """

    def __init__(self, key_groups: range, max_parallelism: int, *,
                 dirty_entries: int = 100_000, name: str = "state",
                 storage: Any = None) -> None:
        super().__init__(key_groups, max_parallelism, dirty_entries)
        self._groups: dict[int, dict[tuple[str, Any], Any]] = {}
        self._slot_max = dirty_entries + 1024  # bounds each table's remembered slots
        self.name, self.storage = name, storage
        # the changelog: keys written or deleted through the tables since the last
        # snapshot, per state name, each with its key group's dict (where it was written:
        # equal keys may hash apart, 5 and numpy's int64(5)), and (key group, slot) written
        # in place (timers, per-group values).  Kept only while the next snapshot can be a
        # delta (``_logging``): with storage, after a full snapshot, until the log is too
        # long for a delta to pay
        self._logging = False
        self._log_keys: dict[str, dict[Any, dict]] = {}
        self._log_slots: set[tuple[int, tuple[str, Any]]] = set()
        self._last: _Link | None = None  # the last snapshot's link in its chain
        self._since_full = 0  # entries in the deltas of that chain

    def _new_table(self, name: str) -> StateTable:
        return _MemoryTable(self, name)

    def _new_timers(self, name: str) -> MemoryTimerQueue:
        return MemoryTimerQueue(self, name)

    def put_group_value(self, name: str, value: Any) -> None:
        slot = (name, b"")
        log = self._log_slots if self._logging else None
        for g in self.key_groups:
            d = self._groups.get(g)
            if d is None:
                d = self._groups[g] = {}
            if log is not None and not _same(d.get(slot, MISSING), value):
                log.add((g, slot))
            d[slot] = value

    def group_values(self, name: str) -> list[Any]:
        slot = (name, b"")
        return [d[slot] for g, d in sorted(self._groups.items()) if slot in d]

    def clean_step(self, name: str, fix: Callable[[Any], Any], budget: int) -> None:
        t = self._tables.get(name)
        fast, deleted = (t.fast, t.deleted) if t is not None else ({}, set())
        cur = self._cursors.get(name)
        if cur is None:  # a new pass
            cur = self._cursors[name] = _Cursor(sorted(self._groups, reverse=True))
        while budget > 0:
            if not cur.slots:
                if not cur.groups:
                    del self._cursors[name]
                    return
                d = self._groups.get(cur.groups.pop())
                if d:
                    cur.slots = [s for s in d if s[0] == name]
                    cur.slots.reverse()
                    cur.group = d
                budget -= 1
                continue
            slot = cur.slots.pop()
            budget -= 1
            d = cur.group
            v = d.get(slot, MISSING)
            if v is MISSING or slot[1] in fast or slot[1] in deleted:
                continue
            new = fix(v)
            if new is MISSING:
                del d[slot]
            elif new is not v:
                d[slot] = new
            else:
                continue
            if self._logging:
                self._log_keys.setdefault(name, {})[slot[1]] = d

    def _group_dict(self, key: Any) -> dict[tuple[str, Any], Any]:
        """The dict of ``key``'s key group (an error if this subtask does not own it)."""
        g = self.owned_group(key)
        table = self._groups.get(g)
        if table is None:
            table = self._groups[g] = {}
        return table

    def _write(self, tables: list[StateTable]) -> None:
        for t in tables:
            assert isinstance(t, _MemoryTable)
            name, fast, where, slots = t.name, t.fast, t.where, t.slots
            log = None
            if self._logging:
                log = self._log_keys.get(name)
                if log is None:
                    log = self._log_keys[name] = {}
            for k in t.deleted:
                if k not in fast:
                    d = self._group_dict(k)
                    d.pop((name, k), None)
                    if log is not None:
                        log[k] = d
            for k, v in fast.items():
                table = where.get(k)
                if table is None:  # written without a read (or forgotten): find its place
                    table = self._group_dict(k)
                    table[(name, k)] = v
                else:
                    table[slots[k]] = v
                if log is not None:
                    log[k] = table
            t.forget()  # the next merge writes what is read (and placed) anew
        self._bound_log()

    def _logged(self) -> int:
        return sum(map(len, self._log_keys.values())) + len(self._log_slots)

    def _bound_log(self) -> None:
        """A log that makes the next snapshot a full one anyway (it holds half the state)
        is dropped, and logging stops until that snapshot."""
        if not self._logging or self._logged() <= self._dirty_max:
            return
        if 2 * self._logged() > sum(map(len, self._groups.values())) + self._dirty_max:
            self._log_keys.clear()
            self._log_slots.clear()
            self._logging = False

    def after_batch(self) -> None:
        super().after_batch()
        if len(self._log_slots) > self._dirty_max:  # timers (written in place)
            self._bound_log()

    def keys(self) -> int:
        self.spill()
        return sum(len(t) for t in self._groups.values())

    def entries(self) -> Iterator[tuple[int, str, Any, Any]]:
        self.spill()
        for g, table in self._groups.items():
            for (name, key), value in table.items():
                yield g, name, key, value

    def snapshot(self) -> bytes | MemorySnapshot:
        """The state as of now: without storage, bytes (the key-group dicts pickled); with
        it, a :class:`MemorySnapshot` whose file (a delta on the last snapshot, or a full
        one) is pickled now and uploaded by its ``finish``."""
        self.spill()
        groups = self._groups
        if self.storage is None:
            return pickle.dumps({g: t for g, t in groups.items() if t}, protocol=5)
        changed, total = self._logged(), sum(map(len, groups.values()))
        last = self._last
        if last is not None and self._logging and not changed:  # nothing changed since
            return MemorySnapshot(self, last, self._since_full)
        # a full snapshot: the first, after the log was dropped, at the chain's bound, when
        # the deltas would hold more entries than the state, or when this delta would hold
        # half of it (a delta costs more per entry than a full snapshot)
        if (last is None or not self._logging or last.length >= CHAIN_MAX
                or self._since_full + changed > total or 2 * changed > total):
            link = _Link(None, pickle.dumps({g: t for g, t in groups.items() if t}, 5))
            self._since_full = 0
        else:
            link = _Link(last, pickle.dumps(self._delta(), 5))
            self._since_full += changed
        self._log_keys.clear()
        self._log_slots.clear()
        self._logging = True
        self._last = link
        return MemorySnapshot(self, link, self._since_full)

    def _delta(self) -> dict[int, dict[tuple[str, Any], Any]]:
        """The logged entries' values now (:data:`TOMBSTONE`: deleted), by key group."""
        groups = self._groups
        group_of = {id(d): g for g, d in groups.items()}
        delta: dict[int, dict[tuple[str, Any], Any]] = {}
        for name, keys in self._log_keys.items():
            for k, d in keys.items():
                g = group_of[id(d)]
                t = delta.get(g)
                if t is None:
                    t = delta[g] = {}
                slot = (name, k)
                t[slot] = d.get(slot, TOMBSTONE)
        for g, slot in self._log_slots:
            t = delta.get(g)
            if t is None:
                t = delta[g] = {}
            t[slot] = groups[g].get(slot, TOMBSTONE)
        return delta

    def restore(self, blobs: Iterable[bytes]) -> None:
        """Load the key groups this subtask owns from any number of snapshots (rescaling):
        in-memory ones (a chain of files, or the key-group dicts) or RocksDB ones (a job may
        switch backends).  Restored from its own last snapshot's chain (same key groups,
        same job), the next snapshot continues that chain."""
        self._reset()
        blobs = list(blobs)
        for blob in blobs:
            if _is_rocksdb(blob):
                from .rocksdb import read_entries

                for g, slot, value in read_entries(blob, self.key_groups, self.storage):
                    self._groups.setdefault(g, {})[slot] = value
            elif is_changelog_snapshot(blob):
                for g, table in read_groups(blob, self.key_groups, self.storage).items():
                    self._groups.setdefault(g, {}).update(table)
            else:
                apply_file(self._groups, blob, self.key_groups)
        self._last, self._since_full = None, 0
        if self.storage is not None and len(blobs) == 1 and is_changelog_snapshot(blobs[0]):
            m = manifest(blobs[0])
            if (m["key_groups"] == [self.key_groups.start, self.key_groups.stop]
                    and m["max_parallelism"] == self.max_parallelism
                    and m["base"] == self.storage.job_url):
                self._last = _Link(None, None, files=[list(f) for f in m["files"]])
                self._since_full = m["since_full"]
                self._logging = True
        self._restored()

    def _reset(self) -> None:
        super()._reset()
        self._groups = {}
        self._log_keys.clear()
        self._log_slots.clear()
        self._logging = False

    def close(self) -> None:
        pass


class _Cursor:
    """Where :meth:`MemoryStateBackend.clean_step` is in its pass over a state name: the
    key groups still to visit, and the slots of the current group's dict still to visit."""

    __slots__ = ("groups", "slots", "group")

    def __init__(self, groups: list[int]) -> None:
        self.groups = groups
        self.slots: list[tuple[str, Any]] = []
        self.group: dict[tuple[str, Any], Any] = {}


class _MemoryTable(StateTable):
    """For keys read since the last merge: ``where`` (key -> its key group's dict) and
    ``slots`` (key -> its ``(name, key)`` tuple).  Two dicts, not one of pairs: a pair
    holding a dict stays tracked by the garbage collector, and a hundred thousand of them
    make every full collection slower (measured: 0.6x records/s on 200,000 keys)."""

    __slots__ = ("_backend", "where", "slots")

    def __init__(self, backend: MemoryStateBackend, name: str) -> None:
        super().__init__(name)
        self._backend = backend
        self.where: dict[Any, dict[tuple[str, Any], Any]] = {}
        self.slots: dict[Any, tuple[str, Any]] = {}

    def read(self, key: Any, default: Any = None) -> Any:
        if self.deleted and key in self.deleted:
            return default
        table = self.where.get(key)
        if table is None:  # (_group_dict inlined: on a large key set most reads come here)
            b = self._backend
            table = b._groups.get(key_group(key, b.max_parallelism))
            if table is None:
                table = b._group_dict(key)
            if len(self.where) >= b._slot_max:
                self.forget()
            self.where[key] = table
            slot = self.slots[key] = (self.name, key)
        else:
            slot = self.slots[key]
        return table.get(slot, default)

    def forget(self) -> None:
        self.where.clear()
        self.slots.clear()

    def reset(self) -> None:
        super().reset()
        self.forget()


class _Link:
    """One snapshot in a chain: its file's bytes (until uploaded), then the chain of
    uploaded files ``[path, size, sha256]`` it restores from (``files``).  ``prev``: the
    snapshot it is a delta on (``None``: a full one); held until this one is uploaded,
    so a snapshot whose checkpoint was aborted before its upload is uploaded by the next
    one's (its changes are in no other delta)."""

    __slots__ = ("prev", "data", "ref", "files", "length")

    def __init__(self, prev: _Link | None, data: bytes | None,
                 files: list[list] | None = None) -> None:
        self.prev, self.data, self.files = prev, data, files
        self.ref: list | None = None  # [path, size, sha256] once uploaded
        self.length: int = len(files) if files is not None else 1 + (prev.length if prev else 0)


class MemorySnapshot:
    """An incremental snapshot taken (its file pickled), not stored yet: :meth:`finish`
    (on the task's upload thread) uploads it, and the files of earlier snapshots of its
    chain not uploaded yet, and returns the manifest stored in the checkpoint; then
    :attr:`shared` lists the files it references and :attr:`uploaded` the bytes written."""

    def __init__(self, backend: MemoryStateBackend, link: _Link, since_full: int) -> None:
        self._backend, self._link, self._since_full = backend, link, since_full
        self.shared: dict[str, dict] = {}
        self.uploaded = 0

    def finish(self, storage: Any, checkpoint_id: int) -> bytes:
        b = self._backend
        pending, link = [], self._link
        while link.files is None:  # the links not uploaded yet, back to an uploaded one
            pending.append(link)
            if link.prev is None:
                break
            link = link.prev
        files: list[list] = [] if link.files is None else link.files
        for link in reversed(pending):
            if link.ref is None:
                assert link.data is not None
                info = storage.upload_shared_bytes(b.name, checkpoint_id, link.data, ".pkl")
                self.uploaded += info["uploaded"]
                link.ref = [info["path"], info["size"], info["sha256"]]
            files = (files if link.prev is not None else []) + [link.ref]
            link.files, link.data, link.prev = files, None, None
        for rel, size, sha in files:
            self.shared[rel] = {"size": size, "sha256": sha}
        return encode_manifest(key_groups=b.key_groups, max_parallelism=b.max_parallelism,
                               base=storage.job_url, files=files,
                               since_full=self._since_full)


def _same(old: Any, new: Any) -> bool:
    """Whether a per-group value is unchanged (a watermark: a float, or ``MISSING``)."""
    try:
        return old is new or bool(old == new)
    except Exception:  # noqa: BLE001 - an object without a truth-valued ==: changed
        return False


def _is_rocksdb(blob: bytes) -> bool:
    return bytes(blob[:16]) == b"cutline-rocksdb\x00"
