"""A bank: N accounts move money between them at random; every snapshot must show the total.

    python examples/bank.py [--accounts 8] [--transfers 1000] [--engine threads] ...
    cutline run examples/bank.py --snapshot-interval 0.5 --kill --view bank.png

Each account sends a random part of its balance to a random neighbour every few
milliseconds, ``transfers`` times, then stops.  Money is never created or destroyed, so the
bank's total is conserved, but at any moment some of it is on the wire.  A Chandy-Lamport
snapshot records those transfers as channel state: process balances plus money in transit
equal the total on every snapshot (the predicate checked here).  When every account has made
its transfers and every transfer has arrived, a snapshot shows every process passive and
every channel empty, and the run ends (termination detection).

With --restore PATH the bank starts from a stored snapshot: balances and pending timers
are restored, and the transfers in transit are delivered again, exactly once.
"""

from __future__ import annotations

import random

from cutline.graph import Process, ProcessGraph, conserved
from cutline.graph.cli import run_main


class Account(Process):
    """State: the balance and the transfers still to make."""

    def __init__(self, balance: int, transfers: int, period: float) -> None:
        self.state = {"balance": balance, "left": transfers}
        self.period = period

    def on_start(self, ctx) -> None:
        if self.state["left"] > 0:
            ctx.schedule(ctx.rng.uniform(0, 2 * self.period))

    def on_timer(self, ctx, tag) -> None:
        s = self.state
        s["left"] -= 1
        if s["balance"] > 0:
            amount = ctx.rng.randint(1, s["balance"])
            s["balance"] -= amount
            ctx.send(ctx.rng.choice(ctx.outputs), amount)
        if s["left"] > 0:
            ctx.schedule(ctx.rng.uniform(0, 2 * self.period))

    def on_message(self, ctx, sender, amount) -> None:
        self.state["balance"] += amount


def build(accounts: int = 8, balance: int = 100, transfers: int = 1000,
          period: float = 0.002, chords: int = 0) -> ProcessGraph:
    """A bank of accounts that transfer money at random; the total is conserved.

    accounts: number of accounts (processes)
    balance: opening balance of each account
    transfers: transfers each account makes before it stops
    period: mean seconds between two transfers of an account
    chords: seed of the channel layout (a ring both ways plus random chords)
    """
    g = ProcessGraph("bank")
    names = [f"A{i}" for i in range(accounts)]
    for n in names:
        g.add(n, Account(balance, transfers, period))
    g.ring(names, both=True)
    rng = random.Random(chords)
    for a in names:  # a few chords: the graph is strongly connected, not just a ring
        b = rng.choice(names)
        if b != a and (a, b) not in g.edges:
            g.connect(a, b)
    g.check(conserved(accounts * balance, value=lambda s: s["balance"]))
    return g


if __name__ == "__main__":
    raise SystemExit(run_main(build))
