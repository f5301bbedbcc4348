"""Why global predicates need consistent cuts: states read without markers.

A naive monitor visits the processes one after another and reads each one's state, with
no markers and no channel state: a cut, but not necessarily a consistent one.  Two runs
show what it gets wrong, with the same processes the Chandy-Lamport snapshots get right:

* **tokens**: the monitor sums the tokens it read.  A transfer sent by a process *after*
  the monitor read it and received by a process read *later* is counted twice (the cut
  holds the receive but not the send: Dijkstra's colouring finds the orphan); a transfer
  in flight across the reads is counted nowhere.  The naive total is too high or too low.
* **termination**: the monitor reads, at each process, whether it is passive and how many
  work messages it sent and received, and declares termination when every process it
  read was passive and the counts balance.  Counting messages does not save it: a message
  sent after its sender was read and received before its receiver was read balances a
  message still in flight.  It declares termination while work is still going on.

Stable predicates are sound on consistent cuts only: a consistent cut that shows
termination proves it; an inconsistent one proves nothing.
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass, field
from typing import Any

from ...analysis import check_cut
from ..graphs import strongly_connected
from ...analysis.trace import Snapshot
from ..world import SimContext, SimProcess, Simulation
from . import tokens as tokens_scenario


@dataclass
class Read:
    """One pass of the naive monitor over every process."""

    started: float
    finished: float
    value: Any  # naive total (tokens) or verdict (termination)
    orphans: int  # messages received inside the cut, sent outside it (counted twice)
    unrecorded: int  # messages in flight across the cut (counted nowhere)


@dataclass
class InconsistentResult:
    processes: int
    expected_total: int
    token_reads: list[Read] = field(default_factory=list)
    snapshot_totals: list[int] = field(default_factory=list)  # Chandy-Lamport, same run
    termination_runs: int = 0
    naive_early: list[tuple[int, float, float]] = field(default_factory=list)  # seed, said, end
    snapshot_early: int = 0

    def as_dict(self) -> dict:
        return {
            "expected_total": self.expected_total,
            "naive_totals": [r.value for r in self.token_reads],
            "naive_wrong": sum(r.value != self.expected_total for r in self.token_reads),
            "naive_inconsistent_cuts": sum(r.orphans > 0 for r in self.token_reads),
            "snapshot_totals": self.snapshot_totals,
            "termination_runs": self.termination_runs,
            "naive_early_termination": [
                {"seed": s, "declared": round(a, 3), "ended": round(b, 3)}
                for s, a, b in self.naive_early],
            "snapshot_early_termination": self.snapshot_early,
        }


def _poll(sim: Simulation, start: float, gap: float, order: list[str],
          on_done) -> None:
    """Read ``order``'s states at ``start``, ``start + gap``, ...; no markers."""
    states: dict[str, Any] = {}
    cut: dict[str, int] = {}
    taken: dict[str, float] = {}

    def read(name: str, last: bool) -> None:
        p = sim.procs[name]
        states[name] = copy.deepcopy(p.logic.state)
        cut[name] = p.events
        taken[name] = sim.now
        if last:
            on_done(Snapshot(-1, states=states, cut=cut, taken_at=taken, started_at=start,
                             completed_at=sim.now))

    for i, name in enumerate(order):
        sim._at(start + i * gap, read, name, i == len(order) - 1)


def _judge(sim: Simulation, snap: Snapshot) -> tuple[int, int]:
    report = check_cut(sim.trace, snap, sim.procs, sim.chans)
    unrecorded = sum(len(exp) for exp, _ in report.channel_errors.values())
    return len(report.orphans), unrecorded


def run_tokens(seed: int = 0, processes: int = 5, tokens: int = 100, reads: int = 8,
               gap: float = 0.5) -> tuple[list[Read], list[int]]:
    sim = Simulation("chandy_lamport", seed=seed, delay=(0.05, 0.3))
    names = [f"P{i + 1}" for i in range(processes)]
    for n in names:
        sim.add_process(n, tokens_scenario.Bank(tokens, 0.3))
    for a, b in strongly_connected(processes, random.Random(seed)):
        sim.connect(names[a], names[b])
    rows: list[Read] = []

    def done(snap: Snapshot) -> None:
        assert snap.started_at is not None and snap.completed_at is not None  # completed
        orphans, unrecorded = _judge(sim, snap)
        rows.append(Read(snap.started_at, snap.completed_at, sum(snap.states.values()),
                         orphans, unrecorded))

    for k in range(reads):
        _poll(sim, 2.0 + 4.0 * k, gap, sim.rng.sample(names, len(names)), done)
        sim.snapshot_at(2.0 + 4.0 * k, k + 1, [names[k % len(names)]])
    sim.run(until=4.0 * reads + 10)
    totals = [sum(s.states.values()) + sum(m.payload for ms in s.channels.values()
                                           for m in ms) for s in sim.completed]
    rows.sort(key=lambda r: r.started)
    return rows, totals


class _Worker(SimProcess):
    """A diffusing computation that counts the work messages it sent and received."""

    def __init__(self, root: bool, budget: int) -> None:
        self.root, self.budget = root, budget
        self.state = {"pending": 0, "sent": 0, "received": 0}

    def on_start(self, ctx: SimContext) -> None:
        if self.root:
            self._take(ctx, self.budget)

    def _take(self, ctx: SimContext, budget: int) -> None:
        self.state["pending"] += 1
        ctx.schedule(ctx.rng.uniform(0.3, 1.0), budget)

    def on_receive(self, ctx: SimContext, channel: str, budget: Any) -> None:
        self.state["received"] += 1
        self._take(ctx, budget)

    def on_timer(self, ctx: SimContext, budget: Any) -> None:
        self.state["pending"] -= 1
        ctx.internal("work")
        if budget > 0:
            for _ in range(ctx.rng.randint(1 if budget == self.budget else 0, 2)):
                ctx.send(ctx.rng.choice(ctx.outputs), budget - 1)
                self.state["sent"] += 1


def _naive_says_terminated(snap: Snapshot) -> bool:
    states = snap.states.values()
    return (all(s["pending"] == 0 for s in states)
            and sum(s["sent"] for s in states) == sum(s["received"] for s in states))


def run_termination(seed: int, processes: int = 5, budget: int = 6, gap: float = 0.8,
                    every: float = 1.0) -> tuple[float | None, float, bool]:
    """(when the naive monitor declared termination, when the work really ended, whether a
    Chandy-Lamport snapshot ever showed termination before the end)."""
    sim = Simulation("chandy_lamport", seed=seed, delay=(0.2, 1.5))
    names = [f"P{i + 1}" for i in range(processes)]
    for i, n in enumerate(names):
        sim.add_process(n, _Worker(i == 0, budget))
    for a, b in strongly_connected(processes, random.Random(seed)):
        sim.connect(names[a], names[b])
    said: list[float] = []

    def done(snap: Snapshot) -> None:
        if _naive_says_terminated(snap) and not said:
            assert snap.completed_at is not None  # called when a snapshot completes
            said.append(snap.completed_at)

    horizon = 40.0
    t, k = every, 1
    while t < horizon:
        _poll(sim, t, gap, sim.rng.sample(names, len(names)), done)
        sim.snapshot_at(t, k, [names[0]])
        t += every
        k += 1
    sim.run(until=horizon + 10)
    app = [e.time for e in sim.trace if e.kind in ("send", "recv", "internal")]
    ended = max(app, default=0.0)
    cl_early = any(
        s.completed_at is not None and s.completed_at < ended
        and all(st["pending"] == 0 for st in s.states.values())
        and not any(s.channels.values())
        for s in sim.completed)
    return (said[0] if said else None), ended, cl_early


def run(seed: int = 0, runs: int = 30) -> InconsistentResult:
    reads, totals = run_tokens(seed)
    result = InconsistentResult(5, 5 * 100, reads, totals)
    for s in range(seed, seed + runs):
        said, ended, cl_early = run_termination(s)
        result.termination_runs += 1
        if said is not None and said < ended:
            result.naive_early.append((s, said, ended))
        result.snapshot_early += cl_early
    return result


def diagram(path, seed: int = 5):
    """Draw a marker snapshot (1) beside states read one by one over the same stretch of
    time (2): three processes with 100 tokens each; messages that cross cut 2 backwards
    (sent after their sender was read, received before their receiver was) are counted
    twice.  Returns (path, naive total, orphan message ids)."""
    from ..diagram import draw

    sim = Simulation("chandy_lamport", seed=seed, delay=(0.3, 1.0))
    names = ["P1", "P2", "P3"]
    for n in names:
        sim.add_process(n, tokens_scenario.Bank(100, 0.8))
    for a, b in strongly_connected(3, random.Random(seed), extra=0.5):
        sim.connect(names[a], names[b])
    got: list[Snapshot] = []
    _poll(sim, 3.0, 1.2, names, got.append)
    sim.snapshot_at(3.0, 1, ["P1"])
    sim.run(until=9)
    naive = got[0]
    naive.id = 2
    sim.snapshots[2] = naive
    total = sum(naive.states.values())
    orphans = check_cut(sim.trace, naive, sim.procs, sim.chans).orphans
    out = draw(sim, path, snapshot_ids=[1, 2], window=(1.5, 7.5),
               title=f"cut 1: markers (total 300); cut 2: states read one by one "
                     f"(total {total}, {len(orphans)} message(s) counted twice)")
    return out, total, orphans
