"""Every message a job's driver, its tasks and an admin client exchange: one module, one codec.

Each message is a frozen, slotted dataclass; :func:`encode` and :func:`decode` are the only
way they become bytes and back.  A frame is the msgpack array ``[VERSION, tag, *fields]``
(fields in declaration order; a nested message is its own field array).  :func:`decode`
refuses, with a :class:`MessageError` naming what was wrong, a frame that is not msgpack,
carries another codec version, an unknown tag, the wrong number of fields or a field of the
wrong type; receivers log that error and drop the frame.  Nothing is ever unpickled here.

Who sends what (a newcomer finds every message a task can receive in this file):

==========================  =====================================================
task / host -> driver       :class:`Register`, :class:`Ack`, :class:`Decline`,
                            :class:`Drained`, :class:`ForwardClosed`,
                            :class:`Metrics`, :class:`Finished`, :class:`Failed`
graph host -> driver        :class:`Register`, :class:`Parts`, :class:`Initiated`,
                            :class:`IdsWanted`, :class:`HostMetrics`,
                            :class:`TraceEvents`, :class:`FinalStates`, :class:`Failed`
driver -> task / host       :class:`Start`, :class:`Trigger`, :class:`Abort`,
                            :class:`Complete`, :class:`CloseLoop`, :class:`Align`,
                            :class:`Stop`,
                            :class:`TriggerProcesses`, :class:`Ids`
admin client <-> driver     :class:`SavepointRequest`, :class:`SavepointReply`
==========================  =====================================================
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass
from typing import Any, ClassVar, TypeAlias

import msgpack

__all__ = [
    "VERSION", "MessageError", "Message", "encode", "decode",
    "Register", "SnapshotStats", "Ack", "Decline", "Drained", "ForwardClosed", "Metrics",
    "Finished", "Failed", "Start", "Trigger", "Abort", "Complete", "CloseLoop", "Align", "Stop",
    "Parts", "Initiated", "IdsWanted", "Ids", "TriggerProcesses", "HostMetrics",
    "TraceEvents", "FinalStates", "SavepointRequest", "SavepointReply",
]

VERSION = 1
"""Codec version: bump it when a message changes shape; a peer of another version is
refused by name instead of misread (a driver and its tasks always run the same cutline)."""


class MessageError(ValueError):
    """A frame that is not a message of this codec version."""


_BY_TAG: dict[str, type] = {}
_FIELDS: dict[type, tuple[tuple[str, Any], ...]] = {}


def _message(tag: str):
    def register(cls: type) -> type:
        if tag in _BY_TAG:
            raise TypeError(f"message tag {tag!r} used twice")
        cls.TAG = tag  # type: ignore[attr-defined]
        _BY_TAG[tag] = cls
        return cls
    return register


def _fields(cls: type) -> tuple[tuple[str, Any], ...]:
    got = _FIELDS.get(cls)
    if got is None:
        hints = typing.get_type_hints(cls)
        got = _FIELDS[cls] = tuple((f.name, hints[f.name]) for f in dataclasses.fields(cls))
    return got


# ---------------------------------------------------------------- task -> driver

@_message("register")
@dataclass(frozen=True, slots=True)
class Register:
    """A slot (Spark task) of a new attempt: its subtasks' (or host's) listen addresses
    (``None``: no inputs, nobody connects to it)."""
    slot: int
    pid: int
    addresses: dict[str, list | None]
    TAG: ClassVar[str]


@_message("stats")
@dataclass(frozen=True, slots=True)
class SnapshotStats:
    """What a task reports with its acknowledgement: where its state file is and what the
    snapshot cost.  ``shared``: RocksDB files the state references (listed in ``_metadata``).
    Times in seconds: ``alignment`` (channels held blocked for the barriers), ``sync`` (the
    synchronous part, on the task's thread: state captured, the barrier sent on after the
    output buffered ahead of it), ``duration`` (from the snapshot to the ack: ``sync`` plus
    the asynchronous write).  ``in_flight``: records of
    channel state, ``in_flight_bytes`` their persisted size."""
    path: str | None = None
    size: int | None = None
    sha256: str | None = None
    bytes: int = 0
    in_flight: int = 0
    alignment: float = 0.0
    duration: float = 0.0
    chain: str | None = None
    forward_closed: bool = False
    shared: dict | None = None
    sync: float = 0.0
    in_flight_bytes: int = 0
    TAG: ClassVar[str]

    def as_dict(self) -> dict[str, Any]:
        """The mapping :meth:`CheckpointStorage.commit` takes for ``states``."""
        return {f: getattr(self, f) for f, _ in _fields(SnapshotStats)
                if getattr(self, f) is not None}


@_message("ack")
@dataclass(frozen=True, slots=True)
class Ack:
    task: str
    checkpoint: int
    stats: SnapshotStats
    TAG: ClassVar[str]


@_message("decline")
@dataclass(frozen=True, slots=True)
class Decline:
    task: str
    checkpoint: int
    reason: str
    TAG: ClassVar[str]


@_message("drained")
@dataclass(frozen=True, slots=True)
class Drained:
    """The task's inputs all ended and it sent EOF downstream."""
    task: str
    TAG: ClassVar[str]


@_message("forward_closed")
@dataclass(frozen=True, slots=True)
class ForwardClosed:
    """An iteration head whose inputs from outside the loop all ended."""
    task: str
    TAG: ClassVar[str]


TIMERS_COUNTED = 100_000  # a task counts its pending timers up to this (RocksDB reads them)


@_message("metrics")
@dataclass(frozen=True, slots=True)
class Metrics:
    """A task's progress.  ``watermark``: its output watermark with event time, encoded
    (:func:`~cutline.protocol.watermarks.encode_ts`: ``None`` none yet, ``"inf"`` the end);
    ``timed``: whether it has one.  ``backpressured``: seconds so far its output waited for
    credit from a slower receiver.  ``timers``: its pending timers (``process`` with
    ``on_timer``), counted up to :data:`TIMERS_COUNTED`.  ``records``: records only (not
    watermarks, not idle markers).  ``late``: per window operator (uid) that drops late
    records, how many it dropped (restored counts included: they are in its checkpoints);
    ``first_late``: per such operator, ``[time, watermark]`` of the first record it dropped
    in this attempt (the driver's console warning names them).  A source whose reader
    tells them: ``lag``, records behind the end of each of its splits (Kafka: per
    ``"topic/partition"``); ``stalled``, why it cannot read now (a broker not answering).
    ``idle``: a source subtask whose assigner is idle or that has no split to read (it
    holds no other subtask back in watermark alignment)."""
    task: str
    records: int
    source: bool
    cpu: float
    timed: bool = False
    watermark: float | str | None = None
    backpressured: float = 0.0
    timers: int = 0
    late: dict[str, int] | None = None
    first_late: dict[str, list] | None = None
    lag: dict[str, int] | None = None
    stalled: str | None = None
    idle: bool = False
    TAG: ClassVar[str]


@_message("finished")
@dataclass(frozen=True, slots=True)
class Finished:
    task: str
    cpu: float
    TAG: ClassVar[str]


@_message("failed")
@dataclass(frozen=True, slots=True)
class Failed:
    """A task (or graph host ``"host-k"``) failed.  ``fatal``: it will fail again on a
    retry (bad record, user code, a sink refusing a commit): the job fails with ``error``."""
    who: str
    fatal: bool
    error: str
    trace: str = ""
    TAG: ClassVar[str]


# ---------------------------------------------------------------- driver -> task

@_message("start")
@dataclass(frozen=True, slots=True)
class Start:
    """Every slot registered: run attempt ``attempt`` from ``restore`` (a checkpoint path,
    or ``None``), connecting outputs to ``addresses``.  ``t0``: the run's wall-clock start
    (process graphs time their traces from it)."""
    attempt: int
    addresses: dict[str, list | None]
    restore: str | None = None
    t0: float = 0.0
    TAG: ClassVar[str]


@_message("trigger")
@dataclass(frozen=True, slots=True)
class Trigger:
    """Snapshot now and emit barrier ``checkpoint`` (sources; or tasks no barrier can reach:
    drained, or an iteration head whose outside inputs ended)."""
    checkpoint: int
    task: str
    TAG: ClassVar[str]


@_message("abort")
@dataclass(frozen=True, slots=True)
class Abort:
    checkpoint: int
    TAG: ClassVar[str]


@_message("complete")
@dataclass(frozen=True, slots=True)
class Complete:
    """``_metadata`` of ``checkpoint`` is written: sinks commit.  ``final``: the job's last."""
    checkpoint: int
    final: bool = False
    TAG: ClassVar[str]


@_message("close_loop")
@dataclass(frozen=True, slots=True)
class CloseLoop:
    """A checkpoint showed this iteration empty: the head ends its outputs."""
    task: str
    TAG: ClassVar[str]


@_message("align")
@dataclass(frozen=True, slots=True)
class Align:
    """Watermark alignment across a source's subtasks (``assign_timestamps(max_drift=)``,
    Flink's FLIP-182): the lowest watermark of the subtasks in ``task``'s alignment group
    (encoded, :func:`~cutline.protocol.watermarks.encode_ts`).  The task reads on while
    its own watermark is at most its ``max_drift`` above it, and pauses beyond."""
    task: str
    watermark: float | str | None
    TAG: ClassVar[str]


@_message("stop")
@dataclass(frozen=True, slots=True)
class Stop:
    """End now (the run ended, was stopped with a savepoint, or this attempt is stale).
    ``lost``: not sent by the driver; a task's own note that its driver is gone.
    ``abandoned``: why the driver gave up this attempt (a task of it was lost): the Spark
    task ends with that error, never a success Spark would keep (it would then rerun only
    the other partitions, and the next attempt would miss this slot)."""
    lost: bool = False
    abandoned: str = ""
    TAG: ClassVar[str]


# ---------------------------------------------------------------- process graphs

@_message("parts")
@dataclass(frozen=True, slots=True)
class Parts:
    """Finished snapshot parts: ``[snapshot id, process, part]`` each."""
    slot: int
    parts: list
    TAG: ClassVar[str]


@_message("initiated")
@dataclass(frozen=True, slots=True)
class Initiated:
    """Process ``process`` started snapshot ``checkpoint`` on its own."""
    checkpoint: int
    process: str
    TAG: ClassVar[str]


@_message("ids_wanted")
@dataclass(frozen=True, slots=True)
class IdsWanted:
    slot: int
    TAG: ClassVar[str]


@_message("ids")
@dataclass(frozen=True, slots=True)
class Ids:
    """Snapshot ids a host hands to processes that initiate snapshots themselves."""
    ids: list
    TAG: ClassVar[str]


@_message("trigger_processes")
@dataclass(frozen=True, slots=True)
class TriggerProcesses:
    checkpoint: int
    processes: list
    TAG: ClassVar[str]


@_message("host_metrics")
@dataclass(frozen=True, slots=True)
class HostMetrics:
    slot: int
    delivered: int
    sent: int
    cpu: float
    TAG: ClassVar[str]


@_message("trace")
@dataclass(frozen=True, slots=True)
class TraceEvents:
    slot: int
    events: list
    TAG: ClassVar[str]


@_message("final")
@dataclass(frozen=True, slots=True)
class FinalStates:
    """A stopped host's processes: their final states (pickled by the host's processes'
    own code, opened only by the driver that started them), and its counters."""
    slot: int
    states: dict[str, bytes]
    queued: int = 0
    timers: int = 0
    trace_dropped: int = 0
    delivered: int = 0
    sent: int = 0
    cpu: float = 0.0
    TAG: ClassVar[str]


# ---------------------------------------------------------------- admin

@_message("savepoint")
@dataclass(frozen=True, slots=True)
class SavepointRequest:
    stop: bool = False
    timeout: float = 600.0
    TAG: ClassVar[str]


@_message("savepoint_reply")
@dataclass(frozen=True, slots=True)
class SavepointReply:
    ok: bool
    path: str | None = None
    error: str | None = None
    TAG: ClassVar[str]


Message: TypeAlias = (
    Register | Ack | Decline | Drained | ForwardClosed | Metrics | Finished | Failed | Start
    | Trigger | Abort | Complete | CloseLoop | Align | Stop | Parts | Initiated | IdsWanted | Ids
    | TriggerProcesses | HostMetrics | TraceEvents | FinalStates | SavepointRequest
    | SavepointReply
)

# ---------------------------------------------------------------- the codec


def _to_wire(msg: Any) -> list:
    return [_value(getattr(msg, name)) for name, _ in _fields(type(msg))]


def _value(v: Any) -> Any:
    if getattr(type(v), "TAG", None) in _BY_TAG:
        return _to_wire(v)
    return v


def encode(msg: Any) -> bytes:
    """The frame body of ``msg`` (one of this module's messages)."""
    cls = type(msg)
    if _BY_TAG.get(getattr(cls, "TAG", "")) is not cls:
        raise TypeError(f"not a control message: {msg!r}")
    return msgpack.packb([VERSION, cls.TAG, *_to_wire(msg)], use_bin_type=True)


def decode(data: bytes | bytearray | memoryview) -> Any:
    """The message in a frame body; :class:`MessageError` naming what is wrong otherwise."""
    try:
        frame = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as exc:  # noqa: BLE001 - msgpack raises several types
        raise MessageError(f"not a msgpack frame ({type(exc).__name__}: {exc})") from None
    if not isinstance(frame, list) or len(frame) < 2:
        raise MessageError(f"not a control message frame: {_short(frame)}")
    version, tag = frame[0], frame[1]
    if version != VERSION:
        raise MessageError(f"control message of codec version {_short(version)} "
                           f"(this cutline speaks version {VERSION}): {_short(frame)}")
    cls = _BY_TAG.get(tag) if isinstance(tag, str) else None
    if cls is None:
        raise MessageError(f"unknown control message {_short(tag)}")
    return _build(cls, frame[2:], tag)


def _build(cls: type, values: list, tag: str) -> Any:
    fields = _fields(cls)
    required = sum(1 for f in dataclasses.fields(cls)
                   if f.default is dataclasses.MISSING
                   and f.default_factory is dataclasses.MISSING)
    if not required <= len(values) <= len(fields):
        raise MessageError(f"malformed {tag!r} message: {len(values)} fields, expected "
                           f"{required}..{len(fields)}")
    kwargs = {}
    for (name, hint), v in zip(fields, values):
        kwargs[name] = _check(tag, name, hint, v)
    return cls(**kwargs)


_SCALARS = {int: (int,), float: (float, int), str: (str,), bool: (bool,),
            bytes: (bytes,), type(None): (type(None),)}


def _check(tag: str, name: str, hint: Any, v: Any) -> Any:
    if hint is Any:
        return v
    options = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    for opt in options:
        origin = typing.get_origin(opt) or opt
        if origin in _BY_TAG.values():
            if isinstance(v, list):
                return _build(origin, v, f"{tag}.{name}")
            continue
        if origin is float and isinstance(v, int) and not isinstance(v, bool):
            return float(v)
        kinds = _SCALARS.get(origin, (origin,))
        if isinstance(v, kinds) and not (origin is int and isinstance(v, bool)):
            return v
    raise MessageError(f"malformed {tag!r} message: field {name!r} is {_short(v)}, "
                       f"expected {getattr(hint, '__name__', hint)}")


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 120 else text[:120] + "..."

