"""Word count over a generated stream, exactly once, on embedded Spark.

    python examples/wordcount.py [--records N] [--mode aligned|unaligned|at_least_once]

Counts the words of N generated sentences with a keyed running count, checkpointing every
second, and checks the committed output against a plain Python count of the same input.
"""

from __future__ import annotations

import argparse
import collections
import tempfile

from cutline import CheckpointConfig, Pipeline
from cutline.connectors import CollectSink, GeneratorSource

WORDS = ("snapshot marker barrier channel cut state stream spark flink lamport chandy "
         "dijkstra align replay commit").split()


def sentence(i: int) -> str:
    return " ".join(WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(1 + i % 5))


def build(records: int, storage: str, out_dir: str, mode: str = "aligned",
          parallelism: int = 2, rate: float | None = None) -> tuple[Pipeline, CollectSink]:
    cfg = CheckpointConfig(interval=1.0, storage=storage,
                           mode="at_least_once" if mode == "at_least_once" else "exactly_once",
                           unaligned=mode == "unaligned")
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


def final_counts(rows) -> dict[str, int]:
    counts: dict[str, int] = {}
    for word, n in rows:
        counts[word] = max(n, counts.get(word, 0))
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--mode", default="aligned", choices=["aligned", "unaligned", "at_least_once"])
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="cutline-wordcount-")
    p, sink = build(args.records, f"file://{tmp}/checkpoints", f"{tmp}/out", args.mode)
    result = p.run()
    counts = final_counts(sink.results())
    print(f"{len(result.checkpoints)} checkpoints; {sum(counts.values())} words counted; "
          f"equal to a plain Python count: {counts == expected(args.records)}")


if __name__ == "__main__":
    main()
