"""A global snapshot of a process graph: what it holds, how it is stored and read back.

A host sends the driver one *part* per process when the process's share of a snapshot is
finished (its own state, plus the messages recorded on each of its input channels).  Parts
are msgpack maps whose user objects (states, timer tags, messages) are pickle-5 blobs, as
in the dataflow runtime's channel state; the driver stores them unchanged.

Layout in checkpoint storage (:class:`~cutline.storage.checkpoints.CheckpointStorage`)::

    <root>/<job>/chk-<id>/host-<k>.state   msgpack {"processes": {name: part}}
    <root>/<job>/chk-<id>/_metadata        written last: processes -> file, channels,
                                           initiators, predicate results

Reading a snapshot unpickles the user's objects: only read snapshots you wrote.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgpack

from ..analysis import GlobalState
from ..analysis.trace import Message, Snapshot as SimSnapshot

__all__ = ["Check", "GraphSnapshot", "decode", "load_snapshot", "load_parts",
           "list_snapshots", "open_snapshot", "open_storage", "write_snapshot", "KIND"]

KIND = "process-graph"
Edge = tuple[str, str]


def dumps(obj: Any) -> bytes:
    return pickle.dumps(obj, protocol=5)


@dataclass(frozen=True)
class Check:
    """One predicate evaluated on one snapshot."""

    name: str
    kind: str  # "invariant" (must hold) or "stable" (detected when it holds)
    holds: bool
    detail: str = ""

    @property
    def violated(self) -> bool:
        return self.kind == "invariant" and not self.holds

    @property
    def detected(self) -> bool:
        return self.kind == "stable" and self.holds

    def as_dict(self) -> dict:
        return {"name": self.name, "kind": self.kind, "holds": self.holds,
                "detail": self.detail}


@dataclass
class GraphSnapshot:
    """Process states and the messages in transit on every channel, at a consistent cut."""

    id: int
    states: dict[str, Any]
    channels: dict[Edge, list[Any]]  # every channel of the graph; [] when empty
    passive: dict[str, bool]
    timers: dict[str, list[tuple[float, Any]]] = field(default_factory=dict)
    cut: dict[str, int] = field(default_factory=dict)  # app events before the local snapshot
    taken_at: dict[str, float] = field(default_factory=dict)  # s since the attempt began
    message_ids: dict[Edge, list[int]] = field(default_factory=dict)
    initiators: list[str] = field(default_factory=list)
    by_driver: bool = False  # started by the driver's schedule (else by processes)
    attempt: int = 0
    started: float | None = None  # s since the run began
    completed: float | None = None
    path: str | None = None
    checks: list[Check] = field(default_factory=list)

    def __repr__(self) -> str:
        return (f"GraphSnapshot({self.id}, {len(self.states)} processes, "
                f"{self.in_transit} in transit)")

    @property
    def in_transit(self) -> int:
        return sum(len(m) for m in self.channels.values())

    @property
    def terminated(self) -> bool:
        """Every process passive and every channel empty (Dijkstra's termination)."""
        return all(self.passive.values()) and not self.in_transit

    @property
    def duration(self) -> float | None:
        if self.started is None or self.completed is None:
            return None
        return self.completed - self.started

    @property
    def violations(self) -> list[Check]:
        return [c for c in self.checks if c.violated]

    def channel(self, src: str, dst: str) -> list[Any]:
        return self.channels[(src, dst)]

    def global_state(self) -> GlobalState:
        """The snapshot as :class:`cutline.analysis.GlobalState` (channels named ``a->b``)."""
        return GlobalState(dict(self.states),
                           {f"{a}->{b}": list(m) for (a, b), m in self.channels.items()})

    def to_sim(self) -> SimSnapshot:
        """As the simulator's snapshot record: what the consistent-cut checker and the
        space-time diagrams read."""
        chans = {}
        for (a, b), msgs in self.channels.items():
            ids = self.message_ids.get((a, b)) or [0] * len(msgs)
            chans[f"{a}->{b}"] = [Message(i, f"{a}->{b}", m) for i, m in zip(ids, msgs)]
        return SimSnapshot(self.id, states=dict(self.states), channels=chans,
                           cut=dict(self.cut), taken_at=dict(self.taken_at),
                           finished=set(self.states), started_at=min(self.taken_at.values(),
                                                                     default=None),
                           completed_at=max(self.taken_at.values(), default=0.0))

    def summary(self) -> dict:
        return {"id": self.id, "attempt": self.attempt, "initiators": self.initiators,
                "by_driver": self.by_driver,
                "processes": len(self.states), "passive": sum(self.passive.values()),
                "in_transit": self.in_transit, "terminated": self.terminated,
                "started": self.started, "completed": self.completed, "path": self.path,
                "checks": [c.as_dict() for c in self.checks]}


# ---------------------------------------------------------------------- parts


def decode(n: int, parts: Mapping[str, Mapping], edges: Iterable[Edge],
           names: Iterable[str] | None = None) -> GraphSnapshot:
    """Build a snapshot from every process's part (unpickles the user's objects);
    processes in the order of ``names`` (the graph's order) when given."""
    snap = GraphSnapshot(n, {}, {(src, dst): [] for src, dst in edges}, {})
    order = [x for x in names if x in parts] if names is not None else list(parts)
    for name in order:
        part = parts[name]
        snap.states[name] = pickle.loads(part["state"])
        snap.timers[name] = pickle.loads(part["timers"]) if part.get("timers") else []
        snap.passive[name] = bool(part["passive"])
        snap.cut[name] = int(part.get("cut", 0))
        snap.taken_at[name] = float(part.get("at", 0.0))
        for src, blobs in (part.get("channels") or {}).items():
            key = (src, name)
            if key not in snap.channels:
                raise ValueError(f"snapshot {n} records channel {src}->{name}, which the "
                                 f"graph does not have (the graph changed since?)")
            for blob in blobs:
                for mid, msg in pickle.loads(blob):
                    snap.channels[key].append(msg)
                    snap.message_ids.setdefault(key, []).append(mid)
    return snap


def recorded_messages(part: Mapping) -> dict[str, list[Any]]:
    """sender -> the messages a part recorded on that input channel, in order."""
    return {src: [msg for blob in blobs for _, msg in pickle.loads(blob)]
            for src, blobs in (part.get("channels") or {}).items()}


# ---------------------------------------------------------------------- storage


def open_storage(path: str):
    """The storage and snapshot label of ``<root>/<job>[/chk-<id>]`` (a path or URL)."""
    from fsspec.core import url_to_fs

    from ..storage.checkpoints import CheckpointStorage

    fs, p = url_to_fs(path)
    p = p.rstrip("/")
    if not fs.exists(p):
        raise FileNotFoundError(f"no such snapshot directory: {path}")
    label = None
    head, _, last = p.rpartition("/")
    if last.startswith(("chk-", "savepoint-")):
        label, p = last, head
        head, _, last = p.rpartition("/")
    root = fs.unstrip_protocol(head or "/")
    return CheckpointStorage(root, last), label


def write_snapshot(storage, n: int, parts_by_file: Mapping[str, Mapping[str, Mapping]],
                   metadata: dict) -> str:
    """Write one state file per host group, then ``_metadata`` (the commit point)."""
    infos = {}
    for file, parts in parts_by_file.items():
        data = msgpack.packb({"processes": dict(parts)}, use_bin_type=True)
        infos[file] = storage.write_task_state(n, file, data)
    metadata = dict(metadata, kind=KIND,
                    processes={name: file for file, parts in parts_by_file.items()
                               for name in parts})
    return storage.commit(n, metadata, states=infos)


def open_snapshot(path_or_handle):
    """The storage handle of a snapshot path (a ``chk-<id>`` directory, or a job directory
    for its newest snapshot)."""
    if not isinstance(path_or_handle, str):
        return path_or_handle
    storage, label = open_storage(path_or_handle)
    if label is None:
        latest = storage.latest()
        if latest is None:
            raise FileNotFoundError(f"no completed snapshot under {path_or_handle}")
        return latest
    return storage.open(label)


def load_parts(path_or_handle, names: Iterable[str] | None = None) -> dict[str, dict]:
    """The stored parts of the processes ``names`` (default all) of a snapshot."""
    handle = open_snapshot(path_or_handle)
    meta = handle.metadata
    if meta.get("kind") != KIND:
        raise ValueError(f"{handle.path} is not a process-graph snapshot "
                         f"(a dataflow checkpoint?)")
    where: dict[str, str] = meta["processes"]
    wanted = list(where) if names is None else list(names)
    missing = [n for n in wanted if n not in where]
    if missing:
        raise ValueError(f"snapshot {handle.path} has no state for process(es) "
                         f"{', '.join(missing)} (the graph changed since it was taken?)")
    out: dict[str, dict] = {}
    for file in sorted({where[n] for n in wanted}):
        stored = msgpack.unpackb(handle.read_task_state(file), raw=False,
                                 strict_map_key=False)["processes"]
        out.update({n: p for n, p in stored.items() if n in wanted})
    return out


def load_snapshot(path_or_handle) -> GraphSnapshot:
    """A stored snapshot, decoded (``path``: a ``chk-<id>`` directory, or a job directory
    for its newest snapshot)."""
    handle = open_snapshot(path_or_handle)
    parts = load_parts(handle)
    meta = handle.metadata
    snap = decode(handle.id, parts, [tuple(e) for e in meta["edges"]], meta.get("names"))
    snap.initiators = list(meta.get("initiators") or [])
    snap.by_driver = bool(meta.get("by_driver"))
    snap.attempt = int(meta.get("attempt") or 0)
    snap.started, snap.completed = meta.get("started"), meta.get("completed")
    snap.path = handle.path
    snap.checks = [Check(**c) for c in meta.get("checks") or []]
    return snap


def list_snapshots(path: str) -> list[dict]:
    """Summaries of the completed snapshots under a job directory, oldest first."""
    storage, label = open_storage(path)
    ids = storage.completed() if label is None else [storage.open(label).id]
    out = []
    for n in ids:
        h = storage.open(n) if label is None else storage.open(label)
        m = h.metadata
        if m.get("kind") != KIND:
            continue
        out.append({"id": h.id, "path": h.path, "attempt": m.get("attempt"),
                    "initiators": m.get("initiators") or [], "by_driver": m.get("by_driver"),
                    "processes": len(m.get("processes") or {}),
                    "passive": m.get("passive"), "in_transit": m.get("in_transit"),
                    "completed": m.get("completed"), "time": m.get("time"),
                    "checks": m.get("checks") or []})
    return out
