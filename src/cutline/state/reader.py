"""Read keyed state out of a completed checkpoint or savepoint (no job running).

``keyed_rows(handle, uid)`` yields one ``{"key": k, <state name>: value, ...}`` per key of
operator ``uid`` (a key's pending timers as ``timers.event`` / ``timers.processing``: their
times, sorted; state with a TTL as its live values); ``window_rows(handle, uid)`` one
``{"key", "start", "end", "accumulator", "fired"}`` per key and window of a window
operator; :func:`summary` counts operators, bytes, keys and timers for ``cutline
checkpoints show``.  ``cutline.state.read`` turns the rows into a Spark DataFrame
(``cutline.spark``).
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Iterator, Mapping
from typing import Any

from ..protocol.watermarks import decode_ts, encode_ts
from ..storage.schema import TaskState, read_task_states
from .backend import iter_memory_entries
from .timers import TIMER_STATES
from .ttl import Expiring

__all__ = ["LATE_STATE", "WINDOW_KINDS", "is_window_operator", "keyed_rows", "keyed_entries",
           "operators_with_state", "summary", "window_rows"]

#: A window operator's late records dropped, per key group (:mod:`cutline.runtime.late`)
LATE_STATE = "__late"
#: States kept per key group under a stand-in key (the window operator's watermark of each
#: key group, :data:`cutline.runtime.windows.MARKS`): not counted as keys
PER_KEY_GROUP_STATES = frozenset({"window-watermark"})
#: The window operator's tables (:mod:`cutline.runtime.windows`): key -> ``{(start, end):
#: accumulator}``; per key group, the watermark it acted on; key -> windows the end of input
#: fired above the last real watermark
WINDOWS, WINDOW_MARKS, WINDOW_FIRED = "windows", "window-watermark", "window-fired"
#: Plan kinds of window operators (per record, and on record batches)
WINDOW_KINDS = ("window", "window_agg")


def keyed_entries(blob: Any) -> Iterator[tuple[int, str, Any, Any]]:
    """``(key group, state name, key, value)`` of one subtask's snapshot of a keyed operator."""
    decode = getattr(blob, "decode_entries", None)
    if decode is not None:  # a backend that knows its own format
        yield from decode()
        return
    if not isinstance(blob, (bytes, bytearray, memoryview)):
        raise ValueError(f"cannot read keyed state snapshot of type {type(blob).__name__}")
    from .rocksdb import is_rocksdb_snapshot, read_entries

    if is_rocksdb_snapshot(blob):  # RocksDBStateBackend: a manifest of shared files
        for group, (name, key), value in read_entries(blob):
            yield group, name, key, value
        return
    # MemoryStateBackend: {g: {(n, k): v}} pickled, or a chain of them (changelog)
    for group, (name, key), value in iter_memory_entries([bytes(blob)]):
        yield int(group), name, key, value


def state_bytes(blob: Any) -> int:
    """Bytes of state a subtask's snapshot of a keyed operator holds: the files a manifest
    names (RocksDB's, the in-memory backend's chain), or the pickled key groups."""
    from .changelog import is_changelog_snapshot, manifest
    from .rocksdb import _manifest, is_rocksdb_snapshot

    if is_changelog_snapshot(blob):
        return sum(size for _, size, _ in manifest(blob)["files"])
    if is_rocksdb_snapshot(blob):
        m = _manifest(blob)
        return sum(f[2] for f in m["files"]) + sum(len(v) for v in m["inline"].values())
    return len(blob)


def _blobs(states: Mapping[str, TaskState], uid: str) -> list[tuple[str, Any]]:
    return [(task, st.ops[uid]) for task, st in sorted(states.items()) if uid in st.ops]


def operators_with_state(states: Mapping[str, TaskState]) -> list[str]:
    return sorted({uid for st in states.values() for uid in st.ops})


def _operator_blobs(handle: Any, uid: str, states: Mapping[str, TaskState] | None) -> list:
    """Operator ``uid``'s keyed state blobs in the checkpoint, or a KeyError naming the
    operators that have some."""
    states = read_task_states(handle) if states is None else states
    blobs = _blobs(states, uid)
    if not blobs:
        have = operators_with_state(states)
        raise KeyError(f"checkpoint {handle.path} holds no keyed state of operator {uid!r}; "
                       f"operators with keyed state: {have or 'none'}")
    return blobs


def keyed_rows(handle: Any, uid: str, states: Mapping[str, TaskState] | None = None
               ) -> Iterator[dict]:
    """One row per key of operator ``uid``: ``{"key", "key_group", <state name>: value}``."""
    blobs = _operator_blobs(handle, uid, states)
    now = time.time()
    for _, blob in blobs:
        rows: dict[Any, dict] = {}
        for group, name, key, value in keyed_entries(blob):
            timer = name in TIMER_STATES
            if name.startswith("__") and not timer:
                continue  # an operator's own entries (its watermark per key group)
            if timer:
                when, key = value
            else:
                value = _live(value, now)
                if value is _EXPIRED:
                    continue
            try:
                row = rows.setdefault(key, {"key": key, "key_group": group})
            except TypeError:  # unhashable key
                row = {"key": key, "key_group": group}
                yield row
            if timer:
                col = "timers." + name.rsplit(".", 1)[1]
                row[col] = sorted([*row.get(col, ()), when])
            else:
                row[_column(name)] = value
        yield from rows.values()


def is_window_operator(handle: Any, uid: str) -> bool:
    """Whether operator ``uid`` of the checkpoint is a window operator (its plan says so)."""
    plan = (handle.metadata.get("plan") or {}).get("operators") or {}
    return (plan.get(uid) or {}).get("kind") in WINDOW_KINDS


def window_rows(handle: Any, uid: str, states: Mapping[str, TaskState] | None = None
                ) -> Iterator[dict]:
    """One row per key and window of window operator ``uid``: ``{"key", "start", "end",
    "accumulator", "fired"}``, by key group, then key, then window.  ``fired``: the
    watermark the operator acted on had reached the window's end (a window kept for its
    ``allowed_lateness``), or the end of input fired it.  A sliding window on record
    batches that keeps panes (one slide each, merged when a window fires) has a row per
    pane."""
    blobs = _operator_blobs(handle, uid, states)
    for _, blob in blobs:
        marks: dict[int, float] = {}
        fired: dict[Any, Any] = {}
        windows: list[tuple[int, Any, Any]] = []
        for group, name, key, value in keyed_entries(blob):
            if name == WINDOWS:
                windows.append((group, key, value))
            elif name == WINDOW_MARKS:
                marks[group] = value
            elif name == WINDOW_FIRED and value:
                fired[_hashable(key)] = value
        for group, key, value in windows:
            mark = marks.get(group, -math.inf)
            done = fired.get(_hashable(key)) or ()
            for (start, end), acc in sorted(value.items(), key=_by_window):
                yield {"key": key, "start": start, "end": end, "accumulator": acc,
                       "fired": end <= mark or (start, end) in done}


def _by_window(item: tuple) -> tuple:
    (start, end), _ = item
    return (start, end)


def _hashable(key: Any) -> Any:
    try:
        hash(key)
    except TypeError:
        return repr(key)
    return key


_EXPIRED: Any = object()


def _live(value: Any, now: float) -> Any:
    """A stored value without its TTL wrappers (:mod:`cutline.state.ttl`), expired parts
    left out (``_EXPIRED``: all of it)."""
    if type(value) is Expiring:
        return value.value if value.expires > now else _EXPIRED
    if isinstance(value, list) and any(type(v) is Expiring for v in value):
        return [v.value if type(v) is Expiring else v for v in value
                if type(v) is not Expiring or v.expires > now]
    if isinstance(value, dict) and any(type(v) is Expiring for v in value.values()):
        return {k: v.value if type(v) is Expiring else v for k, v in value.items()
                if type(v) is not Expiring or v.expires > now}
    return value


def _column(name: str) -> str:
    """The user's state name: list and map state are stored as ``l:<name>`` / ``m:<name>``."""
    return name[2:] if name[:2] in ("l:", "m:") else name


def summary(handle: Any) -> dict:
    """Operators, tasks, bytes and key counts of a checkpoint (for the CLI).

    ``keys``: the keys that have state, the keys :func:`keyed_rows` / :func:`window_rows`
    (``cutline.state.read``) return rows of.  A window operator's also has ``windows``:
    its windows held (open, or fired and kept for ``allowed_lateness``), one row each in
    :func:`window_rows`; and ``fired_at_end``: the windows the end of input fired that
    are only remembered (no accumulator kept, no row), so that a record for one of them in
    a run continued from this checkpoint is late (:mod:`cutline.runtime.windows`; those
    whose accumulator is kept are among ``windows``).
    ``name``: what the dashboard calls an operator cutline named (the checkpoint's plan
    records it), else its uid."""
    states = read_task_states(handle)
    plan = (handle.metadata.get("plan") or {}).get("operators") or {}
    per_op: dict[str, dict] = defaultdict(lambda: {"tasks": 0, "keys": 0, "bytes": 0})
    for st in states.values():
        for uid, blob in st.ops.items():
            op = per_op[uid]
            op["tasks"] += 1
            op["bytes"] += state_bytes(blob)
            window = (plan.get(uid) or {}).get("kind") in WINDOW_KINDS
            keys: set = set()
            held: dict[Any, Any] = {}  # a window operator's: key -> its windows held
            fired: list[tuple[Any, Any]] = []  # (key, windows the end of input fired)
            for _, name, k, v in keyed_entries(blob):
                if window and name == WINDOW_FIRED:  # marks: a key only for its held ones
                    fired.append((_hashable(k), v or ()))
                    continue
                if window and name == WINDOWS:
                    op["windows"] = op.get("windows", 0) + len(v or ())
                    held[_hashable(k)] = v or {}
                if name in TIMER_STATES:
                    op["timers"] = op.get("timers", 0) + 1
                    k = v[1]
                elif name == LATE_STATE:  # a window's dropped late records, per key group
                    op["late_records"] = op.get("late_records", 0) + v
                    by = op.setdefault("late_by_subtask", {})
                    by[st.index] = by.get(st.index, 0) + v
                    continue
                elif name.startswith("__") or name in PER_KEY_GROUP_STATES:
                    continue  # (entries per key group, under a stand-in key: not keys)
                if k.__hash__ is not None:
                    keys.add(k)
            op["keys"] += len(keys)
            if fired:  # fired by the end of input and only remembered (no accumulator)
                op["fired_at_end"] = op.get("fired_at_end", 0) + sum(
                    1 for k, marks in fired for w in marks if w not in held.get(k, ()))
        if st.source is not None and st.source_uid is not None:
            per_op[st.source_uid]["source"] = True
        if st.sink and st.sink_uid is not None:
            sink = per_op[st.sink_uid]
            sink["pending_transactions"] = sink.get("pending_transactions", 0) + len(st.sink)
        if st.in_flight_bytes:
            chain = per_op[st.chain]
            chain["in_flight_bytes"] = chain.get("in_flight_bytes", 0) + st.in_flight_bytes
        if st.watermarks is not None:  # event time: the chain's output, lowest subtask's
            chain = per_op[st.chain]
            wm = decode_ts(st.watermarks.get("output"))
            chain["_wm"] = min(chain.get("_wm", math.inf), wm)
    operators = []
    for uid in sorted(set(plan) | set(per_op)):
        info = dict(per_op.get(uid, {}))
        info.setdefault("tasks", 0)
        info.setdefault("keys", 0)
        info.setdefault("bytes", 0)
        if plan.get(uid, {}).get("kind") in WINDOW_KINDS:
            info.setdefault("late_records", 0)  # none dropped (or they go to .late())
            info.setdefault("windows", 0)
            info.setdefault("fired_at_end", 0)
        if "_wm" in info:  # None: no watermark yet, "inf": the end of input
            info["watermark"] = encode_ts(info.pop("_wm"))
        operators.append({"uid": uid, "name": plan.get(uid, {}).get("name") or uid,
                          "kind": plan.get(uid, {}).get("kind"),
                          "parallelism": plan.get(uid, {}).get("parallelism"), **info})
    return {"path": handle.path, "id": handle.id, "savepoint": handle.is_savepoint,
            "final": bool(handle.metadata.get("final")),
            "job": handle.job, "mode": handle.metadata.get("mode"),
            "tasks": len(states),
            "state_bytes": sum(int(i.get("size") or 0) for i in handle.states.values()),
            "operators": operators}
