"""Before/after for any change to cutline: ``bench/runtime.py`` and ``bench/vs_spark.py`` run
for two versions of the code side by side, in one run, and one table of after/before ratios.

Run ``python bench/ab.py --before REV`` (``--after REV``, default the working tree;
``--quick`` for a short run).  Each version is its own checkout of ``src/`` (``git archive
REV src``; the working tree's ``src/`` as it is for ``worktree``), put first on
``PYTHONPATH`` of a fresh process per run, so the driver and every Spark worker import that
version's cutline: each run reports ``cutline.__file__`` from inside a Spark task, and a
run that imported anything else is refused.  The benchmark code is this checkout's for both
versions, so only cutline differs.

Rounds alternate: in round r each benchmark runs for both versions back to back, the
version that goes first swapping every round, and the benchmarks' order rotating.  A run
is one benchmark process with one round of its cases (its own Spark session and warm-up):

* ``runtime.py --rounds 1`` (``--quick --only throughput --only backpressure`` with
  ``--quick``): records/s with checkpoints off and on, at parallelism 1 and on the threads
  engine; checkpoint durations (p50, final excluded) at a 1 s interval and under
  backpressure, aligned and unaligned; the full run adds recovery.  The bare Python loop
  runs no cutline code: its ratio is the machine's noise.
* ``vs_spark.py --quick --rounds 1 --cutline-only --no-profile`` (``--only throughput`` with
  ``--quick``): cutline's records/s and checkpoint durations on the stateless and keyed
  workloads; the full run adds latency p99.  Spark's own queries do not change with
  cutline's version and are left out.

Each metric's ratio is after / before per round; the table shows their median, their
spread (min-max) and the noise (half the spread).  A ratio within the noise of 1 is
"within noise", beyond it "better" or "worse".  The change passes when no throughput or
checkpoint-duration metric is worse beyond its noise.  Results go to
``bench/results/ab.json``.  Exit code is 0 unless the arguments are bad or a version cannot
be checked out.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import (
    HERE, RESULTS, ROOT, before_after, bench_parser, checkout_src, fmt, git_state, median, ms,
    parse_bench_args, resolve, rotated, side_by_side, stamp, styled, table, write_results,
)
from _common import console as make_console

DEFAULT_OUT = RESULTS / "ab.json"
WORKTREE = "worktree"
VERSIONS = ("before", "after")
BENCHES = ("runtime", "vs_spark")
RUN_TIMEOUT = 1800.0


def bench_args(bench: str, quick: bool) -> list[str]:
    """The command line of one run of ``bench`` (one round of its cases)."""
    if bench == "runtime":
        return ["--rounds", "1"] + (["--quick", "--only", "throughput", "--only",
                                     "backpressure"] if quick else [])
    return ["--quick", "--rounds", "1", "--latency-rounds", "1", "--cutline-only",
            "--no-profile"] + (["--only", "throughput"] if quick else
                               ["--only", "throughput", "--only", "latency"])


# --------------------------------------------------------------------------- metrics
# (name, kind, higher is better); kind "control" runs no cutline code.


def _p50(checkpoints: list[dict]) -> float | None:
    return median([c["duration"] for c in checkpoints if not c["final"]])


def runtime_metrics(result: dict) -> dict[str, tuple[str, bool, float | None]]:
    runs = {name: (v[0] if v else None) for name, v in result["runs"].items()}

    def rate(name: str) -> float | None:
        run = runs.get(name)
        return run["rate"] if run else None

    def p50(name: str) -> float | None:
        run = runs.get(name)
        return _p50(run["checkpoints"]) if run else None

    out: dict[str, tuple[str, bool, float | None]] = {
        "runtime: records/s, checkpoints on (1 s)": ("throughput", True,
                                                      rate("checkpoints on (1 s)")),
        "runtime: records/s, checkpoints off": ("throughput", True, rate("checkpoints off")),
        "runtime: records/s, one task": ("throughput", True, rate("one task (parallelism 1)")),
        "runtime: records/s, threads engine": ("throughput", True, rate("threads engine")),
        "runtime: checkpoint p50, on (1 s)": ("checkpoint", False,
                                               p50("checkpoints on (1 s)")),
        "runtime: checkpoint p50, aligned under backpressure": (
            "checkpoint", False, p50("aligned (backpressure)")),
        "runtime: checkpoint p50, unaligned under backpressure": (
            "checkpoint", False, p50("unaligned (backpressure)")),
        "runtime: records/s, bare loop (no cutline)": ("control", True, rate("bare loop")),
    }
    killed = runs.get("rate-limited, kill -9")
    if killed is not None:
        out["runtime: recovery, kill -> 1st checkpoint"] = (
            "recovery", False, killed.get("kill_to_caught_up"))
    return out


def vs_spark_metrics(result: dict) -> dict[str, tuple[str, bool, float | None]]:
    runs = {name: (v[0] if v else None) for name, v in result["runs"].items()}
    out: dict[str, tuple[str, bool, float | None]] = {}
    for w in ("stateless", "keyed"):
        run = runs.get(f"tp | {w} | cutline")
        out[f"vs_spark: records/s, {w}"] = ("throughput", True, run["rate"] if run else None)
        out[f"vs_spark: checkpoint p50, {w}"] = (
            "checkpoint", False, median(run.get("checkpoint_durations") or []) if run else None)
    for name, run in runs.items():
        if name.startswith("lat |") and run is not None:
            _, w, _, config = name.split(" | ")
            out[f"vs_spark: latency p99, {w}, {config}"] = ("latency", False, run["p99"])
    return out


METRICS = {"runtime": runtime_metrics, "vs_spark": vs_spark_metrics}


# --------------------------------------------------------------------------- versions


def prepare(rev: str, dest: Path) -> dict:
    """Where a version's ``cutline`` comes from: a checkout of ``rev``'s ``src/``, or this
    working tree's for ``worktree``."""
    if rev == WORKTREE:
        state = git_state()
        return {"rev": WORKTREE, "commit": state["commit"],
                "uncommitted": state["src_uncommitted"], "src": str(ROOT / "src")}
    return {"rev": rev, "commit": resolve(rev), "src": str(checkout_src(rev, dest))}


def run_bench(bench: str, version: dict, quick: bool, out: Path, log: Path) -> dict:
    """One run of ``bench`` in a fresh process importing ``version``'s cutline."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([version["src"]] + (
        [env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["COLUMNS"] = "200"
    cmd = [sys.executable, str(HERE / f"{bench}.py"), *bench_args(bench, quick),
           "--out", str(out)]
    with log.open("w") as fh:
        proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env,
                              timeout=RUN_TIMEOUT, check=False)
    if proc.returncode != 0 or not out.exists():
        tail = log.read_text()[-2000:]
        raise RuntimeError(f"{bench}.py exited with {proc.returncode}; log {log}:\n{tail}")
    result = json.loads(out.read_text())
    expected = str(Path(version["src"]) / "cutline")
    seen = {"driver": result["git"].get("cutline", ""),
            "spark task": result.get("cutline_in_spark_task", "")}
    for where, path in seen.items():
        if not str(path).startswith(expected + os.sep) and str(path) != expected:
            raise RuntimeError(f"{bench}.py imported cutline from {path} in the {where}, "
                               f"not from {expected}: the comparison would be wrong")
    if result.get("errors"):
        raise RuntimeError(f"{bench}.py: {len(result['errors'])} case(s) failed: "
                           f"{result['errors'][0]['error']} (log {log})")
    return result


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = bench_parser(__doc__, DEFAULT_OUT, (3, 2),
                      quick="short run: runtime.py --quick without recovery, vs_spark.py "
                            "--quick throughput only (about 12 minutes)")
    ap.add_argument("--before", required=True, help="git revision of the 'before' version")
    ap.add_argument("--after", default=WORKTREE,
                    help="git revision of the 'after' version, or 'worktree' (the default): "
                         "this checkout's src/ as it is")
    ap.add_argument("--only", choices=BENCHES, action="append", default=None,
                    help="run only these benchmarks (repeatable)")
    args = parse_bench_args(ap, argv)
    console = make_console(170)
    t_bench = time.monotonic()
    benches = [b for b in BENCHES if b in (args.only or BENCHES)]

    work = Path(tempfile.mkdtemp(prefix="cutline-ab-"))
    versions = {"before": prepare(args.before, work / "before"),
                "after": prepare(args.after, work / "after")}
    console.print(f"[bold]cutline before/after[/]  {'quick, ' if args.quick else ''}"
                  f"{args.rounds} round(s) of {' and '.join(f'{b}.py' for b in benches)}; "
                  f"before {args.before} ({versions['before']['commit'][:10]}), after "
                  f"{args.after} ({(versions['after']['commit'] or '?')[:10]})")
    for v, info in versions.items():
        console.print(f"  {v:<6} imports cutline from {info['src']}", style="dim")

    values: dict[str, dict[str, list[float | None]]] = {}
    kinds: dict[str, tuple[str, bool]] = {}
    locations: dict[str, set[str]] = {v: set() for v in VERSIONS}
    errors: list[dict] = []
    for r in range(args.rounds):
        for bench in rotated(benches, r):
            for v in side_by_side(VERSIONS, r):
                out = work / f"{bench}-{v}-{r + 1}.json"
                log = work / f"{bench}-{v}-{r + 1}.log"
                t0 = time.monotonic()
                try:
                    result = run_bench(bench, versions[v], args.quick, out, log)
                except Exception as exc:  # noqa: BLE001 - reported, the others go on
                    errors.append({"round": r + 1, "bench": bench, "version": v,
                                   "error": str(exc)})
                    console.print(f"  round {r + 1}/{args.rounds}: {bench} {v} FAILED: {exc}",
                                  style="red")
                    metrics = {}
                else:
                    metrics = METRICS[bench](result)
                    locations[v].add(result["cutline_in_spark_task"])
                for name, (kind, higher, value) in metrics.items():
                    kinds[name] = (kind, higher)
                    per = values.setdefault(name, {x: [None] * args.rounds for x in VERSIONS})
                    per[v][r] = value
                shown = [f"{value:,.0f}/s" for name, (kind, _, value) in metrics.items()
                         if kind == "throughput" and value is not None][:2]
                console.print(f"  round {r + 1}/{args.rounds}: {bench:<9} {v:<6} "
                              f"{time.monotonic() - t0:5.1f} s  {', '.join(shown)}",
                              style="dim")

    summary = {name: before_after(v["before"], v["after"], higher_is_better=kinds[name][1])
               | {"kind": kinds[name][0], "before_rounds": v["before"],
                  "after_rounds": v["after"]}
               for name, v in values.items()}
    print_table(console, summary, args)
    gated = [n for n, s in summary.items() if s["kind"] in ("throughput", "checkpoint")]
    worse = [n for n in gated if summary[n]["verdict"] == "worse"]
    unmeasured = [n for n in gated if summary[n]["verdict"] in ("noise not measured", "n/a")]
    if worse:
        passed, word = False, f"[red]NO[/]: worse beyond noise: {', '.join(worse)}"
    elif unmeasured or errors:
        passed, word = None, "[yellow]UNDECIDED[/]: " + (
            f"{len(errors)} run(s) failed" if errors else "noise needs 2 rounds or more")
    else:
        passed, word = True, "[green]YES[/]"
    console.print(f"no throughput or checkpoint-duration regression beyond noise: {word}")
    elapsed = time.monotonic() - t_bench
    console.print(f"cutline in Spark tasks: before {sorted(locations['before'])}, after "
                  f"{sorted(locations['after'])}", style="dim")
    console.print(f"benchmark took {elapsed:.0f} s", style="dim")
    result: dict[str, Any] = {
        "benchmark": "cutline before/after: runtime.py and vs_spark.py side by side",
        **stamp(), "command": "python bench/ab.py " + " ".join(
            argv if argv is not None else sys.argv[1:]),
        "quick": args.quick, "rounds": args.rounds, "benches": benches,
        "bench_args": {b: bench_args(b, args.quick) for b in benches},
        "versions": versions | {v: versions[v] | {"cutline_in_spark_task":
                                                  sorted(locations[v])} for v in VERSIONS},
        "elapsed_s": elapsed, "summary": summary, "passed": passed, "worse": worse,
        "errors": errors}
    write_results(args.out, result, console)
    if errors:
        console.print(f"the failed runs' logs are kept in {work}", style="yellow")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def print_table(console: Any, summary: dict, args: Any) -> None:
    t = table(f"after ({args.after}) / before ({args.before}): median of {args.rounds} "
              "round(s), side by side",
              ("metric", "before", "after", "after / before", "spread", "noise", "verdict"),
              left=("metric", "verdict"))
    order = {"throughput": 0, "checkpoint": 1, "latency": 2, "recovery": 3, "control": 4}
    for name, s in sorted(summary.items(), key=lambda kv: order[kv[1]["kind"]]):
        unit = (lambda x: fmt(x, ",.0f", "/s")) if s["kind"] in ("throughput", "control") \
            else (lambda x: ms(x, ",.1f"))
        spread = f"{s['spread'][0]:.3f}-{s['spread'][1]:.3f}" if s["spread"] else "-"
        t.add_row(name, unit(s["before"]), unit(s["after"]), fmt(s["paired"], ".3f", "x"),
                  spread, fmt(s["noise"], ".3f", "") if s["noise"] is not None else "-",
                  styled(s["verdict"]))
    console.print(t)
    console.print("after / before: median of the per-round ratios (each round runs both "
                  "versions back to back); spread: their min-max; noise: half the spread.  "
                  "Throughput: higher is better; checkpoint durations and latency: lower is "
                  "better.  The bare loop runs no cutline code: its spread is the machine's.",
                  style="dim")


if __name__ == "__main__":
    sys.exit(main())
