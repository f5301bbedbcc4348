"""Event time in the simulator: sources that send watermarks in band, and window tasks.

* :class:`TimedSource` sends records ``(key, ts, id)`` with out-of-order timestamps (and a
  straggler now and then, far behind; optionally :data:`~cutline.protocol.watermarks.IDLE`
  before a pause), and after each batch the watermark of a
  :class:`~cutline.protocol.watermarks.BoundedOutOfOrderness` generator as a
  :class:`~cutline.protocol.watermarks.Watermark` *message*: FIFO with the records, on every
  output channel.  To the snapshot handlers it is a record, so an aligned checkpoint blocks
  it with its channel and an unaligned or Chandy-Lamport one records it as channel state.
  Its items are a pure function of its index (:func:`source_items`), so a restore replays
  them exactly from the position in its state.
* :class:`WindowTask` runs :class:`~cutline.analysis.explore_time.WindowModel` (the real
  :class:`~cutline.protocol.watermarks.WatermarkTracker` and window assigners) and sends
  what it emits to the sink.  Its checkpoint is the tracker's own ``snapshot()``, its open
  windows, and the log of the items it applied (records, watermarks, ends of input, and a
  ``("restored",)`` marker per restore: a restore re-opens every input, as the runtime's
  does), so the log is exactly the items behind its state.

:func:`check` is the oracle: every item of every channel applied exactly once, in channel
order; the sink's output from each window task equals a fresh operator's replaying that
task's log (so no window fired twice, none was lost, none fired early: a late record is
late in both); with no lateness no window fired twice, and nothing is left open at the end.
"""

from __future__ import annotations

import math
import zlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from ..analysis.explore_time import WindowModel, _shows, replay
from ..protocol.watermarks import IDLE, BoundedOutOfOrderness, Watermark
from ..protocol.windows import Tumbling, WindowAssigner, tumbling
from .dataflow import Sink, build_stages, route
from .world import SimContext, SimProcess, Simulation

__all__ = ["TimedSource", "WindowTask", "Workload", "build_timed", "check", "item_of",
           "logic", "source_items"]

Record = tuple[str, int, str]  # (key, event time, id)


@dataclass(frozen=True)
class Workload:
    """What the sources send: ``records`` each (``shorter`` fewer for each next source), one
    per ``interval`` of simulated time, ``spacing`` seconds of event time apart and up to
    ``spread`` seconds out of order; every ``straggle_every``-th record ``straggle`` seconds
    behind (late, mostly); watermarks ``max_delay`` behind the largest timestamp seen.
    With ``pause_at``, every source but the first says it is idle after that many records
    and pauses for ``pause`` seconds."""

    records: int = 6
    shorter: int = 0
    pause_at: int | None = None
    pause: float = 4.0
    keys: str = "ab"
    spacing: int = 2
    spread: int = 3
    straggle_every: int = 5
    straggle: int = 15
    max_delay: float = 2.0
    interval: float = 1.0


def timed_record(source: int, offset: int, w: Workload) -> Record:
    """Record ``offset`` of source ``source``: deterministic, so replay is exact."""
    h = zlib.crc32(f"{source}-{offset}".encode())
    ts = 10 + w.spacing * offset + source - h % (w.spread + 1)
    if w.straggle_every and offset % w.straggle_every == w.straggle_every - 1:
        ts -= w.straggle
    return (w.keys[(h >> 8) % len(w.keys)], max(ts, 0), f"s{source}-{offset}")


def source_items(source: int, w: Workload) -> list[tuple[Record, float | None]]:
    """Per record: the record, and the watermark sent after it (None: it did not rise)."""
    gen, last = BoundedOutOfOrderness(w.max_delay), None
    out: list[tuple[Record, float | None]] = []
    for offset in range(max(w.records - source * w.shorter, 0)):
        rec = timed_record(source, offset, w)
        gen.on_event(rec[1])
        wm = gen.current()
        out.append((rec, wm if last is None or wm > last else None))
        if last is None or wm > last:
            last = wm
    return out


class TimedSource(SimProcess):
    """Sends a record, half an interval later the watermark if it rose, and so on, then ends
    its outputs; its position is its state.  ``sent`` (not state) keeps ``(time, channel,
    item)`` for the diagram."""

    def __init__(self, index: int, workload: Workload) -> None:
        self.index, self.w = index, workload
        self.items = source_items(index, workload)
        self.pauses_at = workload.pause_at if index else None
        self.state = {"offset": 0, "watermark_due": False}
        self.sent: list[tuple[float, str, tuple]] = []

    def on_start(self, ctx: SimContext) -> None:
        if self._done():
            self._finish(ctx)
        else:
            ctx.schedule(self.w.interval / 2)

    def _finish(self, ctx: SimContext) -> None:
        ctx.finish()
        self.sent += [(ctx.now, ch, ("eof",)) for ch in ctx.outputs]

    def _done(self) -> bool:
        return self.state["offset"] >= len(self.items) and not self.state["watermark_due"]

    def on_timer(self, ctx: SimContext, tag: Any) -> None:
        st = self.state
        if self._done():  # half an interval after the last watermark
            self._finish(ctx)
            return
        if st["watermark_due"]:
            st["watermark_due"] = False
            wm = self.items[st["offset"] - 1][1]
            if wm is not None:
                for ch in ctx.outputs:  # not key-routed: every output channel
                    self._send(ctx, ch, Watermark(wm), ("w", wm))
            if self.pauses_at == st["offset"]:  # quiet for a while: say so downstream
                for ch in ctx.outputs:
                    self._send(ctx, ch, IDLE, ("idle",))
                ctx.schedule(self.w.pause)
                return
        else:
            rec = self.items[st["offset"]][0]
            self._send(ctx, route(rec[0], ctx.outputs), rec, ("r", rec))
            st["offset"] += 1
            st["watermark_due"] = True
        ctx.schedule(self.w.interval / 2)

    def _send(self, ctx: SimContext, ch: str, payload: Any, item: tuple) -> None:
        ctx.send(ch, payload)
        self.sent.append((ctx.now, ch, item))


class WindowTask(SimProcess):
    """A window operator task: :class:`WindowModel` behind its snapshot handler; what it
    emits goes to every output as ``(task name, output)``.  For the diagram (not state):
    ``took`` ``(time, channel, item)``, ``emitted`` ``(time, output)``, ``watermarks``
    ``(time, its new watermark)`` and ``ended_at``, when its inputs ended."""

    def __init__(self, channels: Sequence[str], assigner: WindowAssigner,
                 lateness: float = 0.0) -> None:
        self.channels, self.assigner, self.lateness = list(channels), assigner, lateness
        self.model = WindowModel(self.channels, assigner, lateness)
        self.state: dict[str, Any] = {"log": [], "emitted": 0}
        self.took: list[tuple[float, str, tuple]] = []
        self.emitted: list[tuple[float, tuple]] = []
        self.watermarks: list[tuple[float, float]] = []
        self.ended_at = math.inf

    def on_receive(self, ctx: SimContext, channel: str, payload: Any) -> None:
        item = item_of(payload)
        self.took.append((ctx.now, channel, item))
        self._apply(ctx, channel, item)

    def on_input_closed(self, ctx: SimContext, channel: str) -> None:
        self.took.append((ctx.now, channel, ("eof",)))
        self._apply(ctx, channel, ("eof",))

    def on_end_of_input(self, ctx: SimContext) -> None:
        self.ended_at = ctx.now

    def _apply(self, ctx: SimContext, channel: str, item: tuple) -> None:
        out = self.model.output
        n, wm = len(out), self.model.tracker.current
        self.model.apply(channel, item)
        if self.model.tracker.current != wm:
            self.watermarks.append((ctx.now, self.model.tracker.current))
        self.state["log"].append((channel, item))
        for o in out[n:]:
            self.emitted.append((ctx.now, o))
            for ch in ctx.outputs:
                ctx.send(ch, (ctx.name, o))
        self.state["emitted"] += len(out) - n
        del out[:]

    def snapshot_state(self) -> Any:
        return {"tracker": self.model.tracker.snapshot(), "windows": dict(self.model.windows),
                "log": list(self.state["log"]), "emitted": self.state["emitted"]}

    def restore_state(self, state: Any) -> None:
        self.model = WindowModel(self.channels, self.assigner, self.lateness)
        self.model.tracker.restore(state["tracker"])
        self.model.windows = dict(state["windows"])
        self.state = {"log": list(state["log"]) + [(None, ("restored",))],
                      "emitted": state["emitted"]}


def window_names(windows: int) -> list[str]:
    return ["W"] if windows == 1 else [f"W{i + 1}" for i in range(windows)]


def build_timed(sim: Simulation, *, sources: int = 2, windows: int = 1,
                workload: Workload = Workload(), assigner: WindowAssigner | None = None,
                lateness: float = 0.0) -> None:
    """``S1..Sn --hash(key)--> W (or W1..Wk) --> sink``; watermarks go to every W."""
    srcs = [f"S{i + 1}" for i in range(sources)]
    build_stages(sim, {s: TimedSource(i, workload) for i, s in enumerate(srcs)},
                 {wn: WindowTask([f"{s}->{wn}" for s in srcs], assigner or tumbling(10),
                                 lateness) for wn in window_names(windows)})


L = TypeVar("L", bound=SimProcess)


def logic(sim: Simulation, name: str, kind: type[L]) -> L:
    """Process ``name``'s logic, which is a ``kind``."""
    found = sim.procs[name].logic
    if not isinstance(found, kind):
        raise TypeError(f"{name} runs a {type(found).__name__}, not a {kind.__name__}")
    return found


def check(sim: Simulation) -> list[str]:
    """What is wrong with the finished run ``sim`` (see the module docstring); [] if
    nothing.  With tumbling windows and no lateness, the window counts and the late records
    also add up to the records sent."""
    found: list[str] = []
    stuck = [c for c, ch in sim.chans.items() if ch.inbox]
    if stuck:
        return [f"deadlock: {', '.join(stuck)} still hold items nobody takes"]
    srcs = [n for n, p in sim.procs.items() if isinstance(p.logic, TimedSource)]
    wins = [n for n, p in sim.procs.items() if isinstance(p.logic, WindowTask)]
    want: dict[str, list[tuple]] = {f"{s}->{wn}": [] for s in srcs for wn in wins}
    for s in srcs:
        src = logic(sim, s, TimedSource)
        for offset, (rec, wm) in enumerate(src.items):
            want[f"{s}->{route(rec[0], wins)}"].append(("r", rec))
            for wn in wins:
                want[f"{s}->{wn}"] += [("w", wm)] if wm is not None else []
                want[f"{s}->{wn}"] += [("idle",)] if src.pauses_at == offset + 1 else []
    sink = logic(sim, "sink", Sink).state
    for wn in wins:
        task = logic(sim, wn, WindowTask)
        log = task.state["log"]
        for ch in task.channels:
            took = [it for c, it in log if c == ch and it[0] in ("r", "w", "idle")]
            if took != want[ch]:
                found.append(f"{ch}: {wn} applied {_shows(took)}, the channel carried "
                             f"{_shows(want[ch])}")
        got = [o for who, o in sink if who == wn]
        again = replay(task.channels, task.assigner, task.lateness, log).output
        if got != again:
            found.append(f"{wn}: the sink got {got}, a failure-free operator makes {again} "
                         f"from the same items")
        fired = Counter(o[1:4] for o in got if o[0] == "window")
        twice = sorted(w for w, n in fired.items() if n > 1)
        if twice and not task.lateness:
            found.append(f"{wn}: window(s) fired twice: {twice}")
        if task.model.windows:
            found.append(f"{wn}: window(s) never fired: {sorted(task.model.windows)}")
    n = sum(len(logic(sim, s, TimedSource).items) for s in srcs)
    if all(type(t.assigner) is Tumbling and not t.lateness
           for t in (logic(sim, wn, WindowTask) for wn in wins)):  # each record counts once
        counted = sum(o[4] for _, o in sink if o[0] == "window")
        late = sum(1 for _, o in sink if o[0] == "late")
        if counted + late != n:
            found.append(f"{counted} record(s) in windows and {late} late, of {n} sent")
    return found


def item_of(payload: Any) -> tuple:
    """A message payload as a log item: ``("w", ts)``, ``("idle",)`` or ``("r", record)``."""
    if type(payload) is Watermark:
        return ("w", payload.ts)
    return ("idle",) if payload is IDLE else ("r", payload)
