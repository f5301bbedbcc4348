"""Event time across a failure in the simulator: watermarks in band, windows exactly once.

Two sources send out-of-order records and their watermarks (in band, FIFO with the
records) to a window task counting records per key in tumbling windows of 10 s, which
sends its results and late records to a sink (:mod:`cutline.sim.eventtime`).  The job
checkpoints every ``interval``; at ``crash_at`` it dies, the latest completed checkpoint is
restored into a fresh world (states, the tracker's watermarks, then the recorded channel
state, watermarks included) and the sources replay from their positions to the end.
:func:`~cutline.sim.eventtime.check` is the verdict: every item applied exactly once, the
sink's output equal to a fresh operator's on the items the window task applied.

``fault`` injects a known bug so the check is seen to catch it:
``"watermarks_not_in_channel_state"`` (the restored channel state loses its watermarks)
and ``"tracker_not_restored"`` (the window task's watermark starts over).

:func:`time_run` turns a run into the event-time diagram's
:class:`~cutline.analysis.time_diagram.TimeRun` (``cutline simulate watermarks
--diagram``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, cast

from ...analysis.time_diagram import TimeRun
from ...protocol import Barrier
from ...protocol.watermarks import Watermark, WatermarkTracker
from ...protocol.windows import WindowAssigner
from ..dataflow import Sink
from ..eventtime import (
    TimedSource,
    WindowTask,
    Workload,
    build_timed,
    check,
    item_of,
    logic,
    window_names,
)
from ..world import Simulation, Snapshot

MODES: dict[str, tuple[str, float | None]] = {
    "aligned": ("aligned", None),
    "aligned_timeout": ("aligned", 0.5),
    "unaligned": ("unaligned", None),
    "chandy_lamport": ("chandy_lamport", None),
}
FAULTS = ("watermarks_not_in_channel_state", "tracker_not_restored")
SCALE = 3.5  # diagram x units per simulated second


@dataclass
class WatermarksResult:
    mode: str
    seed: int
    crash_at: float | None
    fault: str | None
    worlds: list[Simulation]
    restored: Snapshot | None = None  # as restored (after the fault, if any)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def output(self) -> list[tuple[str, tuple]]:
        """The sink's committed output: ``(window task, output)``."""
        return list(logic(self.worlds[-1], "sink", Sink).state)

    def as_dict(self) -> dict[str, Any]:
        out = [o for _, o in self.output]
        recorded = [m.payload for ms in (self.restored.channels.values() if self.restored
                                         else ()) for m in ms]
        return {
            "mode": self.mode, "seed": self.seed, "crash_at": self.crash_at,
            "fault": self.fault,
            "restored_checkpoint": self.restored.id if self.restored else None,
            "channel_state": {"records": sum(item_of(p)[0] == "r" for p in recorded),
                              "watermarks": sum(item_of(p)[0] == "w" for p in recorded)},
            "windows": [{"key": k, "start": s, "end": e, "count": n}
                        for kind, k, s, e, n in (o for o in out if o[0] == "window")],
            "late": [{"key": o[1], "ts": o[2]} for o in out if o[0] == "late"],
            "ok": self.ok, "problems": self.problems,
        }


def _world(mode: str, seed: int, workload: Workload, windows: int,
           assigner: WindowAssigner | None, lateness: float, service: float) -> Simulation:
    m, timeout = MODES[mode]
    sim = Simulation(m, seed=seed, delay=(0.3, 1.8), aligned_timeout=timeout,
                     service_time={w: service for w in window_names(windows)})
    build_timed(sim, windows=windows, workload=workload, assigner=assigner,
                lateness=lateness)
    return sim


def run(seed: int = 0, mode: str = "aligned", *, crash_at: float | None = 7.0,
        interval: float = 2.0, workload: Workload | None = None, windows: int = 1,
        assigner: WindowAssigner | None = None, lateness: float = 0.0, service: float = 0.3,
        fault: str | None = None) -> WatermarksResult:
    """One run, checkpointing every ``interval``, dying at ``crash_at`` (None: never);
    a window task takes ``service`` seconds per item (backpressure)."""
    workload = workload or Workload()
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {', '.join(MODES)}")
    if fault is not None and fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; expected one of {', '.join(FAULTS)}")
    horizon = workload.records * workload.interval + 20.0
    sim = _world(mode, seed, workload, windows, assigner, lateness, service)
    sim.snapshot_every(interval, start=interval + 0.75, until=horizon)  # between sends
    result = WatermarksResult(mode, seed, crash_at, fault, [sim])
    if crash_at is not None:
        sim.run(until=crash_at)  # ... and the job dies here
        last = sim.latest_completed()
        sim = _world(mode, seed + 1000, workload, windows, assigner, lateness, service)
        if last is not None:
            if fault == "watermarks_not_in_channel_state":
                last = dataclasses.replace(last, channels={
                    c: [m for m in ms if type(m.payload) is not Watermark]
                    for c, ms in last.channels.items()})
            sim.restore(last)
        if fault == "tracker_not_restored":
            for wn in window_names(windows):
                task = logic(sim, wn, WindowTask)
                task.model.tracker = WatermarkTracker(task.channels)
        sim.snapshot_every(interval, start=interval + 0.75, until=horizon,
                           first_id=(last.id if last else 0) + 1)
        result.restored = last
        result.worlds.append(sim)
    sim.run()
    result.problems = check(sim)
    return result


def time_run(result: WatermarksResult) -> TimeRun:
    """``result`` (one window task) as the event-time diagram draws it: x is simulated
    time, the restored world's after the crash; the outputs are those the sink kept."""
    first = result.worlds[0]
    srcs = [n for n, p in first.procs.items() if isinstance(p.logic, TimedSource)]
    if "W" not in first.procs:
        raise ValueError("the diagram draws one window task; this run has "
                         f"{len(first.procs) - len(srcs) - 1}")
    run = TimeRun(f"seed {result.seed}", result.mode, [*srcs, "W"],
                  title=f"event time in the simulator, across a crash: {result.mode}, "
                        f"seed {result.seed} (tumbling 10 s, max_delay 2 s)")
    if result.crash_at is not None:
        run.crash = result.crash_at * SCALE
        run.restored = result.restored.id if result.restored else 0
    for k, sim in enumerate(result.worlds):
        restored = result.restored if k == 1 else None
        _draw_world(run, sim, srcs, 0.0 if k == 0 else (run.crash or 0.0) + 1.0, restored)
        if k == 0 and len(result.worlds) > 1:  # only what the restored checkpoint emitted
            kept = result.restored.states["W"]["emitted"] if result.restored else 0
            run.outputs = run.outputs[:kept]
    last = max([a[3] for a in run.arrows] + [x for x, _ in run.outputs], default=0.0)
    run.steps = int(last) + 1
    run.problems = result.problems
    return run


def _draw_world(run: TimeRun, sim: Simulation, srcs: list[str], off: float,
                restored: Snapshot | None) -> None:
    """Add one world's arrows, checkpoints, outputs and watermarks to ``run``, ``off`` to
    the right; ``restored``: the channel state it started with (arrows from the crash)."""
    task = logic(sim, "W", WindowTask)
    chans = [f"{s}->W" for s in srcs]
    for c, ch in enumerate(chans):
        sent = [(t * SCALE + off, it) for t, cc, it in logic(sim, srcs[c], TimedSource).sent
                if cc == ch]
        replayed = restored.channels.get(ch, []) if restored else []
        took = [t * SCALE + off for t, cc, _ in task.took if cc == ch]
        for i, x in enumerate(took):  # FIFO: the channel state first, then what was sent
            if i < len(replayed):
                run.arrows.append((c, item_of(replayed[i].payload), off - 1.0 + 0.7 * i, x))
            else:
                x0, item = sent[i - len(replayed)]
                run.arrows.append((c, item, x0, x))
    marks = {(e.channel, e.checkpoint): e.time for e in sim.trace if e.kind == "marker_send"}
    for e in sim.trace:
        if e.process != "W" or e.checkpoint is None:
            continue
        if e.kind == "marker_recv" and (e.channel, e.checkpoint) in marks:
            run.arrows.append((chans.index(cast(str, e.channel)), ("b", Barrier(e.checkpoint)),
                               marks[(e.channel, e.checkpoint)] * SCALE + off,
                               e.time * SCALE + off))
        elif e.kind == "snapshot" and e.time <= task.ended_at and \
                sim.snapshots[e.checkpoint].complete:  # (not its final state's)
            run.checkpoints.append((e.time * SCALE + off, "W", e.checkpoint))
    run.outputs += [(t * SCALE + off, o) for t, o in task.emitted]
    run.watermarks += [(t * SCALE + off, wm) for t, wm in task.watermarks]


