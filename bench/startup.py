"""Where a job's fixed cost goes (issue 28 item 5): the seconds between process start and
the first record, and after the last, of a small job run as a user runs it.

Run ``python bench/startup.py`` (``--rounds 5``, ``--records 200000``).  Each round is a
fresh process (``run_child``: timed from just before the spawn to its exit) running a
keyed count over JSON-lines files (``--columnar``: ``FileSource.batches``; default per
record) on the embedded Spark session, as ``Pipeline.run()`` does, with each phase stamped:

- *interpreter*: spawn -> the program's first line runs (Python starts, site-packages);
- *import cutline*: ``import cutline`` and the connectors;
- *Spark session*: what ``Pipeline.run()`` starts when given none (``embedded_context()``:
  the JVM and a SparkContext; a user's session is already up);
- *plan and submit*: ``Pipeline.run()`` called -> the driver is up (``on_start``: plan,
  checks, control service, the barrier stage about to be submitted);
- *tasks start*: -> attempt 0 started (every Spark task running cutline has registered:
  stage launch, the PySpark daemon, the Python workers' imports, channels connected);
- *processing*: -> the final checkpoint completed (reading, counting, the checkpoints);
- *job end*: -> ``run()`` returned (tasks finish, the stage ends, the report is written);
- *Spark stop*: ``spark.stop()``;
- *exit*: -> the process is gone (interpreter teardown, the JVM's exit).

``--threads``: the same job on the threads engine (no Spark) beside it, in the same
rounds.  ``--cds``: Spark runs with and without the JVM's class-data archive
(``cutline.spark.cds``; ``CUTLINE_SPARK_CDS=0``) beside each other, the archive written by
two warm-up runs first (in the bench's own folder: the user's cache is left alone).
``--preload``: the embedded session's Python workers forked by ``cutline.spark.daemon``
(cutline's task runtime imported before the fork, the default) and by PySpark's own daemon
(``CUTLINE_SPARK_PRELOAD=0``) beside each other.
Prints the median of every phase and its share of the whole; writes
``bench/results/startup.json``.  Not a speed target: a map of where the seconds go.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

from _common import (
    RESULTS,
    AttemptWatcher,
    RunFailed,
    rotated,
    Workdir,
    bench_parser,
    conditions,
    console,
    fmt,
    median,
    parse_bench_args,
    run_child,
    table,
    write_results,
)

DEFAULT_OUT = RESULTS / "startup.json"
PHASES = ("interpreter", "import cutline", "Spark session", "plan and submit", "tasks start",
          "processing", "job end", "Spark stop", "exit")


def write_input(d: Path, records: int, files: int) -> None:
    rng = random.Random(7)
    per = records // files
    for f in range(files):
        with open(d / f"part-{f:03d}.jsonl", "w") as out:
            for i in range(per):
                out.write(json.dumps({"ts": f * per + i, "user": f"u{rng.randrange(1000)}"},
                                     separators=(",", ":")) + "\n")


def child_main(spec_path: str) -> int:
    t_py = time.time()
    spec = json.loads(Path(spec_path).read_text())
    import cutline  # noqa: F401
    from cutline import CheckpointConfig, Pipeline
    from cutline.connectors import DiscardSink, FileSource

    t_import = time.time()
    engine = spec["engine"]
    spark = None
    if engine == "spark":
        from cutline.spark import launcher

        # what Pipeline.run() starts when given no session (a revision before the context
        # without a SparkSession: the session)
        start = getattr(launcher, "embedded_context", launcher.embedded_session)
        spark = start(2)
    t_session = time.time()
    p = Pipeline("startup", parallelism=2,
                 checkpoint=CheckpointConfig(interval=1.0, storage=f"file://{spec['ck']}"))
    src = FileSource(spec["input"], format="jsonl")
    if spec["columnar"]:
        import pyarrow as pa

        stream: Any = p.source(src.batches(pa.schema([("user", pa.string())])), uid="in")
        stream.key_by("user").agg(n="count").rows().sink(DiscardSink(), uid="out")
    else:
        p.source(src, uid="in").key_by(lambda r: r["user"]).count(uid="count") \
            .sink(DiscardSink(), uid="out")
    driver_up: list[float] = []
    watch = AttemptWatcher()

    def on_start(driver: Any) -> None:
        driver_up.append(time.monotonic())
        watch(driver)

    mono0, wall0 = time.monotonic(), time.time()

    def wall(m: float) -> float:
        return wall0 + (m - mono0)

    t_run = time.time()
    result = p.run(spark, on_start=on_start) if spark is not None \
        else p.run(engine="threads", on_start=on_start)
    t_return = time.time()
    if spark is not None:
        spark.stop()
    t_stop = time.time()
    finals = [c for c in result.checkpoints if c.final]
    stamps = {"py": t_py, "import": t_import, "session": t_session, "run": t_run,
              "driver": wall(driver_up[0]) if driver_up else None,
              "attempt": wall(watch.started) if watch.started is not None else None,
              "final": wall(finals[-1].completed) if finals else None,
              "return": t_return, "stop": t_stop, "attempts": result.attempts}
    Path(spec["result"]).write_text(json.dumps(stamps))
    return 0


def _spec(engine: str, columnar: bool, d: Path, run_dir: Path) -> dict:
    spec = {"engine": engine, "columnar": columnar, "input": str(d / "in"),
            "ck": str(run_dir / "ck"), "result": str(run_dir / "result.json")}
    (run_dir / "spec.json").write_text(json.dumps(spec))
    return spec


def warm_up(run_dir: Path, d: Path, columnar: bool, env: dict | None) -> None:
    """One run as a user's program ends (its JVM exits on its own, writing the class-data
    archive), then wait until that JVM is gone (its pid is in the archive's marker)."""
    import subprocess

    run_dir.mkdir()
    _spec("spark", columnar, d, run_dir)
    subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child",
                    str(run_dir / "spec.json")], check=True, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
    deadline = time.monotonic() + 180
    for marker in (d / "cds").glob("*.pid"):
        try:
            pid = int(marker.read_text().partition("\n")[0])
        except (OSError, ValueError):
            continue
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.2)


def phases(spawn: float, end_to_end: float, s: dict) -> dict[str, float | None]:
    """Seconds per phase of one run from its stamps (wall clock; ``spawn``: the parent's)."""
    marks = [spawn, s["py"], s["import"], s["session"], s["driver"], s["attempt"], s["final"],
             s["return"], s["stop"], spawn + end_to_end]
    out: dict[str, float | None] = {}
    for name, a, b in zip(PHASES, marks[:-1], marks[1:], strict=True):
        out[name] = None if a is None or b is None else b - a
    # "plan and submit" starts when run() is called (building the pipeline is in between)
    if s["driver"] is not None:
        out["plan and submit"] = s["driver"] - s["run"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = bench_parser(__doc__, DEFAULT_OUT, (5, 2))
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--files", type=int, default=2)
    ap.add_argument("--columnar", action="store_true", help="FileSource.batches: Arrow batches")
    ap.add_argument("--threads", action="store_true",
                    help="the threads engine beside it (no Spark)")
    ap.add_argument("--cds", action="store_true",
                    help="Spark with and without the JVM's class-data archive, side by side")
    ap.add_argument("--preload", action="store_true",
                    help="Spark's Python workers forked by cutline's daemon (cutline's runtime "
                         "imported before the fork) and by PySpark's, side by side")
    args = parse_bench_args(ap, argv)
    con = console()
    runs: list[dict] = []
    with Workdir("cutline-startup-") as d:
        # case -> (engine, environment of its runs)
        cases: dict[str, tuple[str, dict | None]] = {"spark": ("spark", None)}
        if args.cds:
            cases = {"spark": ("spark", {**os.environ, "CUTLINE_CDS_DIR": str(d / "cds")}),
                     "spark, no CDS": ("spark", {**os.environ, "CUTLINE_SPARK_CDS": "0"})}
        if args.preload:
            cases["spark, PySpark's daemon"] = ("spark", {**os.environ,
                                                          "CUTLINE_SPARK_PRELOAD": "0"})
        if args.threads:
            cases["threads"] = ("threads", None)
        (d / "in").mkdir()
        write_input(d / "in", args.records, args.files)
        if args.cds:
            con.print("writing the class-data archive (two warm-up runs)", style="dim")
            for k in range(2):
                warm_up(d / f"warm-{k}", d, args.columnar, cases["spark"][1])
        for r in range(args.rounds):
            for case, (engine, env) in rotated(list(cases.items()), r):
                run_dir = d / f"run-{r}-{case.replace(', ', '-').replace(' ', '-')}"
                run_dir.mkdir()
                _spec(engine, args.columnar, d, run_dir)
                spawn = time.time()
                try:
                    out = run_child([str(Path(__file__).resolve()), "--child",
                                     str(run_dir / "spec.json")], run_dir / "result.json", 600,
                                    env=env)
                except RunFailed as exc:
                    con.print(f"round {r + 1} {case}: FAILED {exc}", style="red")
                    return 1
                ph = phases(spawn, out["end_to_end"], out)
                runs.append({"round": r + 1, "engine": case, "end_to_end": out["end_to_end"],
                             "phases": ph, "load": out["load"]})
                con.print(f"round {r + 1} {case:<13} end to end {out['end_to_end']:6.2f} s  "
                          + "  ".join(f"{k} {fmt(v, '.2f')}" for k, v in ph.items()),
                          style="dim")
    engines = list(cases)
    summary = {}
    for engine in engines:
        mine = [x for x in runs if x["engine"] == engine]
        e2e = median([x["end_to_end"] for x in mine])
        summary[engine] = {"end_to_end": e2e, "phases": {
            k: median([x["phases"][k] for x in mine]) for k in PHASES}}
    t = table(f"where the seconds of a {args.records:,}-record keyed count go "
              f"({'columnar' if args.columnar else 'per record'}; median of {args.rounds} "
              f"runs, s)", ["phase", *[f"{e} s" for e in engines],
                            *[f"{e} share" for e in engines]], left=("phase",))
    for k in PHASES:
        vals = [summary[e]["phases"][k] for e in engines]
        shares = [None if v is None or not summary[e]["end_to_end"] else
                  v / summary[e]["end_to_end"] for e, v in zip(engines, vals, strict=True)]
        t.add_row(k, *[fmt(v, ".2f") for v in vals], *[fmt(s, ".0%") for s in shares])
    t.add_row("end to end", *[fmt(summary[e]["end_to_end"], ".2f") for e in engines],
              *["" for _ in engines])
    con.print(t)
    write_results(args.out, {"benchmark": "where a job's fixed cost goes",
                             **conditions(), "records": args.records, "files": args.files,
                             "columnar": args.columnar, "rounds": args.rounds,
                             "summary": summary, "runs": runs}, con)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        raise SystemExit(child_main(sys.argv[2]))
    raise SystemExit(main())
