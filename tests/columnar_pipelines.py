"""Batch-stream pipelines shared by the columnar tests (a module: Spark ships it by value)."""

from __future__ import annotations

import collections

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cutline import CheckpointConfig, Pipeline, session, tumbling
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
    """Four branches of one batch source: stateless (``where`` + ``with_column`` +
    ``select`` to Parquet, compared row for row), keyed (``count`` / ``sum`` / ``max`` /
    ``mean`` per user, compared on each user's last row), windowed (rows per user and
    tumbling window of event time ``i``: one row each, exact) and each user's latest row
    by (value, i) (``latest``, compared on each user's last row)."""
    cfg = CheckpointConfig(interval=interval, storage=f"file://{tmp}/checkpoints",
                           unaligned=mode == "unaligned", state_backend=backend)
    p = Pipeline("columnar", parallelism=parallelism, checkpoint=cfg)
    rows, aggs = ParquetSink(str(tmp / "rows")), ParquetSink(str(tmp / "aggs"))
    wins, latest = ParquetSink(str(tmp / "windows")), ParquetSink(str(tmp / "latest"))
    # event time right after the source (chained to it): a watermark per generator split,
    # so after a rescale that gives one reader two splits, the one behind is not late
    src = p.source(GeneratorSource(count=records, batch_fn=events, rate=rate,
                                   batch_rows=batch_rows), uid="events") \
        .assign_timestamps("i", uid="time")
    (src.where(pc.field("kind") == "click", uid="clicks")
        .with_column("score", pc.field("value") * 2 + 1, uid="score")
        .select("i", "user", "score", uid="project")
        .sink(rows, uid="rows"))
    (src.key_by("user")
        .agg(n="count", total=("value", "sum"), top=("value", "max"), avg=("value", "mean"),
             uid="agg")
        .sink(aggs, uid="aggs"))
    (src.key_by("user").window(tumbling(WINDOW)).count(uid="windows")
        .sink(wins, uid="wins"))
    (src.key_by("user").latest(by=["value", "i"], uid="latest")
        .sink(latest, uid="latest-rows"))
    return p, rows, aggs, wins, latest


def expected(records: int) -> tuple[collections.Counter, dict, collections.Counter, dict]:
    """The failure-free output: the stateless rows, each user's final aggregates, the
    window rows (user, start, end, count) and each user's latest (value, i)."""
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
    latest: dict = {}
    for i in range(records):
        user, best = f"u{i * 7 % USERS}", (i % 100, i)
        latest[user] = max(latest.get(user, best), best)
    return rows, final, collections.Counter(
        (u, float(s), float(s + WINDOW), n) for (u, s), n in windows.items()), latest


def observed(rows_sink: ParquetSink, aggs_sink: ParquetSink, wins_sink: ParquetSink,
             latest_sink: ParquetSink) -> tuple[collections.Counter, dict, collections.Counter,
                                                dict]:
    rows = collections.Counter((r["i"], r["user"], r["score"])
                               for r in rows_sink.read_records())
    final: dict = {}
    for r in aggs_sink.read_records():  # the update stream: a user's last row has its total
        cur = final.get(r["user"])
        if cur is None or r["n"] > cur[0]:
            final[r["user"]] = (r["n"], r["total"], r["top"], r["avg"])
    windows = collections.Counter((r["user"], r["start"], r["end"], r["count"])
                                  for r in wins_sink.read_records())
    latest: dict = {}  # the update stream: a user's rows grow in (value, i), so a row
    seen = set()  # committed twice is a duplicate (a replay's)
    for r in latest_sink.read_records():
        row = (r["user"], r["value"], r["i"])
        assert row not in seen, f"latest: {row} committed twice"
        seen.add(row)
        latest[r["user"]] = max(latest.get(r["user"], (-1, -1)), row[1:])
    return rows, final, windows, latest


# --------------------------------------------------------------------------- sessions

GAP, LATENESS = 40, 3000


def visits(indices: np.ndarray) -> pa.RecordBatch:
    """Row ``i``: user ``u<i % 5>``, value ``i % 100``, event time ``t``: in order, in
    bursts of 500 rows 100 s apart (a session per user and burst); from row 1,000 every
    31st row is 1,500 s behind (its session fired, within the lateness: it is emitted
    again, updated) and from row 2,000 every 97th 10,000 s behind (late: ``.late()``).
    Which rows are late does not depend on where the source cuts its batches (<= 500
    rows, one split): the single-split job gives the same rows in every run."""
    i = indices
    t = i + 100 * (i // 500)
    t = np.where((i >= 2000) & (i % 97 == 0), t - 10_000,
                 np.where((i >= 1000) & (i % 31 == 0), t - 1500, t))
    return pa.record_batch({"i": pa.array(i, pa.int64()),
                            "user": pa.array([f"u{u}" for u in i % 5]),
                            "t": pa.array(t, pa.float64()),
                            "value": pa.array(i % 100, pa.int64())})


def late_sessions(p: Pipeline, tmp, records: int, *, rate=None, batch_rows: int = 500
                  ) -> tuple[ParquetSink, ParquetSink]:
    """A branch of ``p``: :func:`visits` from its own single-split source, session windows
    per user (``allowed_lateness``), their rows and their ``.late()`` rows to Parquet."""
    sessions, late = ParquetSink(str(tmp / "sessions")), ParquetSink(str(tmp / "late"))
    out = (p.source(GeneratorSource(count=records, batch_fn=visits, rate=rate,
                                    batch_rows=batch_rows), uid="visits", parallelism=1)
           .assign_timestamps("t", uid="visit-time", parallelism=1)
           .key_by("user").window(session(GAP), allowed_lateness=LATENESS)
           .agg(n="count", total=("value", "sum"), uid="sessions"))
    out.sink(sessions, uid="sessions-out")
    out.late(uid="late").sink(late, uid="late-out")
    return sessions, late


def _row(r: dict) -> tuple:
    return tuple(sorted(r.items()))


def session_events(records: int) -> tuple[collections.Counter, collections.Counter]:
    """The failure-free rows of :func:`late_sessions` (sessions, late rows), from the
    per-record window operator (``count()`` and ``sum("value")``) on the same rows, a
    watermark after every 500."""
    from cutline.logical import ColumnKey, make_node
    from cutline.protocol.windows import WindowSpec, counting, summarizing
    from cutline.runtime.registry import build_operator
    from cutline.runtime.windows import LateRecord

    ops = [build_operator(make_node(0, "s", "window", WindowSpec(
        session(GAP), LATENESS, lambda r: r["t"], agg, emit_late=True),
        key_fn=ColumnKey(("user",))), 0, 1, 128)
        for agg in (counting(), summarizing("sum", "value"))]
    out: list[list] = [[], []]
    wm = -np.inf
    for lo in range(0, records, 500):
        rows = visits(np.arange(lo, min(records, lo + 500))).to_pylist()
        wm = max(wm, max(r["t"] for r in rows))
        for op, o in zip(ops, out):
            o += op.process(rows) + op.on_watermark(wm)
    for op, o in zip(ops, out):
        o += op.on_watermark(np.inf)
    late = collections.Counter(_row(x.record) for x in out[0] if type(x) is LateRecord)
    counts, sums = ([x for x in o if type(x) is not LateRecord] for o in out)
    return collections.Counter(
        _row({"user": c.key, "start": float(c.start), "end": float(c.end), "n": c.value,
              "total": s.value}) for c, s in zip(counts, sums)), late


def observed_sessions(sessions: ParquetSink, late: ParquetSink
                      ) -> tuple[collections.Counter, collections.Counter]:
    return (collections.Counter(map(_row, sessions.read_records())),
            collections.Counter(map(_row, late.read_records())))
