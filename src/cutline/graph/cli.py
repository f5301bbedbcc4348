"""``cutline run FILE`` and ``python FILE``: run a process-graph or pipeline program from
the command line; ``cutline snapshots list|show``: read what its runs stored.

A program is a Python file with a function ``build(...)`` returning a ``ProcessGraph`` or a
``Pipeline``; its keyword parameters become options (``def build(accounts: int = 8)`` gives
``--accounts``), and a line ``name: text`` in its docstring is the option's help.  The file
ends with::

    if __name__ == "__main__":
        raise SystemExit(run_main(build))

``cutline run FILE`` (:func:`run_file`) also runs a pipeline script: one that runs its own
pipeline (``p.run()``, at the top level or under ``if __name__ == "__main__":``) runs as
``python FILE`` would; one that only defines a ``Pipeline`` or ``ProcessGraph`` at module
level has it run with the run options.  What kind of file it is, is read from its source
before any of it runs.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.table import Table

from .. import terminal

__all__ = ["load_program", "run_file", "run_main", "snapshots_main"]

console = terminal.console()


class _Usage(ValueError):
    pass


def load_program(path: str) -> Callable[..., Any]:
    """The ``build`` function of the program at ``path``."""
    file = Path(path)
    if not file.is_file():
        raise _Usage(f"no such program file: {path}")
    build = getattr(_load_module(file), "build", None)
    if not callable(build):
        raise _Usage(f"{path} defines no build() function returning a ProcessGraph or a "
                     "Pipeline")
    return build


WHAT_TO_DEFINE = (
    "`cutline run FILE` runs (1) a function build() returning a Pipeline or a ProcessGraph, "
    "its keyword parameters (with defaults) the program's options; (2) a script that runs "
    "its own pipeline (p.run(), at the top level or under `if __name__ == \"__main__\":`), "
    "as `python FILE` would; or (3) one Pipeline or ProcessGraph defined at module level")


def _program_kind(path: str, source: str) -> str:
    """``build`` (a build() whose parameters all have defaults), ``script`` (the file runs
    something itself: a ``__main__`` block or a ``.run()`` / ``.start()`` /
    ``run_main()`` call), ``object`` (it only defines things), read from the source."""
    import ast

    try:
        tree = ast.parse(source, filename=path)
    except SyntaxError as exc:
        raise _Usage(f"{path} is not valid Python: {exc.msg} (line {exc.lineno})") from None
    build = next((n for n in tree.body
                  if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                  and n.name == "build"), None)
    required: list[str] = []
    if isinstance(build, (ast.FunctionDef, ast.AsyncFunctionDef)):
        a = build.args
        positional = [*a.posonlyargs, *a.args]
        required = [x.arg for x in positional[:len(positional) - len(a.defaults)]]
        required += [x.arg for x, d in zip(a.kwonlyargs, a.kw_defaults) if d is None]
    main_block = any(isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)
                     and "__name__" in ast.unparse(n.test) for n in tree.body)
    # calls the module makes when it is run: top-level statements only (a helper function's
    # subprocess.run() runs nothing by itself)
    top = [n for n in tree.body
           if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    runs = any(isinstance(n, ast.Call) and (
        isinstance(n.func, ast.Attribute) and n.func.attr in ("run", "start", "run_main")
        or isinstance(n.func, ast.Name) and n.func.id == "run_main")
        for stmt in top for n in ast.walk(stmt))
    if build is not None and not required:
        return "build"
    if main_block or runs:
        return "script"
    if build is not None:
        raise _Usage(f"{path}: build() has parameters without defaults "
                     f"({', '.join(required)}), which `cutline run` cannot give; give them "
                     f"defaults (they become options), or run the program's own code under "
                     f"`if __name__ == \"__main__\":`. {WHAT_TO_DEFINE}")
    return "object"


def _load_module(file: Path) -> Any:
    name = "cutline_program_" + re.sub(r"\W", "_", file.stem)
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise _Usage(f"cannot load {file} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # Spark pickles its classes by value (cutline.spark.graph)
    spec.loader.exec_module(module)
    return module


def _run_module(file: Path) -> Any:
    """The program's module, its code run; its own error is printed with its traceback,
    as ``python FILE`` prints it, and ends the command (status 1)."""
    try:
        return _load_module(file)
    except Exception:
        import traceback

        traceback.print_exc()
        raise SystemExit(1) from None


def run_file(path: str, argv: Sequence[str], prog: str | None = None) -> int:
    """``cutline run FILE ARGS...``: the program at ``path`` run the way its source says
    (:func:`_program_kind`); the exit status."""
    prog = prog or f"cutline run {path}"
    file = Path(path)
    if not file.is_file():
        raise _Usage(f"no such program file: {path}")
    kind = _program_kind(path, file.read_text(encoding="utf-8", errors="replace"))
    if kind == "build":
        return run_main(_run_module(file).build, argv, prog=prog)
    if kind == "script":
        import runpy

        saved, saved_path = sys.argv, list(sys.path)
        sys.argv = [path, *argv]
        sys.path.insert(0, str(file.resolve().parent))  # as `python FILE`: siblings import
        try:
            runpy.run_path(path, run_name="__main__")
        except SystemExit as exc:
            if exc.code is None or isinstance(exc.code, int):
                return exc.code or 0
            print(exc.code, file=sys.stderr)
            return 1
        except Exception:  # the script's own error: its traceback, as `python FILE` prints
            import traceback

            traceback.print_exc()
            return 1
        finally:
            sys.argv = saved
            sys.path[:] = saved_path
        return 0
    from ..api import Pipeline
    from .api import ProcessGraph

    module = _run_module(file)
    found = {id(v): (k, v) for k, v in vars(module).items()
             if isinstance(v, (Pipeline, ProcessGraph))}
    if len(found) != 1:
        names = ", ".join(sorted(k for k, _ in found.values()))
        raise _Usage(f"{path} defines no build() function, runs nothing itself and defines "
                     + (f"{len(found)} Pipelines/ProcessGraphs at module level ({names}): "
                        "which one to run? " if found else
                        "no Pipeline or ProcessGraph at module level. ") + WHAT_TO_DEFINE)
    (name, job), = found.values()

    def build() -> Any:
        return job

    build.__module__ = f"{file.name}: {name}"
    return run_main(build, argv, prog=prog)


def _doc_help(fn: Callable) -> dict[str, str]:
    out = {}
    for line in (inspect.getdoc(fn) or "").splitlines():
        m = re.match(r"\s*(\w+):\s+(\S.*)$", line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def _window(text: str) -> tuple[float, float]:
    try:
        a, b = (float(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"window must be T0:T1 in seconds, got {text!r}") from None
    if not a < b:
        raise argparse.ArgumentTypeError(f"window needs T0 < T1, got {text!r}")
    return a, b


def _parser(build: Callable, prog: str) -> tuple[argparse.ArgumentParser, list[str]]:
    doc = inspect.getdoc(build) or ""
    ap = argparse.ArgumentParser(prog=prog, description=doc.split("\n\n")[0] or None)
    g = ap.add_argument_group("run (a process graph's or a pipeline's)")
    g.add_argument("--engine", choices=["spark", "threads"], default="spark",
                   help="spark: one barrier stage on embedded Spark (default); threads: no Spark")
    g.add_argument("--storage", metavar="URL",
                   help="snapshot storage (default: a temp dir); a pipeline's checkpoint "
                        "storage (default: its CheckpointConfig's)")
    g.add_argument("--restore", metavar="PATH",
                   help="start from this snapshot (a chk-N directory, or a job directory "
                        "for its newest one); messages in transit are delivered again")
    g.add_argument("--timeout", type=float, default=600, metavar="S")
    g.add_argument("--kill", action="store_true",
                   help="kill -9 a Spark Python worker after the first snapshot (spark)")
    g.add_argument("--kill-after", type=int, default=1, metavar="N",
                   help="with --kill: after N completed snapshots (default 1)")
    g = ap.add_argument_group("process-graph runs (a pipeline's program sets these itself: "
                              "refused for a pipeline)")
    g.add_argument("--tasks", type=int, default=2, help="Spark tasks (process groups); default 2")
    g.add_argument("--snapshot-interval", type=float, default=1.0, metavar="S",
                   help="start a snapshot every S seconds (0: only processes start them)")
    g.add_argument("--initiators", type=int, default=1, metavar="K",
                   help="processes that initiate each scheduled snapshot (default 1)")
    g.add_argument("--max-concurrent", type=int, default=4, metavar="N")
    g.add_argument("--retain", type=int, default=20, metavar="N",
                   help="completed snapshots kept in storage (default 20)")
    g.add_argument("--duration", type=float, metavar="S", help="stop after S seconds")
    g.add_argument("--seed", type=int)
    g.add_argument("--diagram", metavar="FILE.png|svg",
                   help="space-time diagram of a window of the run, with a snapshot's cut")
    g.add_argument("--view", metavar="FILE.png|svg", help="picture of a snapshot")
    g.add_argument("--snapshot", type=int, metavar="ID",
                   help="the snapshot to draw (default: one with messages in transit)")
    g.add_argument("--window", type=_window, metavar="T0:T1",
                   help="--diagram: seconds of the run to draw (default: around the cut)")
    g.add_argument("--rows", type=int, default=12, help="snapshots shown (the last ROWS)")
    g.add_argument("--format", choices=["table", "json"], default="table")
    own = ap.add_argument_group(f"program options ({getattr(build, '__module__', '')})")
    helps = _doc_help(build)
    params = []
    for name, p in inspect.signature(build).parameters.items():
        if p.default is inspect.Parameter.empty or p.kind not in (
                p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            continue
        flag = "--" + name.replace("_", "-")
        if flag in ap._option_string_actions:
            raise _Usage(f"build() parameter {name!r} clashes with the run option {flag}; "
                         f"rename the parameter")
        text = helps.get(name, "")
        if isinstance(p.default, bool):
            own.add_argument(flag, dest=f"prog_{name}", action=argparse.BooleanOptionalAction,
                             default=p.default, help=text)
        else:
            kind = type(p.default) if p.default is not None else str
            own.add_argument(flag, dest=f"prog_{name}", type=kind, default=p.default,
                             help=f"{text} (default {p.default})".strip())
        params.append(name)
    return ap, params


def run_main(build: Callable, argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """Parse options, build the graph, run it, print what its snapshots showed."""
    prog = prog or f"python {Path(sys.argv[0]).name}"
    try:
        ap, params = _parser(build, prog)
    except _Usage as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    args = ap.parse_args(argv)
    try:
        given = _given(build, prog, argv)
        if "kill_after" in given and not args.kill:
            raise _Usage("--kill-after says when --kill kills a worker: give --kill too")
        for what in ("diagram", "view"):
            v = getattr(args, what)
            if v and Path(v).suffix.lower() not in (".png", ".svg"):
                raise _Usage(f"--{what} file must end in .png or .svg, got {v!r}")
        if args.kill and args.engine != "spark":
            raise _Usage("--kill needs --engine spark (it kills a Spark Python worker)")
        graph = build(**{n: getattr(args, f"prog_{n}") for n in params})
        from ..api import Pipeline
        from .api import ProcessGraph

        if isinstance(graph, Pipeline):
            refused = [f"--{dest.replace('_', '-')}" for dest in GRAPH_ONLY if dest in given]
            if refused:
                raise _Usage(
                    f"{', '.join(refused)}: {'an option' if len(refused) == 1 else 'options'} "
                    f"of process-graph runs, which a pipeline's run does not take: "
                    "its program sets them (Pipeline(parallelism=...), "
                    "CheckpointConfig(interval=..., retained=...)). A pipeline's run "
                    "options: --engine, --storage, --restore, --timeout, --kill, "
                    "--kill-after")
            return _run_pipeline(graph, args)
        if not isinstance(graph, ProcessGraph):
            raise _Usage(f"build() returned {type(graph).__name__}, not a ProcessGraph "
                         "or a Pipeline")
        return _run(graph, args)
    except (_Usage, ValueError, FileNotFoundError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2


GRAPH_ONLY = ("tasks", "snapshot_interval", "initiators", "max_concurrent", "retain",
              "duration", "seed", "diagram", "view", "snapshot", "window", "rows", "format")
"""Run options a pipeline's run does not take (its program sets parallelism and checkpoint
settings; no diagram, view or snapshot table): refused for a pipeline, naming them."""


def _given(build: Callable, prog: str, argv: Sequence[str] | None) -> set[str]:
    """The options given on the command line (their ``dest``), whatever their values: the
    same parser, every default suppressed (abbreviations and ``--opt=value`` as argparse
    reads them)."""
    ap, _ = _parser(build, prog)
    for action in ap._actions:
        action.default = argparse.SUPPRESS
    return set(vars(ap.parse_args(argv)))


def _with_storage(pipeline: Any, url: str) -> Any:
    """``pipeline`` with its checkpoints in ``url`` (``--storage``): the program's
    ``storage_options`` are kept for a URL of the same scheme (its endpoint, its
    credentials), dropped for another (they were another filesystem's)."""
    def scheme(u: str) -> str:
        return u.split("://", 1)[0] if "://" in u else "file"

    cfg = pipeline.checkpoint
    same = scheme(url) == scheme(cfg.storage)
    return pipeline.with_checkpoint(storage=url,
                                    storage_options=cfg.storage_options if same else None)


def _run_pipeline(pipeline: Any, args: argparse.Namespace) -> int:
    """``cutline run`` of a program whose build() returns a Pipeline: run it (with a
    ``--kill`` of a worker after ``--kill-after`` checkpoints; ``--storage``: its checkpoint
    storage), print its checkpoints, and hand the result to the pipeline's
    ``after_run(result)`` if it has one (its exit code).  A run that fails or is refused
    prints its message (exit status 1), as a process graph's does."""
    from ..report import checkpoint_table
    from ..spark.launcher import USER_ERRORS

    console = terminal.console()
    if args.storage:
        pipeline = _with_storage(pipeline, args.storage)
    kill = None
    if args.kill:
        from ..spark.faults import Kill

        kill = Kill(after_checkpoint=args.kill_after, delay=0.2)
    try:
        result = pipeline.run(engine=args.engine, on_start=kill, restore_from=args.restore,
                              timeout=args.timeout, progress=console)
    except KeyboardInterrupt:
        raise
    except USER_ERRORS as exc:
        print(f"cutline: error: {exc}", file=sys.stderr)
        return 1
    if kill is not None and kill.killed:
        slot, pid, _ = kill.killed[0]
        console.print(f"killed Spark Python worker pid {pid} (slot {slot}) with SIGKILL; "
                      f"the job ran {result.attempts} attempts")
    console.print(checkpoint_table(result))
    after = getattr(pipeline, "after_run", None)
    return int(after(result) or 0) if callable(after) else 0


def _run(graph: Any, args: argparse.Namespace) -> int:
    from ..spark.graph import JobFailed

    kill = None
    if args.kill:
        from ..spark.faults import Kill

        kill = Kill(after_checkpoint=args.kill_after, delay=0.0)
    interval = args.snapshot_interval or None
    if args.format == "table":
        where = (f"{args.tasks} Spark task(s)" if args.engine == "spark"
                 else f"{args.tasks} thread host(s)")
        console.print(f"[bold]{graph.name}[/]: {len(graph.processes)} processes, "
                      f"{len(graph.edges)} channels on {where}; "
                      + (f"a snapshot every {interval:g} s" if interval else
                         "snapshots started by processes")
                      + (f"; restoring {args.restore}" if args.restore else ""))
    try:
        result = graph.run(
            engine=args.engine, tasks=args.tasks, snapshot_interval=interval,
            initiators=args.initiators, max_concurrent=args.max_concurrent,
            storage=args.storage, retained=args.retain, restore_from=args.restore,
            duration=args.duration, timeout=args.timeout, seed=args.seed,
            trace=bool(args.diagram), on_start=kill)
    except JobFailed as exc:
        print(f"cutline: error: {exc}", file=sys.stderr)
        return 1
    if args.format == "json":
        print(json.dumps(_summary(result, kill), default=str))
    else:
        _print(result, args, kill)
    if args.diagram:
        out = result.diagram(args.diagram, snapshot=args.snapshot, window=args.window)
        if args.format == "table":
            console.print(f"space-time diagram written to [bold]{out}[/]", soft_wrap=True)
    if args.view:
        out = result.view(args.view, snapshot=args.snapshot)
        if args.format == "table":
            console.print(f"snapshot view written to [bold]{out}[/]")
    return 1 if result.violations else 0


def _summary(result: Any, kill: Any) -> dict:
    durations = sorted(s.duration for s in result.snapshots if s.duration is not None)
    return {
        "job": result.job, "stopped": result.stopped, "duration": round(result.duration, 3),
        "attempts": len(result.attempts), "storage": result.storage,
        "restored_from": result.restored_from, "delivered": result.delivered,
        "snapshots": [s.summary() for s in result.snapshots],
        "stopped_by": result.stopped_by.id if result.stopped_by else None,
        "violations": [{"snapshot": n, **c.as_dict()} for n, c in result.violations],
        "snapshot_duration_p50": durations[len(durations) // 2] if durations else None,
        "killed": [{"slot": s, "pid": p, "time": t} for s, p, t in kill.killed] if kill else [],
    }


def _print(result: Any, args: argparse.Namespace, kill: Any) -> None:
    snaps = result.snapshots
    names = []
    for s in snaps:
        for c in s.checks:
            if c.name not in names:
                names.append(c.name)
    shown = snaps[-args.rows:] if args.rows > 0 else []
    t = Table(title=f"{len(snaps)} snapshots" + (f" (the last {len(shown)})"
                                                   if len(shown) < len(snaps) else ""))
    for col in ("snapshot", "attempt", "initiators", "at (s)", "took (ms)", "passive",
                "in transit"):
        t.add_column(col, justify="left" if col == "initiators" else "right")
    for n in names:
        t.add_column(n)
    for s in shown:
        checks = {c.name: c for c in s.checks}
        cells = []
        for n in names:
            c = checks.get(n)
            if c is None:
                cells.append("")
            elif c.kind == "stable":
                cells.append("[green]yes[/]" if c.holds else "no")
            else:
                cells.append(f"[green]✓[/] {c.detail}" if c.holds else f"[red]✗ {c.detail}[/]")
        t.add_row(str(s.id), str(s.attempt), ", ".join(s.initiators) or "-",
                  f"{s.completed:.2f}", f"{(s.duration or 0) * 1000:.0f}",
                  f"{sum(s.passive.values())}/{len(s.passive)}", str(s.in_transit), *cells)
    if shown:
        console.print(t)
    for n in names:
        history = [(s.id, c) for s in snaps for c in s.checks if c.name == n]
        if history and history[0][1].kind == "invariant":
            bad = [i for i, c in history if not c.holds]
            if bad:
                console.print(f"[red]✗ {n}: violated on snapshot(s) "
                              f"{', '.join(map(str, bad[:10]))}[/] - first: "
                              f"{next(c.detail for i, c in history if not c.holds)}")
            else:
                console.print(f"[green]✓[/] {n}: holds on every snapshot ({len(history)})")
    if result.stopped_by is not None:
        s = result.stopped_by
        why = next((c for c in s.checks if result.stopped.startswith(c.name)), None)
        console.print(f"run ended: [bold]{result.stopped}[/] on snapshot {s.id}"
                      + (f" ({why.detail})" if why is not None and why.name != "terminated"
                         else "") + ", "
                      f"{s.completed:.2f} s after the start ({sum(s.passive.values())} "
                      f"passive, {s.in_transit} in transit); {result.delivered:,} messages "
                      f"delivered in the last attempt")
    else:
        console.print(f"run ended: [bold]{result.stopped or 'finished'}[/] after "
                      f"{result.duration:.2f} s")
    if result.restored_from and result.attempts:
        a = result.attempts[0]
        console.print(f"restored snapshot {a.restored_id} from {result.restored_from}: "
                      f"{a.redelivered} message(s) in transit delivered again")
    if kill is not None and kill.killed:
        slot, pid, at = kill.killed[0]
        line = f"killed Spark Python worker pid {pid} (task {slot}) with SIGKILL"
        later = [a for a in result.attempts if a.started > at]
        if later:
            a = later[0]
            line += (f"; attempt {a.number} started {a.started - at:.2f} s later from "
                     + (f"snapshot {a.restored_id} ({a.redelivered} in transit, delivered "
                        f"again)" if a.restored_from else "the beginning"))
            first = next((s for s in snaps if s.attempt == later[0].number), None)
            if first is not None:
                line += (f"; its first snapshot completed "
                         f"{result.started_at + first.completed - at:.2f} s after the kill")
        console.print(line)
    elif kill is not None:
        console.print("[yellow]--kill: the run ended before a worker could be killed[/]")
    durations = sorted(s.duration for s in snaps if s.duration is not None)
    if durations:
        console.print(f"{len(snaps)} snapshots in {result.duration:.2f} s; snapshot duration "
                      f"p50 {durations[len(durations) // 2] * 1000:.0f} ms, max "
                      f"{durations[-1] * 1000:.0f} ms; "
                      + (f"stored in {result.storage}" if args.storage else
                         "not kept (--storage URL keeps them)"))


# ---------------------------------------------------------------------- snapshots


def snapshots_main(args: argparse.Namespace) -> int:
    from .snapshot import list_snapshots, load_snapshot

    if args.action == "list":
        rows = list_snapshots(args.path)
        if args.format == "json":
            print(json.dumps(rows, default=str))
            return 0
        t = Table(title=f"snapshots in {args.path}")
        names: list[str] = []
        for r in rows:
            names += [c["name"] for c in r["checks"] if c["name"] not in names]
        for col in ("id", "directory", "attempt", "started by", "completed (s)", "passive",
                    "in transit", *names):
            t.add_column(col, justify="right" if col in ("id", "attempt", "completed (s)",
                                                          "passive", "in transit") else "left")
        for r in rows:
            checks = {c["name"]: c for c in r["checks"]}
            cells = []
            for n in names:
                c = checks.get(n)
                if c is None:
                    cells.append("")
                elif c["kind"] == "invariant":
                    cells.append("[green]✓[/]" if c["holds"] else "[red]✗[/]")
                else:
                    cells.append("[green]yes[/]" if c["holds"] else "no")
            t.add_row(str(r["id"]), r["path"].rstrip("/").rsplit("/", 1)[-1],
                      str(r["attempt"]),
                      ("driver: " if r.get("by_driver") else "") + ", ".join(r["initiators"]),
                      f"{r['completed']:.2f}" if r["completed"] is not None else "",
                      f"{r['passive']}/{r['processes']}", str(r["in_transit"]), *cells)
        console.print(t)
        if not rows:
            console.print("no completed process-graph snapshot there")
        return 0
    snap = load_snapshot(args.path)
    if args.format == "json":
        out = snap.summary()
        out["states"] = snap.states
        out["channels"] = {f"{a}->{b}": m for (a, b), m in snap.channels.items()}
        out["timers"] = snap.timers
        print(json.dumps(out, default=repr))
    else:
        t = Table(title=f"snapshot {snap.id} ({snap.path}), initiated by "
                        f"{', '.join(snap.initiators) or '-'}")
        t.add_column("process")
        t.add_column("passive")
        t.add_column("state")
        t.add_column("pending timers", justify="right")
        for p, state in snap.states.items():
            t.add_row(p, "yes" if snap.passive[p] else "no", _short(state, 90),
                      str(len(snap.timers.get(p) or ())))
        console.print(t)
        c = Table(title=f"messages in transit ({snap.in_transit})")
        c.add_column("channel")
        c.add_column("count", justify="right")
        c.add_column("messages, in order")
        for (a, b), msgs in snap.channels.items():
            if msgs or args.all:
                c.add_row(f"{a}->{b}", str(len(msgs)), _short(msgs, 90) if msgs else "")
        console.print(c)
        for ch in snap.checks:
            if ch.kind == "invariant":
                console.print(f"{'[green]✓[/]' if ch.holds else '[red]✗[/]'} {ch.name}: "
                              f"{ch.detail}")
            else:
                console.print(f"{ch.name}: {'[green]yes[/]' if ch.holds else 'no'} "
                              f"({ch.detail})")
    if args.view:
        from .pictures import snapshot_view

        view = snapshot_view(snap, args.view)
        if args.format == "table":
            console.print(f"snapshot view written to [bold]{view}[/]")
    return 0


def _short(value: Any, width: int) -> str:
    text = repr(value)
    return text if len(text) <= width else text[: width - 1] + "…"
