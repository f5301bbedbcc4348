"""Tokens (or money) passed at random on a strongly connected graph.

Each process starts with the same number of tokens and, at random times, sends a random
part of them to a random neighbour.  Snapshots are started by one to three initiators at
once, and several are in flight together.  Every completed snapshot must conserve the
total *counting the tokens in transit*: the process states alone do not, which is why
Chandy-Lamport records channel state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...analysis import GlobalState, check_cut, total
from ..graphs import strongly_connected
from ..world import SimContext, SimProcess, Simulation, Snapshot


class Bank(SimProcess):
    """State: the tokens held.  Messages: token amounts."""

    def __init__(self, tokens: int, period: float) -> None:
        self.state = tokens
        self.period = period

    def on_start(self, ctx: SimContext) -> None:
        ctx.schedule(ctx.rng.expovariate(1 / self.period), "transfer")

    def on_timer(self, ctx: SimContext, tag: Any) -> None:
        if self.state > 0 and ctx.outputs:
            amount = ctx.rng.randint(1, self.state)
            self.state -= amount
            ctx.send(ctx.rng.choice(ctx.outputs), amount)
        ctx.schedule(ctx.rng.expovariate(1 / self.period), "transfer")

    def on_receive(self, ctx: SimContext, channel: str, payload: Any) -> None:
        self.state += payload


@dataclass
class SnapshotRow:
    id: int
    initiators: list[str]
    in_processes: int
    in_transit: int
    total: int
    consistent: bool
    duration: float


@dataclass
class TokensResult:
    sim: Simulation
    expected_total: int
    rows: list[SnapshotRow] = field(default_factory=list)
    max_concurrent: int = 0

    @property
    def all_conserved(self) -> bool:
        return bool(self.rows) and all(r.total == self.expected_total and r.consistent
                                       for r in self.rows)

    @property
    def states_alone_wrong(self) -> int:
        """Snapshots where the process states alone miss tokens that were in transit."""
        return sum(r.in_processes != self.expected_total for r in self.rows)

    def as_dict(self) -> dict:
        return {
            "expected_total": self.expected_total,
            "all_conserved": self.all_conserved,
            "max_concurrent_snapshots": self.max_concurrent,
            "snapshots": [r.__dict__ for r in self.rows],
        }


def build(
    processes: int = 5, tokens: int = 100, seed: int = 0, mode: str = "chandy_lamport",
    period: float = 1.0, graph_seed: int | None = None,
) -> Simulation:
    import random

    sim = Simulation(mode, seed=seed, delay=(0.2, 2.0))
    names = [f"P{i + 1}" for i in range(processes)]
    for n in names:
        sim.add_process(n, Bank(tokens, period))
    graph_rng = random.Random(seed if graph_seed is None else graph_seed)
    for a, b in strongly_connected(processes, graph_rng):
        sim.connect(names[a], names[b])
    return sim


def run(
    processes: int = 5, tokens: int = 100, snapshots: int = 8, seed: int = 0,
    duration: float = 20.0, max_initiators: int = 3,
) -> TokensResult:
    if processes < 2:
        raise ValueError(f"tokens needs at least 2 processes, got {processes}")
    sim = build(processes, tokens, seed)
    names = list(sim.procs)
    initiators: dict[int, list[str]] = {}
    for k in range(1, snapshots + 1):
        t = duration * k / (snapshots + 1)
        who = sim.rng.sample(names, sim.rng.randint(1, min(max_initiators, processes)))
        initiators[k] = who
        # several initiators of the same snapshot, each at a slightly different moment;
        # consecutive snapshots overlap in time
        for i, name in enumerate(who):
            sim.snapshot_at(t + 0.3 * i, k, [name])
    sim.run(until=duration + 20)
    result = TokensResult(sim, processes * tokens)
    result.max_concurrent = _max_overlap(sim.completed)
    for snap in sim.completed:
        gs = GlobalState.of(snap)
        report = check_cut(sim.trace, snap, sim.procs, sim.chans)
        result.rows.append(SnapshotRow(
            snap.id, initiators.get(snap.id, []),
            int(total(gs, include_channels=False)), int(sum(gs.in_transit())),
            int(total(gs)), report.ok, round(snap.duration or 0.0, 3),
        ))
    return result


def _max_overlap(snaps: list[Snapshot]) -> int:
    """Most snapshots in flight at one moment."""
    marks = sorted([(s.started_at, 1) for s in snaps] + [(s.completed_at, -1) for s in snaps])
    best = cur = 0
    for _, d in marks:
        cur += d
        best = max(best, cur)
    return best
