"""Batch-stream pipelines shared by the columnar tests (a module: Spark ships it by value)."""

from __future__ import annotations

import collections

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cutline import CheckpointConfig, Pipeline, tumbling
from cutline.connectors import GeneratorSource, ParquetSink

USERS = 13
WINDOW = 500  # rows: event time is the row number ``i`` (seconds), in order per subtask


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
    """Three branches of one batch source: stateless (``where`` + ``with_column`` +
    ``select`` to Parquet, compared row for row), keyed (``count`` / ``sum`` / ``max`` /
    ``mean`` per user, compared on each user's last row) and windowed (rows per user and
    tumbling window of event time ``i``: one row each, exact)."""
    cfg = CheckpointConfig(interval=interval, storage=f"file://{tmp}/checkpoints",
                           unaligned=mode == "unaligned", state_backend=backend)
    p = Pipeline("columnar", parallelism=parallelism, checkpoint=cfg)
    rows, aggs = ParquetSink(str(tmp / "rows")), ParquetSink(str(tmp / "aggs"))
    wins = ParquetSink(str(tmp / "windows"))
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
    (src.assign_timestamps("i", uid="time")
        .key_by("user").window(tumbling(WINDOW)).count(uid="windows")
        .sink(wins, uid="wins"))
    return p, rows, aggs, wins


def expected(records: int) -> tuple[collections.Counter, dict, collections.Counter]:
    """The failure-free output: the stateless rows, each user's final aggregates, and the
    window rows (user, start, end, count)."""
    rows: collections.Counter = collections.Counter()
    per: dict[str, list[int]] = collections.defaultdict(list)
    windows: collections.Counter = collections.Counter()
    for i in range(records):
        user, value = f"u{i * 7 % USERS}", i % 100
        per[user].append(value)
        windows[(user, i - i % WINDOW)] += 1
        if i % 3:
            rows[(i, user, value * 2 + 1)] += 1
    final = {u: (len(v), sum(v), max(v), sum(v) / len(v)) for u, v in per.items()}
    return rows, final, collections.Counter(
        (u, float(s), float(s + WINDOW), n) for (u, s), n in windows.items())


def observed(rows_sink: ParquetSink, aggs_sink: ParquetSink, wins_sink: ParquetSink
             ) -> tuple[collections.Counter, dict, collections.Counter]:
    rows = collections.Counter((r["i"], r["user"], r["score"])
                               for r in rows_sink.read_records())
    final: dict = {}
    for r in aggs_sink.read_records():  # the update stream: a user's last row has its total
        cur = final.get(r["user"])
        if cur is None or r["n"] > cur[0]:
            final[r["user"]] = (r["n"], r["total"], r["top"], r["avg"])
    windows = collections.Counter((r["user"], r["start"], r["end"], r["count"])
                                  for r in wins_sink.read_records())
    return rows, final, windows
