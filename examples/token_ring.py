"""A token ring: mutual exclusion by a single token; every snapshot must show one token.

    python examples/token_ring.py [--processes 6] [--rounds 20] [--engine threads]
    cutline run examples/token_ring.py --snapshot-interval 0.05 --initiators 2 --view ring.png

Processes sit on a ring.  Only the process holding the token may enter its critical section;
it stays there a moment, leaves, and passes the token on.  After ``rounds`` trips around the
ring the token is retired and the run ends by termination detection.

Snapshots are started by the processes themselves: whenever the token completes a round,
the process that holds it calls ``ctx.initiate_snapshot()`` (with --snapshot-interval S the
driver starts more, at random processes, so several run at once).  Every snapshot is checked
for: at most one process in its critical section, and exactly one token, held or in transit.
The token is in transit in many snapshots: states alone would show no token at all.
"""

from __future__ import annotations

from cutline.graph import Process, ProcessGraph, at_most_one, conserved
from cutline.graph.cli import run_main


class Node(Process):
    """State: do I hold the token, am I in my critical section, how often was I."""

    def __init__(self, first: bool, hold: float, hops: int, ring: int) -> None:
        self.state = {"token": first, "in_cs": False, "entries": 0}
        self.hold, self.hops, self.ring = hold, hops, ring

    def on_start(self, ctx) -> None:
        if self.state["token"]:
            self._enter(ctx, 0)

    def _enter(self, ctx, hop: int) -> None:
        self.state.update(token=True, in_cs=True, hop=hop)
        self.state["entries"] += 1
        ctx.schedule(self.hold, "leave")

    def on_timer(self, ctx, tag) -> None:
        hop = self.state.pop("hop")
        self.state["in_cs"] = False
        if hop + 1 >= self.hops:
            self.state["token"] = "retired"  # the last holder keeps it; nothing moves
            ctx.initiate_snapshot()  # taken when this handler returns: it shows the end
            return
        if (hop + 1) % self.ring == 0:
            ctx.initiate_snapshot()  # a process-initiated snapshot, once a round
        self.state["token"] = False
        ctx.send(ctx.outputs[0], {"token": hop + 1})

    def on_message(self, ctx, sender, msg) -> None:
        self._enter(ctx, msg["token"])


def build(processes: int = 6, rounds: int = 20, hold: float = 0.01) -> ProcessGraph:
    """A ring of processes passing one token.

    processes: processes on the ring
    rounds: trips of the token around the ring before it is retired
    hold: seconds a process stays in its critical section
    """
    g = ProcessGraph("token_ring")
    names = [f"P{i}" for i in range(processes)]
    for i, n in enumerate(names):
        g.add(n, Node(i == 0, hold, rounds * processes, processes))
    g.ring(names)
    g.check(
        at_most_one(lambda s: s["in_cs"], name="mutual exclusion"),
        conserved(1, value=lambda s: 1 if s["token"] else 0,
                  message_value=lambda m: 1, name="exactly one token"),
    )
    return g


if __name__ == "__main__":
    raise SystemExit(run_main(build))
