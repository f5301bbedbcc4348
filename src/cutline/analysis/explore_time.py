"""Exhaustive exploration of event time across a restore: windows fire exactly once.

A small dataflow is run through *every* order of steps FIFO channels allow, with a crash
and a restore at every point: sources with timestamped records and the watermarks their
generator (:class:`~cutline.protocol.watermarks.BoundedOutOfOrderness`) makes, one channel
each into a window operator that counts records per key in tumbling windows.  The window
operator combines its inputs with the real
:class:`~cutline.protocol.watermarks.WatermarkTracker` behind the real
:class:`~cutline.protocol.SnapshotHandler`; to the handler a watermark is a record, so an
aligned checkpoint blocks it with its channel and an unaligned or Chandy-Lamport one
records it as channel state.  Checkpoints are triggered at the sources; a crash restores
the last completed one (source positions, window state, the tracker's watermarks, the
output committed with it, the recorded channel state re-delivered first) and the run goes
on to the end of input, which closes the channels (watermark ``inf``: every window fires).

Verdicts at every final state, in Dijkstra's spirit (the ground truth travels with the
state):

* every input item (record or watermark) of every channel took effect exactly once, in
  channel order: the items the output reflects are exactly the channels' contents;
* the output equals what a failure-free window operator makes from that same sequence of
  items (so no window fired twice, none was lost, none fired early: a restored watermark
  that ran ahead of the cut would make a later record late, one that fell behind would
  re-open a fired window);
* with no record late on its own channel, the output as a set equals the failure-free
  run's, whatever the interleaving;
* no window fires twice, and nothing is left in a channel (no deadlock).

Items are tuples here (``("r", (key, ts))``, ``("w", ts)``): the runtime's
:class:`~cutline.protocol.watermarks.Watermark` plays ``("w", ts)``.

``fault`` injects a known bug so the checker is seen to catch it: ``"watermarks_not_in_
channel_state"`` (unaligned channel state without its watermarks),
``"tracker_ahead"`` (the tracker snapshotted after the cut: it restores the watermark the
operator reached later), ``"tracker_not_restored"`` (restore starts the watermark over).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, cast

from ..protocol import (
    Barrier,
    Deliver,
    EmitBarrier,
    FinishSnapshot,
    Mode,
    RecordChannelState,
    SnapshotHandler,
    TakeSnapshot,
)
from ..protocol.watermarks import NO_WATERMARK, BoundedOutOfOrderness, WatermarkTracker
from ..protocol.windows import Tumbling, WindowAssigner, merge_into
from .explore import search

__all__ = ["FAULTS", "SCENARIOS", "TimeExploreResult", "WindowModel", "explore_time", "replay"]

FAULTS = ("watermarks_not_in_channel_state", "tracker_ahead", "tracker_not_restored")

Record = tuple[str, float]  # (key, timestamp)

#: Two sources into one window operator, tumbling windows of 10 s, max_delay 2 s.
#: ``late``: source B sends ("a", 8) after its watermark passed 10 - whether the window
#: [0, 10) fired by then depends on source A: a record late or not by interleaving.
SCENARIOS: dict[str, tuple[tuple[Record, ...], ...]] = {
    "small": ((("a", 12.0),), (("a", 8.0), ("b", 14.0))),
    "in-order": ((("a", 3.0), ("a", 12.0)), (("a", 5.0), ("b", 14.0))),
    "out-of-order": ((("a", 3.0), ("b", 12.0), ("a", 11.0)), (("a", 9.0), ("a", 5.0))),
    "late": ((("a", 3.0), ("a", 12.0)), (("b", 14.0), ("a", 8.0))),
}


def _items(records: Sequence[Record], max_delay: float) -> tuple:
    """What a source sends: each record, then the watermark if it rose."""
    gen, last = BoundedOutOfOrderness(max_delay), None
    out: list[tuple] = []
    for key, ts in records:
        out.append(("r", (key, ts)))
        gen.on_event(ts)
        wm = gen.current()
        if last is None or wm > last:
            out.append(("w", wm))
            last = wm
    return tuple(out)


class WindowModel:
    """A window operator's logic, failure-free: counts per key and window with the real
    :class:`~cutline.protocol.watermarks.WatermarkTracker` and a real window assigner
    (tumbling, sliding, or merging sessions), Spark's firing rule and Flink's
    ``allowed_lateness``.  The explorer runs one per world and the simulator one per window
    task; the oracle replays an item log through a fresh one (:func:`replay`).

    Output: ``("window", key, start, end, count)`` when the watermark passes ``end`` (and
    again for a record within the lateness), ``("late", key, ts)`` for a record later than
    that for all its windows.  Records are ``(key, ts, ...)`` tuples."""

    def __init__(self, channels: Sequence[str], assigner: WindowAssigner,
                 lateness: float = 0.0) -> None:
        self.assigner, self.lateness = assigner, lateness
        self.tracker = WatermarkTracker(channels)
        self.windows: dict[tuple, int] = {}  # (key, start, end) -> count
        self.output: list[tuple] = []

    def apply(self, ch: str | None, item: tuple) -> None:
        """One log item: ``("r", record)``, ``("w", ts)``, ``("idle",)``, ``("eof",)`` on
        ``ch``, or ``("restored",)`` (a restore: every channel is open again)."""
        kind = item[0]
        if kind == "r":
            self.record(cast(str, ch), item[1])
        elif kind == "w":
            self.watermark(cast(str, ch), item[1])
        elif kind == "idle":
            self._advance(self.tracker.current, self.tracker.on_idle(cast(str, ch)))
        elif kind == "eof":
            self.close(cast(str, ch))
        else:  # what a restore keeps, read without the tracker's own snapshot/restore
            old = self.tracker
            self.tracker = WatermarkTracker(old.channels)
            for c in old.channels:
                if old.watermark_of(c) != NO_WATERMARK:
                    self.tracker.on_watermark(c, old.watermark_of(c))
                if old.is_idle(c):
                    self.tracker.on_idle(c)
            self.tracker.current = old.current

    def record(self, ch: str, rec: tuple) -> None:
        key, ts = rec[0], rec[1]
        self._advance(self.tracker.current, self.tracker.on_active(ch))
        cur, lateness, windows = self.tracker.current, self.lateness, self.windows
        late = True
        for w in self.assigner.bounds(ts):
            if self.assigner.merging:
                result, merged = merge_into([(s, e) for k, s, e in windows if k == key], w)
                w = (result.start, result.end)
                if w[1] + lateness <= cur:
                    continue
                n = sum(windows.pop((key, s, e)) for s, e in merged) + 1
            elif w[1] + lateness <= cur:
                continue
            else:
                n = windows.get((key, *w), 0) + 1
            late = False
            windows[(key, *w)] = n
            if w[1] <= cur:  # a fired window, within the lateness: emit it again
                self.output.append(("window", key, w[0], w[1], n))
        if late:
            self.output.append(("late", key, ts))

    def watermark(self, ch: str, ts: float) -> None:
        self._advance(self.tracker.current, self.tracker.on_watermark(ch, ts))

    def close(self, ch: str) -> None:
        self._advance(self.tracker.current, self.tracker.on_close(ch))

    def _advance(self, prev: float, wm: float | None) -> None:
        if wm is None:
            return
        for key, start, end in sorted(self.windows, key=lambda w: (w[2], w[1], w[0])):
            if prev < end <= wm:
                self.output.append(("window", key, start, end, self.windows[(key, start, end)]))
            if end + self.lateness <= wm:
                del self.windows[(key, start, end)]

    def clone(self) -> "WindowModel":
        c = WindowModel.__new__(WindowModel)
        c.assigner, c.lateness, c.tracker = self.assigner, self.lateness, self.tracker.copy()
        c.windows, c.output = dict(self.windows), list(self.output)
        return c

    def key(self) -> tuple:
        t = self.tracker
        return (tuple(sorted(self.windows.items())), t.current,
                tuple((t.watermark_of(c), t.is_closed(c)) for c in t.channels),
                tuple(self.output))


def replay(channels: Sequence[str], assigner: WindowAssigner, lateness: float,
           log: Sequence[tuple[str | None, tuple]]) -> WindowModel:
    """A fresh :class:`WindowModel` fed ``log`` (``(channel, item)`` pairs, as
    :meth:`WindowModel.apply` takes them): what a failure-free operator makes of them."""
    model = WindowModel(channels, assigner, lateness)
    for ch, item in log:
        model.apply(ch, item)
    return model


@dataclass(frozen=True)
class _World:
    pcs: tuple[int, ...]                 # per source: items sent
    queues: tuple[tuple, ...]            # per channel: ("r", rec) | ("w", ts) | ("b", B) | ("eof",)
    handler: SnapshotHandler
    win: WindowModel
    log: tuple                           # (channel, item) the operator took, in order
    triggered: tuple[int, ...]           # per source: checkpoints triggered at it
    snaps: tuple                         # per checkpoint: None | (pcs, win, log, recorded)
    recorded: tuple                      # per checkpoint, per channel: recorded items
    done: frozenset                      # completed checkpoints
    crashed: bool

    def key(self) -> tuple:
        snaps = tuple(None if s is None else (s[0], s[1] and s[1].key(), s[2], len(s))
                      for s in self.snaps)
        return (self.pcs, self.queues, self.handler.state_key(), self.win.key(), self.log,
                self.triggered, snaps, self.recorded, self.done, self.crashed)


@dataclass
class TimeExploreResult:
    scenario: str
    mode: str
    checkpoints: int
    fault: str | None
    states: int = 0
    interleavings: int = 0
    violating: int = 0
    counterexample: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    stopped: bool = False  # at the first counterexample (``first=True``)

    @property
    def ok(self) -> bool:
        return self.violating == 0

    def summary(self) -> str:
        where = (f"stopped at the first counterexample after {self.states:,} distinct states"
                 if self.stopped else
                 f"{self.interleavings:,} interleavings ({self.states:,} distinct states)")
        head = (f"{self.mode}, scenario {self.scenario!r}, {self.checkpoints} checkpoint(s), "
                f"a crash anywhere{', fault ' + self.fault if self.fault else ''}: {where}")
        if self.ok:
            return head + " - every window fires exactly once, none early, none lost"
        what = ("an interleaving breaks" if self.stopped
                else f"{self.violating:,} interleavings break")
        lines = [head, f"{what} event time; counterexample:" if self.stopped else
                 f"{what} event time; first counterexample:"]
        lines += [f"  {i + 1:>2}. {s}" for i, s in enumerate(self.counterexample)]
        lines += [f"  => {p}" for p in self.problems]
        return "\n".join(lines)


class _Explorer:
    def __init__(self, sources: tuple[tuple[Record, ...], ...], mode: Mode, checkpoints: int,
                 size: float, max_delay: float, fault: str | None) -> None:
        self.mode, self.k, self.size, self.fault = mode, checkpoints, size, fault
        self.chans = [f"S{i + 1}->W" for i in range(len(sources))]
        self.items = [_items(recs, max_delay) for recs in sources]
        # no record is late on its own channel (its window ends after the channel's
        # watermark when it is sent): then no interleaving makes one late
        self.in_order = all(
            all(ts - ts % size + size > max((t for _, t in recs[:j]), default=-1e18)
                - max_delay for j, (_, ts) in enumerate(recs)) for recs in sources)

    def _model(self) -> WindowModel:
        return WindowModel(self.chans, Tumbling(self.size))

    def initial(self) -> _World:
        n = len(self.chans)
        return _World(tuple(0 for _ in range(n)), tuple(() for _ in range(n)),
                      SnapshotHandler(self.chans, self.mode), self._model(),
                      (), tuple(0 for _ in range(n)), tuple(None for _ in range(self.k)),
                      tuple(tuple(() for _ in range(n)) for _ in range(self.k)), frozenset(),
                      False)

    # ------------------------------------------------------------------ steps

    def steps(self, w: _World) -> list[tuple[str, Callable[[], _World]]]:
        out: list[tuple[str, Callable[[], _World]]] = []
        for s, items in enumerate(self.items):
            if w.pcs[s] <= len(items) and not self._sent_eof(w, s):
                what = "ends" if w.pcs[s] == len(items) else _show(items[w.pcs[s]])
                out.append((f"S{s + 1} sends {what}", partial(self._send, w, s)))
            if not w.crashed and w.triggered[s] < self.k and w.pcs[s] <= len(items) \
                    and not self._sent_eof(w, s):
                out.append((f"S{s + 1} starts checkpoint {w.triggered[s] + 1}",
                            partial(self._trigger, w, s)))
        for c, q in enumerate(w.queues):
            if not q or self.chans[c] in w.handler.blocked:
                continue
            out.append((f"W takes {_show(q[0])} from {self.chans[c]}",
                        partial(self._deliver, w, c)))
            if self.mode is Mode.UNALIGNED:
                pos = next((i for i, it in enumerate(q) if it[0] == "b"), 0)
                if pos:
                    out.append((f"barrier {q[pos][1].checkpoint_id} overtakes {pos} item(s) "
                                f"on {self.chans[c]}", partial(self._overtake, w, c, pos)))
        if not w.crashed and out:
            out.append(("crash; restore the last completed checkpoint",
                        partial(self._crash, w)))
        return out

    def _sent_eof(self, w: _World, s: int) -> bool:
        return w.pcs[s] > len(self.items[s])

    def _send(self, w: _World, s: int) -> _World:
        items = self.items[s]
        item = items[w.pcs[s]] if w.pcs[s] < len(items) else ("eof",)
        return self._with(w, pcs=_set(w.pcs, s, w.pcs[s] + 1),
                          queues=_set(w.queues, s, w.queues[s] + (item,)))

    def _trigger(self, w: _World, s: int) -> _World:
        n = w.triggered[s] + 1
        snaps = list(w.snaps)
        src_pcs = dict(snaps[n - 1][0]) if snaps[n - 1] is not None else {}
        src_pcs[s] = w.pcs[s]
        part = snaps[n - 1]
        snaps[n - 1] = (tuple(sorted(src_pcs.items())),) + (part[1:] if part else (None, None))
        w = self._with(w, triggered=_set(w.triggered, s, n), snaps=tuple(snaps),
                       queues=_set(w.queues, s, w.queues[s] + (("b", Barrier(n)),)))
        return self._complete(w)

    def _deliver(self, w: _World, c: int) -> _World:
        item = w.queues[c][0]
        w = self._with(w, queues=_set(w.queues, c, w.queues[c][1:]))
        ch = self.chans[c]
        if item[0] == "eof":
            return self._run(w, lambda h: h.on_close(ch), close=ch)
        if item[0] == "b":
            return self._run(w, lambda h: h.on_barrier(ch, item[1]))
        return self._run(w, lambda h: h.on_records(ch, (item,)))

    def _overtake(self, w: _World, c: int, pos: int) -> _World:
        q = w.queues[c]
        barrier = Barrier(q[pos][1].checkpoint_id, unaligned=True)
        w = self._with(w, queues=_set(w.queues, c, q[pos + 1:]))
        ch = self.chans[c]
        return self._run(w, lambda h: h.on_barrier(ch, barrier, q[:pos]))

    def _run(self, w: _World, event: Callable[[SnapshotHandler], list],
             close: str | None = None) -> _World:
        h = w.handler.copy()
        win = w.win.clone()
        log = w.log
        snaps, recorded = list(w.snaps), [list(r) for r in w.recorded]
        actions = event(h)
        if close is not None:
            win.close(close)
            log = log + ((close, ("eof",)),)
        for a in actions:
            t = type(a)
            if t is Deliver:
                for item in a.records:
                    log = log + ((a.channel, item),)
                    win.apply(a.channel, item)
            elif t is TakeSnapshot:
                n = a.checkpoint_id
                part = snaps[n - 1]
                snaps[n - 1] = ((part[0] if part else ()), win.clone(), log)
            elif t is RecordChannelState:
                k, c = a.checkpoint_id - 1, self.chans.index(a.channel)
                recorded[k][c] = recorded[k][c] + tuple(a.records)
            elif t is FinishSnapshot:
                n = a.checkpoint_id
                snaps[n - 1] = snaps[n - 1][:3] + ("finished",)
            elif t is EmitBarrier:
                pass  # W is the last operator: its output is the committed result
        if self.fault == "tracker_ahead":
            # the bug: the tracker's state in an open snapshot follows the live one
            for n, part in enumerate(snaps):
                if part is not None and part[1] is not None and len(part) == 3:
                    snap_win = part[1].clone()
                    snap_win.tracker = win.tracker.copy()
                    snaps[n] = (part[0], snap_win, part[2])
        w = self._with(w, handler=h, win=win, log=log, snaps=tuple(snaps),
                       recorded=tuple(tuple(r) for r in recorded))
        return self._complete(w)

    def _complete(self, w: _World) -> _World:
        """A checkpoint is complete once every source took its part and W finished."""
        done = set(w.done)
        for n, part in enumerate(w.snaps, start=1):
            if n in done or part is None or len(part) < 4:
                continue
            if all(t >= n for t in w.triggered):
                done.add(n)
        return self._with(w, done=frozenset(done)) if done != w.done else w

    def _crash(self, w: _World) -> _World:
        n = max(w.done, default=0)
        if n == 0:
            fresh = self.initial()
            return self._with(fresh, crashed=True)
        src_pcs, win, log = dict(w.snaps[n - 1][0]), w.snaps[n - 1][1].clone(), \
            w.snaps[n - 1][2]
        pcs = tuple(src_pcs[s] for s in range(len(self.chans)))
        queues = []
        for c in range(len(self.chans)):
            state = w.recorded[n - 1][c]
            if self.fault == "watermarks_not_in_channel_state":
                state = tuple(it for it in state if it[0] != "w")
            queues.append(tuple(state))
        if self.fault == "tracker_not_restored":
            win.tracker = WatermarkTracker(self.chans)
        return _World(pcs, tuple(queues), SnapshotHandler(self.chans, self.mode), win, log,
                      w.triggered, w.snaps, w.recorded, w.done, True)

    @staticmethod
    def _with(w: _World, **changes: Any) -> _World:
        d = {f: getattr(w, f) for f in w.__dataclass_fields__}
        d.update(changes)
        return _World(**d)

    # ------------------------------------------------------------------ verdict

    def problems(self, w: _World) -> list[str]:
        found = []
        stuck = [self.chans[c] for c, q in enumerate(w.queues) if q]
        if stuck:
            found.append(f"deadlock: {', '.join(stuck)} still hold items nobody takes")
            return found
        for c, ch in enumerate(self.chans):
            took = tuple(it for chan, it in w.log if chan == ch)
            want = self.items[c] + (("eof",),)
            if took != want:
                found.append(f"{ch}: the operator took {_shows(took)}, the channel carried "
                             f"{_shows(want)}")
        again = replay(self.chans, Tumbling(self.size), 0, w.log)
        if w.win.output != again.output:
            found.append(f"output {w.win.output} differs from the failure-free operator's "
                         f"on the same items {again.output}")
        if self.in_order:
            expected = self.failure_free()
            if sorted(w.win.output) != sorted(expected):
                found.append(f"output {sorted(w.win.output)} is not the failure-free run's "
                             f"{sorted(expected)}")
        fired = [o[1:4] for o in w.win.output if o[0] == "window"]
        if len(set(fired)) != len(fired):
            found.append(f"a window fired twice: {fired}")
        return found

    def failure_free(self) -> list[tuple]:
        return replay(self.chans, Tumbling(self.size), 0,
                      [(self.chans[c], item) for c, items in enumerate(self.items)
                       for item in items + (("eof",),)]).output


def _set(t: tuple, i: int, v: Any) -> tuple:
    return t[:i] + (v,) + t[i + 1:]


def _show(item: tuple, short: bool = False) -> str:
    """An item for a counterexample, or (``short``) for a diagram's arrow."""
    if item[0] == "r":
        return f"{'' if short else 'record '}{item[1][0]}@{item[1][1]:g}"
    if item[0] == "w":
        return f"{'wm' if short else 'watermark'} {item[1]:g}"
    if item[0] == "b":
        return f"barrier {item[1].checkpoint_id}"
    if item[0] == "idle":
        return "idle"
    return "end" if short else "end of input"


def _shows(items: Sequence[tuple]) -> str:
    return "[" + ", ".join(_show(i) for i in items) + "]"


def explore_time(scenario: str = "in-order", *, mode: str = "aligned", checkpoints: int = 1,
                 size: float = 10.0, max_delay: float = 2.0, fault: str | None = None,
                 max_states: int = 2_000_000, first: bool = False) -> TimeExploreResult:
    """Check every interleaving, with a crash at every point; see the module docstring.
    ``first``: stop at the first counterexample (the counts are then not totals)."""
    m = Mode.parse(mode)
    if m is Mode.AT_LEAST_ONCE:
        raise ValueError("at_least_once replays records on restore by design: windows may "
                         "count them twice; explore an exactly-once mode")
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; expected one of "
                         f"{', '.join(SCENARIOS)}")
    if fault is not None and fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; expected one of {', '.join(FAULTS)}")
    if checkpoints < 1:
        raise ValueError(f"checkpoints must be >= 1, got {checkpoints}")
    ex = _Explorer(SCENARIOS[scenario], m, checkpoints, size, max_delay, fault)
    result = TimeExploreResult(scenario, m.value, checkpoints, fault)
    found = search(ex.initial(), ex.steps, ex.problems, max_states=max_states, first=first)
    result.states, result.interleavings, result.violating = (
        found.states, found.interleavings, found.violating)
    result.stopped = found.stopped
    result.counterexample, result.problems = found.counterexample, found.problems
    return result

