"""Before/after for any change to cutline: the cases of ``bench/runtime.py`` and
``bench/vs_spark.py`` run for two versions of the code side by side, in one run, and one
table of after/before ratios.

Run ``python bench/ab.py --before REV`` (``--after REV``, default the working tree;
``--quick`` for a short run).  Each version is its own checkout of ``src/`` (``git archive
REV src``; the working tree's ``src/`` as it is for ``worktree``), first on ``PYTHONPATH``
of its own process: a server (``ab.py --serve``) with its own embedded Spark session
(``local[2,8]``), warmed up once, that runs one case when asked.  Its driver and every
Spark worker import that version's cutline: each server reports ``cutline.__file__`` from
inside a Spark task, and one that imported anything else is refused.  The benchmark code
is this checkout's for both versions, so only cutline differs.

The cases, at the sizes of ``runtime.py --quick`` and ``vs_spark.py --quick``:

* runtime.py: records/s with checkpoints off and on, at parallelism 1, on the threads
  engine and under backpressure; checkpoint durations (p50, final excluded) of every run
  that checkpoints (1 s interval; aligned and unaligned under backpressure).  The bare
  Python loop runs no cutline code: its ratio is the machine's noise.  The full run adds
  recovery (kill -9 -> first checkpoint of the new attempt) at ``runtime.py``'s full sizes.
* vs_spark.py: cutline's records/s and checkpoint durations on the stateless and keyed
  workloads; the full run adds latency p99.  Spark's own queries do not change with
  cutline's version and are left out.

Side by side: each case runs for one version and at once for the other, the version that
goes first alternating from case to case and round to round; the cases rotate each round.
Each metric's ratio is after / before per round; the table shows their median, their spread
(min-max) and the noise (half the spread).  A ratio within the noise of 1 is "within noise",
beyond it "better" or "worse".  The change passes when no throughput or checkpoint-duration
metric is worse beyond its noise.  Results go to ``bench/results/ab.json``.  Exit code is 0
unless the arguments are bad or a version cannot be checked out or started.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import IO, Any

from _common import (
    RESULTS, ROOT, before_after, bench_parser, checkout_src, fmt, git_state, median, ms,
    parse_bench_args, resolve, rotated, side_by_side, stamp, styled, table, write_results,
)
from _common import console as make_console

DEFAULT_OUT = RESULTS / "ab.json"
WORKTREE = "worktree"
VERSIONS = ("before", "after")
BENCHES = ("runtime", "vs_spark")

# --------------------------------------------------------------------------- server


def serve(quick: bool, benches: list[str]) -> int:
    """``--serve``: one version's cases, on one Spark session.  Protocol on stdout, one JSON
    line a message: ``{"ready", "cases", "cutline", "cutline_in_spark_task"}`` once set up,
    then ``{"case", "result"}`` or ``{"case", "error"}`` for each ``{"case"}`` line read
    from stdin; stops at the end of stdin.  Anything else printed goes to stderr."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    import runtime as rt
    import vs_spark as vs
    from _common import Workdir, cutline_in_spark_task, spark_session, stop_quietly

    import cutline

    def send(msg: dict) -> None:
        proto.write(json.dumps(msg, default=str) + "\n")

    console = make_console(160)
    spark = spark_session(rt.SLOTS)
    cases: dict[str, Any] = {}
    with Workdir("cutline-ab-serve-") as work:
        if "runtime" in benches:
            ctx = rt.make_ctx(quick) | {"spark": spark}
            rt.warm_up(spark)
            for group in rt.GROUPS[:2] if quick else rt.GROUPS:
                for name, fn in group:
                    cases[f"runtime | {name}"] = lambda fn=fn: fn(ctx)
        if "vs_spark" in benches:
            vargs = vs.parse_args(["--quick", "--cutline-only", "--no-profile"])
            vctx = vs.make_ctx(spark, vargs)
            vs.warm_up(vctx, console)
            vs.add_backlog(vctx, work, vargs.records)
            vcases = vs.throughput_cases(vctx) + ([] if quick else vs.latency_cases(vctx))
            for name, fn in vs.cutline_only(vcases):
                cases[f"vs_spark | {name}"] = fn
        send({"ready": True, "cases": list(cases), "cutline": cutline.__file__,
              "cutline_in_spark_task": cutline_in_spark_task(spark)})
        for line in sys.stdin:
            name = json.loads(line)["case"]
            try:
                send({"case": name, "result": cases[name]()})
            except Exception as exc:  # noqa: BLE001 - reported to the client
                send({"case": name, "error": repr(exc), "trace": traceback.format_exc()[-3000:]})
    stop_quietly(spark)
    return 0


class Server:
    """The client side of one ``--serve`` process."""

    def __init__(self, version: str, info: dict, quick: bool, benches: list[str],
                 log: Path) -> None:
        self.version, self.info = version, info
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([info["src"]] + (
            [env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        cmd = [sys.executable, str(Path(__file__).resolve()), "--serve",
               *(["--quick"] if quick else []), *sum((["--only", b] for b in benches), [])]
        self.log = log
        self._log: IO[str] = log.open("w")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._log, env=env, text=True, bufsize=1)

    def _read(self) -> dict:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            tail = self.log.read_text()[-3000:]
            raise RuntimeError(f"the {self.version} server ended (exit {self.proc.wait()}); "
                               f"log {self.log}:\n{tail}")
        return json.loads(line)

    def ready(self) -> dict:
        msg = self._read()
        expected = str(Path(self.info["src"]) / "cutline") + os.sep
        for where in ("cutline", "cutline_in_spark_task"):
            if not str(msg[where]).startswith(expected):
                raise RuntimeError(f"the {self.version} server imported cutline from "
                                   f"{msg[where]} ({where}), not from {expected}: the "
                                   "comparison would be wrong")
        return msg

    def run(self, case: str) -> dict:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"case": case}) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


# --------------------------------------------------------------------------- metrics


def _p50(checkpoints: list[dict]) -> float | None:
    return median([c["duration"] for c in checkpoints if not c["final"]])


def metrics_of(case: str, out: dict) -> list[tuple[str, str, bool, float | None]]:
    """``(metric, kind, higher is better, value)`` of one case's run; kind "control" runs no
    cutline code."""
    bench, name = case.split(" | ", 1)
    if bench == "runtime":
        if name == "bare loop":
            return [("runtime: records/s, bare loop (no cutline)", "control", True, out["rate"])]
        if "kill" in name:
            return [("runtime: recovery, kill -> 1st checkpoint after", "recovery", False,
                     out.get("kill_to_caught_up"))]
        if name.startswith("rate-limited"):
            return []
        found = [(f"runtime: records/s, {name}", "throughput", True, out["rate"])]
        p50 = _p50(out.get("checkpoints", []))
        if p50 is not None:
            found.append((f"runtime: checkpoint p50, {name}", "checkpoint", False, p50))
        return found
    if name.startswith("tp |"):
        w = name.split(" | ")[1]
        return [(f"vs_spark: records/s, {w}", "throughput", True, out["rate"]),
                (f"vs_spark: checkpoint p50, {w}", "checkpoint", False,
                 median(out.get("checkpoint_durations") or []))]
    _, w, _, config = name.split(" | ")
    return [(f"vs_spark: latency p99, {w}, {config}", "latency", False, out["p99"])]


# --------------------------------------------------------------------------- versions


def prepare(rev: str, dest: Path) -> dict:
    """Where a version's ``cutline`` comes from: a checkout of ``rev``'s ``src/``, or this
    working tree's for ``worktree``."""
    if rev == WORKTREE:
        state = git_state()
        return {"rev": WORKTREE, "commit": state["commit"],
                "uncommitted": state["src_uncommitted"], "src": str(ROOT / "src")}
    return {"rev": rev, "commit": resolve(rev), "src": str(checkout_src(rev, dest))}


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = bench_parser(__doc__, DEFAULT_OUT, (6, 4),
                      quick="short run: runtime.py --quick without recovery, vs_spark.py "
                            "--quick throughput only (about 7 minutes)")
    ap.add_argument("--before", help="git revision of the 'before' version (required)")
    ap.add_argument("--after", default=WORKTREE,
                    help="git revision of the 'after' version, or 'worktree' (the default): "
                         "this checkout's src/ as it is")
    ap.add_argument("--only", choices=BENCHES, action="append", default=None,
                    help="run only these benchmarks' cases (repeatable)")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parse_bench_args(ap, argv)
    benches = [b for b in BENCHES if b in (args.only or BENCHES)]
    if args.serve:
        return serve(args.quick, benches)
    if args.before is None:
        ap.error("--before REV is required")
    console = make_console(170)
    t_bench = time.monotonic()

    work = Path(tempfile.mkdtemp(prefix="cutline-ab-"))
    versions = {"before": prepare(args.before, work / "before"),
                "after": prepare(args.after, work / "after")}
    console.print(f"[bold]cutline before/after[/]  {'quick, ' if args.quick else ''}"
                  f"{args.rounds} round(s) of the cases of "
                  f"{' and '.join(f'{b}.py' for b in benches)}; before {args.before} "
                  f"({versions['before']['commit'][:10]}), after {args.after} "
                  f"({(versions['after']['commit'] or '?')[:10]})")
    servers = {v: Server(v, versions[v], args.quick, benches, work / f"{v}.log")
               for v in VERSIONS}
    values: dict[str, dict[str, list[float | None]]] = {}
    kinds: dict[str, tuple[str, bool]] = {}
    errors: list[dict] = []
    try:
        names = None
        for v, server in servers.items():
            ready = server.ready()
            versions[v]["cutline_in_spark_task"] = ready["cutline_in_spark_task"]
            console.print(f"  {v:<6} ready; a Spark task imports {ready['cutline_in_spark_task']}",
                          style="dim")
            names = ready["cases"] if names is None else [n for n in names if n in ready["cases"]]
        for r in range(args.rounds):
            for k, case in enumerate(rotated(names or [], r)):
                for v in side_by_side(VERSIONS, r + k):
                    t0 = time.monotonic()
                    msg = servers[v].run(case)
                    if "error" in msg:
                        errors.append({"round": r + 1, "case": case, "version": v,
                                       "error": msg["error"], "trace": msg.get("trace")})
                        console.print(f"  round {r + 1}/{args.rounds}: {case} {v} FAILED: "
                                      f"{msg['error']}", style="red")
                        continue
                    found = metrics_of(case, msg["result"])
                    for metric, kind, higher, value in found:
                        kinds[metric] = (kind, higher)
                        per = values.setdefault(metric,
                                                {x: [None] * args.rounds for x in VERSIONS})
                        per[v][r] = value
                    shown = found[0][3] if found else None
                    console.print(f"  round {r + 1}/{args.rounds}: {case:<42} {v:<6} "
                                  f"{time.monotonic() - t0:5.1f} s  "
                                  f"{fmt(shown, ',.0f') if found and found[0][2] else ms(shown)}",
                                  style="dim")
    except RuntimeError as exc:  # a server died or imported the wrong cutline
        errors.append({"error": str(exc)})
        console.print(f"stopped: {exc}", style="red")
    finally:
        for server in servers.values():
            server.close()

    summary = {name: before_after(v["before"], v["after"], higher_is_better=kinds[name][1])
               | {"kind": kinds[name][0], "before_rounds": v["before"],
                  "after_rounds": v["after"]}
               for name, v in values.items()}
    print_table(console, summary, args)
    gated = [n for n, s in summary.items() if s["kind"] in ("throughput", "checkpoint")]
    worse = [n for n in gated if summary[n]["verdict"] == "worse"]
    # "n/a": no value in any round (a run too short for a periodic checkpoint): not judged
    unmeasured = [n for n in gated if summary[n]["verdict"] == "noise not measured"]
    if worse:
        passed, word = False, f"[red]NO[/]: worse beyond noise: {', '.join(worse)}"
    elif unmeasured or errors or not gated:
        passed, word = None, "[yellow]UNDECIDED[/]: " + (
            f"{len(errors)} run(s) failed" if errors else "noise needs 2 rounds or more")
    else:
        passed, word = True, "[green]YES[/]"
    console.print(f"no throughput or checkpoint-duration regression beyond noise: {word}")
    elapsed = time.monotonic() - t_bench
    console.print(f"benchmark took {elapsed:.0f} s", style="dim")
    result: dict[str, Any] = {
        "benchmark": "cutline before/after: runtime.py and vs_spark.py cases side by side",
        **stamp(), "command": "python bench/ab.py " + " ".join(
            argv if argv is not None else sys.argv[1:]),
        "quick": args.quick, "rounds": args.rounds, "benches": benches,
        "versions": versions, "elapsed_s": elapsed, "summary": summary, "passed": passed,
        "worse": worse, "errors": errors}
    write_results(args.out, result, console)
    if errors:
        console.print(f"the servers' logs are kept in {work}", style="yellow")
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
