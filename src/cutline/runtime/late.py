"""Late records a window operator drops: counted exactly once, reported, or failing the job.

A record later than ``allowed_lateness`` for every window it belongs to is *late*.  With
``.late()`` it goes to that stream; otherwise the window drops it (``on_late="drop"``, the
default) or fails the job (``window(..., on_late="fail")``: :func:`late_error`, a
:class:`~cutline.runtime.operators.UserFunctionError`, fatal: no retry repeats it away).

:class:`LateDrops` counts the dropped ones per key group in the operator's keyed state
(state ``__late``, hidden from state reads like the operator's watermarks), so the count is
part of every checkpoint: restored with the windows, it goes on rising after a failure
without counting a replayed record twice, and moves with its key groups on rescale.  The
task reports each operator's count, and the time and watermark of its first drop, in its
``Metrics``; the driver turns them into the console line, the live line, the dashboard
and ``/metrics`` (:mod:`cutline.driver.late`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..report import format_event_time
from ..state.keygroups import key_group
from ..state.reader import LATE_STATE
from .operators import UserFunctionError

__all__ = ["LATE_STATE", "LateDrops", "LateRecordError", "late_error"]


class LateRecordError(Exception):
    """A record late for every window it belongs to, at a window with ``on_late="fail"``."""


def late_error(uid: str, record: Any, ts: float, watermark: float,
               lateness: float) -> UserFunctionError:
    """The job's failure on ``record`` (time ``ts``) at window ``uid`` whose watermark is
    ``watermark``: names the record, both times and how to keep such records."""
    by = f" by more than allowed_lateness {lateness:g} s" if lateness else ""
    why = LateRecordError(
        f"its time {format_event_time(ts)} is behind the watermark "
        f"{format_event_time(watermark)}{by} for every window it belongs to, and "
        "window(..., on_late='fail') fails the job on a late record. To keep such records, "
        "raise allowed_lateness or read them with .late(); on_late='drop' (the default) "
        "drops and counts them")
    return UserFunctionError(uid, "window", record, why)


class LateDrops:
    """The late records one window operator subtask dropped, per key group it owns.

    ``table``: the operator's ``__late`` state table; ``group_keys``: for each owned key
    group, the key its count is stored under (a key of that group).  :attr:`total` is
    what the subtask reports (restored counts included); :attr:`first` the time and
    watermark of the first record it dropped since it started (this attempt)."""

    def __init__(self, table: Any, group_keys: Mapping[int, Any], max_parallelism: int) -> None:
        self.table, self.group_keys, self.max_parallelism = table, group_keys, max_parallelism
        self.by_group: dict[int, int] = {}
        self.changed: set[int] = set()
        self.total = 0
        self.first: tuple[float, float] | None = None

    def add(self, key: Any, ts: float, watermark: float, n: int = 1) -> None:
        """One record of ``key`` (time ``ts``) dropped at ``watermark`` (``n``: as many
        records at once, a two-phase window's partial)."""
        g = key_group(key, self.max_parallelism)
        self.by_group[g] = self.by_group.get(g, 0) + n
        self.changed.add(g)
        self.total += n
        if self.first is None:
            self.first = (float(ts), float(watermark))

    def add_groups(self, groups: Iterable[int], ts: float, watermark: float) -> None:
        """Rows dropped at once (a batch stream), one key group each; ``ts`` and
        ``watermark``: the first row's."""
        by_group = self.by_group
        for g in groups:
            g = int(g)
            by_group[g] = by_group.get(g, 0) + 1
            self.changed.add(g)
            self.total += 1
        if self.first is None:
            self.first = (float(ts), float(watermark))

    def snapshot(self) -> None:
        """Write the counts that changed since the last snapshot into the state table
        (before the state backend snapshots)."""
        put, keys = self.table.fast, self.group_keys
        for g in self.changed:
            put[keys[g]] = self.by_group[g]
        self.changed.clear()

    def restored(self, counts: Mapping[int, int]) -> None:
        """The state was restored: ``counts`` per owned key group (from its ``__late``
        entries)."""
        self.by_group = {g: int(n) for g, n in counts.items() if g in self.group_keys}
        self.changed.clear()
        self.total = sum(self.by_group.values())
