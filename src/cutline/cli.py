"""The ``cutline`` command."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from rich.table import Table

from . import terminal
from .analysis.explore_time import FAULTS as TIME_FAULTS
from .analysis.explore_time import SCENARIOS as TIME_SCENARIOS
from .sim.scenarios.watermarks import FAULTS as WM_FAULTS
from .sim.scenarios.watermarks import MODES as WM_MODES

# Piped output (CI logs, README captures): tables at their natural width, not cut at 80
console = terminal.console()


class UsageError(Exception):
    """Bad input from the user: printed as ``cutline: error: ...``, exit status 2."""


def _positive(name: str, minimum: int = 1) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{name} must be a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{name} must be >= {minimum}, got {value}")
        return value

    return parse


def _diagram_path(text: str) -> Path:
    path = Path(text)
    if path.suffix.lower() not in (".png", ".svg"):
        raise argparse.ArgumentTypeError(
            f"diagram file must end in .png or .svg, got {text!r}")
    return path


# What is said beside the result: stderr when stdout carries JSON (it stays pure JSON).
err_console = terminal.console(stderr=True)


def _say(args: argparse.Namespace, text: str) -> None:
    """A one-line message: never hard-wrapped (a path in it must stay one copyable string)."""
    (err_console if getattr(args, "format", "table") == "json" else console).print(
        text, soft_wrap=True)


def _draw(args: argparse.Namespace, sim, title: str, **kw) -> None:
    if args.diagram is None:
        return
    from .sim.diagram import draw

    out = draw(sim, args.diagram, title=title, **kw)
    _say(args, f"space-time diagram written to [bold]{out}[/bold]")


# ---------------------------------------------------------------------------- scenarios


def _lecture(args: argparse.Namespace) -> int:
    from .analysis import check_cut
    from .sim.scenarios import lecture

    result = lecture.run()
    data = result.as_dict()
    report = check_cut(result.sim.trace, result.snapshot, result.sim.procs, result.sim.chans)
    if args.format == "json":
        print(json.dumps(data))
    else:
        t = Table(title="Chandy-Lamport snapshot of the lecture example (P1 initiates after B)")
        t.add_column("process")
        t.add_column("recorded state (events before its cut)")
        for p, events in data["processes"].items():
            t.add_row(p, ", ".join(events))
        console.print(t)
        c = Table(title="recorded channel states (messages named by their send event)")
        c.add_column("channel")
        c.add_column("in transit across the cut")
        for ch, msgs in data["channels"].items():
            c.add_row(ch, ", ".join(msgs) if msgs else "(empty)")
        console.print(c)
        console.print(report.explain())
    _draw(args, result.sim, "Chandy-Lamport snapshot: the lecture example")
    return 0 if report.ok else 1


def _tokens(args: argparse.Namespace) -> int:
    from .sim.scenarios import tokens

    result = tokens.run(processes=args.processes, tokens=args.tokens,
                        snapshots=args.snapshots, seed=args.seed)
    if args.format == "json":
        print(json.dumps(result.as_dict()))
    else:
        t = Table(title=f"{args.processes} processes, {result.expected_total} tokens in all, "
                        f"up to {result.max_concurrent} snapshots in flight at once")
        for col in ("snapshot", "initiators", "in processes", "in transit", "total",
                    "consistent cut", "duration"):
            t.add_column(col, justify="right" if col != "initiators" else "left")
        for r in result.rows:
            ok = r.total == result.expected_total
            t.add_row(str(r.id), ", ".join(r.initiators), str(r.in_processes),
                      str(r.in_transit), f"[{'green' if ok else 'red'}]{r.total}[/]",
                      "yes" if r.consistent else "[red]NO[/]", f"{r.duration:.2f}")
        console.print(t)
        console.print(
            f"every snapshot conserves {result.expected_total} tokens: "
            f"{'[green]yes[/]' if result.all_conserved else '[red]NO[/]'}; "
            f"process states alone miss tokens in {result.states_alone_wrong} of "
            f"{len(result.rows)} snapshots (the tokens in transit are in the channel state)")
    _draw(args, result.sim, "Tokens: concurrent snapshots, several initiators",
          **tokens_picture(result.sim))
    return 0 if result.all_conserved else 1


def tokens_picture(sim) -> dict:
    """What ``simulate tokens --diagram`` draws: every snapshot, from the start until the
    last one completed (its last marker in)."""
    done = list(sim.completed)
    end = max((s.completed_at or max(s.taken_at.values()) for s in done if s.taken_at),
              default=12.0)
    return {"snapshot_ids": [s.id for s in done], "window": (0.0, end + 0.5)}


def _termination(args: argparse.Namespace) -> int:
    from .sim.scenarios import termination

    result = termination.run(processes=args.processes, seed=args.seed)
    if args.format == "json":
        print(json.dumps(result.as_dict()))
    else:
        t = Table(title="termination detection by snapshots (diffusing computation)")
        for col in ("probe", "started", "completed", "active", "in transit",
                    "terminated?", "states alone say"):
            t.add_column(col, justify="right")
        for p in result.probes:
            t.add_row(str(p.id), f"{p.started:.2f}", f"{p.completed:.2f}", str(p.active),
                      str(p.in_transit), "[green]yes[/]" if p.detected else "no",
                      ("[red]terminated (wrong)[/]" if p.states_only and not p.detected
                       else "terminated" if p.states_only else "running"))
        console.print(t)
        console.print(
            f"computation ended at t={result.terminated_at:.2f}; detected at "
            f"t={result.detected_at:.2f} ({'[red]EARLY[/]' if result.early else 'never early'})")
    _draw(args, result.sim, "Termination detection: the detecting snapshot",
          snapshot_ids=[p.id for p in result.probes if p.detected])
    return 0 if result.detected_at is not None and not result.early else 1


def _alignment(args: argparse.Namespace) -> int:
    from .sim.scenarios import alignment

    if args.diagram is not None:
        raise UsageError("--diagram: the alignment scenario runs one simulation per "
                         "checkpoint mode and draws none of them (too many records for a "
                         "space-time diagram); the scenarios with a diagram are lecture, "
                         "tokens, termination, inconsistent and watermarks")
    result = alignment.run(seed=args.seed, records=args.records,
                           failure_at=9.0 if args.failure_at is None else args.failure_at)
    if args.format == "json":
        print(json.dumps(result.as_dict()))
        return 0
    t = Table(title=(f"sources -> keyed count -> slow sink; failure at t={result.failure_at}, "
                     f"restore + replay; failure-free run: {result.reference_records} records"))
    for col in ("mode", "checkpoints", "restored from", "mean duration",
                "in-flight stored", "output", "duplicates", "lost", "vs failure-free"):
        t.add_column(col, justify="right" if col != "mode" else "left")
    for r in result.runs:
        t.add_row(r.mode, str(r.checkpoints), str(r.restored_from), f"{r.mean_duration:.2f}",
                  str(r.channel_state_records), str(r.records),
                  f"[{'red' if r.duplicates else 'green'}]{r.duplicates}[/]",
                  f"[{'red' if r.lost else 'green'}]{r.lost}[/]",
                  "[green]exact[/]" if r.exact else "[yellow]no[/]")
    console.print(t)
    ok = all(r.exact for r in result.runs if r.mode != "at_least_once") and all(
        r.lost == 0 for r in result.runs)
    return 0 if ok else 1


def _inconsistent(args: argparse.Namespace) -> int:
    from .sim.scenarios import inconsistent

    result = inconsistent.run(seed=args.seed)
    if args.diagram is not None:
        out, total, orphans = inconsistent.diagram(args.diagram)
        _say(args, f"diagram written to [bold]{out}[/bold]: the naive cut counts "
                   f"{total} of 300 tokens")
    if args.format == "json":
        print(json.dumps(result.as_dict()))
        return 0
    t = Table(title=f"tokens: a monitor reads the {result.processes} processes one "
                    f"by one, without markers (Chandy-Lamport, same run: "
                    f"{', '.join(map(str, result.snapshot_totals))})")
    for col in ("read", "from", "to", "naive total", "counted twice (orphans)",
                "counted nowhere (in flight)"):
        t.add_column(col, justify="right")
    for k, r in enumerate(result.token_reads, 1):
        ok = r.value == result.expected_total
        t.add_row(str(k), f"{r.started:.1f}", f"{r.finished:.1f}",
                  f"[{'green' if ok else 'red'}]{r.value}[/]", str(r.orphans),
                  str(r.unrecorded))
    console.print(t)
    early = result.naive_early
    console.print(
        f"termination, {result.termination_runs} seeded runs: the naive monitor (every process "
        f"read passive, messages sent = received) declared termination early in "
        f"[{'red' if early else 'green'}]{len(early)}[/] run(s)"
        + (" (" + "; ".join(f"seed {s}: at t={a:.1f}, work ended at t={b:.1f}"
                            for s, a, b in early[:3]) + ")" if early else "")
        + f"; Chandy-Lamport snapshots: {result.snapshot_early}")
    return 0 if result.snapshot_early == 0 else 1


def _watermarks(args: argparse.Namespace) -> int:
    from .sim.scenarios import watermarks

    crash = 7.0 if args.failure_at is None else args.failure_at
    result = watermarks.run(seed=args.seed, mode=args.mode or "aligned", crash_at=crash,
                            fault=args.fault)
    data = result.as_dict()
    if args.diagram is not None:
        from .analysis.time_diagram import draw_time_run

        out = draw_time_run(watermarks.time_run(result), args.diagram)
        _say(args, f"space-time diagram written to [bold]{out}[/bold]")
    if args.format == "json":
        print(json.dumps(data))
        return 0 if result.ok else 1
    state = data["channel_state"]
    console.print(f"S1, S2 (out of order, watermarks max_delay 2 s) -> W (count per key, "
                  f"tumbling 10 s) -> sink; {result.mode}, seed {result.seed}: crash at "
                  f"t={crash:g}, restored checkpoint {data['restored_checkpoint'] or '(none)'}"
                  f" with {state['records']} record(s) and {state['watermarks']} "
                  f"watermark(s) in its channel state", highlight=False)
    t = Table()
    for col in ("sink got", "key", "window / event time", "count"):
        t.add_column(col, justify="right" if col == "count" else "left")
    for _, o in result.output:
        if o[0] == "window":
            t.add_row("window", o[1], f"[{o[2]:g}, {o[3]:g})", str(o[4]))
        else:
            t.add_row("[yellow]late record[/]", o[1], f"{o[2]:g}", "")
    console.print(t)
    if result.ok:
        console.print("every record and watermark took effect exactly once, in channel "
                      "order; the sink's output equals a failure-free window operator's on "
                      "the same items: [green]no window fired twice, early or never[/]")
    for p in result.problems:
        console.print(f"[red]{p}[/]", highlight=False)
    return 0 if result.ok else 1


SCENARIOS = {
    "lecture": ("the classic three-process Chandy-Lamport lecture example", _lecture),
    "tokens": ("tokens on a strongly connected graph: every snapshot conserves them", _tokens),
    "termination": ("termination of a diffusing computation, detected by snapshots",
                    _termination),
    "alignment": ("one pipeline under each checkpoint mode, with a failure and a restore",
                  _alignment),
    "inconsistent": ("states read without markers: wrong totals and false termination",
                     _inconsistent),
    "watermarks": ("event time across a crash: watermarks in band, windows fire exactly "
                   "once", _watermarks),
}


def _explore(args: argparse.Namespace) -> int:
    if args.event_time is not None:
        from .analysis.explore_time import explore_time

        timed = explore_time(args.event_time, mode=args.mode or "aligned",
                             checkpoints=args.snapshots,
                             fault=args.fault, first=args.fault is not None)
        console.print(timed.summary(), markup=False, highlight=False)
        if args.diagram is not None:
            from .analysis.time_diagram import draw_time_run, sample_run

            run = sample_run(args.event_time, args.mode or "aligned", seed=args.seed)
            draw_time_run(run, args.diagram)
            console.print(f"one interleaving with a crash after checkpoint {run.restored}, "
                          f"drawn to {args.diagram}", markup=False)
        return 0 if timed.ok else 1
    from .analysis.explore import explore

    result = explore(processes=args.processes, messages=args.messages,
                     snapshots=args.snapshots, mode=args.mode or "chandy_lamport",
                     topology=args.topology, overtake=args.overtake,
                     progress=not args.quiet)
    console.print(result.summary(), markup=False, highlight=False)
    return 0 if result.ok else 1


def _nexmark(args: argparse.Namespace) -> int:
    from .connectors.nexmark import NexmarkConfig, write_events

    cfg = NexmarkConfig(seed=args.seed, events_per_second=args.events_per_second,
                        out_of_order=args.out_of_order)
    paths = write_events(args.out, args.events, format=args.format, files=args.files,
                         config=cfg, sentinel=args.sentinel)
    print(f"{args.events:,} Nexmark events (seed {args.seed}) in {len(paths)} "
          f"{args.format} file(s) under {args.out}")
    return 0


def _report(args: argparse.Namespace) -> int:
    from .driver.history import rebuild_report
    from .storage.checkpoints import CheckpointStorageError

    try:
        where, snap = rebuild_report(args.job_dir, out=args.out)
    except (CheckpointStorageError, OSError, ImportError) as exc:
        print(f"cutline: error: {exc}", file=sys.stderr)
        return 1
    ck = snap["checkpoints"]
    print(f"report of job {snap['job']!r} ({snap['status']}, {ck['total']} checkpoint"
          f"{'' if ck['total'] == 1 else 's'}"
          f"{'' if snap['report']['source'] == 'history' else ', from _metadata only'}): "
          f"{where}")
    return 0


# ---------------------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cutline", description="Consistent distributed snapshots for stream processing.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sim = sub.add_parser(
        "simulate", help="run a snapshot scenario in the deterministic simulator",
        description="Run a scenario in the deterministic simulator. Scenarios: " + "; ".join(
            f"{k}: {v[0]}" for k, v in SCENARIOS.items()))
    sim.add_argument("scenario", choices=list(SCENARIOS), metavar="SCENARIO",
                     help="one of: " + ", ".join(SCENARIOS))
    sim.add_argument("--format", choices=["table", "json"], default="table")
    sim.add_argument("--diagram", type=_diagram_path, metavar="FILE.png|svg",
                     help="also draw the space-time diagram with the snapshot's cut")
    sim.add_argument("--seed", type=int, default=0)
    sim.add_argument("--processes", type=_positive("--processes", 2), default=5)
    sim.add_argument("--tokens", type=_positive("--tokens"), default=100)
    sim.add_argument("--snapshots", type=_positive("--snapshots"), default=8)
    sim.add_argument("--records", type=_positive("--records"), default=300)
    sim.add_argument("--failure-at", type=float, default=None,
                     help="when the job dies (alignment: default 9, watermarks: 7)")
    sim.add_argument("--mode", choices=list(WM_MODES),
                     help="watermarks: the checkpoint mode (default aligned)")
    sim.add_argument("--fault", choices=list(WM_FAULTS),
                     help="watermarks: inject a known bug to see the check catch it")

    ex = sub.add_parser(
        "explore", help="check every interleaving of a small system exhaustively",
        description="Enumerate every interleaving the FIFO channels allow for a small "
                    "system and check every snapshot with the consistent-cut checker.")
    ex.add_argument("--processes", type=_positive("--processes", 2), default=3)
    ex.add_argument("--messages", type=_positive("--messages", 0), default=1,
                    help="application messages each process sends")
    ex.add_argument("--snapshots", type=_positive("--snapshots"), default=1)
    ex.add_argument("--mode", default=None,
                    choices=["chandy_lamport", "aligned", "unaligned", "at_least_once"],
                    help="default chandy_lamport (aligned with --event-time)")
    ex.add_argument("--topology", default="complete", choices=["complete", "ring", "dag"])
    ex.add_argument("--overtake", default="take", choices=["take", "copy"],
                    help="unaligned: records a barrier overtakes are taken out of the queue "
                         "(take, as the simulator does) or copied and left queued (copy, as "
                         "the runtime's input gate does)")
    ex.add_argument("--event-time", choices=list(TIME_SCENARIOS), metavar="SCENARIO",
                    help="instead: two sources with watermarks into a tumbling-window count, "
                         "a crash anywhere; every window must fire exactly once. Scenarios: "
                         + ", ".join(TIME_SCENARIOS))
    ex.add_argument("--fault", choices=list(TIME_FAULTS),
                    help="--event-time: inject a known bug to see the checker catch it")
    ex.add_argument("--diagram", type=_diagram_path, metavar="FILE.png|svg",
                    help="--event-time: also draw one interleaving with a crash")
    ex.add_argument("--seed", type=int, default=1,
                    help="--diagram: which interleaving (a seeded random walk)")
    ex.add_argument("--quiet", action="store_true")
    from . import cli_jobs

    cli_jobs.add_parser(sub)

    run = sub.add_parser(
        "run", help="run a pipeline or process-graph program (examples/bank.py ...)",
        description="Run a Python file that (1) defines build() returning a Pipeline or a "
                    "cutline.graph.ProcessGraph: its keyword parameters (with defaults) "
                    "become options, and options after the file go to the run: `cutline run "
                    "examples/bank.py --help` lists them (--engine, --storage, --restore "
                    "PATH, --kill, and the program's own; a process graph's run also "
                    "--snapshot-interval, --diagram, --view ..., which a pipeline's refuses); "
                    "(2) runs its own pipeline (p.run(), at the top level or under `if "
                    "__name__ == \"__main__\":`): it runs as `python FILE ...` would, "
                    "options after the file are its own; or (3) defines one Pipeline or "
                    "ProcessGraph at module level: it runs with the run options of (1).")
    run.add_argument("program", metavar="FILE.py")
    run.add_argument("args", nargs=argparse.REMAINDER, metavar="...",
                     help="options of the run and of the program")

    nx = sub.add_parser(
        "nexmark", help="the Nexmark benchmark's events, for cutline and other systems",
        description="generate: write Nexmark events (persons, auctions, bids) to JSON-lines "
                    "or Parquet files, the same events NexmarkSource emits (deterministic "
                    "from --seed), for Spark and other systems to read.")
    nx.add_argument("action", choices=["generate"])
    nx.add_argument("out", metavar="OUT", help="output directory")
    nx.add_argument("--events", type=_positive("--events"), required=True)
    nx.add_argument("--format", choices=["jsonl", "parquet"], default="jsonl")
    nx.add_argument("--files", type=_positive("--files"), default=1,
                    help="split the events over this many files, in event order")
    nx.add_argument("--seed", type=int, default=0)
    nx.add_argument("--events-per-second", type=float, default=10_000.0,
                    help="events per second of event time (default 10,000)")
    nx.add_argument("--out-of-order", type=_positive("--out-of-order"), default=1,
                    help="shuffle events within groups of this many (event times out of "
                         "order by less than group size / events-per-second)")
    nx.add_argument("--sentinel", action="store_true",
                    help="add a file with one bid a year later (closes every window in "
                         "Spark, whose watermark only moves with the input)")

    rep = sub.add_parser(
        "report", help="a job's report (its dashboard after the job), from its storage",
        description="Rebuild a job's static report, the dashboard's page with its "
                    "configuration, checkpoint history and summary, subtasks, attempts and "
                    "runs, from its job directory alone (history.jsonl and the checkpoints' "
                    "_metadata): a path or URL such as /tmp/cutline-checkpoints/wordcount or "
                    "s3://bucket/checkpoints/wordcount (s3: credentials and endpoint from the "
                    "AWS_* environment variables). Written to JOB_DIR/report.html unless "
                    "--out says where; prints where.")
    rep.add_argument("job_dir", metavar="JOB_DIR", help="the job directory: <storage>/<job>")
    rep.add_argument("--out", metavar="FILE.html", help="write it here (a local file)")
    snaps = sub.add_parser(
        "snapshots", help="list or show the stored snapshots of process-graph runs",
        description="list PATH: the completed snapshots under a job directory "
                    "(<storage>/<job>). show PATH: one snapshot (a chk-N directory, or a "
                    "job directory for its newest): process states, messages in transit, "
                    "checks.")
    snaps.add_argument("action", choices=["list", "show"])
    snaps.add_argument("path", metavar="PATH")
    snaps.add_argument("--format", choices=["table", "json"], default="table")
    snaps.add_argument("--view", type=_diagram_path, metavar="FILE.png|svg",
                       help="show: also draw the snapshot (processes, channels, in transit)")
    snaps.add_argument("--all", action="store_true", help="show: list empty channels too")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "simulate":
            if args.scenario != "watermarks" and (args.mode or args.fault):
                raise UsageError("--mode and --fault apply to the watermarks scenario only")
            return SCENARIOS[args.scenario][1](args)
        if args.command == "explore":
            return _explore(args)
        if args.command in ("checkpoints", "savepoint", "chaos"):
            from . import cli_jobs

            return cli_jobs.run(args)
        if args.command == "run":
            from .graph.cli import run_file

            return run_file(args.program, args.args)
        if args.command == "nexmark":
            return _nexmark(args)
        if args.command == "report":
            return _report(args)
        if args.command == "snapshots":
            from .graph.cli import snapshots_main

            return snapshots_main(args)
    except (UsageError, ValueError, FileNotFoundError) as exc:
        print(f"cutline: error: {exc}", file=sys.stderr)
        return 2
    parser.error(f"unknown command {args.command!r}")  # pragma: no cover
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
