"""Before/after for a change to ``FileSource``: the version of a git revision against the
working tree's, side by side in one run.

Run ``python bench/ab_file_source.py --before REV`` (``--quick`` for a short run).  It
measures, in interleaved rounds:

1. the reader alone: ``FileReader.read_batch(1000)`` over 100 JSON-lines files of 1,000
   events (the events of ``bench/vs_spark.py``), in this process;
2. cutline end to end on embedded Spark: ``bench/vs_spark.py``'s stateless and keyed
   pipelines over its backlog (records / processing time, checkpoints every 1 s);
3. Spark's runs of the same workloads (``mapInPandas``, ``applyInPandasWithState``, SQL
   aggregation), once a round, so that cutline / Spark is shown before and after.

The old ``files.py`` is read with ``git show REV:src/cutline/connectors/files.py``, loaded
as a module of ``cutline.connectors`` and shipped to the Spark workers by value, so both
versions run against the same everything else.  Results go to
``bench/results/ab_file_source.json``.  Exit code is 0 unless the arguments are bad.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import sys
import tempfile
import time
from pathlib import Path

import vs_spark as vs  # the workloads, input and pipelines of the comparison
from _common import (
    RESULTS, AttemptWatcher, Workdir, before_after, bench_parser, git_show, git_state,
    parse_bench_args, side_by_side, spark_session, stamp, stop_quietly, table, write_results,
)
from _common import console as make_console
from _common import median as median_of
from rich.console import Console

from cutline.connectors import files as files_now

OUT = RESULTS / "ab_file_source.json"


def load_revision(rev: str) -> object:
    text = git_show(rev, "src/cutline/connectors/files.py")
    path = Path(tempfile.mkdtemp(prefix="cutline-ab-")) / "files_before.py"
    path.write_text(text)
    name = "cutline.connectors.files_before"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    shutil.rmtree(path.parent, ignore_errors=True)  # loaded; Spark ships it by value
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(module)  # Spark workers cannot import it
    return module


def read_all(module: object, directory: Path, keep: list | None = None) -> int:
    reader = module.FileSource(str(directory)).create_reader()
    reader.open(0, 1)
    n = 0
    while (batch := reader.read_batch(1000)) is not None:
        n += len(batch)
        if keep is not None:
            keep.extend(batch)
    reader.close()
    return n


def cutline_rate(ctx: dict, module: object, workload: str) -> float:
    from cutline.connectors import ParquetSink

    with Workdir("cutline-ab-") as d:
        p = vs.cutline_pipeline(f"ab-{workload}", workload,
                                module.FileSource(str(ctx["backlog"])),
                                ParquetSink(str(d / "out")), f"file://{d}/ck", vs.INTERVAL)
        watch = AttemptWatcher()
        result = p.run(ctx["spark"], on_start=watch, timeout=vs.JOB_TIMEOUT)
        end = [c for c in result.checkpoints if c.final][-1].completed
    return ctx["expected"]["records"] / (end - watch.started)


def main(argv: list[str] | None = None) -> int:
    ap = bench_parser(__doc__, OUT, (5, 1), quick="short run")
    ap.add_argument("--before", required=True, help="git revision of the 'before' files.py")
    args = parse_bench_args(ap, argv)
    console = make_console(140)
    before = load_revision(args.before)
    versions = {"before": before, "after": files_now}

    spark = spark_session(vs.SLOTS, shuffle_partitions=vs.PARALLELISM)
    ctx = {"spark": spark}
    work = Path(tempfile.mkdtemp(prefix="cutline-ab-input-"))
    try:
        return _measure(args, console, versions, ctx, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        stop_quietly(spark)


def _measure(args: argparse.Namespace, console: Console, versions: dict, ctx: dict,
             work: Path) -> int:
    rounds = args.rounds
    records = 50_000 if args.quick else 400_000
    before, after = versions["before"], versions["after"]
    small = work / "small"
    vs.write_backlog(small, 100_000, 100)
    ctx["backlog"] = work / "backlog"
    # small files (1,000 events): what this benchmark measures is the listing and reading
    ctx["expected"] = vs.write_backlog(ctx["backlog"], records, records // 1_000)
    old_records, new_records = [], []
    read_all(before, small, old_records)
    read_all(after, small, new_records)
    if old_records != new_records:
        raise SystemExit("the two versions read different records")
    del old_records, new_records
    for module in versions.values():  # warm up: workers started, modules imported
        for workload in (vs.STATELESS, vs.KEYED):
            cutline_rate(ctx, module, workload)
    spark_cases = [(vs.STATELESS, vs.SPARK_PY), (vs.KEYED, vs.SPARK_PY),
                   (vs.KEYED_SQL, vs.SPARK_SQL)]
    for w, e in spark_cases:
        vs.throughput(ctx, w, e)

    cases = [("reader alone", lambda m: 100_000 / _timed(read_all, m, small))]
    cases += [(f"cutline {w}", lambda m, w=w: cutline_rate(ctx, m, w))
              for w in (vs.STATELESS, vs.KEYED)]
    runs: dict[str, dict[str, list[float]]] = {c: {"before": [], "after": []} for c, _ in cases}
    spark_rates: dict[str, list[float]] = {vs.SPARK_API[c]: [] for c in spark_cases}
    for r in range(rounds):
        for case, fn in cases:
            for version in side_by_side(["before", "after"], r):
                rate = fn(versions[version])
                runs[case][version].append(rate)
                console.print(f"  round {r + 1}/{rounds}: {case:<22} {version:<6} "
                              f"{rate:>10,.0f} records/s", style="dim")
        for w, e in spark_cases:
            rate = vs.throughput(ctx, w, e)["rate"]
            spark_rates[vs.SPARK_API[w, e]].append(rate)
            console.print(f"  round {r + 1}/{rounds}: Spark {vs.SPARK_API[w, e]:<22} "
                          f"{rate:>10,.0f} records/s", style="dim")

    t = table(f"FileSource {args.before} (before) vs working tree (after): records/s, "
              f"median of {rounds} round(s)",
              ("case", "before", "after", "after / before", "per round"), no_wrap=False)
    summary = {}
    for case, v in runs.items():
        summary[case] = before_after(v["before"], v["after"])
        b, a, per = summary[case]["before"], summary[case]["after"], summary[case]["per_round"]
        t.add_row(case, f"{b:,.0f}", f"{a:,.0f}", f"{a / b:.2f}x",
                  ", ".join(f"{x:.2f}" for x in per))
    console.print(t)
    vs_spark = {}
    rt = table("cutline / Spark throughput, before and after (median of per-round ratios)",
               ("cutline workload", "Spark", "before", "after"),
               left=("cutline workload", "Spark"), no_wrap=False)
    for cw, api in ((vs.STATELESS, "mapInPandas"), (vs.KEYED, "applyInPandasWithState"),
                    (vs.KEYED, "SQL aggregation")):
        case = f"cutline {cw}"
        ratios = {v: median_of([c / s_ for c, s_ in zip(runs[case][v], spark_rates[api])])
                  for v in ("before", "after")}
        vs_spark[f"{cw} / {api}"] = ratios
        rt.add_row(cw, api, f"{ratios['before']:.2f}x", f"{ratios['after']:.2f}x")
    console.print(rt)
    result = {"benchmark": "FileSource before/after, side by side", "before": args.before,
              "git": git_state(), "rounds": rounds, "records": records, **stamp(),
              "summary": summary, "cutline_over_spark": vs_spark, "runs": runs,
              "spark_runs": spark_rates}
    write_results(args.out, result, console, indent=1)
    return 0


def _timed(fn, *a) -> float:
    t0 = time.perf_counter()
    fn(*a)
    return time.perf_counter() - t0


if __name__ == "__main__":
    sys.exit(main())
