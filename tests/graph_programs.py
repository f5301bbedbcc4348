"""Process graphs the graph tests share (threads and Spark).

``Ledger``: a bank account whose every transfer has a unique id ``(sender, seq)`` and that
remembers the ids it received, so a test can count losses and duplicates exactly: after a
restore, every transfer recorded in transit must arrive exactly once.
"""

from __future__ import annotations

import collections
import random
import time

from cutline.graph import Process, ProcessGraph, conserved

BALANCE = 1000


class Ledger(Process):
    def __init__(self, transfers: int, period: float, initiate: float = 0.0,
                 jitter: float = 0.0) -> None:
        self.state = {"balance": BALANCE, "left": transfers, "seq": 0, "seen": []}
        self.period, self.initiate, self.jitter = period, initiate, jitter

    def on_start(self, ctx) -> None:
        if self.state["left"] > 0:
            ctx.schedule(ctx.rng.uniform(0, self.period))

    def on_timer(self, ctx, tag) -> None:
        s = self.state
        if s["left"] <= 0:
            return
        s["left"] -= 1
        amount = ctx.rng.randint(1, 20)
        if amount <= s["balance"]:
            s["balance"] -= amount
            ctx.send(ctx.rng.choice(ctx.outputs), (ctx.name, s["seq"], amount))
            s["seq"] += 1
        if s["left"] > 0:
            ctx.schedule(ctx.rng.uniform(0, 2 * self.period))

    def on_message(self, ctx, sender, msg) -> None:
        src, seq, amount = msg
        assert src == sender, (src, sender)
        self.state["balance"] += amount
        self.state["seen"].append([src, seq])
        if self.jitter and ctx.rng.random() < 0.05:
            time.sleep(ctx.rng.uniform(0, self.jitter))  # a slow handler now and then
        if self.initiate and ctx.rng.random() < self.initiate:
            ctx.initiate_snapshot()  # from inside a handler, mid-batch


class Frozen(Ledger):
    """Restored with no transfers left: only the messages in transit move."""

    def restore_state(self, state) -> None:
        state["left"] = 0
        self.state = state

    def on_timer(self, ctx, tag) -> None:
        pass


def ledger_graph(n: int = 6, transfers: int = 60, period: float = 0.004, *,
                 cls=Ledger, name: str = "ledger", **kw) -> ProcessGraph:
    g = ProcessGraph(name)
    names = [f"A{i}" for i in range(n)]
    for a in names:
        g.add(a, cls(transfers, period, **kw))
    g.ring(names, both=True)
    rng = random.Random(7)
    for a in names:
        b = rng.choice(names)
        if a != b and (a, b) not in g.edges:
            g.connect(a, b)
    g.check(conserved(n * BALANCE, value=lambda s: s["balance"],
                      message_value=lambda m: m[2]))
    return g


def ledger_problems(states: dict) -> list[str]:
    """Losses and duplicates: every transfer sent (ids below each sender's ``seq``) must be
    seen exactly once, at exactly one account, and no id may be seen that was not sent."""
    seen = collections.Counter(tuple(x) for s in states.values() for x in s["seen"])
    sent = {(a, k) for a, s in states.items() for k in range(s["seq"])}
    problems = [f"duplicate {i} x{c}" for i, c in seen.items() if c > 1]
    problems += [f"lost {i}" for i in sorted(sent - set(seen))]
    problems += [f"never sent {i}" for i in sorted(set(seen) - sent)]
    return problems
