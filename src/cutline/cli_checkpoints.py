"""``cutline checkpoints``: list a job's checkpoints and savepoints, show one."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    ck = sub.add_parser("checkpoints", help="list and show checkpoints and savepoints",
                        description="Inspect completed checkpoints and savepoints.")
    cs = ck.add_subparsers(dest="checkpoints_command", required=True, metavar="ACTION")
    show = cs.add_parser("show", help="operators, sizes and key counts of one checkpoint")
    show.add_argument("path", help="a checkpoint or savepoint directory (path or URL)")
    show.add_argument("--format", choices=["table", "json"], default="table")
    ls = cs.add_parser("list", help="the completed checkpoints and savepoints of a job")
    ls.add_argument("storage", help="the checkpoint storage URL (CheckpointConfig.storage)")
    ls.add_argument("job", help="the pipeline's name")
    ls.add_argument("--format", choices=["table", "json"], default="table")


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return str(n)  # pragma: no cover


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from .state.reader import summary
    from .storage.checkpoints import CheckpointStorageError, open_checkpoint

    console = Console()
    if args.checkpoints_command == "show":
        try:
            info = summary(open_checkpoint(args.path))
        except CheckpointStorageError as exc:
            print(f"cutline: error: {exc}", file=sys.stderr)
            return 1
        if args.format == "json":
            print(json.dumps(info, indent=2, default=str))
            return 0
        kind = "savepoint" if info["savepoint"] else "checkpoint"
        console.print(f"[bold]{kind} {info['id']}[/] of job {info['job']!r} at {info['path']}"
                      f"  mode {info['mode']}, {info['tasks']} task states, "
                      f"{_size(info['state_bytes'])}")
        t = Table()
        for col in ("operator", "kind", "parallelism", "keyed state", "keys", "source position",
                    "pending sink transactions", "in-flight"):
            t.add_column(col, justify="left" if col in ("operator", "kind") else "right")
        for op in info["operators"]:
            t.add_row(op["uid"], op["kind"] or "-", str(op["parallelism"] or "-"),
                      _size(op["bytes"]) if op["tasks"] else "-",
                      f"{op['keys']:,}" if op["tasks"] else "-",
                      "yes" if op.get("source") else "-",
                      str(op.get("pending_transactions", "-")),
                      _size(op["in_flight_bytes"]) if op.get("in_flight_bytes") else "-")
        console.print(t)
        return 0
    from .storage.checkpoints import CheckpointStorage

    storage = CheckpointStorage(args.storage, args.job)
    rows = []
    for name in sorted(storage._entries()):
        try:
            h = storage.open(name)
        except CheckpointStorageError:
            continue  # partial or not a checkpoint
        rows.append({"id": h.id, "savepoint": h.is_savepoint, "path": h.path,
                     "bytes": sum(int(i.get("size") or 0) for i in h.states.values()),
                     "tasks": len(h.states), "time": h.metadata.get("time")})
    rows.sort(key=lambda r: r["id"])
    if args.format == "json":
        print(json.dumps(rows, indent=2))
        return 0
    t = Table(title=f"job {args.job!r} in {args.storage}")
    for col in ("id", "kind", "tasks", "state", "path"):
        t.add_column(col)
    for r in rows:
        t.add_row(str(r["id"]), "savepoint" if r["savepoint"] else "checkpoint",
                  str(r["tasks"]), _size(r["bytes"]), r["path"])
    console.print(t)
    return 0
