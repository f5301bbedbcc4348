"""Dining philosophers on a ring, with deadlock detection on the wait-for graph.

    python examples/deadlock.py [--philosophers 5] [--meals 20] [--engine threads]
    cutline run examples/deadlock.py --snapshot-interval 0.1 --view deadlock.png

Each philosopher owns one fork and needs its right neighbour's fork too.  When hungry it
takes its own fork, then asks the neighbour for theirs and waits; a neighbour lends its
fork only while it is not using it.  If all philosophers take their own fork at about the same
time, each waits for the next: a cycle in the wait-for graph, a deadlock.

Deadlock is a stable predicate: a snapshot's wait-for graph (who waits for whom, with an
edge dropped while the awaited answer is in transit) that has a cycle proves the cycle is
there for good.  The run ends on the first snapshot that shows it, or on termination when
every philosopher has eaten its meals.  With --polite, a philosopher whose neighbour is
slow to answer cancels its request, puts its own fork down and tries again later: no
deadlock.
"""

from __future__ import annotations

from cutline.graph import Process, ProcessGraph, deadlocked
from cutline.graph.cli import run_main


class Philosopher(Process):
    def __init__(self, left: str, right: str, meals: int, think: float, eat: float,
                 polite: bool) -> None:
        self.state = {"meals": meals, "mine": "free", "waiting_for": [], "queue": []}
        self.left, self.right = left, right
        self.think, self.eat, self.polite = think, eat, polite

    def on_start(self, ctx) -> None:
        if self.state["meals"] > 0:
            ctx.schedule(ctx.rng.uniform(0, self.think), "hungry")

    def on_timer(self, ctx, tag) -> None:
        s, right = self.state, self.right
        if tag == "hungry":
            if s["mine"] != "free":  # lent out: think a little longer
                ctx.schedule(ctx.rng.uniform(0, self.think), "hungry")
                return
            s["mine"] = "mine"  # own fork in hand; reach for the other one in a moment
            ctx.schedule(self.eat, "reach")
        elif tag == "reach":
            s["waiting_for"] = [right]
            ctx.send(right, "request")
            if self.polite:
                ctx.schedule(3 * self.eat, "give up")
        elif tag == "give up" and s["waiting_for"]:
            s["waiting_for"] = []
            ctx.send(right, "cancel")
            self._free(ctx)
            ctx.schedule(ctx.rng.uniform(0, self.think), "hungry")
        elif tag == "full":
            ctx.send(right, "return")
            s["meals"] -= 1
            self._free(ctx)
            if s["meals"] > 0:
                ctx.schedule(ctx.rng.uniform(0, self.think), "hungry")

    def _free(self, ctx) -> None:
        s = self.state
        s["mine"] = "free"
        if s["queue"]:
            s["queue"].pop(0)
            s["mine"] = "lent"
            ctx.send(self.left, "fork")

    def on_message(self, ctx, sender, msg) -> None:
        s = self.state
        if msg == "request":  # from the left neighbour
            if s["mine"] == "free":
                s["mine"] = "lent"
                ctx.send(sender, "fork")
            else:
                s["queue"].append(sender)
        elif msg == "cancel":  # if the fork is already on its way, it comes back
            if sender in s["queue"]:  # as 'return'
                s["queue"].remove(sender)
        elif msg == "return":
            self._free(ctx)
        elif msg == "fork":  # from the right neighbour
            if s["waiting_for"]:
                s["waiting_for"] = []
                ctx.schedule(ctx.rng.uniform(0.5, 1.5) * self.eat, "full")
            else:  # we gave up meanwhile: hand it straight back
                ctx.send(sender, "return")


def build(philosophers: int = 5, meals: int = 20, think: float = 0.02, eat: float = 0.01,
          polite: bool = False) -> ProcessGraph:
    """Philosophers on a ring, each needing its own and its right neighbour's fork.

    philosophers: processes on the ring
    meals: meals each philosopher eats before it stops
    think: mean seconds of thinking between meals
    eat: mean seconds a meal takes
    polite: give up a request that takes too long (no deadlock)
    """
    g = ProcessGraph("philosophers")
    names = [f"Ph{i}" for i in range(philosophers)]
    for i, n in enumerate(names):
        left, right = names[i - 1], names[(i + 1) % len(names)]
        g.add(n, Philosopher(left, right, meals, think, eat, polite))
    g.ring(names, both=True)  # requests go right, forks come back left
    g.check(deadlocked(lambda s: s["waiting_for"]))
    return g


if __name__ == "__main__":
    raise SystemExit(run_main(build))
