"""Global predicates evaluated on a recorded global state.

A *global state* is what a snapshot records: one state per process plus the messages in
transit on every channel.  Predicates are plain functions of it.  A *stable* predicate
(termination, deadlock, token loss) stays true once true, so seeing it true on a
consistent snapshot proves it true now; on an inconsistent "snapshot" (states gathered
without markers) the same test can fire before the predicate ever held.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .trace import Snapshot

__all__ = ["GlobalState", "total", "conserves", "terminated", "deadlock", "deadlocked"]


@dataclass(frozen=True)
class GlobalState:
    processes: Mapping[str, Any]
    channels: Mapping[str, Sequence[Any]]  # payloads in transit, per channel

    @classmethod
    def of(cls, snapshot: Snapshot) -> "GlobalState":
        return cls(dict(snapshot.states), snapshot.channel_payloads())

    def in_transit(self) -> list[Any]:
        return [m for msgs in self.channels.values() for m in msgs]


def total(
    gs: GlobalState,
    state_value: Callable[[Any], float] = lambda s: s,
    message_value: Callable[[Any], float] = lambda m: m,
    *,
    include_channels: bool = True,
) -> float:
    """Sum of a quantity over processes (and, by default, messages in transit)."""
    s = sum(state_value(v) for v in gs.processes.values())
    if include_channels:
        s += sum(message_value(m) for m in gs.in_transit())
    return s


def conserves(
    expected: float,
    state_value: Callable[[Any], float] = lambda s: s,
    message_value: Callable[[Any], float] = lambda m: m,
) -> Callable[[GlobalState], bool]:
    """Predicate: the quantity (tokens, money) in processes plus channels equals ``expected``."""
    return lambda gs: total(gs, state_value, message_value) == expected


def terminated(is_passive: Callable[[Any], bool]) -> Callable[[GlobalState], bool]:
    """Stable predicate: every process passive and every channel empty."""
    return lambda gs: all(map(is_passive, gs.processes.values())) and not gs.in_transit()


def deadlock(gs: GlobalState, waits_for: Callable[[Any], Any]) -> list[str]:
    """Processes that can never proceed, on the wait-for graph of a global state (AND model).

    ``waits_for(state)`` names the processes a process is blocked on (all of them must
    answer; empty: not blocked).  An edge ``p -> q`` is dropped while a message from ``q``
    to ``p`` is in transit (it may be the answer), so a message in transit never reads as a
    deadlock.  Graph reduction: a process whose awaited processes can all proceed can
    proceed; what is left waits, directly or not, on a cycle.  Stable on a consistent cut.
    """
    waits = {}
    for p, state in gs.processes.items():
        targets = {q for q in (waits_for(state) or ()) if q in gs.processes}
        waits[p] = {q for q in targets if not gs.channels.get(f"{q}->{p}")}
    stuck = {p for p, w in waits.items() if w}
    changed = True
    while changed:
        changed = False
        for p in sorted(stuck):
            if not waits[p] & stuck:
                stuck.discard(p)
                changed = True
    return sorted(stuck)


def deadlocked(waits_for: Callable[[Any], Any]) -> Callable[[GlobalState], bool]:
    """Stable predicate: some processes wait on each other in a cycle (see :func:`deadlock`)."""
    return lambda gs: bool(deadlock(gs, waits_for))
