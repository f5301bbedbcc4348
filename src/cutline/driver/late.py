"""Late records on the user's console, and their counts per window operator.

A window operator that drops late records (no ``.late()``, ``on_late="drop"``) counts them
per subtask, in its checkpointed state (:mod:`cutline.runtime.late`), and reports the count
in each ``Metrics``, with the time and watermark of the first record it dropped.  Here, on
the driver:

* :func:`late_totals` / :func:`late_by_subtask`: the counts of the current attempt's tasks
  (``JobResult.late_records``, the live line, the dashboard, ``/metrics``);
* :class:`LateWarnings`: one console line at an operator's first drop (the operator, the
  record's time, the watermark, how to keep such records), then at most one line every
  :data:`REPORT_EVERY` seconds with the count since, and at the end of the run the count
  not yet reported.  Pure: it returns the lines, the driver logs them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..protocol import messages as m
from ..report import format_event_time

__all__ = ["REPORT_EVERY", "LateWarnings", "late_by_subtask", "late_totals", "lateness_of"]

REPORT_EVERY = 30.0  # seconds: at most one line per operator this often after the first


def late_totals(metrics: Iterable[m.Metrics]) -> dict[str, int]:
    """Late records dropped per window operator (uid), over its subtasks' latest counts;
    every operator that drops late records is listed, 0 included."""
    totals: dict[str, int] = {}
    for x in metrics:
        for uid, n in (x.late or {}).items():
            totals[uid] = totals.get(uid, 0) + n
    return dict(sorted(totals.items()))


def late_by_subtask(x: m.Metrics | None) -> dict[str, int]:
    """One task's counts: window operator uid -> late records it dropped."""
    return dict(x.late) if x is not None and x.late else {}


class LateWarnings:
    """What the console says about late records.  ``lateness``: each window operator's
    ``allowed_lateness`` (seconds, by uid), named in the first warning."""

    def __init__(self, lateness: Mapping[str, float] | None = None,
                 every: float = REPORT_EVERY) -> None:
        self.lateness = dict(lateness or {})
        self.every = every
        self.reported: dict[str, int] = {}  # operator -> its total at its last line
        self.last_line: dict[str, float] = {}  # operator -> when

    def on_metrics(self, msg: m.Metrics, totals: Mapping[str, int], now: float) -> list[str]:
        """A task's ``Metrics`` arrived (``totals``: every operator's, with it counted):
        the first warning of each operator it reports a first drop of."""
        lines = []
        for uid, first in (msg.first_late or {}).items():
            if uid in self.reported or len(first) != 2:
                continue
            ts, wm = first
            total = totals.get(uid, 0)
            self.reported[uid], self.last_line[uid] = total, now
            lateness = self.lateness.get(uid)
            so_far = f"; {total:,} so far" if total > 1 else ""
            fired = ("its windows had all fired" if not lateness else
                     f"its windows had all fired more than allowed_lateness {lateness:g} s ago")
            lines.append(
                f"cutline: window {uid!r} dropped a late record (subtask "
                f"{msg.task.rsplit('.', 1)[-1]}: time {format_event_time(ts)}, watermark "
                f"{format_event_time(wm)}: {fired}{so_far}). To keep such records, raise "
                "window(..., allowed_lateness=...) or read them with .late(); "
                "window(..., on_late=\"fail\") fails the job instead. Drops are counted in "
                "JobResult.late_records, the live line, the dashboard and /metrics, and "
                f"reported here at most every {self.every:g} s")
        return lines

    def tick(self, totals: Mapping[str, int], now: float) -> list[str]:
        """Every operator warned about at least :attr:`every` seconds ago that dropped
        more since: one line with the count since."""
        lines = []
        for uid, before in self.reported.items():
            total = totals.get(uid, 0)
            since = now - self.last_line[uid]
            if total > before and since >= self.every:
                lines.append(f"cutline: window {uid!r} dropped {total - before:,} more late "
                             f"records in the last {since:.0f} s ({total:,} in all)")
                self.reported[uid], self.last_line[uid] = total, now
        return lines

    def summary(self, totals: Mapping[str, int]) -> list[str]:
        """The run ended: each operator's drops not reported yet, with its total."""
        lines = []
        for uid, before in self.reported.items():
            total = totals.get(uid, 0)
            if total > before:
                lines.append(f"cutline: window {uid!r} dropped {total:,} late records in all "
                             f"({total - before:,} since the last report)")
                self.reported[uid] = total
        return lines


def lateness_of(plan: Any) -> dict[str, float]:
    """Each window operator's ``allowed_lateness`` (seconds), by uid, from a physical
    plan."""
    return {n.uid: float(n.fn.allowed_lateness) for c in plan.chains for n in c.nodes
            if n.kind in ("window", "window_agg")}
