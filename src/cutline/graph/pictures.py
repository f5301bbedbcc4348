"""Pictures of a process-graph run (matplotlib, PNG or SVG).

* :func:`run_diagram`: a space-time diagram of a window of a traced run with a snapshot's
  cut, drawn by :func:`cutline.sim.diagram.draw` (the simulator's diagrams) from the trace
  the hosts recorded.  Times are the hosts' wall clocks: on one machine they agree; on a
  cluster, clock skew can tilt arrows.
* :func:`snapshot_view`: one snapshot as a graph: processes on a circle (state and whether
  passive), channels as arrows, the messages recorded in transit on them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Circle, FancyArrowPatch

from .snapshot import GraphSnapshot

__all__ = ["run_diagram", "snapshot_view"]

SUFFIXES = (".png", ".svg")
IDLE, IN_TRANSIT = "#9a9a9a", "#d62728"
PASSIVE_FILL, ACTIVE_FILL = "#ffffff", "#ffd8a8"


def _suffix(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise ValueError(f"cannot draw to {path.name!r}: use .png or .svg")
    return suffix


class _TracedRun:
    """What :func:`cutline.sim.diagram.draw` reads from a simulation, from a live run."""

    def __init__(self, result: Any, snaps: list[GraphSnapshot]) -> None:
        self.trace = result.trace
        self.procs = {n: None for n in result.names}
        self.chans = {f"{a}->{b}": SimpleNamespace(src=a, dst=b) for a, b in result.edges}
        self.snapshots = {s.id: s.to_sim() for s in snaps}

    @property
    def completed(self) -> list:
        return sorted(self.snapshots.values(), key=lambda s: s.id)


def run_diagram(result: Any, path: str | Path, *, snapshot: int | None = None,
                window: tuple[float, float] | None = None, max_messages: int | None = 300,
                title: str | None = None) -> Path:
    """Space-time diagram of the last attempt of ``result`` around ``snapshot`` (default:
    :meth:`~cutline.graph.result.RunResult.showcase`)."""
    from ..sim.diagram import draw

    if not result.trace:
        raise ValueError("no trace to draw: run the graph with trace=True (cutline run "
                         "--diagram does)")
    mine = [s for s in result.snapshots if s.attempt == result.last_attempt]
    if not mine:
        raise ValueError("the last attempt of the run completed no snapshot")
    if snapshot is None:
        snap = result.showcase()
        if snap not in mine:
            snap = mine[0]
    else:
        snap = next((s for s in mine if s.id == snapshot), None)
        if snap is None:
            raise ValueError(f"no snapshot {snapshot} in the last attempt of the run "
                             f"(have {[s.id for s in mine]})")
    if window is None:
        window = _cut_window(result.trace, snap)
    title = title or (f"{result.job}: snapshot {snap.id} "
                      f"({snap.in_transit} message(s) in transit)")
    return draw(_TracedRun(result, [snap]), path, snapshot_ids=[snap.id], window=window,
                max_messages=max_messages, title=title)


def _cut_window(trace: Any, snap: GraphSnapshot) -> tuple[float, float]:
    """The stretch of time a snapshot's cut needs: from its first marker sent (or local
    snapshot) to its last marker received, with a third of that on either side, so the
    cut fills the middle of the picture rather than a sliver of it."""
    times = list(snap.taken_at.values())
    times += [ev.time for ev in trace
              if ev.checkpoint == snap.id and ev.kind in ("marker_send", "marker_recv")]
    lo, hi = min(times), max(times)
    pad = max((hi - lo) / 3, 1e-3)
    return max(lo - pad, 0.0), hi + pad


def _label(state: Any, width: int = 24) -> str:
    if isinstance(state, dict):
        text = " ".join(f"{k}={v}" for k, v in list(state.items())[:2]
                        if not isinstance(v, (list, dict, set, tuple)) or len(v) < 4)
    else:
        text = repr(state)
    return text if len(text) <= width else text[: width - 1] + "…"


def snapshot_view(snap: GraphSnapshot, path: str | Path, *, title: str | None = None,
                  label: Callable[[Any], str] | None = None, max_listed: int = 4) -> Path:
    """Draw ``snap``: processes on a circle, channels as arrows; channels with messages in
    transit in red, with their count and first messages."""
    path = Path(path)
    suffix = _suffix(path)
    names = list(snap.states)
    n = len(names)
    pos = {p: (math.cos(math.pi / 2 - 2 * math.pi * i / n),
               math.sin(math.pi / 2 - 2 * math.pi * i / n)) for i, p in enumerate(names)}
    size = 7.5 if n <= 12 else 10.0
    fig = Figure(figsize=(size, size), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_xlim(-1.7, 1.7)
    ax.set_ylim(-1.45, 1.45)
    radius = min(0.16, 1.4 / max(n, 1))
    small = n > 24
    def rim(a: str, b: str) -> tuple[tuple[float, float], tuple[float, float]]:
        (x0, y0), (x1, y1) = pos[a], pos[b]
        d = math.hypot(x1 - x0, y1 - y0) or 1.0
        ux, uy = (x1 - x0) / d, (y1 - y0) / d
        return (x0 + ux * radius, y0 + uy * radius), (x1 - ux * radius, y1 - uy * radius)

    for (a, b), msgs in snap.channels.items():
        if a not in pos or b not in pos:
            continue
        busy = bool(msgs)
        start, end = rim(a, b)
        ax.add_patch(FancyArrowPatch(
            start, end, connectionstyle="arc3,rad=0.12", arrowstyle="-|>",
            mutation_scale=12 if not small else 7, shrinkA=0, shrinkB=1,
            color=IN_TRANSIT if busy else IDLE, lw=2.4 if busy else 0.9, zorder=2))
        if busy and not small:
            (x0, y0), (x1, y1) = start, end
            mx, my = (x0 + x1) / 2, (y0 + y1) / 2
            dx, dy = x1 - x0, y1 - y0  # the arc bulges to the right of a -> b
            shown = ", ".join(_short(m) for m in msgs[:max_listed])
            more = f" +{len(msgs) - max_listed}" if len(msgs) > max_listed else ""
            ax.text(mx + 0.09 * dy, my - 0.09 * dx, f"{len(msgs)}: {shown}{more}",
                    fontsize=8, color=IN_TRANSIT, ha="center", va="center", zorder=5,
                    bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.85))
    fmt = label or _label
    for p in names:
        x, y = pos[p]
        fill = PASSIVE_FILL if snap.passive.get(p, True) else ACTIVE_FILL
        ax.add_patch(Circle((x, y), radius, fc=fill, ec="black", lw=1.2, zorder=3))
        ax.text(x, y, p, ha="center", va="center", fontsize=10 if not small else 6,
                fontweight="bold", zorder=4)
        if not small:  # the state, outside the circle of processes
            ax.text(x * (1 + radius + 0.05), y * (1 + radius + 0.05), fmt(snap.states[p]),
                    ha="left" if x > 0.3 else "right" if x < -0.3 else "center",
                    va="bottom" if y > 0.3 else "top" if y < -0.3 else "center",
                    fontsize=8, zorder=4, color="#333333",
                    bbox=dict(boxstyle="round,pad=0.1", fc="white", ec="none", alpha=0.8))
    checks = "; ".join(f"{c.name}: {'holds' if c.holds else 'no'}"
                       + (f" ({c.detail})" if c.detail else "") for c in snap.checks)
    ax.set_title(title or f"snapshot {snap.id}: {n} processes, {snap.in_transit} message(s) "
                          f"in transit", fontsize=12)
    if checks:
        fig.text(0.5, 0.01, checks, ha="center", va="bottom", fontsize=8, wrap=True)
    fig.legend(handles=[
        Line2D([], [], color=IDLE, lw=0.9, label="channel, empty"),
        Line2D([], [], color=IN_TRANSIT, lw=2.4, label="messages in transit (recorded)"),
        Line2D([], [], marker="o", ls="", mfc=PASSIVE_FILL, mec="black", ms=10,
               label="passive"),
        Line2D([], [], marker="o", ls="", mfc=ACTIVE_FILL, mec="black", ms=10,
               label="active (timer pending)"),
    ], loc="outside upper center", ncols=4, frameon=False, fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "cutline"}):
        fig.savefig(path, format=suffix[1:], dpi=110,
                    metadata={"Date": None} if suffix == ".svg" else None)
    return path


def _short(m: Any, width: int = 10) -> str:
    text = repr(m)
    return text if len(text) <= width else text[: width - 1] + "…"
