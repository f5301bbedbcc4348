"""Word count over a generated stream, exactly once, on embedded Spark.

    python examples/wordcount.py [--records N] [--rate R] [--mode MODE] [--kill]

Counts the words of N generated sentences with a keyed running count, checkpointing every
second.  With --kill, a Spark Python worker is killed with `kill -9` after the first
checkpoint; Spark restarts the stage, the job restores the latest checkpoint and carries
on.  The committed output is compared, row for row, with the failure-free output.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile

from rich.console import Console

from cutline import CheckpointConfig, Pipeline
from cutline.connectors import CollectSink, GeneratorSource
from cutline.report import checkpoint_table

WORDS = ("snapshot marker barrier channel cut state stream spark flink lamport chandy "
         "dijkstra align replay commit").split()


def sentence(i: int) -> str:
    return " ".join(WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(1 + i % 5))


def build(records: int, storage: str, out_dir: str, mode: str = "aligned",
          parallelism: int = 2, rate: float | None = None,
          interval: float = 1.0) -> tuple[Pipeline, CollectSink]:
    cfg = CheckpointConfig(interval=interval, storage=storage,
                           mode="at_least_once" if mode == "at_least_once" else "exactly_once",
                           unaligned=mode == "unaligned",
                           aligned_timeout=0.05 if mode == "aligned_timeout" else None)
    p = Pipeline("wordcount", parallelism=parallelism, checkpoint=cfg)
    sink = CollectSink(out_dir)
    (p.source(GeneratorSource(count=records, fn=sentence, rate=rate), uid="sentences")
       .flat_map(str.split, uid="split")
       .key_by(lambda w: w)
       .count(uid="count")
       .sink(sink, uid="out"))
    return p, sink


def expected(records: int) -> dict[str, int]:
    return dict(collections.Counter(w for i in range(records) for w in sentence(i).split()))


def expected_rows(records: int) -> collections.Counter:
    """What a failure-free run commits: (word, 1), (word, 2), ... for every word."""
    return collections.Counter((w, k) for w, n in expected(records).items()
                               for k in range(1, n + 1))


def final_counts(rows) -> dict[str, int]:
    counts: dict[str, int] = {}
    for word, n in rows:
        counts[word] = max(n, counts.get(word, 0))
    return counts


def chaos_job(workdir: str, mode: str = "aligned", records: int | None = None):
    """For ``cutline chaos examples/wordcount.py``: the pipeline (rate-limited, checkpoints
    every 0.5 s), a function reading its committed output, and what a failure-free run
    commits."""
    records = records or 200_000
    p, sink = build(records, f"file://{workdir}/checkpoints", f"{workdir}/out", mode,
                    rate=8_000, interval=0.5)
    return p, sink.results, expected_rows(records)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=80_000)
    ap.add_argument("--rate", type=float, default=10_000, help="records/s (0: unlimited)")
    ap.add_argument("--mode", default="aligned",
                    choices=["aligned", "unaligned", "aligned_timeout", "at_least_once"])
    ap.add_argument("--kill", action="store_true",
                    help="kill -9 a Spark Python worker after the first checkpoint")
    args = ap.parse_args()
    console = Console() if sys.stdout.isatty() else Console(width=100)
    with tempfile.TemporaryDirectory(prefix="cutline-wordcount-") as tmp:
        return run(args, tmp, console)


def run(args: argparse.Namespace, tmp: str, console: Console) -> int:
    p, sink = build(args.records, f"file://{tmp}/checkpoints", f"{tmp}/out", args.mode,
                    rate=args.rate or None)
    kill = None
    if args.kill:
        from cutline.spark.faults import Kill

        kill = Kill(after_checkpoint=1, delay=0.5)
    console.print(f"[bold]cutline wordcount[/]: {args.records:,} sentences, mode {args.mode}, "
                  f"checkpoints every 1 s to {tmp}/checkpoints")
    result = p.run(on_start=kill, progress=console)
    if kill is not None and kill.killed:
        slot, pid, _ = kill.killed[0]
        console.print(f"killed Spark Python worker pid {pid} (slot {slot}) with SIGKILL; "
                      f"the job ran {result.attempts} attempts")
    console.print(checkpoint_table(result))
    rows = collections.Counter(sink.results())
    same = rows == expected_rows(args.records)
    words = sum(final_counts(rows.elements()).values())
    console.print(f"{words:,} words counted; committed output identical to the failure-free "
                  f"output: {'[green]yes[/]' if same else '[red]NO[/]'}")
    return 0 if same or args.mode == "at_least_once" else 1


if __name__ == "__main__":
    raise SystemExit(main())
