"""Batch-stream pipelines shared by the columnar tests (a module: Spark ships it by value)."""

from __future__ import annotations

import collections

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cutline import CheckpointConfig, Pipeline
from cutline.connectors import GeneratorSource, ParquetSink

USERS = 13


def events(indices: np.ndarray) -> pa.RecordBatch:
    """Row ``i``: user ``u<i*7 % 13>``, value ``i % 100``, kind ``view`` every third row."""
    return pa.record_batch({
        "i": pa.array(indices, pa.int64()),
        "user": pa.array([f"u{u}" for u in (indices * 7) % USERS]),
        "value": pa.array(indices % 100, pa.int64()),
        "kind": pa.array(np.where(indices % 3 == 0, "view", "click")),
    })


def columnar(tmp, records: int, mode: str = "aligned", *, rate=None, parallelism: int = 2,
             interval: float = 0.3, backend: str = "memory", batch_rows: int = 500):
    """Two branches of one batch source: stateless (``where`` + ``with_column`` + ``select``
    to Parquet, compared row for row) and keyed (``count`` / ``sum`` / ``max`` / ``mean`` per
    user, compared on each user's last row)."""
    cfg = CheckpointConfig(interval=interval, storage=f"file://{tmp}/checkpoints",
                           unaligned=mode == "unaligned", state_backend=backend)
    p = Pipeline("columnar", parallelism=parallelism, checkpoint=cfg)
    rows, aggs = ParquetSink(str(tmp / "rows")), ParquetSink(str(tmp / "aggs"))
    src = p.source(GeneratorSource(count=records, batch_fn=events, rate=rate,
                                   batch_rows=batch_rows), uid="events")
    (src.where(pc.field("kind") == "click", uid="clicks")
        .with_column("score", pc.field("value") * 2 + 1, uid="score")
        .select("i", "user", "score", uid="project")
        .sink(rows, uid="rows"))
    (src.key_by("user")
        .agg(n="count", total=("value", "sum"), top=("value", "max"), avg=("value", "mean"),
             uid="agg")
        .sink(aggs, uid="aggs"))
    return p, rows, aggs


def expected(records: int) -> tuple[collections.Counter, dict]:
    """The failure-free output: the stateless rows, and each user's final aggregates."""
    rows: collections.Counter = collections.Counter()
    per: dict[str, list[int]] = collections.defaultdict(list)
    for i in range(records):
        user, value = f"u{i * 7 % USERS}", i % 100
        per[user].append(value)
        if i % 3:
            rows[(i, user, value * 2 + 1)] += 1
    final = {u: (len(v), sum(v), max(v), sum(v) / len(v)) for u, v in per.items()}
    return rows, final


def observed(rows_sink: ParquetSink, aggs_sink: ParquetSink) -> tuple[collections.Counter, dict]:
    rows = collections.Counter((r["i"], r["user"], r["score"])
                               for r in rows_sink.read_records())
    final: dict = {}
    for r in aggs_sink.read_records():  # the update stream: a user's last row has its total
        cur = final.get(r["user"])
        if cur is None or r["n"] > cur[0]:
            final[r["user"]] = (r["n"], r["total"], r["top"], r["avg"])
    return rows, final
