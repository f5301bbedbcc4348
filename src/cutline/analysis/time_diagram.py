"""A space-time diagram of event time across a failure: one interleaving of the event-time
explorer (:mod:`cutline.analysis.explore_time`), or one simulator run
(:func:`cutline.sim.scenarios.watermarks.time_run`), drawn.

Sources S1, S2 and the window operator W are horizontal lines; steps of the interleaving
(or simulated time) run left to right.  Arrows are items on the FIFO channels: records
(grey, ``a@8``), watermarks (blue, ``wm 10``), barriers (red).  On W: its combined
watermark where it rises (blue, ``W wm 7``, then the new values), its checkpoint (a red
bar), each window firing (a green star, ``a [0,10) = 2``), each late record (an orange
cross); the crash (a grey band), after which W restores the checkpoint and the sources
resend from their checkpointed positions, and the recorded channel state is delivered
first (arrows that start at the band).  The title gives the verdict: the output equals a
failure-free operator's on the same items, or what is wrong.

``cutline explore --event-time SCENARIO --diagram FILE.png`` and ``cutline simulate
watermarks --diagram FILE.png`` draw one such run.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

from ..protocol import Mode
from .explore_time import SCENARIOS, _Explorer, _show, _World

__all__ = ["TimeRun", "draw_time_run", "sample_run"]


@dataclass
class TimeRun:
    """What :func:`draw_time_run` draws.  ``x`` is where on the time axis: a step of the
    explorer's interleaving, or (:func:`cutline.sim.scenarios.watermarks.time_run`)
    scaled simulated time."""

    scenario: str
    mode: str
    lines: list[str]  # the sources' lines (S1, S2, ...) and "W"
    #: (channel index, item, send x (re-delivered channel state: at the crash), take x)
    arrows: list[tuple[int, tuple, float, float]] = field(default_factory=list)
    outputs: list[tuple[float, tuple]] = field(default_factory=list)  # (x, output)
    checkpoints: list[tuple[float, str, int]] = field(default_factory=list)  # (x, who, id)
    crash: float | None = None
    restored: int | None = None  # the checkpoint restored (0: none)
    steps: float = 0  # the last x
    problems: list[str] = field(default_factory=list)
    title: str | None = None  # what the run is, before the verdict
    watermarks: list[tuple[float, float]] = field(default_factory=list)  # (x, W's new)


def sample_run(scenario: str = "late", mode: str = "aligned", *, seed: int = 0,
               tries: int = 5000) -> TimeRun:
    """One interleaving, picked at random (``seed``) among those with a crash after a
    completed checkpoint and, if the scenario can, a late record before the crash."""
    m = Mode.parse(mode)
    ex = _Explorer(SCENARIOS[scenario], m, 1, 10.0, 2.0, None)
    rng = random.Random(seed)
    best: TimeRun | None = None
    for _ in range(tries):
        run = _walk(ex, rng, scenario, m.value)
        if run.crash is None or not run.restored:
            continue
        late = any(o[0] == "late" for s, o in run.outputs if s < run.crash)
        if late or scenario != "late":
            return run
        best = best or run
    if best is None:
        raise RuntimeError(f"no interleaving of {scenario!r} with a crash after a checkpoint "
                           f"in {tries} tries")
    return best


def _walk(ex: _Explorer, rng: random.Random, scenario: str, mode: str) -> TimeRun:
    run = TimeRun(scenario, mode, [*(f"S{i + 1}" for i in range(len(ex.chans))), "W"])
    w: _World = ex.initial()
    flight: list[list[tuple[tuple, float]]] = [[] for _ in ex.chans]
    crash_wanted = rng.random() < 0.9
    step = 0
    while True:
        steps = ex.steps(w)
        if not steps:
            break
        crashes = [s for s in steps if s[0].startswith("crash")]
        others = [s for s in steps if not s[0].startswith("crash")]
        if crashes and crash_wanted and w.done and rng.random() < 0.12:
            label, thunk = crashes[0]
        else:
            label, thunk = rng.choice(others) if others else crashes[0]
        step += 1
        before = w
        w = thunk()
        if label.startswith("crash"):
            run.crash, run.restored = step, max(before.done, default=0)
            run.outputs = [(s, o) for s, o in run.outputs
                           if s < step][:len(w.win.output)]
            flight = [[(it, step - 0.5) for it in q] for q in w.queues]
            continue
        for c in range(len(ex.chans)):
            old, new = before.queues[c], w.queues[c]
            if label.startswith(f"S{c + 1} ") and len(new) > len(old):
                flight[c].append((new[-1], step))
            elif len(new) < len(old) and f"{ex.chans[c]}" in label:
                if "overtakes" in label:
                    pos = len(old) - len(new) - 1
                    taken = flight[c][:pos + 1]
                    flight[c] = flight[c][pos + 1:]
                else:
                    taken, flight[c] = flight[c][:1], flight[c][1:]
                for item, sent in taken:
                    run.arrows.append((c, item, sent, step))
        for out in w.win.output[len(before.win.output):]:
            run.outputs.append((step, out))
        for n, (a, b) in enumerate(zip(before.snaps, w.snaps), start=1):
            if b is not None and b[1] is not None and (a is None or a[1] is None):
                run.checkpoints.append((step, "W", n))
        for n in w.done - before.done:
            run.checkpoints.append((step, "done", n))
        if w.win.tracker.current != before.win.tracker.current:
            run.watermarks.append((step, w.win.tracker.current))
    run.steps = step
    run.problems = ex.problems(w)
    return run


def draw_time_run(run: TimeRun, path: str | Path) -> Path:
    """Render ``run`` to ``path`` (``.png`` or ``.svg``)."""
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    path = Path(path)
    if path.suffix.lower() not in (".png", ".svg"):
        raise ValueError(f"cannot render a diagram to {path.name!r}: use .png or .svg")
    y = {name: len(run.lines) - 1 - i for i, name in enumerate(run.lines)}
    wy = y["W"]
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "cutline"}):
        width = max(10.0, run.steps * 0.42)
        fig = Figure(figsize=(width, 4.6))
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        for name, yy in y.items():
            ax.plot([0, run.steps + 1], [yy, yy], color="black", lw=1)
            ax.text(-0.4, yy, name, ha="right", va="center", fontsize=11, weight="bold")
        if run.crash is not None:
            ax.axvspan(run.crash - 0.35, run.crash + 0.35, color="0.8", zorder=0)
            ax.text(run.crash, wy + 0.35, f"crash: restore checkpoint {run.restored}"
                    if run.restored else "crash: no checkpoint yet, start over",
                    ha="center", va="bottom", fontsize=8, color="0.3")
        style = {"r": ("0.45", "-"), "w": ("tab:blue", "--"), "b": ("tab:red", "-"),
                 "idle": ("tab:purple", ":"), "eof": ("0.7", ":")}
        for c, item, sent, took in run.arrows:
            color, ls = style[item[0]]
            x0 = sent
            ax.annotate("", xy=(took, wy), xytext=(x0, y[f"S{c + 1}"]),
                        arrowprops={"arrowstyle": "-|>", "color": color, "lw": 1.1,
                                    "linestyle": ls, "shrinkA": 0, "shrinkB": 0})
            label = _show(item, short=True)
            ax.text(x0, y[f"S{c + 1}"] + 0.08, label, fontsize=7, color=color, ha="center",
                    va="bottom", rotation=35)
        for step, ts in run.watermarks:  # W's combined watermark, where it rises
            ax.text(step + 0.2, wy + 0.04, f"{'W wm ' if step == run.watermarks[0][0] else ''}"
                    f"{'∞' if ts == float('inf') else format(ts, 'g')}", fontsize=7,
                    color="tab:blue", ha="left", va="bottom", weight="bold")
        for step, who, n in run.checkpoints:
            if who == "W":
                ax.plot([step, step], [wy - 0.18, wy + 0.18], color="tab:red", lw=3)
                ax.text(step, wy - 0.22, f"chk {n}", color="tab:red", fontsize=7,
                        ha="center", va="top")
        # output labels below W, each in the first row where it overlaps no other
        per_char = 0.075 * (run.steps + 2.7) / width  # x units per character (8 pt)
        rows: list[float] = []  # each row's right end
        for step, out in run.outputs:
            if out[0] == "window":
                _, key, start, end, count = out
                ax.plot(step, wy, marker="*", color="tab:green", ms=13, zorder=5)
                text, color = f"{key} [{start:g},{end:g}) = {count}", "tab:green"
            else:
                ax.plot(step, wy, marker="X", color="tab:orange", ms=10, zorder=5)
                text, color = f"late {out[1]}@{out[2]:g}", "tab:orange"
            half = len(text) * per_char / 2
            row = next((i for i, end in enumerate(rows) if end < step - half), len(rows))
            rows[row:row + 1] = [step + half]
            ax.text(step, wy - 0.45 - 0.17 * row, text, fontsize=8, color=color,
                    ha="center", va="top")
        ax.set_xlim(-1.2, run.steps + 1.5)
        ax.set_ylim(min(wy - 1.2, wy - 0.65 - 0.17 * len(rows)), len(run.lines) - 0.3)
        ax.axis("off")
        verdict = "output = failure-free operator's on the same items" if not run.problems \
            else "; ".join(run.problems)
        head = run.title or (f"event time across a crash: {run.mode}, scenario "
                             f"{run.scenario!r} (tumbling 10 s, max_delay 2 s)")
        ax.set_title(f"{head} - {verdict}", fontsize=10)
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=130, metadata={"Date": None} if path.suffix == ".svg" else None)
    return path
