"""Exhaustive exploration: every interleaving of a small system, every snapshot checked.

A small system (2-4 processes, a few application messages each, 1-2 snapshots) is run
through *every* order of steps that FIFO channels allow: each process's next send, the
delivery of each channel's head, every initiation of every snapshot, and (unaligned) a
barrier overtaking the records queued ahead of it: taking them out of the queue with it
(``overtake="take"``, as the simulator does), or copying them and leaving them queued, to
be delivered later in order (``overtake="copy"``, as the runtime's input gate does, so a
task is free for the next barrier).  The protocol under test is the same
:class:`~cutline.protocol.SnapshotHandler` every other driver uses.

Each global state carries the ground truth needed to judge the snapshots, in Dijkstra's
colours: for every snapshot, the messages sent *white* (before the sender's local
snapshot) and the messages received white.  So the verdict is a function of the state,
states reached along different interleavings are explored once, and the number of
interleavings is still counted exactly (paths through the state graph).

Verdicts at every final state: no deadlock; every snapshot completed; no message received
inside a cut but sent outside it; every channel state exactly the white messages received
red, in order.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from ..protocol import (
    Barrier,
    DeclineSnapshot,
    Deliver,
    EmitBarrier,
    FinishSnapshot,
    Mode,
    RecordChannelState,
    SnapshotHandler,
    TakeSnapshot,
)

__all__ = ["explore", "ExploreResult"]

MsgId = tuple[int, int]  # (sender, sequence number)


def topology(kind: str, n: int) -> list[tuple[int, int]]:
    if kind == "complete":
        return [(a, b) for a in range(n) for b in range(n) if a != b]
    if kind == "ring":
        return [(a, (a + 1) % n) for a in range(n)]
    if kind == "dag":  # P1 is the only source; every node feeds the next two
        return [(a, b) for a in range(n) for b in range(a + 1, min(n, a + 3))]
    raise ValueError(f"unknown topology {kind!r}; expected complete, ring or dag")


@dataclass(frozen=True)
class _World:
    pcs: tuple[int, ...]
    queues: tuple[tuple, ...]  # per channel: ("m", MsgId) | ("b", Barrier)
    handlers: tuple[SnapshotHandler, ...]
    triggered: tuple[int, ...]  # per snapshot: initiations done
    taken: tuple[frozenset, ...]  # per snapshot: processes that recorded their state
    finished: tuple[frozenset, ...]
    sent_white: tuple[frozenset, ...]
    recv_white: tuple[frozenset, ...]
    recorded: tuple[tuple[tuple, ...], ...]  # per snapshot, per channel: message ids
    aborted: frozenset
    # the handlers' state keys, computed once when a handler changes (the key of every
    # world reached is taken, and most steps change one handler): () = not yet known
    hkeys: tuple = ()

    def key(self) -> tuple:
        hkeys = self.hkeys or tuple(h.state_key() for h in self.handlers)
        return (self.pcs, self.queues, hkeys,
                self.triggered, self.taken, self.finished, self.sent_white, self.recv_white,
                self.recorded, self.aborted)


@dataclass
class ExploreResult:
    processes: int
    topology: str
    mode: str
    messages: int
    snapshots: int
    initiators: int
    states: int = 0
    interleavings: int = 0
    violating: int = 0
    counterexample: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    overtake: str = "take"

    @property
    def ok(self) -> bool:
        return self.violating == 0

    def summary(self) -> str:
        head = (f"{self.mode} on a {self.topology} graph of {self.processes} processes, "
                f"{self.messages} message(s) each, {self.snapshots} snapshot(s) x "
                f"{self.initiators} initiator(s): {self.interleavings:,} interleavings "
                f"({self.states:,} distinct states)")
        if self.overtake == "copy" and self.mode == "unaligned":
            head += ", overtaken records copied and left queued"
        if self.ok:
            return head + " - every snapshot is a consistent cut with exact channel states"
        lines = [head, f"{self.violating:,} interleavings violate the snapshot properties; "
                       "first counterexample:"]
        lines += [f"  {i + 1:>2}. {s}" for i, s in enumerate(self.counterexample)]
        lines += [f"  => {p}" for p in self.problems]
        return "\n".join(lines)


class _Explorer:
    def __init__(self, n: int, edges: list[tuple[int, int]], mode: Mode, messages: int,
                 snapshots: int, initiators: int, copy: bool = False) -> None:
        self.n, self.mode, self.messages, self.snapshots = n, mode, messages, snapshots
        self.copy = copy  # overtaken records stay queued (the runtime's input gate)
        self.edges = edges
        self.names = [f"P{i + 1}" for i in range(n)]
        self.chan_names = [f"{self.names[a]}->{self.names[b]}" for a, b in edges]
        self.outs = [[i for i, (a, _) in enumerate(edges) if a == p] for p in range(n)]
        self.ins = [[i for i, (_, b) in enumerate(edges) if b == p] for p in range(n)]
        if mode is Mode.CHANDY_LAMPORT:
            self.initiators = [[(k + j) % n for j in range(initiators)] for k in range(snapshots)]
        else:
            sources = [p for p in range(n) if not self.ins[p]]
            if not sources:
                raise ValueError(f"mode {mode.value!r} needs a source (a process with no "
                                 "inputs): use --topology dag")
            self.initiators = [sources for _ in range(snapshots)]
        # which channel the j-th message of p goes on (round robin over its outputs)
        self.route = [[self.outs[p][j % len(self.outs[p])] for j in range(messages)]
                      if self.outs[p] else [] for p in range(n)]

    def initial(self) -> _World:
        k = self.snapshots
        empty: tuple[frozenset, ...] = tuple(frozenset() for _ in range(k))
        return _World(
            pcs=tuple(0 for _ in range(self.n)),
            queues=tuple(() for _ in self.edges),
            handlers=tuple(SnapshotHandler([self.chan_names[c] for c in self.ins[p]], self.mode)
                           for p in range(self.n)),
            triggered=tuple(0 for _ in range(k)), taken=empty, finished=empty,
            sent_white=empty, recv_white=empty,
            recorded=tuple(tuple(() for _ in self.edges) for _ in range(k)),
            aborted=frozenset(),
        )

    # ------------------------------------------------------------------ steps

    def steps(self, w: _World) -> list[tuple[str, Callable[[], _World]]]:
        out: list[tuple[str, Callable[[], _World]]] = []
        for p in range(self.n):
            if w.pcs[p] < len(self.route[p]):
                c = self.route[p][w.pcs[p]]
                out.append((f"{self.names[p]} sends m{p + 1}.{w.pcs[p] + 1} on "
                            f"{self.chan_names[c]}", partial(self._send, w, p)))
        for k in range(self.snapshots):
            inits = self.initiators[k]
            done = w.triggered[k]
            ordered = self.mode is not Mode.CHANDY_LAMPORT and k and w.triggered[k - 1] < len(
                self.initiators[k - 1])
            if done < len(inits) and not ordered:
                p = inits[done]
                out.append((f"{self.names[p]} initiates snapshot {k + 1}",
                            partial(self._trigger, w, k, p)))
        for c, (_, dst) in enumerate(self.edges):
            q = w.queues[c]
            if not q or self.chan_names[c] in w.handlers[dst].blocked:
                continue
            out.append((self._describe(c, q[0]), partial(self._deliver, w, c)))
            if self.mode is Mode.UNALIGNED:
                # the first barrier queued behind records may jump them (never a barrier)
                pos = next((i for i, it in enumerate(q) if it[0] == "b"), 0)
                if pos:
                    how = "copies" if self.copy else "overtakes"
                    out.append((f"barrier {q[pos][1].checkpoint_id} {how} {pos} "
                                f"record(s) on {self.chan_names[c]}",
                                partial(self._overtake, w, c, pos)))
        return out

    def _describe(self, c: int, item: tuple) -> str:
        dst = self.names[self.edges[c][1]]
        if item[0] == "m":
            s, j = item[1]
            return f"{dst} receives m{s + 1}.{j + 1} from {self.chan_names[c]}"
        return f"{dst} receives marker {item[1].checkpoint_id} on {self.chan_names[c]}"

    def _send(self, w: _World, p: int) -> _World:
        j = w.pcs[p]
        c = self.route[p][j]
        mid = (p, j)
        sent_white = tuple(sw | {mid} if p not in w.taken[k] else sw
                           for k, sw in enumerate(w.sent_white))
        queues = list(w.queues)
        queues[c] = queues[c] + (("m", mid),)
        pcs = list(w.pcs)
        pcs[p] += 1
        return _World(tuple(pcs), tuple(queues), w.handlers, w.triggered, w.taken, w.finished,
                      sent_white, w.recv_white, w.recorded, w.aborted, w.hkeys)

    def _trigger(self, w: _World, k: int, p: int) -> _World:
        triggered = list(w.triggered)
        triggered[k] += 1
        w = _World(w.pcs, w.queues, w.handlers, tuple(triggered), w.taken, w.finished,
                   w.sent_white, w.recv_white, w.recorded, w.aborted, w.hkeys)
        return self._run(w, p, lambda h: h.on_trigger(k + 1))

    def _deliver(self, w: _World, c: int) -> _World:
        item, rest = w.queues[c][0], w.queues[c][1:]
        queues = list(w.queues)
        queues[c] = rest
        w = _World(w.pcs, tuple(queues), w.handlers, w.triggered, w.taken, w.finished,
                   w.sent_white, w.recv_white, w.recorded, w.aborted, w.hkeys)
        dst, name = self.edges[c][1], self.chan_names[c]
        if item[0] == "m":
            return self._run(w, dst, lambda h: h.on_records(name, (item[1],)))
        return self._run(w, dst, lambda h: h.on_barrier(name, item[1]))

    def _overtake(self, w: _World, c: int, pos: int) -> _World:
        q = w.queues[c]
        overtaken = tuple(it[1] for it in q[:pos])
        barrier = Barrier(q[pos][1].checkpoint_id, unaligned=True)
        queues = list(w.queues)
        queues[c] = q[:pos] + q[pos + 1:] if self.copy else q[pos + 1:]
        w = _World(w.pcs, tuple(queues), w.handlers, w.triggered, w.taken, w.finished,
                   w.sent_white, w.recv_white, w.recorded, w.aborted, w.hkeys)
        name, deliver = self.chan_names[c], not self.copy
        return self._run(w, self.edges[c][1], lambda h: h.on_barrier(
            name, barrier, overtaken, deliver_overtaken=deliver))

    def _run(self, w: _World, p: int, event: Callable[[SnapshotHandler], list]) -> _World:
        """Apply ``event`` to a private copy of ``p``'s handler and perform the actions."""
        handlers = list(w.handlers)
        h = handlers[p] = w.handlers[p].copy()
        actions = event(h)
        queues, taken, finished = list(w.queues), list(w.taken), list(w.finished)
        recv_white, recorded = list(w.recv_white), [list(r) for r in w.recorded]
        aborted = w.aborted
        for a in actions:
            t = type(a)
            if t is Deliver:
                for mid in a.records:
                    for k in range(self.snapshots):
                        if p not in taken[k]:
                            recv_white[k] = recv_white[k] | {mid}
            elif t is TakeSnapshot:
                taken[a.checkpoint_id - 1] = taken[a.checkpoint_id - 1] | {p}
            elif t is EmitBarrier:
                for c in self.outs[p]:
                    queues[c] = queues[c] + (("b", a.barrier),)
            elif t is RecordChannelState:
                c = self.chan_names.index(a.channel)
                k = a.checkpoint_id - 1
                recorded[k][c] = recorded[k][c] + tuple(a.records)
            elif t is FinishSnapshot:
                finished[a.checkpoint_id - 1] = finished[a.checkpoint_id - 1] | {p}
            elif t is DeclineSnapshot:
                aborted = aborted | {a.checkpoint_id}
            # Block/Unblock live in the handler; no timers or announcements here.
        hkeys = list(w.hkeys or (x.state_key() for x in w.handlers))
        hkeys[p] = h.state_key()
        return _World(w.pcs, tuple(queues), tuple(handlers), w.triggered, tuple(taken),
                      tuple(finished), w.sent_white, tuple(recv_white),
                      tuple(tuple(r) for r in recorded), aborted, tuple(hkeys))

    # ------------------------------------------------------------------ verdict

    def problems(self, w: _World) -> list[str]:
        found = []
        stuck = [self.chan_names[c] for c, q in enumerate(w.queues) if q]
        if stuck:
            found.append(f"deadlock: {', '.join(stuck)} still hold data nobody can take")
        for k in range(self.snapshots):
            if k + 1 in w.aborted:
                continue
            if len(w.finished[k]) < self.n:
                missing = [self.names[p] for p in range(self.n) if p not in w.finished[k]]
                found.append(f"snapshot {k + 1} never completed at {', '.join(missing)}")
                continue
            orphans = w.recv_white[k] - w.sent_white[k]
            for s, j in sorted(orphans):
                found.append(f"snapshot {k + 1}: m{s + 1}.{j + 1} is received inside the cut "
                             "but sent outside it")
            for c in range(len(self.edges)):
                src = self.edges[c][0]
                on_c = [(src, j) for j in range(self.messages)
                        if j < len(self.route[src]) and self.route[src][j] == c]
                expected = tuple(m for m in on_c
                                 if m in w.sent_white[k] and m not in w.recv_white[k])
                if expected != w.recorded[k][c]:
                    found.append(f"snapshot {k + 1}: channel {self.chan_names[c]} recorded "
                                 f"{_messages(w.recorded[k][c])}, in transit "
                                 f"{_messages(expected)}")
        return found


def _messages(ms: Iterable[tuple[int, int]]) -> str:
    return "[" + ", ".join(f"m{s + 1}.{j + 1}" for s, j in ms) + "]"


def explore(
    processes: int = 3, messages: int = 1, snapshots: int = 1, *, mode: str = "chandy_lamport",
    topology: str = "complete", initiators: int = 1, progress: bool = False,
    max_states: int = 2_000_000, overtake: str = "take",
) -> ExploreResult:
    """Check every interleaving of a small system; see the module docstring."""
    m = Mode.parse(mode)
    if overtake not in ("take", "copy"):
        raise ValueError(f"overtake must be 'take' or 'copy', got {overtake!r}")
    if processes < 2:
        raise ValueError(f"explore needs at least 2 processes, got {processes}")
    if not 1 <= initiators <= processes:
        raise ValueError(f"initiators must be between 1 and {processes}, got {initiators}")
    if m is not Mode.CHANDY_LAMPORT and initiators != 1:
        raise ValueError("several initiators of one snapshot is a Chandy-Lamport notion; "
                         f"in mode {m.value!r} the sources initiate")
    edges = globals()["topology"](topology, processes)
    ex = _Explorer(processes, edges, m, messages, snapshots, initiators, overtake == "copy")
    result = ExploreResult(processes, topology, m.value, messages, snapshots, initiators,
                           overtake=overtake)
    found = search(ex.initial(), ex.steps, ex.problems, max_states=max_states,
                   progress=progress)
    result.states, result.interleavings, result.violating = (
        found.states, found.interleavings, found.violating)
    result.counterexample, result.problems = found.counterexample, found.problems
    return result


@dataclass
class Search:
    states: int = 0
    interleavings: int = 0
    violating: int = 0
    counterexample: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    stopped: bool = False  # at the first counterexample: the counts are not totals


class _Stop(Exception):
    pass


def search(initial: Any, steps: Callable[[Any], list[tuple[str, Callable[[], Any]]]],
           problems: Callable[[Any], list[str]], *, max_states: int = 2_000_000,
           progress: bool = False, first: bool = False) -> Search:
    """Every path from ``initial`` through ``steps`` (a world's ``(label, next world)``
    choices, none at a final state), each final state judged by ``problems``.  Worlds with
    the same ``key()`` are visited once, and paths through them are still counted exactly.
    The first path to a violating final state is the counterexample; with ``first`` the
    search stops there (``stopped``; ``violating`` is 1 and ``interleavings`` unknown, 0)."""
    found = Search()
    memo: dict[tuple, tuple[int, int]] = {}
    path: list[str] = []
    status = None
    if progress:
        from rich.console import Console

        status = Console(stderr=True).status("exploring ...")
        status.start()

    def visit(w: Any) -> tuple[int, int]:
        key = w.key()
        hit = memo.get(key)
        if hit is not None:
            return hit
        choices = steps(w)
        if not choices:
            bad = problems(w)
            if bad and not found.counterexample:
                found.counterexample, found.problems = list(path), bad
                if first:
                    raise _Stop
            res = (1, 1 if bad else 0)
        else:
            total = violating = 0
            for label, step in choices:
                path.append(label)
                t, v = visit(step())
                path.pop()
                total += t
                violating += v
            res = (total, violating)
        memo[key] = res
        if len(memo) > max_states:
            raise RuntimeError(f"more than {max_states:,} states: choose a smaller system")
        if status is not None and len(memo) % 5000 == 0:
            status.update(f"exploring ... {len(memo):,} states")
        return res

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        found.interleavings, found.violating = visit(initial)
    except _Stop:
        found.stopped, found.violating = True, 1
    finally:
        sys.setrecursionlimit(limit)
        if status is not None:
            status.stop()
    found.states = len(memo)
    return found
