"""A diffusing computation, ended by termination detection.

    python examples/diffusing.py [--processes 12] [--budget 12] [--engine threads]
    cutline run examples/diffusing.py --snapshot-interval 0.1 --diagram diffusing.png

A root starts with one piece of work.  A process that receives work is *active*: it works
for a while (a timer), then sends smaller pieces of work to random neighbours, and turns
passive when it has no work left.  Budgets shrink, so the computation ends, but nobody can
see that locally: a process that is passive now may get work from a message still on the wire.

The driver takes a Chandy-Lamport snapshot every --snapshot-interval seconds.  The run ends
on the first snapshot in which every process is passive *and every channel is empty*:
termination is a stable predicate, so seeing it on a consistent cut proves it holds, and it
is never detected early.  The "work" invariant checks each snapshot's books: every piece
of work ever created is done, being worked on, or on the wire.
"""

from __future__ import annotations

import random

from cutline.graph import Process, ProcessGraph, invariant
from cutline.graph.cli import run_main


class Worker(Process):
    """State: work received (from others), done, and created (sent to others)."""

    def __init__(self, root: bool, budget: int, branch: float, work: float) -> None:
        self.state = {"received": 0, "done": 0, "sent": 0, "pending": 0}
        self.root, self.budget, self.branch, self.work = root, budget, branch, work

    def on_start(self, ctx) -> None:
        if self.root:
            self._take(ctx, self.budget)

    def _take(self, ctx, budget: int) -> None:
        self.state["pending"] += 1
        ctx.schedule(ctx.rng.uniform(0.5, 1.5) * self.work, budget)

    def on_message(self, ctx, sender, budget) -> None:
        self.state["received"] += 1
        self._take(ctx, budget)

    def on_timer(self, ctx, budget) -> None:
        s = self.state
        s["pending"] -= 1
        s["done"] += 1
        if budget > 0:  # one smaller piece of work, sometimes two
            for _ in range(1 + (ctx.rng.random() < self.branch)):
                ctx.send(ctx.rng.choice(ctx.outputs), budget - 1)
                s["sent"] += 1


def books_balance(snap) -> tuple[bool, str]:
    """Work created (1 at the root + all sent) = done + pending + in transit."""
    created = 1 + sum(s["sent"] for s in snap.states.values())
    done = sum(s["done"] for s in snap.states.values())
    pending = sum(s["pending"] for s in snap.states.values())
    ok = created == done + pending + snap.in_transit
    return ok, f"{created} = {done} done + {pending} pending + {snap.in_transit} in transit"


def build(processes: int = 12, budget: int = 12, branch: float = 0.35, work: float = 0.05,
          graph_seed: int = 0) -> ProcessGraph:
    """A diffusing computation on a random strongly connected graph.

    processes: number of processes
    budget: depth of the work tree (each piece carries budget-1 to the next)
    branch: chance that a piece of work spawns two pieces instead of one
    work: mean seconds a piece of work takes
    graph_seed: seed of the channel layout (a ring plus random chords)
    """
    g = ProcessGraph("diffusing")
    names = [f"W{i}" for i in range(processes)]
    for i, n in enumerate(names):
        g.add(n, Worker(i == 0, budget, branch, work))
    g.ring(names)
    rng = random.Random(graph_seed)
    for a in names:
        for b in rng.sample(names, 2):
            if a != b and (a, b) not in g.edges:
                g.connect(a, b)
    g.check(invariant(books_balance, name="work accounted for"))
    return g


if __name__ == "__main__":
    raise SystemExit(run_main(build))
