"""What users look at: live progress while a job runs, and its checkpoints afterwards."""

from __future__ import annotations

import datetime as dt
import math
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # rich is imported where it is used: a task process never draws anything
    from rich.console import Console
    from rich.live import Live
    from rich.table import Table

__all__ = ["Progress", "checkpoint_table", "progress_by_default"]

# set by CI services (GitHub Actions, GitLab, Travis, CircleCI, Buildkite, Jenkins, ...)
_CI_VARIABLES = ("CI", "BUILD_NUMBER", "TEAMCITY_VERSION", "TF_BUILD")


def progress_by_default() -> bool:
    """Show a job's live progress line?  In an interactive terminal, yes; in CI, a
    notebook, or with output going to a file or a pipe, no (ask with ``progress=True``)."""
    import os

    if any(os.environ.get(v) for v in _CI_VARIABLES):
        return False
    from rich.console import Console

    console = Console()
    return console.is_terminal and not console.is_jupyter and not console.is_dumb_terminal


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"  # pragma: no cover


def format_event_time(ts: float) -> str:
    """A watermark for people: UTC time for epoch seconds, else the number."""
    if ts == -math.inf:
        return "none yet"
    if ts == math.inf:
        return "end of input"
    if ts >= 1e9:
        return dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime(
            "%Y-%m-%d %H:%M:%S.%f")[:-3]
    return f"{ts:g}"


def checkpoint_table(result: Any, title: str | None = None) -> Table:
    from rich.table import Table

    t = Table(title=title or f"checkpoints of job {result.job}")
    for col in ("id", "attempt", "duration", "alignment", "size", "in-flight records", ""):
        t.add_column(col, justify="right" if col else "left")
    for c in result.checkpoints:
        t.add_row(str(c.id), str(c.attempt), f"{c.duration * 1000:.0f} ms",
                  f"{c.alignment * 1000:.0f} ms", _size(c.bytes), str(c.in_flight),
                  "final" if c.final else "")
    return t


class Progress:
    """A live line: records/s read by the sources, checkpoints, attempts."""

    def __init__(self, console: Console | None = None) -> None:
        from rich.console import Console

        self.console = console or Console()
        self.live: Live | None = None
        self.t0 = time.monotonic()
        self.last = (self.t0, 0)
        self.rate = 0.0

    def __enter__(self) -> "Progress":
        from rich.live import Live

        self.live = Live(console=self.console, refresh_per_second=4, transient=False)
        self.live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.live is not None:
            self.live.__exit__(*exc)
            if not self.console.is_terminal:
                self.console.print()

    def update(self, driver: Any) -> None:
        """``driver``: a dataflow job's (its ``run``, a ``DataflowRun``, is what is shown)."""
        run = driver.run
        now = time.monotonic()
        total = run.source_records_before + run.source_records()
        t_last, n_last = self.last
        if now - t_last >= 0.5:
            self.rate = max(0.0, (total - n_last) / (now - t_last))
            self.last = (now, total)
        ckpts = run.checkpoints
        latest = f"#{ckpts[-1].id} ({ckpts[-1].duration * 1000:.0f} ms)" if ckpts else "-"
        text = (f"[bold]{run.job}[/] {now - self.t0:5.1f}s  "
                f"read {total:>10,} records  [cyan]{self.rate:>9,.0f} records/s[/]  "
                f"checkpoints {run.controller.checkpoints_completed} latest {latest}  "
                f"attempt {run.attempt.number}")
        wm = run.watermark()
        if wm is not None:
            text += f"  watermark {format_event_time(wm)}"
        late = sum(run.late_records().values())
        if late:
            text += f"  [yellow]late dropped {late:,}[/]"
        lag = run.source_lag()
        if lag:
            text += f"  lag {sum(lag.values()):,}"
        stalled = run.stalled_sources()
        if stalled:
            task, why = sorted(stalled.items())[0]
            more = f" (+{len(stalled) - 1} more)" if len(stalled) > 1 else ""
            text += f"  [bold red]stalled: {task}: {why}{more}[/]"
        if self.live is not None:
            self.live.update(text)
