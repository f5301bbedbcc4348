"""Windowed top-N: the most viewed items of every sliding minute, exactly once, on Spark.

    python examples/top_items.py [--events N] [--top K] [--mode MODE] [--kill]

Item views arrive up to 3 s out of order.  Views are counted per item in sliding windows of
60 s every 10 s; the counts of each window are then ranked, and the top K items of every
window are written when the watermark passes the window's end (a second, keyed window
over the first one's results, keyed by window: Nexmark's "hot items", query 5).  With
--kill, a Spark Python worker is killed with ``kill -9`` after the first checkpoint; the
committed ranking is compared with one computed offline from the same views.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile

from rich.console import Console
from rich.table import Table

from cutline import CheckpointConfig, Pipeline, sliding, tumbling
from cutline.connectors import CollectSink, GeneratorSource
from cutline.report import checkpoint_table

ITEMS = 200
SIZE, SLIDE = 60.0, 10.0
MAX_DELAY = 3.0


def view(i: int) -> dict:
    """View ``i``: one every 0.01 s of event time, up to 2.5 s early; a few items are hot,
    and which ones changes every 40 s."""
    h = (i * 2654435761) % 2**32
    t = i * 0.01
    hot = (h >> 8) % 10 < 4  # 40 % of views go to this period's 5 hot items
    phase = int(t // 40)
    item = (phase * 5 + (h >> 12) % 5) % ITEMS if hot else (h >> 12) % ITEMS
    return {"item": f"item-{item:03d}", "ts": round(t - (h % 250) * 0.01, 2)}


def view_time(v: dict) -> float:
    return v["ts"]


def item_of(v: dict) -> str:
    return v["item"]


def window_of(r) -> tuple:  # noqa: ANN001 - a WindowResult
    return (r.start, r.end)


def top_k(k: int):  # noqa: ANN201
    def rank(window: tuple, _tumbling, results: list) -> list:
        best = sorted(results, key=lambda r: (-r.value, r.key))[:k]
        return [(window[0], window[1], n + 1, r.key, r.value) for n, r in enumerate(best)]
    return rank


def build(events: int, k: int, storage: str, out_dir: str, mode: str = "aligned",
          parallelism: int = 2, rate: float | None = None) -> tuple[Pipeline, CollectSink]:
    cfg = CheckpointConfig(interval=1.0, storage=storage, unaligned=mode == "unaligned")
    p = Pipeline("top-items", parallelism=parallelism, checkpoint=cfg)
    sink = CollectSink(out_dir)
    (p.source(GeneratorSource(count=events, fn=view, rate=rate), uid="views")
       .assign_timestamps(view_time, max_delay=MAX_DELAY, uid="view-time")
       .key_by(item_of)
       .window(sliding(SIZE, SLIDE))
       .count(uid="views-per-item")
       .key_by(window_of)                      # every item's count of one window together
       .window(tumbling(SLIDE))                # fires as soon as that window's counts are in
       .apply(top_k(k), uid="top")
       .sink(sink, uid="out"))
    return p, sink


def expected(events: int, k: int) -> collections.Counter:
    """The ranking computed offline: counts per (window, item), top ``k`` per window."""
    counts: collections.Counter = collections.Counter()
    for i in range(events):
        v = view(i)
        last = v["ts"] - v["ts"] % SLIDE
        start = last - SIZE + SLIDE
        while start <= last:
            counts[(start, start + SIZE, v["item"])] += 1
            start += SLIDE
    per_window: dict[tuple, list] = collections.defaultdict(list)
    for (s, e, item), n in counts.items():
        per_window[(s, e)].append((item, n))
    out: collections.Counter = collections.Counter()
    for (s, e), rows in per_window.items():
        for rank, (item, n) in enumerate(sorted(rows, key=lambda r: (-r[1], r[0]))[:k]):
            out[(s, e, rank + 1, item, n)] += 1
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=60_000)
    ap.add_argument("--top", type=int, default=3)
    ap.add_argument("--rate", type=float, default=15_000, help="views/s (0: unlimited)")
    ap.add_argument("--mode", default="aligned", choices=["aligned", "unaligned"])
    ap.add_argument("--kill", action="store_true",
                    help="kill -9 a Spark Python worker after the first checkpoint")
    args = ap.parse_args()
    console = Console() if sys.stdout.isatty() else Console(width=100)
    tmp = tempfile.mkdtemp(prefix="cutline-top-items-")
    p, sink = build(args.events, args.top, f"file://{tmp}/checkpoints", f"{tmp}/out",
                    args.mode, rate=args.rate or None)
    kill = None
    if args.kill:
        from cutline.spark.faults import Kill

        kill = Kill(after_checkpoint=1, delay=0.3)
    console.print(f"[bold]cutline top items[/]: {args.events:,} views up to 2.5 s out of "
                  f"order, top {args.top} per {SIZE:g} s window every {SLIDE:g} s, "
                  f"mode {args.mode}")
    result = p.run(on_start=kill, progress=console)
    if kill is not None and kill.killed:
        console.print(f"killed Spark Python worker pid {kill.killed[0][1]} with SIGKILL; the "
                      f"job ran {result.attempts} attempts")
    console.print(checkpoint_table(result))
    rows = collections.Counter(sink.results())
    t = Table(title=f"top {args.top} items of the first windows")
    for col in ("window", "rank", "item", "views"):
        t.add_column(col, justify="left" if col in ("window", "item") else "right")
    for s, e, rank, item, n in sorted(rows)[:3 * args.top]:
        t.add_row(f"[{s:g}, {e:g})", str(rank), item, f"{n:,}")
    console.print(t)
    same = rows == expected(args.events, args.top)
    console.print(f"{len({r[:2] for r in rows}):,} windows ranked; identical to the ranking "
                  f"computed offline: {'[green]yes[/]' if same else '[red]NO[/]'}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
