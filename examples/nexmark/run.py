"""Run Nexmark queries on cutline and on Spark Structured Streaming over the same files, and
compare the results.

    python examples/nexmark/run.py [q0 q5 ...] [--events N] [--events-per-second R]

Writes the events with ``cutline nexmark generate`` (Parquet, a far-future sentinel bid
last: Spark's windows close only when its watermark passes them), runs every query on
cutline (embedded Spark, parallelism 2, or ``--engine threads``) and as a Spark streaming
query (``trigger(availableNow=True)``, memory sink), and says for each whether the two
agree (see ``queries.py`` for what is compared).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _queries() -> Any:
    """``queries.py`` next to this file, importable however this file was loaded."""
    if "nexmark_queries" not in sys.modules:
        spec = importlib.util.spec_from_file_location("nexmark_queries", HERE / "queries.py")
        mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules["nexmark_queries"] = mod
        spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return sys.modules["nexmark_queries"]


Q = _queries()


def cutline_pipeline(query: str, input_dir: str, sink: Any, storage: str, max_delay: float,
                     parallelism: int = 2, interval: float = 1.0,
                     columnar: bool = False, state_backend: str | None = None) -> Any:
    """Query ``query`` over the Parquet event files in ``input_dir`` (``columnar``: the
    batch-stream form, ``Q.COLUMNAR``) into ``sink``; keyed state in ``state_backend``
    (default: ``Q.STATE_BACKEND``'s choice for the query)."""
    from cutline import CheckpointConfig, Pipeline
    from cutline.connectors import FileSource

    p = Pipeline(f"nexmark-{query}{'-columnar' if columnar else ''}", parallelism=parallelism,
                 checkpoint=CheckpointConfig(interval=interval, storage=storage,
                                             state_backend=state_backend or
                                             Q.STATE_BACKEND.get(query, "memory")))
    files = FileSource(input_dir, format="parquet")
    if columnar:
        out = Q.build_columnar(query, p.source(files.batches(columns=Q.COLUMNS[query]),
                                               uid="events"), max_delay)
    else:
        out = Q.build(query, p.source(files, uid="events"), max_delay)
    out.sink(sink, uid="out")
    return p


def run_cutline(query: str, input_dir: str, work: str, max_delay: float, *, spark: Any = None,
                engine: str | None = None, parallelism: int = 2,
                columnar: bool = False) -> list[tuple]:
    """Query ``query`` on cutline over the Parquet files in ``input_dir``: its rows."""
    from cutline.connectors import CollectSink

    sink = CollectSink(os.path.join(work, "out"))
    p = cutline_pipeline(query, input_dir, sink, f"file://{work}/ck", max_delay, parallelism,
                         columnar=columnar)
    kw = {"engine": engine} if engine else {"spark": spark}
    if not engine:
        Q.ship_by_value()
    p.run(timeout=300, **kw)
    out: list[tuple] = []
    for r in sink.results():  # record batches (columnar), or rows
        if hasattr(r, "to_pylist"):
            out.extend(tuple(d.values()) for d in r.to_pylist())
        else:
            out.append(tuple(r))
    return out


def start_spark(spark: Any, query: str, input_dir: str, work: str, max_delay: float,
                sink: str = "memory") -> Any:
    """Start query ``query`` as a Spark streaming query (availableNow; ``sink`` "memory",
    or "noop" to measure): the running query, for :func:`spark_rows`."""
    Q.ship_by_value()
    for k, v in Q.SPARK_CONF.get(query, {}).items():
        spark.conf.set(k, v)
    df, mode = Q.spark_query(query, Q.spark_events(spark, input_dir), max_delay)
    w = df.writeStream.format(sink).outputMode(mode)
    if sink == "memory":
        w = w.queryName(f"nexmark_{query}_{abs(hash(work))}")
    return (w.option("checkpointLocation", os.path.join(work, "spark-ck"))
            .trigger(availableNow=True).start())


def await_spark(q: Any, timeout: float = 300) -> None:
    try:
        if not q.awaitTermination(timeout):
            raise TimeoutError(f"Spark query {q.name} not finished within {timeout:.0f} s")
        if q.exception() is not None:
            raise RuntimeError(f"Spark query {q.name} failed: {q.exception()}")
    finally:
        if q.isActive:
            q.stop()


def spark_rows(spark: Any, q: Any) -> list[tuple]:
    """A finished memory-sink query's rows (complete mode: the final table)."""
    await_spark(q)
    rows = [tuple(r) for r in spark.sql(f"select * from {q.name}").collect()]
    spark.catalog.dropTempView(q.name)
    return rows


def run_spark(spark: Any, query: str, input_dir: str, work: str,
              max_delay: float) -> list[tuple]:
    """Query ``query`` on Spark (availableNow, memory sink): its rows."""
    return spark_rows(spark, start_spark(spark, query, input_dir, work, max_delay))


def compare(query: str, cutline_rows: list[tuple], spark_rows: list[tuple]) -> dict:
    """What the two systems agree on: equal multisets of rows, or equal final values."""
    import collections

    if Q.expected_kind(query) == "final":
        a, b = Q.final(query, cutline_rows), Q.final(query, spark_rows)
        a = {k: v for k, v in a.items() if Q.SENTINEL_AUCTION not in k}
        b = {k: v for k, v in b.items() if Q.SENTINEL_AUCTION not in k}
        return {"kind": "final", "equal": a == b, "keys": len(a), "spark_keys": len(b),
                "only_cutline": len(a.keys() - b.keys()), "only_spark": len(b.keys() - a.keys()),
                "differ": sum(a[k] != b[k] for k in a.keys() & b.keys())}
    a = collections.Counter(Q.drop_sentinel(query, cutline_rows))
    b = collections.Counter(Q.drop_sentinel(query, spark_rows))
    return {"kind": "rows", "equal": a == b, "rows": sum(a.values()),
            "spark_rows": sum(b.values()), "only_cutline": sum((a - b).values()),
            "only_spark": sum((b - a).values())}


def generate(directory: str, events: int, events_per_second: float, out_of_order: int,
             files: int = 2) -> Any:
    from cutline.connectors.nexmark import NexmarkConfig, write_events

    cfg = NexmarkConfig(events_per_second=events_per_second, out_of_order=out_of_order)
    write_events(directory, events, format="parquet", files=files, config=cfg, sentinel=True)
    return cfg


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("queries", nargs="*", default=list(Q.QUERIES), metavar="QUERY")
    ap.add_argument("--events", type=int, default=20_000)
    ap.add_argument("--events-per-second", type=float, default=200.0,
                    help="of event time (default 200: 20,000 events span 100 s)")
    ap.add_argument("--out-of-order", type=int, default=20)
    ap.add_argument("--engine", choices=["spark", "threads"], default="spark",
                    help="cutline's engine (Spark's queries always run on Spark)")
    args = ap.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from cutline.spark.launcher import embedded_session

    spark = embedded_session(slots=3)
    spark.conf.set("spark.sql.shuffle.partitions", "2")
    tmp = tempfile.mkdtemp(prefix="cutline-nexmark-")
    cfg = generate(f"{tmp}/in", args.events, args.events_per_second, args.out_of_order)
    ok = True
    for query in args.queries:
        work = tempfile.mkdtemp(dir=tmp, prefix=f"{query}-")
        t0 = time.monotonic()
        mine = run_cutline(query, f"{tmp}/in", work, cfg.max_delay, spark=spark,
                           engine="threads" if args.engine == "threads" else None)
        t1 = time.monotonic()
        theirs = run_spark(spark, query, f"{tmp}/in", work, cfg.max_delay)
        t2 = time.monotonic()
        c = compare(query, mine, theirs)
        ok &= c["equal"]
        print(f"{query:4} cutline {t1 - t0:5.1f} s  spark {t2 - t1:5.1f} s  {c}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
