"""What a run of a process graph leaves behind: its snapshots, checks, trace and end."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..analysis.trace import TraceEvent
from .snapshot import Check, GraphSnapshot

__all__ = ["RunResult", "Attempt"]


@dataclass
class Attempt:
    number: int
    started: float  # wall clock (time.time())
    restored_from: str | None
    restored_id: int | None = None  # the snapshot it restored
    redelivered: int = 0  # messages in transit in that snapshot, delivered again
    lost_at: float | None = None  # wall clock when the driver saw a host of it go


@dataclass
class RunResult:
    job: str
    names: list[str]
    edges: list[tuple[str, str]]
    #: completed snapshots, in the order they completed (all attempts)
    snapshots: list[GraphSnapshot] = field(default_factory=list)
    #: why the run ended: "terminated", "<predicate> detected", "duration", ...
    stopped: str = ""
    #: the snapshot that ended the run (termination or another stopping predicate)
    stopped_by: GraphSnapshot | None = None
    final_states: dict[str, Any] = field(default_factory=dict)
    attempts: list[Attempt] = field(default_factory=list)
    duration: float = 0.0
    storage: str = ""  # the job directory holding the stored snapshots
    restored_from: str | None = None
    trace: list[TraceEvent] = field(default_factory=list)  # last attempt, when traced
    trace_dropped: int = 0
    delivered: int = 0  # messages delivered in the last attempt
    task_pids: dict[int, int] = field(default_factory=dict)
    started_at: float = 0.0  # wall clock when the run began; snapshot times count from it

    # ------------------------------------------------------------------ reading

    @property
    def terminated(self) -> GraphSnapshot | None:
        """The snapshot that detected termination, if the run ended that way."""
        s = self.stopped_by
        return s if s is not None and s.terminated else None

    @property
    def latest(self) -> GraphSnapshot | None:
        return self.snapshots[-1] if self.snapshots else None

    def snapshot(self, n: int) -> GraphSnapshot:
        for s in self.snapshots:
            if s.id == n:
                return s
        raise KeyError(f"no completed snapshot {n} in this run "
                       f"(have {[s.id for s in self.snapshots]})")

    @property
    def violations(self) -> list[tuple[int, Check]]:
        """(snapshot id, check) of every invariant that failed."""
        return [(s.id, c) for s in self.snapshots for c in s.checks if c.violated]

    @property
    def detections(self) -> list[tuple[int, Check]]:
        """(snapshot id, check) of every stable predicate seen to hold."""
        return [(s.id, c) for s in self.snapshots for c in s.checks if c.detected]

    def showcase(self) -> GraphSnapshot | None:
        """The snapshot pictures show by default: the first of the last attempt that caught
        messages in transit, else the one that ended the run, else the latest."""
        mine = [s for s in self.snapshots if s.attempt == self.last_attempt]
        return next((s for s in mine if s.in_transit), None) or self.stopped_by or self.latest

    @property
    def last_attempt(self) -> int:
        return self.attempts[-1].number if self.attempts else 0

    # ------------------------------------------------------------------ checking, pictures

    def check_cuts(self) -> dict[int, Any]:
        """Dijkstra's colouring (:func:`cutline.analysis.check_cut`) of every snapshot of the
        last attempt against the recorded trace; needs ``run(trace=True)``."""
        from ..analysis import check_cut

        if not self.trace:
            raise ValueError("no trace: run the graph with trace=True")
        if self.trace_dropped:
            raise ValueError(f"the trace is incomplete ({self.trace_dropped} events dropped)")
        chans = [f"{a}->{b}" for a, b in self.edges]
        return {s.id: check_cut(self.trace, s.to_sim(), self.names, chans)
                for s in self.snapshots if s.attempt == self.last_attempt}

    def diagram(self, path: str | Path, snapshot: int | None = None,
                window: tuple[float, float] | None = None, max_messages: int | None = 300,
                title: str | None = None) -> Path:
        """A space-time diagram of a window of the last attempt, with ``snapshot``'s cut
        (default :meth:`showcase`)."""
        from .pictures import run_diagram

        return run_diagram(self, path, snapshot=snapshot, window=window,
                           max_messages=max_messages, title=title)

    def view(self, path: str | Path, snapshot: int | None = None,
             title: str | None = None) -> Path:
        """A picture of one snapshot (default :meth:`showcase`): processes, channels and the
        messages in transit."""
        from .pictures import snapshot_view

        snap = self.snapshot(snapshot) if snapshot is not None else self.showcase()
        if snap is None:
            raise ValueError("the run completed no snapshot")
        return snapshot_view(snap, path, title=title)
