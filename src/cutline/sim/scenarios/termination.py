"""Termination detection of a diffusing computation by snapshots (a stable predicate).

A root starts with work; a process that receives work becomes active, works for a while,
may send work to neighbours (with a shrinking budget, so the computation ends), and turns
passive when it has no work left.  A detector at the root takes Chandy-Lamport snapshots,
one after the other; termination is declared on the first snapshot in which every process
is passive *and every channel is empty*.

Termination is stable, so seeing it on a consistent cut proves it holds from then on: the
detection is never early (EWD 864a, Dijkstra's account of the Chandy-Lamport snapshot, is
the reference).  The states-only check (ignoring the messages in transit) is shown beside
it: it fires while work is still travelling.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...analysis import GlobalState, check_cut, terminated
from ..graphs import strongly_connected
from ..world import SimContext, SimProcess, Simulation, Snapshot


def is_passive(state: dict) -> bool:
    return not state["active"]


class Worker(SimProcess):
    def __init__(self, root: bool, budget: int, fanout: int, work_time: float) -> None:
        self.root, self.budget, self.fanout, self.work_time = root, budget, fanout, work_time
        self.state = {"active": False, "pending": 0, "processed": 0}

    def on_start(self, ctx: SimContext) -> None:
        if self.root:
            self._take(ctx, self.budget)

    def _take(self, ctx: SimContext, budget: int) -> None:
        self.state["pending"] += 1
        self.state["active"] = True
        ctx.schedule(ctx.rng.uniform(0.5, 1.5) * self.work_time, budget)

    def on_receive(self, ctx: SimContext, channel: str, payload: Any) -> None:
        self._take(ctx, payload)

    def on_timer(self, ctx: SimContext, budget: Any) -> None:
        self.state["pending"] -= 1
        self.state["processed"] += 1
        ctx.internal("work")
        if budget > 0:
            least = 1 if budget == self.budget else 0  # the root always spreads work
            for _ in range(ctx.rng.randint(least, self.fanout)):
                ctx.send(ctx.rng.choice(ctx.outputs), budget - 1)
        self.state["active"] = self.state["pending"] > 0


@dataclass
class Probe:
    id: int
    started: float
    completed: float
    active: int
    in_transit: int
    detected: bool
    states_only: bool  # what a check without channel state would have said
    consistent: bool


@dataclass
class TerminationResult:
    sim: Simulation
    probes: list[Probe] = field(default_factory=list)
    terminated_at: float = 0.0  # when the last piece of work ended (ground truth)
    detected_at: float | None = None

    @property
    def early(self) -> bool:
        return self.detected_at is not None and self.detected_at < self.terminated_at

    @property
    def false_alarms_without_channels(self) -> int:
        return sum(p.states_only and not p.detected for p in self.probes)

    def as_dict(self) -> dict:
        return {
            "terminated_at": round(self.terminated_at, 3),
            "detected_at": None if self.detected_at is None else round(self.detected_at, 3),
            "early": self.early,
            "probes": len(self.probes),
            "false_alarms_without_channel_state": self.false_alarms_without_channels,
            "work_items": sum(s["processed"] for s in
                              (p.logic.state for p in self.sim.procs.values())),
        }


def run(
    processes: int = 6, budget: int = 7, fanout: int = 3, seed: int = 0,
    probe_interval: float = 2.0, work_time: float = 1.0,
) -> TerminationResult:
    import random

    if processes < 2:
        raise ValueError(f"termination needs at least 2 processes, got {processes}")
    sim = Simulation("chandy_lamport", seed=seed, delay=(0.2, 1.5))
    names = [f"P{i + 1}" for i in range(processes)]
    for i, n in enumerate(names):
        sim.add_process(n, Worker(i == 0, budget, fanout, work_time))
    for a, b in strongly_connected(processes, random.Random(seed)):
        sim.connect(names[a], names[b])
    result = TerminationResult(sim)
    done = terminated(is_passive)

    def on_complete(snap: Snapshot) -> None:
        assert snap.started_at is not None and snap.completed_at is not None  # completed
        gs = GlobalState.of(snap)
        detected = done(gs)
        result.probes.append(Probe(
            snap.id, snap.started_at, snap.completed_at,
            sum(not is_passive(s) for s in gs.processes.values()), len(gs.in_transit()),
            detected, all(map(is_passive, gs.processes.values())),
            check_cut(sim.trace, snap, sim.procs, sim.chans).ok,
        ))
        if detected and result.detected_at is None:
            result.detected_at = snap.completed_at
        elif not detected:  # probe again: one detection wave at a time
            sim.snapshot_at(sim.now + probe_interval, snap.id + 1, [names[0]])

    sim.on_snapshot_complete.append(on_complete)
    sim.snapshot_at(probe_interval, 1, [names[0]])
    sim.run(max_events=2_000_000)
    app = [e.time for e in sim.trace if e.kind in ("send", "recv", "internal")]
    result.terminated_at = max(app, default=0.0)
    return result
