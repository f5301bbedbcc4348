"""Jobs of the cluster-scale fault tests (a module of its own, so Spark ships it by value)."""

from __future__ import annotations

import collections
import time

from cutline import CheckpointConfig, Pipeline
from cutline.connectors import CollectSink, FileSource

SLOW = 0.002  # seconds of work per record: a little backpressure, and a kill lands mid-run


def count_slowly(ctx, e):
    time.sleep(SLOW)
    n = ctx.value_state("n", 0)
    n.update(n.value + 1)
    return ((e["user"], n.value),)


def per_user(tmp, mode: str = "aligned", parallelism: int = 3, name: str = "per-user"):
    """Files -> keyed exchange by user -> a slow keyed count -> an exactly-once sink."""
    cfg = CheckpointConfig(interval=0.3, storage=f"file://{tmp}/checkpoints",
                           mode="at_least_once" if mode == "at_least_once" else "exactly_once")
    p = Pipeline(name, parallelism=parallelism, checkpoint=cfg)
    sink = CollectSink(str(tmp / "out"))
    (p.source(FileSource(str(tmp / "in"), format="jsonl"), uid="files")
       .key_by(lambda e: e["user"])
       .process(count_slowly, uid="per-key")
       .sink(sink, uid="out"))
    return p, sink


def per_user_expected(events: list[dict]) -> collections.Counter:
    n = collections.Counter(e["user"] for e in events)
    return collections.Counter((u, k) for u, c in n.items() for k in range(1, c + 1))
