"""Space-time diagrams of simulator runs (matplotlib).

One horizontal line per process (first process on top), time to the right::

    from cutline.sim.scenarios import lecture
    from cutline.sim.diagram import draw

    draw(lecture.run().sim, "docs/lecture.png", title="the lecture example")

What is drawn, all read from :attr:`Simulation.trace` and :attr:`Simulation.snapshots`:

* application events (``send``/``recv``/``internal``) as dots, with their ``label``;
* application messages as solid arrows, a ``send`` paired with its ``recv`` by message id.
  A message received but never sent in this trace (re-injected by
  :meth:`Simulation.restore`) starts at the left edge; one sent but not received by the
  end of the run runs off the right edge;
* markers (barriers) as dashed grey arrows, ``marker_send``/``marker_recv`` paired by
  ``(channel, checkpoint)``;
* for each chosen snapshot, every process's local snapshot time and the cut through them,
  and the messages recorded in its channel state, in red ("in transit (recorded)").

The figure is built on a bare :class:`matplotlib.figure.Figure` with an Agg canvas: no
pyplot, no global backend switch, nothing shared between calls.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import FancyArrowPatch

from .world import Snapshot, TraceEvent

__all__ = ["Run", "draw"]

APP_KINDS = frozenset({"send", "recv", "internal"})
SUFFIXES = (".png", ".svg")
MAX_DEFAULT_SNAPSHOTS = 3

MESSAGE_COLOUR = "#333333"
MARKER_COLOUR = "#8c8c8c"
RECORDED_COLOUR = "#d62728"
CUT_COLOURS = ("#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2",
               "#bcbd22")
CUT_MARKERS = ("s", "D", "^", "v", "P", "X", "o", "h")
LABEL_SIZE = 12  # points
LABEL_ROWS = 2  # labels that would overlap move up a row; past the last row, left out


class Run(Protocol):
    """What :func:`draw` reads: a :class:`~cutline.sim.Simulation`, or the trace of a live
    process-graph run (:mod:`cutline.graph.pictures`)."""

    @property
    def trace(self) -> Sequence[TraceEvent]: ...
    @property
    def procs(self) -> Mapping[str, Any]: ...  # process names (in drawing order)
    @property
    def chans(self) -> Mapping[str, Any]: ...  # channel name -> an object with .src, .dst
    @property
    def snapshots(self) -> Mapping[int, Snapshot]: ...
    @property
    def completed(self) -> list[Snapshot]: ...


@dataclass(frozen=True)
class _Arrow:
    """One arrow; ``t0``/``t1`` are None where it runs from the left / to the right edge."""

    src: str
    dst: str
    t0: float | None
    t1: float | None
    message: int | None = None  # application message id
    checkpoint: int | None = None  # marker
    recorded: bool = False

    @property
    def start(self) -> float:
        return -math.inf if self.t0 is None else self.t0

    @property
    def end(self) -> float:
        return math.inf if self.t1 is None else self.t1


@dataclass
class _Plan:
    """Everything :func:`draw` puts on the axes, computed without matplotlib."""

    procs: list[str]
    xlim: tuple[float, float]
    events: list[TraceEvent] = field(default_factory=list)
    messages: list[_Arrow] = field(default_factory=list)
    markers: list[_Arrow] = field(default_factory=list)
    cuts: list[tuple[int, list[tuple[str, float]]]] = field(default_factory=list)
    messages_total: int = 0  # message arrows in the window before the cap
    markers_total: int = 0


def draw(
    sim: Run,
    path: str | Path,
    *,
    snapshot_ids: Iterable[int] | None = None,
    title: str | None = None,
    window: tuple[float, float] | None = None,
    max_messages: int | None = 400,
) -> Path:
    """Render a space-time diagram of ``sim``'s run to ``path`` (``.png`` or ``.svg``).

    ``snapshot_ids``: snapshots whose cuts and recorded channel states are drawn; default
    the first :data:`MAX_DEFAULT_SNAPSHOTS` complete ones (within ``window``, if given).
    ``window=(t0, t1)``: draw only that stretch of time; events outside it are left out
    and arrows and cuts crossing its edges are clipped.  ``max_messages``: keep at most this many
    application-message arrows, and separately at most this many marker arrows, the
    earliest-starting ones (``None``: no cap); messages recorded in a drawn snapshot are
    always drawn.  Returns the path written.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise ValueError(
            f"cannot render a diagram to {path.suffix or 'a file without suffix'!r} "
            f"({path.name}): use .png or .svg"
        )
    plan = _plan(sim, snapshot_ids=snapshot_ids, window=window, max_messages=max_messages)
    path.parent.mkdir(parents=True, exist_ok=True)
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "cutline"}):
        fig = _figure(plan, title)
        fig.savefig(
            path,
            format=suffix[1:],
            dpi=150,
            metadata={"Date": None} if suffix == ".svg" else None,
        )
    return path


# ---------------------------------------------------------------------- planning


def _plan(
    sim: Run,
    *,
    snapshot_ids: Iterable[int] | None = None,
    window: tuple[float, float] | None = None,
    max_messages: int | None = 400,
) -> _Plan:
    if window is not None:
        w0, w1 = (float(t) for t in window)
        if not w0 < w1:
            raise ValueError(f"window must be (t0, t1) with t0 < t1, got {window!r}")
    else:
        w0, w1 = -math.inf, math.inf
    if max_messages is not None and max_messages < 0:
        raise ValueError(f"max_messages must be >= 0 or None, got {max_messages!r}")

    procs = list(sim.procs)
    trace = sim.trace

    # Snapshots to draw.
    if snapshot_ids is None:
        ids = [
            s.id for s in sim.completed
            if any(w0 <= t <= w1 for t in s.taken_at.values())
        ][:MAX_DEFAULT_SNAPSHOTS]
    else:
        ids = list(snapshot_ids)
        unknown = [n for n in ids if n not in sim.snapshots]
        if unknown:
            raise ValueError(
                f"no snapshot {unknown[0]!r} in this run (have {sorted(sim.snapshots)})"
            )
    cuts = []
    recorded: set[int] = set()
    for n in ids:
        snap = sim.snapshots[n]
        cuts.append((n, [(p, snap.taken_at[p]) for p in procs if p in snap.taken_at]))
        for msgs in snap.channels.values():
            recorded.update(m.id for m in msgs)

    # Application messages: pair send and recv by message id.
    sends: dict[int, TraceEvent] = {}
    recvs: dict[int, TraceEvent] = {}
    for ev in trace:
        if ev.message is None:
            continue
        if ev.kind == "send":
            sends[ev.message] = ev
        elif ev.kind == "recv":
            recvs[ev.message] = ev
    messages = []
    for mid in sends.keys() | recvs.keys():
        s, r = sends.get(mid), recvs.get(mid)
        channel = s.channel if s is not None else recvs[mid].channel
        src, dst = _ends(sim, channel, s.process if s else None, r.process if r else None)
        messages.append(_Arrow(src, dst, s.time if s else None, r.time if r else None,
                               message=mid, recorded=mid in recorded))

    # Markers: pair marker_send and marker_recv by (channel, checkpoint).
    pending: dict[tuple[str | None, int | None], TraceEvent] = {}
    markers = []
    for ev in trace:
        if ev.kind == "marker_send":
            pending[(ev.channel, ev.checkpoint)] = ev
        elif ev.kind == "marker_recv":
            s = pending.pop((ev.channel, ev.checkpoint), None)
            src, dst = _ends(sim, ev.channel, s.process if s else None, ev.process)
            markers.append(_Arrow(src, dst, s.time if s else None, ev.time,
                                  checkpoint=ev.checkpoint))
    for (channel, checkpoint), s in pending.items():  # never received: off the right edge
        src, dst = _ends(sim, channel, s.process, None)
        markers.append(_Arrow(src, dst, s.time, None, checkpoint=checkpoint))

    def visible(a: _Arrow) -> bool:
        return a.start <= w1 and a.end >= w0 and a.src in sim.procs and a.dst in sim.procs

    def earliest(arrows: list[_Arrow], keep_recorded: bool) -> tuple[list[_Arrow], int]:
        arrows = sorted((a for a in arrows if visible(a)),
                        key=lambda a: (a.start, a.end, a.message or 0, a.src, a.dst))
        if max_messages is None or len(arrows) <= max_messages:
            return arrows, len(arrows)
        kept = arrows[:max_messages]
        if keep_recorded:
            kept += [a for a in arrows[max_messages:] if a.recorded]
        return kept, len(arrows)

    plan = _Plan(procs, (0.0, 1.0), cuts=cuts)
    plan.messages, plan.messages_total = earliest(messages, keep_recorded=True)
    plan.markers, plan.markers_total = earliest(markers, keep_recorded=False)
    plan.events = [ev for ev in trace if ev.kind in APP_KINDS and w0 <= ev.time <= w1
                   and ev.process in sim.procs]

    if window is not None:
        plan.xlim = (w0, w1)
    else:
        times = [ev.time for ev in trace]
        times += [t for _, pts in cuts for _, t in pts]
        lo, hi = (min(times), max(times)) if times else (0.0, 1.0)
        span = (hi - lo) or 1.0
        edge = any(a.t0 is None for a in plan.messages + plan.markers)
        plan.xlim = (lo - span * (0.08 if edge else 0.04), hi + span * 0.04)
    return plan


def _segment(a: _Arrow, x0: float, x1: float, ya: float, yb: float
             ) -> tuple[float, float, float, float, str]:
    """Where ``a`` is drawn between the time limits ``x0``..``x1``: ``(xa, ya, xb, yb,
    arrow style)``.  An arrow that starts or ends outside them stops at the edge, inside
    the figure, headless where its end is not in the picture."""
    xa = x0 if a.t0 is None else a.t0
    xb = x1 if a.t1 is None else a.t1
    ya, yb = float(ya), float(yb)
    head = "-|>"
    if xb > x1 and xb > xa:
        yb = ya + (yb - ya) * (x1 - xa) / (xb - xa)
        xb, head = x1, "-"
    if xa < x0 and xb > xa:
        ya = ya + (yb - ya) * (x0 - xa) / (xb - xa)
        xa = x0
    return xa, ya, xb, yb, head


def _label_width(text: str) -> float:
    """Width in points of a bold label at :data:`LABEL_SIZE` (DejaVu Sans, about 0.68 em
    per character), with its box's padding."""
    return 0.68 * LABEL_SIZE * len(text) + 3.0


def _points_per_unit(fig: Figure, ax: Any) -> float:
    """Points per unit of time on ``ax`` once the figure is laid out."""
    fig.draw_without_rendering()  # the constrained layout places the axes
    x0, x1 = ax.get_xlim()
    width = ax.get_window_extent().width * 72.0 / fig.dpi
    return width / (x1 - x0) if x1 > x0 else 1.0


def _ends(sim: Run, channel: str | None, src: str | None, dst: str | None
          ) -> tuple[str, str]:
    """Sender and receiver of ``channel``, preferring what the trace says."""
    ch = sim.chans.get(channel) if channel is not None else None
    if ch is not None:
        return src or ch.src, dst or ch.dst
    a, _, b = (channel or "").partition("->")
    return src or a, dst or b


# ---------------------------------------------------------------------- drawing


def _figure(plan: _Plan, title: str | None) -> Figure:
    n = len(plan.procs)
    width = min(16.0, max(8.0, 2.0 + 0.45 * len(plan.events)))
    # every cut needs room of its own: several snapshots widen the picture
    width = max(width, min(26.0, 4.0 + 2.6 * len(plan.cuts)))
    height = 1.2 * max(n, 1) + 1.8 + (0.3 if title else 0.0)
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()

    y = {p: n - 1 - i for i, p in enumerate(plan.procs)}
    x0, x1 = plan.xlim
    ax.set_xlim(x0, x1)
    ax.set_ylim(-0.55, n - 0.45)
    ax.set_yticks([y[p] for p in plan.procs], plan.procs, fontsize=12)
    ax.tick_params(axis="y", length=0)
    ax.set_xlabel("time")
    ax.spines[["top", "right"]].set_visible(False)
    if title:
        ax.set_title(title, fontsize=13)
    for p in plan.procs:
        ax.axhline(y[p], color="black", lw=1.3, zorder=1)

    def arrow(a: _Arrow, **style) -> None:
        xa, ya, xb, yb, head = _segment(a, x0, x1, y[a.src], y[a.dst])
        bend = "arc3,rad=0.35" if a.src == a.dst else "arc3"
        ax.add_patch(FancyArrowPatch(
            (xa, ya), (xb, yb), connectionstyle=bend,
            arrowstyle=head, mutation_scale=14, shrinkA=3, shrinkB=4 if head != "-" else 0,
            **style))

    for a in plan.markers:
        arrow(a, color=MARKER_COLOUR, lw=1.2, linestyle=(0, (5, 3)), zorder=2)
    for a in plan.messages:
        if a.recorded:
            arrow(a, color=RECORDED_COLOUR, lw=2.6, zorder=4)
        else:
            arrow(a, color=MESSAGE_COLOUR, lw=1.4, zorder=3)

    # Event dots and labels; labels of events at the same place are spread sideways.
    ax.scatter([ev.time for ev in plan.events], [y[ev.process] for ev in plan.events],
               s=36, color="black", zorder=6)
    # A label sits above its dot, on the left, where no arrow is: arrows leave a send
    # to the right and reach a receive from the left.  Only a receive from a process
    # above has its arrow on the upper left, so its label goes upper right.
    # Labels never overlap: one that would is moved up a row, and past the last row left
    # out (a dense run's labels are repetitive; the lecture example's all fit).
    senders = {a.message: a.src for a in plan.messages}
    seen: dict[tuple[str, float], int] = {}
    per_unit = _points_per_unit(fig, ax)
    taken: dict[tuple[str, int], list[tuple[float, float]]] = {}
    hidden = 0
    for ev in sorted(plan.events, key=lambda e: (e.process, e.time)):
        if not ev.label:
            continue
        k = seen.get((ev.process, ev.time), 0)
        seen[(ev.process, ev.time)] = k + 1
        src = senders.get(ev.message) if ev.kind == "recv" else None
        right = src is not None and y.get(src, -1) > y[ev.process]
        dx = (4 + 11 * k) if right else (-4 - 11 * k)
        w = _label_width(ev.label)
        at = ev.time * per_unit + dx  # in points
        span = (at, at + w) if right else (at - w, at)
        row = next((r for r in range(LABEL_ROWS)
                    if all(span[1] + 1 < a or span[0] - 1 > b
                           for a, b in taken.get((ev.process, r), []))), None)
        if row is None:
            hidden += 1
            continue
        taken.setdefault((ev.process, row), []).append(span)
        ax.annotate(ev.label, (ev.time, y[ev.process]), xytext=(dx, 7 + 16 * row),
                    textcoords="offset points", ha="left" if right else "right", va="bottom",
                    fontsize=LABEL_SIZE, fontweight="bold", zorder=7,
                    bbox=dict(boxstyle="round,pad=0.1", fc="white", ec="none", alpha=0.8))

    # Cuts: a polyline through the local snapshot points, run past the outer lines.
    handles = []
    for i, (n_id, pts) in enumerate(plan.cuts):
        colour, mark = CUT_COLOURS[i % len(CUT_COLOURS)], CUT_MARKERS[i % len(CUT_MARKERS)]
        if pts:
            xs = [t for _, t in pts]
            ys = [y[p] for p, _ in pts]
            # Behind the arrows: a marker often runs right along the cut it causes.
            ax.plot([xs[0], *xs, xs[-1]], [ys[0] + 0.3, *ys, ys[-1] - 0.3], color=colour,
                    lw=5.0, alpha=0.35, zorder=1.5, solid_capstyle="round",
                    solid_joinstyle="round")
            ax.scatter(xs, ys, marker=mark, s=90, color=colour, edgecolor="white",
                       linewidth=1.0, zorder=8)
        handles.append(Line2D([], [], color=to_rgba(colour, 0.35), lw=5.0, marker=mark,
                              markersize=8, markerfacecolor=colour, markeredgecolor="white",
                              label=f"snapshot {n_id}"))

    legend = []
    if plan.messages:
        legend.append(Line2D([], [], color=MESSAGE_COLOUR, lw=1.4, label="message"))
    if plan.markers:
        legend.append(Line2D([], [], color=MARKER_COLOUR, lw=1.2, linestyle=(0, (5, 3)),
                             label="marker"))
    legend += handles
    if any(a.recorded for a in plan.messages):
        legend.append(Line2D([], [], color=RECORDED_COLOUR, lw=2.6,
                             label="in transit (recorded)"))
    if legend:
        fig.legend(handles=legend, loc="outside lower center", ncols=len(legend),
                   frameon=False, fontsize=10)
    notes = []
    if hidden:
        notes.append(f"{hidden} overlapping event labels left out")
    if len(plan.messages) < plan.messages_total:
        notes.append(f"{len(plan.messages)} of {plan.messages_total} messages drawn")
    if len(plan.markers) < plan.markers_total:
        notes.append(f"{len(plan.markers)} of {plan.markers_total} markers drawn")
    if notes:
        ax.text(1.0, 1.0, "; ".join(notes), transform=ax.transAxes, ha="right", va="bottom",
                fontsize=9, color="#666666")
    return fig
