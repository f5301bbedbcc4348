"""Events a driver feeds into a :class:`~cutline.protocol.handler.SnapshotHandler`, and the
actions the handler returns.

The protocol never performs I/O: a driver (the simulator, the explorer, the Spark runtime)
turns what happens on its channels into events, calls the handler, and carries out the
returned actions *in order*.  All types are small frozen dataclasses.

Records travel in batches: every event and action that carries data carries a whole batch
(any sequence), so a driver pays the protocol's cost once per batch, not once per record.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypeAlias

Channel: TypeAlias = Hashable
Batch: TypeAlias = Sequence[Any]


class Mode(str, Enum):
    """How a task takes its part of a snapshot (DESIGN.md section 2)."""

    #: Markers on FIFO channels, no blocking; in-flight messages recorded per channel.
    CHANDY_LAMPORT = "chandy_lamport"
    #: Flink's exactly-once: block inputs that delivered the barrier until all inputs did.
    ALIGNED = "aligned"
    #: Barriers overtake in-flight data; the overtaken data is recorded as channel state.
    UNALIGNED = "unaligned"
    #: No alignment, no channel state: records after a barrier leak into the snapshot.
    AT_LEAST_ONCE = "at_least_once"

    @classmethod
    def parse(cls, value: "Mode | str") -> "Mode":
        if isinstance(value, Mode):
            return value
        try:
            return cls(value)
        except ValueError:
            names = ", ".join(m.value for m in cls)
            raise ValueError(f"unknown snapshot mode {value!r}; expected one of: {names}") from None


@dataclass(frozen=True, slots=True)
class Barrier:
    """The control message that separates pre- and post-snapshot records on a channel.

    Chandy and Lamport call it a *marker*, Flink a *barrier*; cutline uses one type for both.
    ``unaligned`` barriers may overtake the records queued ahead of them (see
    :class:`BarrierArrived`).
    """

    checkpoint_id: int
    unaligned: bool = False


# --------------------------------------------------------------------------- events


@dataclass(frozen=True, slots=True)
class RecordsArrived:
    """A batch of records was taken off ``channel``, in channel order."""

    channel: Channel
    records: Batch


@dataclass(frozen=True, slots=True)
class BarrierArrived:
    """A barrier reached the task on ``channel``.

    ``overtaken`` is used by drivers of unaligned checkpoints: the records that were queued
    on ``channel`` *ahead of* an unaligned barrier, which the driver took out of the queue
    so that the barrier could be handled first.  The handler records them as channel
    state and hands them back in a :class:`Deliver` after the snapshot.
    """

    channel: Channel
    barrier: Barrier
    overtaken: Batch = ()


@dataclass(frozen=True, slots=True)
class BarrierAnnounced:
    """A barrier is queued on ``channel`` behind records the task has not taken yet.

    Flink's barrier announcement: it lets aligned-with-timeout count the time a barrier
    spends stuck in a backpressured queue.  Drivers may send it whenever a barrier arrives;
    handlers in other modes ignore it.
    """

    channel: Channel
    barrier: Barrier


@dataclass(frozen=True, slots=True)
class TriggerCheckpoint:
    """This task initiates snapshot ``checkpoint_id`` (a source, or a Chandy-Lamport initiator)."""

    checkpoint_id: int


@dataclass(frozen=True, slots=True)
class AbortCheckpoint:
    """The coordinator gave up on ``checkpoint_id`` (declined elsewhere, timed out, cancelled)."""

    checkpoint_id: int


@dataclass(frozen=True, slots=True)
class ChannelClosed:
    """``channel`` ended: its sender finished and no record or barrier will follow."""

    channel: Channel


@dataclass(frozen=True, slots=True)
class AlignmentTimeout:
    """The timer asked for by :class:`ScheduleTimeout` fired."""

    checkpoint_id: int


Event: TypeAlias = (
    RecordsArrived
    | BarrierArrived
    | BarrierAnnounced
    | TriggerCheckpoint
    | AbortCheckpoint
    | ChannelClosed
    | AlignmentTimeout
)


# --------------------------------------------------------------------------- actions


# The two actions built once per batch on the hot path are plain (non-frozen) slotted
# dataclasses: a frozen dataclass pays object.__setattr__ per field, which measured as
# half of the handler's per-batch cost with a checkpoint in flight (bench/protocol.py).
@dataclass(slots=True)
class Deliver:
    """Process these records now (hand them to the operator / process logic)."""

    channel: Channel
    records: Batch


@dataclass(frozen=True, slots=True)
class BlockChannel:
    """Stop taking data off ``channel`` until :class:`UnblockChannel` (alignment)."""

    channel: Channel


@dataclass(frozen=True, slots=True)
class UnblockChannel:
    channel: Channel


@dataclass(frozen=True, slots=True)
class TakeSnapshot:
    """Record the task's own state now: before any record delivered after this action."""

    checkpoint_id: int


@dataclass(frozen=True, slots=True)
class EmitBarrier:
    """Send ``barrier`` on every output channel, before any record produced after this action.

    An unaligned barrier may be put ahead of records already queued on the outputs.
    """

    barrier: Barrier


@dataclass(slots=True)
class RecordChannelState:
    """Append ``records`` to the recorded state of ``channel`` in snapshot ``checkpoint_id``.

    Emitted incrementally, batch by batch, so a driver can stream in-flight data to storage.
    """

    checkpoint_id: int
    channel: Channel
    records: Batch


@dataclass(frozen=True, slots=True)
class FinishSnapshot:
    """This task's part of ``checkpoint_id`` is complete: state and all channel state recorded."""

    checkpoint_id: int


@dataclass(frozen=True, slots=True)
class DeclineSnapshot:
    """This task abandons ``checkpoint_id`` (e.g. subsumed by a newer barrier)."""

    checkpoint_id: int
    reason: str


@dataclass(frozen=True, slots=True)
class ScheduleTimeout:
    """Feed :class:`AlignmentTimeout` back after ``delay`` seconds (driver's clock)."""

    checkpoint_id: int
    delay: float


@dataclass(frozen=True, slots=True)
class PrioritizeBarrier:
    """Take barrier ``checkpoint_id`` out of ``channel``'s queue now, ahead of the records
    before it, and feed it back as an unaligned :class:`BarrierArrived` with those records
    as ``overtaken`` (the alignment timed out while the barrier was still queued)."""

    channel: Channel
    checkpoint_id: int


Action: TypeAlias = (
    Deliver
    | BlockChannel
    | UnblockChannel
    | TakeSnapshot
    | EmitBarrier
    | RecordChannelState
    | FinishSnapshot
    | DeclineSnapshot
    | ScheduleTimeout
    | PrioritizeBarrier
)


class ProtocolError(RuntimeError):
    """A driver fed an event that cannot happen on FIFO channels with this handler's setup."""
