"""Sans-IO distributed snapshot protocol: events in, actions out.

Nothing here opens a socket, starts a thread, reads a clock or touches a file; the
simulator, the exhaustive explorer and the Spark runtime are drivers of these objects.
"""

from .events import (
    AbortCheckpoint,
    Action,
    AlignmentTimeout,
    Barrier,
    BarrierAnnounced,
    BarrierArrived,
    BlockChannel,
    ChannelClosed,
    DeclineSnapshot,
    Deliver,
    EmitBarrier,
    Event,
    FinishSnapshot,
    Mode,
    PrioritizeBarrier,
    ProtocolError,
    RecordChannelState,
    RecordsArrived,
    ScheduleTimeout,
    TakeSnapshot,
    TriggerCheckpoint,
    UnblockChannel,
)
from .handler import SnapshotHandler

__all__ = [
    "AbortCheckpoint", "Action", "AlignmentTimeout", "Barrier", "BarrierAnnounced", "BarrierArrived",
    "BlockChannel", "ChannelClosed", "DeclineSnapshot", "Deliver", "EmitBarrier", "Event",
    "FinishSnapshot", "Mode", "PrioritizeBarrier", "ProtocolError", "RecordChannelState", "RecordsArrived",
    "ScheduleTimeout", "SnapshotHandler", "TakeSnapshot", "TriggerCheckpoint",
    "UnblockChannel",
]
