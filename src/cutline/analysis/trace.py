"""What a run leaves behind: messages, the event trace, and recorded snapshots.

Plain data written by the drivers (the simulator, the process-graph hosts) and read by the
consistent-cut checker, the predicates and the diagrams.  It lives here, beside its readers,
so that ``cutline.analysis`` depends on nothing but itself and the simulator sits above it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Message", "TraceEvent", "Snapshot"]


@dataclass(frozen=True, slots=True)
class Message:
    """An application message; ``label`` names its send event (e.g. ``"H"``)."""

    id: int
    channel: str
    payload: Any
    label: str | None = None


@dataclass(slots=True)
class TraceEvent:
    """One thing that happened.  ``index`` numbers application events per process."""

    time: float
    process: str
    kind: str  # send | recv | internal | snapshot | marker_send | marker_recv
    index: int | None = None
    label: str | None = None
    message: int | None = None
    channel: str | None = None
    checkpoint: int | None = None


@dataclass
class Snapshot:
    """A global snapshot as recorded by the processes: states, cut and channel states."""

    id: int
    states: dict[str, Any] = field(default_factory=dict)
    channels: dict[str, list[Message]] = field(default_factory=dict)
    cut: dict[str, int] = field(default_factory=dict)  # app events before the local snapshot
    taken_at: dict[str, float] = field(default_factory=dict)
    finished: set[str] = field(default_factory=set)
    started_at: float | None = None
    completed_at: float | None = None
    aborted: str | None = None

    @property
    def complete(self) -> bool:
        return self.completed_at is not None

    @property
    def duration(self) -> float | None:
        if self.completed_at is None or self.started_at is None:
            return None
        return self.completed_at - self.started_at

    def channel_payloads(self) -> dict[str, list[Any]]:
        return {c: [m.payload for m in ms] for c, ms in self.channels.items()}
