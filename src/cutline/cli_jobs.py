"""Job operations: ``cutline checkpoints list|show``, ``cutline savepoint``, ``cutline chaos``."""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    ck = sub.add_parser("checkpoints", help="list and show checkpoints and savepoints",
                        description="Inspect completed checkpoints and savepoints.")
    cs = ck.add_subparsers(dest="checkpoints_command", required=True, metavar="ACTION")
    show = cs.add_parser("show", help="operators, sizes and key counts of one checkpoint",
                         description="Show one checkpoint or savepoint: its operators, "
                                     "state sizes, keys, windows, source positions, pending "
                                     "sink transactions, in-flight records, timers, "
                                     "watermarks and late records dropped.  Given a job "
                                     "directory (<storage>/<job>), its latest completed "
                                     "checkpoint.")
    show.add_argument("path", help="a checkpoint or savepoint directory, or a job directory "
                                   "for its latest checkpoint (path or URL)")
    show.add_argument("--format", choices=["table", "json"], default="table")
    ls = cs.add_parser("list", help="the completed checkpoints and savepoints of a job")
    ls.add_argument("storage", help="the checkpoint storage URL (CheckpointConfig.storage)")
    ls.add_argument("job", help="the pipeline's name")
    ls.add_argument("--format", choices=["table", "json"], default="table")
    sp = sub.add_parser("savepoint", help="take a savepoint of a running job (and stop it)",
                        description="Ask the running job whose checkpoints go to STORAGE "
                                    "for a savepoint; prints its path.  With --stop the job "
                                    "stops once the savepoint is complete and its sinks "
                                    "committed; `Pipeline.run(restore_from=PATH)` resumes.")
    sp.add_argument("storage", help="the checkpoint storage URL (CheckpointConfig.storage)")
    sp.add_argument("job", help="the pipeline's name")
    sp.add_argument("--stop", action="store_true", help="stop the job with the savepoint")
    sp.add_argument("--timeout", type=float, default=600.0, help="seconds to wait")
    ch = sub.add_parser("chaos", help="run an example while killing its workers, check output",
                        description="Run an example program (it defines chaos_job()) on "
                                    "embedded Spark while a seeded killer sends kill -9 to "
                                    "random Spark Python workers KILLS times, some while the "
                                    "job restores; then compare the committed output with "
                                    "the failure-free output.  Exit 0 when nothing was lost "
                                    "or duplicated (at_least_once: nothing lost).")
    ch.add_argument("example", help="the example program, e.g. examples/wordcount.py")
    ch.add_argument("--kills", type=int, default=10)
    ch.add_argument("--seed", type=int, default=0)
    ch.add_argument("--mode", default="aligned",
                    choices=["aligned", "unaligned", "aligned_timeout", "at_least_once"])
    ch.add_argument("--records", type=int, default=None,
                    help="input records (default: the example's, scaled to --kills)")
    ch.add_argument("--mean-delay", type=float, default=1.0,
                    help="mean seconds from an attempt's start to its kill")
    ch.add_argument("--format", choices=["table", "json"], default="table")


def _watermark(op: dict) -> str:
    """An operator's event-time watermark for a table: UTC time for epoch seconds."""
    if "watermark" not in op:
        return "-"
    from .protocol.watermarks import decode_ts
    from .report import format_event_time

    return format_event_time(decode_ts(op["watermark"]))


def _late(op: dict) -> str:
    """A window's late records dropped, in all and per subtask when several dropped some."""
    if "late_records" not in op:
        return "-"
    by = {k: n for k, n in sorted((op.get("late_by_subtask") or {}).items()) if n}
    text = f"{op['late_records']:,}"
    if len(by) > 1:
        text += " (" + ", ".join(f"#{k}: {n:,}" for k, n in by.items()) + ")"
    return text


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return str(n)  # pragma: no cover


def run(args: argparse.Namespace) -> int:
    from rich.table import Table

    from . import terminal

    from .state.reader import summary
    from .storage.checkpoints import CheckpointStorageError

    console = terminal.console()  # piped: tables at their natural width, not cut at 80
    if args.command == "chaos":
        return _chaos(args, console)
    if args.command == "savepoint":
        from .driver.admin import request_savepoint
        from .storage.checkpoints import CheckpointStorage

        try:
            path = request_savepoint(CheckpointStorage(args.storage, args.job, read_only=True),
                                     stop=args.stop, timeout=args.timeout)
        except (RuntimeError, CheckpointStorageError, OSError, ValueError) as exc:
            print(f"cutline: error: {exc}", file=sys.stderr)
            return 1
        print(path)
        return 0
    if args.checkpoints_command == "show":
        try:
            handle, picked = _checkpoint_to_show(args.path)
            info = summary(handle)
        except (CheckpointStorageError, OSError, ValueError) as exc:
            print(f"cutline: error: {exc}", file=sys.stderr)
            return 1
        info["logs"] = str(_logs(handle, info["job"]))
        if args.format == "json":
            if picked:
                print(f"cutline: {picked}", file=sys.stderr)
            print(json.dumps(info, indent=2, default=str))
            return 0
        if picked:
            console.print(picked, highlight=False, soft_wrap=True)
        kind = ("savepoint" if info["savepoint"] else
                "final checkpoint" if info.get("final") else "checkpoint")
        console.print(f"[bold]{kind} {info['id']}[/] of job {info['job']!r} at {info['path']}"
                      f"  mode {info['mode']}, {info['tasks']} task states, "
                      f"{_size(info['state_bytes'])}")
        table = _show_table(info, with_uids=True)
        natural = console.measure(table, options=console.options.update_width(10**6))
        if natural.maximum > console.width:  # no room for the uids: the names alone
            table = _show_table(info, with_uids=False)
        console.print(table)
        fired = sum(op.get("fired_at_end") or 0 for op in info["operators"])
        if fired:
            console.print(
                "windows: held (open, or fired and kept for allowed_lateness: a row each in "
                f"cutline.state.read) + fired at end: {fired:,} the end of input fired, only "
                "remembered (no row, no key): a record for one in a run continued from here "
                "is late", highlight=False, soft_wrap=True)
        console.print(f"run logs: {info['logs']}", highlight=False, soft_wrap=True)
        return 0
    try:
        rows = _list_checkpoints(args.storage, args.job)
    except (CheckpointStorageError, OSError, ValueError, ImportError) as exc:
        print(f"cutline: error: {exc}", file=sys.stderr)
        return 1
    corrupt = [r for r in rows if r["kind"] == "corrupt"]
    if args.format == "json":
        print(json.dumps(rows, indent=2))
    else:
        t = Table(title=f"job {args.job!r} in {args.storage}")
        for col in ("id", "kind", "tasks", "state", "path"):
            t.add_column(col)
        for r in rows:
            kind = "final checkpoint" if r.get("final") else r["kind"]
            t.add_row(str(r["id"]), kind, str(r["tasks"]), _size(r["bytes"]), r["path"])
        console.print(t)
        if not rows:
            print(f"cutline: job {args.job!r} has no checkpoints in {args.storage} yet",
                  file=sys.stderr)
    for r in corrupt:
        print(f"cutline: error: {r['error']}", file=sys.stderr)
    return 1 if corrupt else 0


def _show_table(info: dict, *, with_uids: bool) -> Any:
    """``checkpoints show``'s table: operators by the dashboard's names, with a ``uid``
    column (``with_uids``) when cutline named some of them."""
    from rich.table import Table

    t = Table()
    ops = info["operators"]
    uids = with_uids and any(op["name"] != op["uid"] for op in ops)
    # late records dropped: a column once a window dropped some (JSON: every window's)
    late = any(op.get("late_records") for op in ops)
    windows = any("windows" in op for op in ops)
    for col in ("operator", *(["uid"] if uids else []), "kind", "parallelism", "keyed state",
                "keys", *(["windows"] if windows else []), "source position",
                "pending sink transactions", "in-flight", "timers", "watermark",
                *(["late dropped"] if late else [])):
        t.add_column(col, justify="left" if col in ("operator", "uid", "kind") else "right")
    for op in ops:
        t.add_row(op["name"], *([op["uid"] if op["uid"] != op["name"] else ""] if uids else []),
                  op["kind"] or "-", str(op["parallelism"] or "-"),
                  _size(op["bytes"]) if op["tasks"] else "-",
                  f"{op['keys']:,}" if op["tasks"] else "-",
                  *([_windows(op)] if windows else []),
                  "yes" if op.get("source") else "-",
                  str(op.get("pending_transactions", "-")),
                  _size(op["in_flight_bytes"]) if op.get("in_flight_bytes") else "-",
                  f"{op['timers']:,}" if op.get("timers") else "-", _watermark(op),
                  *([_late(op)] if late else []))
    return t


def _windows(op: dict) -> str:
    """A window operator's windows held, and those the end of input fired and it only
    remembers (``+ N fired at end``)."""
    if "windows" not in op:
        return "-"
    text = f"{op['windows']:,}"
    if op.get("fired_at_end"):
        text += f" + {op['fired_at_end']:,} fired at end"
    return text


_JOB_ENTRY = re.compile(r"^(chk-\d+|savepoint-\d+-.+|_lease-\d+|_job\.json|history\.jsonl|"
                        r"report\.html|shared|logs)$")
_CHECKPOINT_DIR = re.compile(r"^(chk-\d+|savepoint-\d+-.+)$")


def _checkpoint_to_show(path: str) -> tuple[Any, str | None]:
    """The checkpoint ``checkpoints show PATH`` shows, and a line saying which one it picked
    when PATH is not a checkpoint: a job directory's latest completed checkpoint; a
    storage root's only job's.  A storage root with several jobs, or a job without a
    completed checkpoint, is an error saying so (the latter naming its run logs)."""
    from fsspec.core import url_to_fs

    from .storage.checkpoints import (
        CheckpointNotFoundError,
        CheckpointStorage,
        open_checkpoint,
    )

    try:
        return open_checkpoint(path), None
    except CheckpointNotFoundError:
        fs, root = url_to_fs(path)
        root = fs._strip_protocol(root).rstrip("/") or "/"
        name = root.rsplit("/", 1)[-1]
        if _CHECKPOINT_DIR.match(name) or not fs.isdir(root):
            raise  # a checkpoint not completed (yet), or no such directory: it says so
    url = fs.unstrip_protocol(root)
    jobs = [] if _is_job_dir(fs, root) else sorted(
        p.rstrip("/").rsplit("/", 1)[-1] for p in _subdirs(fs, root) if _is_job_dir(fs, p))
    if not _is_job_dir(fs, root) and len(jobs) != 1:
        if jobs:
            raise CheckpointNotFoundError(
                f"{url} is a checkpoint storage with {len(jobs)} jobs ({', '.join(jobs)}): "
                f"show one of them, e.g. cutline checkpoints show {url}/{jobs[0]}")
        raise CheckpointNotFoundError(
            f"{url} is no checkpoint, savepoint, job directory (<storage>/<job>) or "
            "checkpoint storage: it holds no _metadata, checkpoints or jobs")
    job_dir = root if not jobs else f"{root}/{jobs[0]}"
    job = job_dir.rsplit("/", 1)[-1]
    parent = job_dir.rsplit("/", 1)[0] or "/"
    storage = CheckpointStorage(fs.unstrip_protocol(parent), job, read_only=True)
    handle = storage.latest(deep=False)
    job_url = fs.unstrip_protocol(job_dir)
    if handle is None:
        savepoints = sorted(n for n in storage._entries() if n.startswith("savepoint-"))
        from .driver.logs import job_log_dir

        raise CheckpointNotFoundError(
            f"job {job!r} ({job_url}) has no completed checkpoint: its runs failed or "
            "stopped before their first one, or its checkpoints were deleted"
            + (f"; its savepoints: {', '.join(savepoints)} (show one: "
               f"cutline checkpoints show {job_url}/{savepoints[-1]})" if savepoints else "")
            + f". Its run logs: {job_log_dir(fs, job_dir, job)}")
    where = (f"job directory {job_url}" if not jobs else
             f"checkpoint storage {url}, its only job {job!r}")
    return handle, (f"{where}: its latest completed checkpoint, "
                    f"{handle.path.rsplit('/', 1)[-1]} (all of them: cutline checkpoints "
                    f"list {fs.unstrip_protocol(parent)} {job})")


def _subdirs(fs: Any, directory: str) -> list[str]:
    try:
        return [e["name"] for e in fs.ls(directory, detail=True)
                if e.get("type") == "directory"]
    except (FileNotFoundError, NotADirectoryError):
        return []


def _is_job_dir(fs: Any, directory: str) -> bool:
    """Whether ``directory`` is a job's: it holds what a run writes there (checkpoints,
    savepoints, its lease, its run logs, history.jsonl ...)."""
    try:
        names = fs.ls(directory, detail=False)
    except (FileNotFoundError, NotADirectoryError):
        return False
    return any(_JOB_ENTRY.match(p.rstrip("/").rsplit("/", 1)[-1]) for p in names)


def _logs(handle: Any, job: str) -> Any:
    """The folder of the job's run logs (driver.logs)."""
    from .driver.logs import job_log_dir

    return job_log_dir(handle._fs, handle._job_dir, job)


def _list_checkpoints(storage_url: str, job: str) -> list[dict[str, Any]]:
    """Every checkpoint and savepoint directory of ``job``: complete ones, incomplete ones
    (no ``_metadata`` yet: in progress or abandoned) and corrupt ones (with why)."""
    from .storage.checkpoints import (
        CheckpointNotFoundError,
        CheckpointStorage,
        CheckpointStorageError,
    )

    storage = CheckpointStorage(storage_url, job, read_only=True)
    rows: list[dict[str, Any]] = []
    for name, path in sorted(storage._entries().items()):
        m = re.match(r"^(chk|savepoint)-(\d+)", name)
        if m is None:
            continue  # shared/, _job.json, ...
        row: dict[str, Any] = {"id": int(m.group(2)), "savepoint": m.group(1) != "chk",
                               "path": storage.fs.unstrip_protocol(path),
                               "tasks": 0, "bytes": 0, "time": None, "final": False}
        try:
            h = storage.open(name)
            h.verify(deep=False)
        except CheckpointNotFoundError:
            row["kind"] = "incomplete"
        except CheckpointStorageError as exc:
            row["kind"], row["error"] = "corrupt", f"{name} of job {job!r} is corrupt: {exc}"
        else:
            # final: the last checkpoint of a bounded run (its input read to the end)
            row.update(kind="savepoint" if h.is_savepoint else "checkpoint", path=h.path,
                       final=bool(h.metadata.get("final")),
                       bytes=sum(int(i.get("size") or 0) for i in h.states.values()),
                       tasks=len(h.states), time=h.metadata.get("time"))
        rows.append(row)
    rows.sort(key=lambda r: r["id"])
    return rows


def _chaos(args: argparse.Namespace, console: Any) -> int:
    from dataclasses import asdict

    from .spark.chaos import run_chaos

    if args.kills < 0:
        raise ValueError(f"--kills must be >= 0, got {args.kills}")
    records = args.records or max(40_000, args.kills * 4_000)
    if args.format == "table":
        console.print(f"[bold]cutline chaos[/] {args.example}: {args.kills} kills (seed "
                      f"{args.seed}), mode {args.mode}, {records:,} records")
    report = run_chaos(args.example, args.kills, args.seed, args.mode, records,
                       mean_delay=args.mean_delay,
                       progress=console if args.format == "table" else False)
    ok = report.lost == 0 and (report.duplicated == 0 or args.mode == "at_least_once") \
        and not report.orphans
    if args.format == "json":
        print(json.dumps({**asdict(report), "ok": ok}, indent=2))
        return 0 if ok else 1
    console.print(
        f"{report.kills} kills ({report.during_recovery} while a new attempt restored), "
        f"{report.attempts} attempts, {report.checkpoints} checkpoints, "
        f"{report.seconds:.0f} s")
    console.print(f"storage: {len(report.retained)} checkpoints/savepoints retained, "
                  f"{len(report.orphans)} orphaned files"
                  + (": " + ", ".join(report.orphans[:5]) if report.orphans else ""))
    console.print(f"committed {report.committed:,} rows, expected {report.expected:,}: "
                  f"{report.lost} lost, {report.duplicated} duplicated -> "
                  + ("[green]exactly once[/]" if report.exact else
                     "[yellow]at least once[/]" if ok else "[red]WRONG[/]"))
    return 0 if ok else 1
