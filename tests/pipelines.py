"""Pipelines shared by the runtime tests (a module, so Spark ships it by value)."""

from __future__ import annotations

import collections

from cutline import CheckpointConfig, Pipeline
from cutline.connectors import CollectSink, GeneratorSource

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


def sentence(i: int) -> str:
    return " ".join(WORDS[(i * 5 + k * 7) % len(WORDS)] for k in range(1 + i % 4))


def wordcount(tmp, records: int, mode: str = "aligned", *, rate=None, parallelism: int = 2,
              interval: float = 0.5, aligned_timeout=None):
    cfg = CheckpointConfig(
        interval=interval, storage=f"file://{tmp}/checkpoints",
        mode="at_least_once" if mode == "at_least_once" else "exactly_once",
        unaligned=mode == "unaligned", aligned_timeout=aligned_timeout)
    p = Pipeline("wordcount", parallelism=parallelism, checkpoint=cfg)
    sink = CollectSink(str(tmp / "out"))
    (p.source(GeneratorSource(count=records, fn=sentence, rate=rate), uid="sentences")
       .flat_map(str.split, uid="split")
       .key_by(lambda w: w)
       .count(uid="count")
       .sink(sink, uid="out"))
    return p, sink


def expected_rows(records: int) -> collections.Counter:
    """The exact output multiset of a failure-free run: (word, 1..n) for every word."""
    totals = collections.Counter(w for i in range(records) for w in sentence(i).split())
    return collections.Counter((w, k) for w, n in totals.items() for k in range(1, n + 1))
