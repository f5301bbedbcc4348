"""The columnar path (issue 15) against Spark SQL built-ins, quick: workloads 1b and 3.

Run ``python bench/columnar.py [--records N]``.  One embedded Spark session (``local[2,8]``)
runs both, on the same JSON-lines backlog as ``bench/vs_spark.py`` (its helpers write it
and run Spark's queries): Spark SQL's ``where`` + ``select`` (1b) and ``groupBy(user).agg``
(3), against cutline's batch streams (``FileSource(...).batches(schema)``) and, for
reference, cutline's per-record pipelines of workloads 1 and 2.  Throughput = records /
processing time (vs_spark.py's definitions); CPU = the task processes' CPU seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).parent))
import vs_spark as vs  # noqa: E402

from cutline import CheckpointConfig, Pipeline  # noqa: E402
from cutline.connectors import FileSource, ParquetSink  # noqa: E402

SCHEMA = pa.schema([("ts", pa.float64()), ("user", pa.string()), ("kind", pa.string()),
                    ("value", pa.int64()), ("page", pa.string())])


def section(b: pa.RecordBatch) -> pa.Array:
    return pc.list_element(pc.split_pattern(b["page"], "/"), 1)


def columnar_pipeline(name: str, workload: str, backlog: Path, sink: ParquetSink,
                      storage: str) -> Pipeline:
    p = Pipeline(name, parallelism=vs.PARALLELISM,
                 checkpoint=CheckpointConfig(interval=vs.INTERVAL, storage=storage))
    s = p.source(FileSource(str(backlog)).batches(SCHEMA), uid="events")
    if workload == vs.STATELESS:
        s = (s.where((pc.field("kind") != "view") & (pc.field("value") >= 10), uid="keep")
             .with_column("score", pc.field("value") * 1.5 + 1.0, uid="score")
             .with_column("section", section, uid="section")
             .select(*vs.STATELESS_COLUMNS, uid="enrich"))
    else:
        s = s.key_by("user").agg(count="count", sum=("value", "sum"), ts=("ts", "max"),
                                 uid="aggregate")
    s.sink(sink, uid="out")
    return p


def cutline_run(ctx: dict, workload: str, columnar: bool) -> dict:
    backlog, n = ctx["backlog"], ctx["expected"]["records"]
    with vs.run_dir() as d:
        sink = ParquetSink(str(d / "out"))
        if columnar:
            p = columnar_pipeline(f"col-{workload}", workload, backlog, sink, f"file://{d}/ck")
        else:
            p = vs.cutline_pipeline(f"rec-{workload}", workload, FileSource(str(backlog)),
                                    sink, f"file://{d}/ck", vs.INTERVAL)
        watch = vs.AttemptWatcher(None)
        t0 = time.monotonic()
        result = p.run(ctx["spark"], on_start=watch, timeout=vs.JOB_TIMEOUT)
        t_end = time.monotonic()
        finals = [c for c in result.checkpoints if c.final]
        end = finals[-1].completed if finals else t_end
        start = watch.started if watch.started is not None else t0
        check = vs.check_output(vs.KEYED_SQL if workload != vs.STATELESS and columnar
                                else workload, [Path(f) for f in sink.committed_files()],
                                ctx["expected"])
    cpu = sum(getattr(result, "cpu_seconds", {}).values()) or None
    return {"records": n, "processing": end - start, "rate": n / (end - start),
            "cpu": cpu, "records_per_cpu_second": n / cpu if cpu else None, "output": check}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    spark = vs.spark_session(vs.SLOTS, shuffle_partitions=vs.PARALLELISM)
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        ctx = {"spark": spark, "quick": True}
        vs.add_backlog(ctx, Path(tmp), args.records)
        runs = [("1b", "spark-sql", lambda: vs.spark_throughput(ctx, vs.STATELESS,
                                                                 vs.SPARK_SQL)),
                ("1b", "cutline-columnar", lambda: cutline_run(ctx, vs.STATELESS, True)),
                ("1b", "cutline-records", lambda: cutline_run(ctx, vs.STATELESS, False)),
                ("3", "spark-sql", lambda: vs.spark_throughput(ctx, vs.KEYED_SQL,
                                                                vs.SPARK_SQL)),
                ("3", "cutline-columnar", lambda: cutline_run(ctx, vs.KEYED, True)),
                ("3", "cutline-records", lambda: cutline_run(ctx, vs.KEYED, False))]
        for _ in range(args.rounds):
            for w, system, run in runs:
                r = run()
                results.setdefault(w, {}).setdefault(system, []).append(r)
                per_cpu = r.get("records_per_cpu_second")
                print(f"workload {w:2} {system:17} {r['rate']:>12,.0f} records/s  "
                      f"output ok: {r['output'].get('ok')}  "
                      + (f"{per_cpu:,.0f} records/CPU-s" if per_cpu else ""), flush=True)
    for w, by in results.items():
        best = {s: max(r["rate"] for r in rs) for s, rs in by.items()}
        for s in ("cutline-columnar", "cutline-records"):
            print(f"workload {w}: {s} / spark-sql = {best[s] / best['spark-sql']:.2f}x")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1, default=str))
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
