"""The classic three-process lecture example of the Chandy-Lamport snapshot.

P1, P2, P3 on a complete graph, application events named as in L. Kuper's write-up ("An
example run of the Chandy-Lamport snapshot algorithm", 2019), which fixes the duplicate "E"
of I. Gupta's CS425 notes it follows: P3's message to P2 is sent at I (received at F).  P1
initiates right after B and records A, B; P3 receives the first marker and records I; P2
records F, G, H; the message sent at H and received at D crosses the cut and is recorded on
channel P2->P1; every other channel is empty.  (P3's event J, after its snapshot, is
cutline's: it shows P3 going on after the cut.)

The timeline is pinned by explicit times and per-channel delays, so the run is the
lecture's run on every machine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...protocol import Barrier
from ..world import SimContext, SimProcess, Simulation, Snapshot

PROCESSES = ("P1", "P2", "P3")

# (time, process, event, kind, destination)  kind: internal | send | initiate
SCRIPT = [
    (1.0, "P1", "A", "internal", None),
    (1.5, "P3", "I", "send", "P2"),
    (2.0, "P1", "B", "send", "P2"),
    (2.5, "P1", None, "initiate", None),
    (5.5, "P1", "C", "internal", None),
    (6.0, "P2", "H", "send", "P1"),
    (9.0, "P3", "J", "internal", None),
]
# receive events: message (named by its send event) -> name of the receive event
RECEIVES = {"I": "F", "B": "G", "H": "D"}
MESSAGE_DELAY = {"I": 2.0, "B": 3.0, "H": 1.5}
MARKER_DELAY = {
    "P1->P2": 6.0, "P1->P3": 1.0, "P3->P1": 1.0, "P3->P2": 3.5, "P2->P1": 1.0, "P2->P3": 1.0,
}


class Scripted(SimProcess):
    """Performs its part of ``SCRIPT``; its state is the history of its events."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.state: list[str] = []

    def on_start(self, ctx: SimContext) -> None:
        for step in SCRIPT:
            if step[1] == self.name:
                ctx.schedule(step[0] - ctx.now, step)

    def on_timer(self, ctx: SimContext, step: Any) -> None:
        _, _, event, kind, dest = step
        if kind == "initiate":
            ctx.initiate_snapshot(1)
        elif kind == "send":
            self.state.append(event)
            ctx.send(f"{self.name}->{dest}", event, label=event)
        else:
            self.state.append(event)
            ctx.internal(event)

    def on_receive(self, ctx: SimContext, channel: str, payload: Any) -> None:
        event = RECEIVES[payload]
        self.state.append(event)
        ctx.label(event)


def _delay(channel: str, item: Any, _rng: Any) -> float:
    if isinstance(item, Barrier):
        return MARKER_DELAY[channel]
    return MESSAGE_DELAY[item.label]


@dataclass
class LectureResult:
    sim: Simulation
    snapshot: Snapshot

    def as_dict(self) -> dict:
        snap = self.snapshot
        return {
            "processes": {p: list(snap.states[p]) for p in PROCESSES},
            "channels": {c: [m.label for m in snap.channels.get(c, [])]
                         for c in sorted(self.sim.chans)},
        }


def build(mode: str = "chandy_lamport") -> Simulation:
    sim = Simulation(mode, delay=_delay)
    for p in PROCESSES:
        sim.add_process(p, Scripted(p))
    for a in PROCESSES:
        for b in PROCESSES:
            if a != b:
                sim.connect(a, b)
    return sim


def run() -> LectureResult:
    sim = build()
    sim.run()
    snap = sim.snapshots[1]
    if not snap.complete:  # pragma: no cover - the script guarantees completion
        raise RuntimeError("the lecture snapshot did not complete")
    return LectureResult(sim, snap)
