"""The checkpoint schema: what one task's state file holds, and its versioned codec.

A dataflow task writes one state file per checkpoint (``chk-<id>/<task>.state``, see
:mod:`cutline.storage.checkpoints`): a msgpack map, never pickle at this level.  Its fields
are :class:`TaskState`'s; user objects inside it (keyed state, in-flight records) are opaque
``bytes`` that their owners decode.

Versions:

- **1**: the map without a ``"version"`` field, written by cutline up to commit be9b5d9.
  ``out_channels`` (added with unaligned output state) and ``dead_letter`` may be absent.
- **2**: the same fields plus ``"version": 2``, every field present.
- **3**: plus ``watermarks`` (event time, issue 14): the task's watermark state, a map
  (input tracker, per-segment watermarks, assigners' generators) or nil for a task of a
  pipeline without event time.  Versions 1 and 2 decode with ``watermarks`` nil.

:func:`decode_task_state` reads both; a newer version, or a file that is not a task state,
is refused naming the file and what it found.  Channel ids keep their text form
(``"a.0->b.1"``) in the file and are :class:`~cutline.plan.ChannelId` once decoded.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import msgpack

from .checkpoints import CheckpointHandle, CheckpointStorageError, CorruptCheckpointError

__all__ = ["VERSION", "ChannelId", "TaskState", "UnsupportedStateVersionError",
           "decode_task_state", "encode_task_state", "read_task_states"]

VERSION = 3
_VERSIONS = (1, 2, 3)


class ChannelId(NamedTuple):
    """One channel: subtask ``src_index`` of chain ``src_chain`` to subtask ``dst_index`` of
    ``dst_chain`` (chains by uid).

    The plan builds them (:meth:`cutline.plan.PhysicalPlan.channel_id`); they are defined
    here, below the plan, because checkpoints store them.  Their text, ``str(ch)`` =
    ``"<src chain>.<i>-><dst chain>.<j>"``, is what the wire, the control messages and the
    checkpoint files carry, and what a task keys its channels by (a plain ``str`` hashes
    fastest on the record path).  The text is parsed back in one place only,
    :meth:`parse`, for ids read from a checkpoint file.
    """

    src_chain: str
    src_index: int
    dst_chain: str
    dst_index: int

    def __str__(self) -> str:
        return f"{self.src_chain}.{self.src_index}->{self.dst_chain}.{self.dst_index}"

    @property
    def src_task(self) -> str:
        return f"{self.src_chain}.{self.src_index}"

    @property
    def dst_task(self) -> str:
        return f"{self.dst_chain}.{self.dst_index}"

    @classmethod
    def parse(cls, text: str) -> ChannelId:
        """The id whose text is ``text`` (as a checkpoint file stores it)."""
        src, sep, dst = text.partition("->")
        src_chain, _, i = src.rpartition(".")
        dst_chain, _, j = dst.rpartition(".")
        if not (sep and src_chain and dst_chain and i.isdigit() and j.isdigit()):
            raise ValueError(f"not a channel id: {text!r} (expected 'a.0->b.1')")
        return cls(src_chain, int(i), dst_chain, int(j))


class UnsupportedStateVersionError(CheckpointStorageError):
    """A task state file of a format version this cutline cannot read; names both."""


@dataclass(frozen=True, slots=True)
class TaskState:
    """One subtask's part of a checkpoint.

    ``chain`` is the uid of the chain (its head operator's uid) and ``index`` the subtask;
    ``parallelism`` the chain's when the checkpoint was taken.  ``ops``: keyed operator uid
    -> its snapshot.  ``source``: the source reader's position, ``None`` when the chain has
    no source (``source_uid`` names it).  ``sink`` / ``dead_letter``: pre-committed
    transaction handles not yet known committed, oldest first (``sink_uid`` names the sink).
    ``channels`` / ``out_channels``: in-flight records (pickle-5 blobs) recorded on an input
    channel / still in an output buffer, by channel.
    """

    task: str
    chain: str
    index: int
    parallelism: int
    ops: Mapping[str, bytes] = field(default_factory=dict)
    source_uid: str | None = None
    source: Any = None
    sink_uid: str | None = None
    sink: tuple[Any, ...] = ()
    dead_letter: tuple[Any, ...] = ()
    channels: Mapping[ChannelId, tuple[bytes, ...]] = field(default_factory=dict)
    out_channels: Mapping[ChannelId, tuple[bytes, ...]] = field(default_factory=dict)
    watermarks: Mapping[str, Any] | None = None

    @property
    def in_flight_bytes(self) -> int:
        return sum(len(b) for part in (self.channels, self.out_channels)
                   for blobs in part.values() for b in blobs)


def encode_task_state(state: TaskState) -> bytes:
    """The bytes of ``state``'s file, in the current :data:`VERSION`."""
    return msgpack.packb({
        "version": VERSION, "task": state.task, "chain": state.chain, "index": state.index,
        "parallelism": state.parallelism, "source_uid": state.source_uid,
        "sink_uid": state.sink_uid, "ops": dict(state.ops), "source": state.source,
        "sink": list(state.sink), "dead_letter": list(state.dead_letter),
        "channels": {str(ch): list(b) for ch, b in state.channels.items()},
        "out_channels": {str(ch): list(b) for ch, b in state.out_channels.items()},
        "watermarks": None if state.watermarks is None else dict(state.watermarks),
    }, use_bin_type=True)


# field -> (check, what it must be), for a version 2 map
_FIELDS: dict[str, tuple[Any, str]] = {
    "task": (lambda v: isinstance(v, str), "a string"),
    "chain": (lambda v: isinstance(v, str), "a string"),
    "index": (lambda v: type(v) is int and v >= 0, "an integer >= 0"),
    "parallelism": (lambda v: type(v) is int and v >= 1, "an integer >= 1"),
    "source_uid": (lambda v: v is None or isinstance(v, str), "a string or nil"),
    "sink_uid": (lambda v: v is None or isinstance(v, str), "a string or nil"),
    "ops": (lambda v: isinstance(v, dict) and all(
        isinstance(k, str) and isinstance(b, bytes) for k, b in v.items()),
        "a map of operator uid to bytes"),
    "source": (lambda v: True, "anything"),
    "sink": (lambda v: isinstance(v, list), "a list"),
    "dead_letter": (lambda v: isinstance(v, list), "a list"),
    "channels": (lambda v: _is_channel_map(v), "a map of channel id to a list of bytes"),
    "out_channels": (lambda v: _is_channel_map(v), "a map of channel id to a list of bytes"),
    "watermarks": (lambda v: v is None or isinstance(v, dict), "a map or nil"),
}


def _is_channel_map(v: Any) -> bool:
    return isinstance(v, dict) and all(
        isinstance(k, str) and isinstance(blobs, list)
        and all(isinstance(b, bytes) for b in blobs) for k, blobs in v.items())


def _upgrade_v1(obj: dict[str, Any]) -> dict[str, Any]:
    """A version 1 map as version 2: ``out_channels`` / ``dead_letter`` absent -> empty, a
    ``sink`` of ``None`` (no sink) -> ``[]``."""
    obj.setdefault("out_channels", {})
    obj.setdefault("dead_letter", [])
    if "sink" in obj and obj["sink"] is None:
        obj["sink"] = []
    return obj


def _upgrade_v2(obj: dict[str, Any]) -> dict[str, Any]:
    """A version 2 map as version 3: no event time (``watermarks`` nil)."""
    obj.setdefault("watermarks", None)
    return obj


_UPGRADES = {1: _upgrade_v1, 2: _upgrade_v2}  # version n -> its map as version n + 1


def decode_task_state(data: bytes, where: str) -> TaskState:
    """The :class:`TaskState` in the file ``where`` (named by every error) holding ``data``.

    :class:`UnsupportedStateVersionError` for a version other than 1 and 2,
    :class:`~cutline.storage.checkpoints.CorruptCheckpointError` for anything else that is
    not a task state."""
    try:
        obj = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as exc:  # noqa: BLE001 - whatever the bytes are, name the file
        raise CorruptCheckpointError(
            f"unreadable task state {where}: {type(exc).__name__}: {exc}") from None
    if not isinstance(obj, dict):
        raise CorruptCheckpointError(
            f"task state {where} is a msgpack {type(obj).__name__}, not a map")
    version = obj.pop("version", 1)  # version 1 (up to be9b5d9) has no version field
    if type(version) is not int or version not in _VERSIONS:
        raise UnsupportedStateVersionError(
            f"task state {where} has format version {version!r}; this cutline reads "
            f"versions {', '.join(map(str, _VERSIONS))} (a newer cutline wrote it: restore "
            "it with that version)")
    for v in range(version, VERSION):
        obj = _UPGRADES[v](obj)
    missing = sorted(set(_FIELDS) - set(obj))
    if missing:
        raise CorruptCheckpointError(
            f"task state {where} (format version {version}) lacks {', '.join(missing)}")
    for name, (check, what) in _FIELDS.items():
        if not check(obj[name]):
            raise CorruptCheckpointError(
                f"task state {where} (format version {version}): field {name!r} must be "
                f"{what}, got {type(obj[name]).__name__}")
    try:
        channels = {part: {ChannelId.parse(ch): tuple(blobs) for ch, blobs in obj[part].items()}
                    for part in ("channels", "out_channels")}
    except ValueError as exc:
        raise CorruptCheckpointError(f"task state {where}: {exc}") from None
    return TaskState(
        task=obj["task"], chain=obj["chain"], index=obj["index"],
        parallelism=obj["parallelism"], ops=obj["ops"], source_uid=obj["source_uid"],
        source=obj["source"], sink_uid=obj["sink_uid"], sink=tuple(obj["sink"]),
        dead_letter=tuple(obj["dead_letter"]), channels=channels["channels"],
        out_channels=channels["out_channels"], watermarks=obj["watermarks"])


def read_task_states(handle: CheckpointHandle) -> dict[str, TaskState]:
    """Every task state of a checkpoint (a verified handle), decoded, by task id."""
    return {task: decode_task_state(handle.read_task_state(task), handle.state_path(task))
            for task in handle.tasks}
