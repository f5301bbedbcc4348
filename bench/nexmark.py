"""Nexmark on cutline and on Spark Structured Streaming: throughput at saturation, side by side.

Run ``python bench/nexmark.py`` (``--quick``: a small input, one round).  The input is
``--events`` Nexmark events (``cutline nexmark generate``: the reference's mix and
distributions, 10,000 events per second of event time, out of order within groups of 100,
i.e. by less than 10 ms) in Parquet files of 50,000 events (at least 4), and a last file holding a
far-future sentinel bid (Spark closes windows only when its watermark passes them).  One
embedded Spark session (``local[2,8]``) runs both systems.  Every query
(``examples/nexmark/queries.py``; ``tests/test_nexmark_queries.py`` checks that the two
systems' results are equal) runs:

- on cutline at parallelism 2 with checkpoints every 1 s into a ``DiscardSink`` (Nexmark's
  blackhole), from ``FileSource(parquet)``; q0-q2 also in their columnar form (batch
  streams).  Processing time: attempt 0 started -> the final checkpoint completed.
- on Spark with ``spark.sql.shuffle.partitions=2``, ``trigger(availableNow=True)`` (the
  whole backlog in one micro-batch: Spark's best case), into the ``noop`` sink.  Processing
  time: the first micro-batch's trigger -> the end of the last micro-batch.

Records/s = events in the backlog / processing time.  One unmeasured warm-up run of each
system goes first; rounds rotate the order of the cases; medians are reported, with the
noise (half the spread of the per-round ratios).  The ratio
is cutline / Spark (cutline's better form for q0-q2).  Results: ``bench/results/
nexmark.json``.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path
from typing import Any

from _common import (
    RESULTS, AttemptWatcher, Runner, Workdir, bench_parser, fmt, git_state, median, noise_of,
    parse_bench_args, positive_int, rotated, spark_processing, spark_session, stamp,
    stop_quietly, table, write_results,
)
from _common import console as make_console

from cutline.connectors import DiscardSink

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = RESULTS / "nexmark.json"
SLOTS = PARALLELISM = 2
EVENTS = (1_000_000, 100_000)  # full, quick
PER_FILE = 50_000
OUT_OF_ORDER = 100
JOB_TIMEOUT = 900.0
CUTLINE, COLUMNAR, SPARK = "cutline", "cutline columnar", "spark"


def _run_module() -> Any:
    path = HERE.parent / "examples" / "nexmark" / "run.py"
    spec = importlib.util.spec_from_file_location("nexmark_run", path)
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules["nexmark_run"] = mod
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


R = _run_module()
Q = R.Q


def cutline_case(ctx: dict, query: str, columnar: bool) -> dict:
    with Workdir() as d:
        sink = DiscardSink(str(d / "count"))
        p = R.cutline_pipeline(query, ctx["input"], sink, f"file://{d}/ck", ctx["max_delay"],
                               PARALLELISM, columnar=columnar)
        Q.ship_by_value()
        watch = AttemptWatcher()
        t0 = time.monotonic()
        result = p.run(ctx["spark"], on_start=watch, timeout=JOB_TIMEOUT)
        t_end = time.monotonic()
        finals = [c for c in result.checkpoints if c.final]
        end = finals[-1].completed if finals else t_end
        start = watch.started if watch.started is not None else t0
        rows = sink.count(p.name)
    n = ctx["events"]
    durations = sorted(c.duration for c in result.checkpoints if not c.final)
    return {"records": n, "processing": end - start, "rate": n / (end - start),
            "end_to_end": t_end - t0, "rows": rows, "attempts": result.attempts,
            "checkpoints": len(result.checkpoints),
            "checkpoint_p50": median(durations), "checkpoint_max": max(durations, default=None)}


def spark_case(ctx: dict, query: str) -> dict:
    with Workdir() as d:
        t0 = time.monotonic()
        q = R.start_spark(ctx["spark"], query, ctx["input"], str(d), ctx["max_delay"],
                          sink="noop")
        R.await_spark(q, JOB_TIMEOUT)
        t_end = time.monotonic()
        processing = spark_processing(q.recentProgress)
    n = ctx["events"]
    return {"records": n, "processing": processing, "rate": n / processing,
            "end_to_end": t_end - t0}


def run_case(ctx: dict, query: str, system: str) -> dict:
    if system == SPARK:
        return spark_case(ctx, query)
    return cutline_case(ctx, query, system == COLUMNAR)


def cases(queries: list[str]) -> list[tuple[str, str, str]]:
    out = []
    for q in queries:
        out.append((q, CUTLINE, f"{q} {CUTLINE}"))
        if q in Q.COLUMNAR:
            out.append((q, COLUMNAR, f"{q} {COLUMNAR}"))
        out.append((q, SPARK, f"{q} {SPARK}"))
    return out


def summarise(runs: dict, queries: list[str]) -> list[dict]:
    rows = []
    for q in queries:
        def rates(system: str, q: str = q) -> list:
            return [r["rate"] if r else None for r in runs.get(f"{q} {system}", [])]

        mine = {s: rates(s) for s in (CUTLINE, COLUMNAR)}
        best = COLUMNAR if median(mine[COLUMNAR]) and (
            median(mine[COLUMNAR]) or 0) > (median(mine[CUTLINE]) or 0) else CUTLINE
        spark = rates(SPARK)
        per = [a / b for a, b in zip(mine[best], spark) if a and b]
        m, s = median(mine[best]), median(spark)
        rows.append({"query": q, "cutline": median(mine[CUTLINE]),
                     "cutline_columnar": median(mine[COLUMNAR]), "spark": s,
                     "best_cutline": best, "ratio": m / s if m and s else None,
                     "noise": noise_of(per), "per_round": per,
                     "checkpoint_p50": median([r.get("checkpoint_p50") for r in
                                               runs.get(f"{q} {CUTLINE}", []) if r])})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = bench_parser(__doc__, DEFAULT_OUT, (3, 1))
    ap.add_argument("--events", type=positive_int, default=None,
                    help=f"events in the backlog (default {EVENTS[0]:,}, quick {EVENTS[1]:,})")
    ap.add_argument("--queries", nargs="*", default=list(Q.QUERIES), choices=Q.QUERIES,
                    metavar="QUERY")
    args = parse_bench_args(ap, argv)
    events = args.events or EVENTS[1 if args.quick else 0]
    console = make_console()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = spark_session(SLOTS, shuffle_partitions=PARALLELISM)
    for conf in Q.SPARK_CONF.values():
        for k, v in conf.items():
            spark.conf.set(k, v)
    runner = Runner(console, width=24)
    try:
        with Workdir("cutline-nexmark-") as d:
            t = time.monotonic()
            cfg = R.generate(str(d / "in"), events, 10_000.0, OUT_OF_ORDER,
                             files=max(2 * PARALLELISM, events // PER_FILE))
            console.print(f"{events:,} Nexmark events written in "
                          f"{time.monotonic() - t:.1f} s; {args.rounds} round(s)")
            ctx = {"spark": spark, "input": str(d / "in"), "events": events + 1,
                   "max_delay": cfg.max_delay}
            todo = cases(args.queries)
            # warm-up, not measured: Spark's JIT and Python workers, cutline's imports
            runner.run("warm-up spark", lambda: spark_case(ctx, "q1"))
            runner.run("warm-up cutline", lambda: cutline_case(ctx, "q1", False))
            for r in range(args.rounds):
                for q, system, name in rotated(todo, r):
                    runner.run(name, lambda q=q, s=system: run_case(ctx, q, s), r,
                               args.rounds,
                               describe=lambda o: f"{o['rate']:>10,.0f} records/s")
    finally:
        stop_quietly(spark)
    rows = summarise(runner.runs, args.queries)
    t = table(f"Nexmark, {events:,} events: records/s at saturation (median of "
              f"{args.rounds} round(s))",
              ["query", "cutline", "cutline columnar", "Spark", "cutline / Spark", "noise",
               "cutline checkpoint p50"], left=("query",))
    for row in rows:
        t.add_row(row["query"], fmt(row["cutline"], ",.0f"),
                  fmt(row["cutline_columnar"], ",.0f"), fmt(row["spark"], ",.0f"),
                  fmt(row["ratio"], ".2f", "x"), fmt(row["noise"], ".2f"),
                  fmt(row["checkpoint_p50"] and row["checkpoint_p50"] * 1000, ".0f", " ms"))
    console.print(t)
    result = {"stamp": stamp(), "git": git_state(), "events": events, "rounds": args.rounds,
              "quick": args.quick, "summary": rows, "runs": runner.runs,
              "errors": runner.errors}
    write_results(args.out, result, console)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
