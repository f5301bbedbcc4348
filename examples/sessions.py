"""Sessionization: user sessions from an out-of-order click stream, exactly once, on Spark.

    python examples/sessions.py [--events N] [--gap S] [--mode MODE] [--kill]

Clicks arrive up to 4 s out of order.  ``assign_timestamps`` reads each click's time and
makes watermarks 5 s behind the latest; per user, clicks less than ``--gap`` seconds apart
form one session (session windows merge as clicks arrive), and each session's clicks,
distinct pages and length are written when the watermark passes its end.  With --kill, a
Spark Python worker is killed with ``kill -9`` after the first checkpoint; the job restores
it and carries on.  The committed sessions are compared with sessions computed offline from
the same clicks.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile

from rich.console import Console
from rich.table import Table

from cutline import CheckpointConfig, Pipeline, session
from cutline.connectors import CollectSink, GeneratorSource
from cutline.report import checkpoint_table

USERS = 40
PAGES = ("home", "search", "item", "cart", "checkout", "help")
MAX_DELAY = 5.0  # seconds; clicks are at most 4 s out of order


def click(i: int) -> dict:
    """Click ``i``: one every 0.05 s of event time, up to 4 s early.  Users come in waves of
    eight, each wave active for 30 s; within a wave a user pauses for 16 s now and then (a
    pause longer than the gap ends a session)."""
    h = (i * 2654435761) % 2**32
    t = i * 0.05
    idx = (h >> 8) % 8
    while (int(t // 16) + idx) % 3 == 0:  # this user pauses: the next one clicks
        idx = (idx + 1) % 8
    user = f"u{(int(t // 30) * 8 + idx) % USERS:02d}"
    return {"user": user, "ts": round(t - (h % 80) * 0.05, 2),
            "page": PAGES[(h >> 4) % len(PAGES)]}


def click_time(c: dict) -> float:
    return c["ts"]


def user_of(c: dict) -> str:
    return c["user"]


def new_session() -> dict:
    return {"clicks": 0, "pages": set(), "first": float("inf"), "last": float("-inf")}


def add_click(s: dict, c: dict) -> dict:
    s["clicks"] += 1
    s["pages"].add(c["page"])
    s["first"], s["last"] = min(s["first"], c["ts"]), max(s["last"], c["ts"])
    return s


def merge_sessions(a: dict, b: dict) -> dict:
    return {"clicks": a["clicks"] + b["clicks"], "pages": a["pages"] | b["pages"],
            "first": min(a["first"], b["first"]), "last": max(a["last"], b["last"])}


def summary(s: dict) -> tuple:
    return (s["clicks"], len(s["pages"]), round(s["last"] - s["first"], 2))


def build(events: int, gap: float, storage: str, out_dir: str, mode: str = "aligned",
          parallelism: int = 2, rate: float | None = None) -> tuple[Pipeline, CollectSink]:
    cfg = CheckpointConfig(interval=1.0, storage=storage, unaligned=mode == "unaligned")
    p = Pipeline("sessions", parallelism=parallelism, checkpoint=cfg)
    sink = CollectSink(out_dir)
    (p.source(GeneratorSource(count=events, fn=click, rate=rate), uid="clicks")
       .assign_timestamps(click_time, max_delay=MAX_DELAY, uid="click-time")
       .key_by(user_of)
       .window(session(gap))
       .aggregate(new_session, add_click, merge_sessions, summary, uid="sessions")
       .map(lambda r: (r.key, r.start, r.end, *r.value), uid="rows")
       .sink(sink, uid="out"))
    return p, sink


def expected(events: int, gap: float) -> collections.Counter:
    """Sessions computed offline: per user, sorted clicks split where two are ``gap`` or
    more apart; a session spans [first click, last click + gap)."""
    by_user: dict[str, list[dict]] = collections.defaultdict(list)
    for i in range(events):
        c = click(i)
        by_user[c["user"]].append(c)
    out: collections.Counter = collections.Counter()
    for user, clicks in by_user.items():
        clicks.sort(key=click_time)
        run = [clicks[0]]
        for c in clicks[1:] + [None]:
            if c is not None and c["ts"] - run[-1]["ts"] < gap:
                run.append(c)
                continue
            s = new_session()
            for r in run:
                add_click(s, r)
            out[(user, run[0]["ts"], run[-1]["ts"] + gap, *summary(s))] += 1
            if c is not None:
                run = [c]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=40_000)
    ap.add_argument("--gap", type=float, default=10.0, help="session gap, seconds")
    ap.add_argument("--rate", type=float, default=8_000, help="clicks/s (0: unlimited)")
    ap.add_argument("--mode", default="aligned", choices=["aligned", "unaligned"])
    ap.add_argument("--kill", action="store_true",
                    help="kill -9 a Spark Python worker after the first checkpoint")
    args = ap.parse_args()
    console = Console() if sys.stdout.isatty() else Console(width=100)
    tmp = tempfile.mkdtemp(prefix="cutline-sessions-")
    p, sink = build(args.events, args.gap, f"file://{tmp}/checkpoints", f"{tmp}/out",
                    args.mode, rate=args.rate or None)
    kill = None
    if args.kill:
        from cutline.spark.faults import Kill

        kill = Kill(after_checkpoint=1, delay=0.3)
    console.print(f"[bold]cutline sessions[/]: {args.events:,} clicks up to 4 s out of order, "
                  f"session gap {args.gap:g} s, mode {args.mode}")
    result = p.run(on_start=kill, progress=console)
    if kill is not None and kill.killed:
        console.print(f"killed Spark Python worker pid {kill.killed[0][1]} with SIGKILL; the "
                      f"job ran {result.attempts} attempts")
    console.print(checkpoint_table(result))
    rows = collections.Counter(sink.results())
    t = Table(title="the first sessions (user, start, end, clicks, pages, length s)")
    for col in ("user", "start", "end", "clicks", "pages", "length"):
        t.add_column(col, justify="left" if col == "user" else "right")
    for row in sorted(rows, key=lambda r: (r[1], r[0]))[:6]:
        t.add_row(row[0], f"{row[1]:g}", f"{row[2]:g}", *(f"{v:g}" for v in row[3:]))
    console.print(t)
    same = rows == expected(args.events, args.gap)
    console.print(f"{sum(rows.values()):,} sessions committed; identical to the sessions "
                  f"computed offline: {'[green]yes[/]' if same else '[red]NO[/]'}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
