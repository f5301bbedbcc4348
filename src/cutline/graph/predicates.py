"""Global predicates evaluated by the driver on every completed snapshot.

Two kinds, both thin wrappers over :mod:`cutline.analysis`:

* an *invariant* must hold on every snapshot (tokens conserved, at most one token holder);
  a snapshot where it fails is reported as a violation, with the snapshot that shows it;
* a *stable* predicate, once true, stays true (termination, deadlock); the first snapshot
  that shows it *detects* it, and may end the run.

Both are only sound on consistent cuts: the runtime evaluates them on Chandy-Lamport
snapshots, never on states read one by one (docs/process-graphs.md shows what goes wrong).

A predicate function takes a :class:`~cutline.graph.snapshot.GraphSnapshot` and returns a
bool, or ``(bool, detail)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..analysis import GlobalState, deadlock, terminated as _terminated, total
from .snapshot import Check, GraphSnapshot

__all__ = ["Predicate", "as_predicate", "at_most_one", "conserved", "deadlocked", "invariant",
           "stable", "terminated"]


def _identity(x: Any) -> Any:
    return x


@dataclass(frozen=True)
class Predicate:
    name: str
    fn: Callable[[GraphSnapshot], Any]
    kind: str = "invariant"  # "invariant" | "stable"
    stop: bool = False  # a stable predicate that ends the run when detected

    def __post_init__(self) -> None:
        if self.kind not in ("invariant", "stable"):
            raise ValueError(f"predicate kind must be 'invariant' or 'stable', got {self.kind!r}")

    def evaluate(self, snap: GraphSnapshot) -> Check:
        try:
            out = self.fn(snap)
        except Exception as exc:  # a broken predicate is reported, not fatal
            return Check(self.name, self.kind, False, f"raised {type(exc).__name__}: {exc}")
        if isinstance(out, tuple):
            holds, detail = bool(out[0]), str(out[1])
        else:
            holds, detail = bool(out), ""
        return Check(self.name, self.kind, holds, detail)


def as_predicate(p: Predicate | Callable) -> Predicate:
    if isinstance(p, Predicate):
        return p
    if callable(p):
        return Predicate(getattr(p, "__name__", "predicate"), p)
    raise TypeError(f"a predicate is a Predicate or a function of a snapshot, got {p!r}")


def invariant(fn: Callable[[GraphSnapshot], Any], name: str | None = None) -> Predicate:
    """A user function that must hold on every snapshot."""
    return Predicate(name or str(getattr(fn, "__name__", "invariant")), fn)


def stable(fn: Callable[[GraphSnapshot], Any], name: str | None = None, *,
           stop: bool = False) -> Predicate:
    """A user's stable predicate: reported on the first snapshot that shows it; ``stop``
    ends the run there."""
    return Predicate(name or str(getattr(fn, "__name__", "stable")), fn, "stable", stop)


def conserved(expected: float, value: Callable[[Any], float] = _identity,
              message_value: Callable[[Any], float] = _identity, *,
              name: str | None = None) -> Predicate:
    """The quantity in every process (``value(state)``) plus every message in transit
    (``message_value(msg)``) equals ``expected``."""

    def check(snap: GraphSnapshot) -> tuple[bool, str]:
        gs = snap.global_state()
        got = total(gs, value, message_value)
        held = total(gs, value, message_value, include_channels=False)
        return got == expected, (f"{got:g} = {held:g} + {got - held:g} in transit"
                                 + ("" if got == expected else f", expected {expected:g}"))

    return Predicate(name or f"total conserved ({expected:g})", check)


def at_most_one(holds: Callable[[Any], bool], message: Callable[[Any], bool] | None = None,
                *, name: str = "at most one holder") -> Predicate:
    """Mutual exclusion: at most one process state satisfies ``holds`` (and, with
    ``message``, counting the matching messages in transit as holders too)."""

    def check(snap: GraphSnapshot) -> tuple[bool, str]:
        who = sorted(p for p, s in snap.states.items() if holds(s))
        moving = ([f"{a}->{b}" for (a, b), ms in snap.channels.items() for m in ms
                   if message(m)] if message is not None else [])
        n = len(who) + len(moving)
        detail = ", ".join(who + [f"in transit on {c}" for c in moving]) or "none"
        return n <= 1, f"{n}: {detail}"

    return Predicate(name, check)


def terminated(*, stop: bool = True, name: str = "terminated") -> Predicate:
    """Stable: every process passive (no pending timer) and every channel empty."""
    done = _terminated(bool)

    def check(snap: GraphSnapshot) -> tuple[bool, str]:
        gs = GlobalState(snap.passive, snap.global_state().channels)
        active = sorted(p for p, v in snap.passive.items() if not v)
        return done(gs), (f"{len(active)} active, {snap.in_transit} in transit")

    return Predicate(name, check, "stable", stop)


_ACTIVE = object()


def deadlocked(waits_for: Callable[[Any], Any], *, stop: bool = True,
               name: str = "deadlock") -> Predicate:
    """Stable: processes blocked on each other in a cycle of the wait-for graph built from
    ``waits_for(state)`` (the processes a process waits on).  Only a passive process is
    blocked: one with a pending timer can still act (give up, retry) on its own."""

    def waits(state: Any) -> Any:
        return () if state is _ACTIVE else waits_for(state)

    def check(snap: GraphSnapshot) -> tuple[bool, str]:
        gs = snap.global_state()
        gs = GlobalState({p: s if snap.passive.get(p, True) else _ACTIVE
                          for p, s in gs.processes.items()}, gs.channels)
        stuck = deadlock(gs, waits)
        return bool(stuck), ("deadlocked: " + ", ".join(stuck)) if stuck else "none"

    return Predicate(name, check, "stable", stop)
