"""Keyed operator loops (``count``, ``reduce``, ``process`` with value state), this checkout
against an older commit, side by side.

Run ``python bench/state_ops.py`` (``--quick`` for a short run).  Each round starts one
worker process per code version (the order alternates between rounds); a worker imports
cutline from its version's ``src/`` and runs every case once: a keyed operator subtask
owning all 128 key groups, warmed with every key once (a long-running job's steady state),
then timed over ``--records`` records in batches of ``--batch`` keyed by ``--keys``
distinct string keys, on the in-memory and the RocksDB backend (``process`` counts with a
value state: ``ctx.value_state("n", 0)``, read, update, emit), followed by one snapshot
whose synchronous part (what stops the task) is timed too.  The older version is
``git archive``'d from ``--old`` (default: the commit before the keyed-state interface).

Medians over the rounds and new/old ratios are printed (records/s: > 1 is faster; snapshot
time: < 1 is faster).  Exit code is always 0: a benchmark, not a test.  Results also go to
``bench/results/state_ops.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEFAULT_OUT = HERE / "results" / "state_ops.json"
MAXP = 128
OPS = ("count", "reduce", "process")
BACKENDS = ("memory", "rocksdb")


# --------------------------------------------------------------------------- worker

def _add(a: tuple, b: tuple) -> tuple:
    return (a[0], a[1] + b[1])


def _count_in_value_state(ctx: Any, record: Any) -> list:
    n = ctx.value_state("n", 0)
    v = n.value + 1
    n.update(v)
    return [(ctx.key, v)]


def _run_case(op_kind: str, backend: str, keys: int, records: int, batch: int,
              seed: int) -> dict[str, float]:
    from cutline.logical import make_node
    from cutline.runtime.registry import build_operator

    rnd = random.Random(seed)
    names = [f"k{i}" for i in range(keys)]
    picks = [names[rnd.randrange(keys)] for _ in range(records)]
    if op_kind == "count":
        node = make_node(0, "count", "count", key_fn=lambda r: r)
        warm, recs = names, picks
    elif op_kind == "process":
        node = make_node(0, "process", "process", fn=_count_in_value_state, key_fn=lambda r: r)
        warm, recs = names, picks
    else:
        node = make_node(0, "reduce", "reduce", fn=_add, key_fn=lambda r: r[0])
        warm, recs = [(k, 1) for k in names], [(k, 1) for k in picks]
    op = build_operator(node, 0, 1, MAXP, state_backend=backend)
    try:
        for i in range(0, len(warm), batch):
            op.process(warm[i:i + batch])
        t = time.perf_counter()
        for i in range(0, records, batch):
            op.process(recs[i:i + batch])
        elapsed = time.perf_counter() - t
        t = time.perf_counter()
        snap = op.snapshot()
        sync = time.perf_counter() - t
        del snap  # an unfinished RocksDB snapshot removes its local files
        return {"records_per_s": records / elapsed, "snapshot_sync_ms": sync * 1000}
    finally:
        op.close()


def worker(src: str, cases: list[tuple[str, str, int]], records: int, batch: int,
           seed: int) -> None:
    sys.path.insert(0, src)
    import cutline

    where = os.path.realpath(cutline.__file__)
    if not where.startswith(os.path.realpath(src)):
        raise SystemExit(f"imported cutline from {where}, not from {src}")
    os.environ.setdefault("SPARK_LOCAL_DIRS", tempfile.gettempdir())
    out = {}
    for o, b, k in cases:
        t = time.perf_counter()
        out[f"{o}/{b}/{k}"] = _run_case(o, b, k, records, batch, seed)
        print(f"  {src}: {o}/{b}/{k} {time.perf_counter() - t:.1f} s", file=sys.stderr)
    json.dump(out, sys.stdout)


# --------------------------------------------------------------------------- driver

def export_old(rev: str, dest: str) -> str:
    """``src/`` of ``rev`` (git archive) under ``dest``; returns that ``src`` directory."""
    data = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "src"],
                          check=True, capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(data)) as tar:
        tar.extractall(dest, filter="data")
    return os.path.join(dest, "src")


def run_worker(src: str, cases: list[tuple[str, str, int]], args: argparse.Namespace
               ) -> dict[str, dict[str, float]]:
    cmd = [sys.executable, __file__, "--worker", src, "--records", str(args.records),
           "--batch", str(args.batch), "--seed", str(args.seed),
           "--cases", ",".join(f"{o}/{b}/{k}" for o, b, k in cases)]
    env = dict(os.environ, PYTHONPATH=src)
    done = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True, env=env)
    return json.loads(done.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--old", default="be9b5d9", help="git revision to compare against")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--keys", default="10000,200000",
                    help="comma-separated numbers of distinct keys")
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="3 rounds of 200,000 records")
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--cases", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        cases = [(o, b, int(k)) for o, b, k in (c.split("/") for c in args.cases.split(","))]
        worker(args.worker, cases, args.records, args.batch, args.seed)
        return
    if args.quick:
        args.rounds, args.records = 3, 200_000
    keys = [int(k) for k in args.keys.split(",")]
    cases = [(o, b, k) for k in keys for o in OPS for b in BACKENDS]
    with tempfile.TemporaryDirectory(prefix="state-ops-") as tmp:
        versions = {"old": export_old(args.old, tmp), "new": str(ROOT / "src")}
        rounds: dict[str, list[dict[str, dict[str, float]]]] = {"old": [], "new": []}
        for r in range(args.rounds):
            order = ["old", "new"] if r % 2 == 0 else ["new", "old"]
            for v in order:
                rounds[v].append(run_worker(versions[v], cases, args))
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    result: dict[str, Any] = {"old": args.old, "records": args.records, "batch": args.batch,
                              "rounds": args.rounds, "cases": {}}
    print(f"\n{args.records:,} records per case, batches of {args.batch}, "
          f"median of {args.rounds} rounds; new = this checkout, old = {args.old}\n")
    print(f"{'case':<26}{'old rec/s':>12}{'new rec/s':>12}{'ratio':>7}"
          f"{'old snap ms':>13}{'new snap ms':>13}{'ratio':>7}")
    for o, b, k in cases:
        name = f"{o}/{b}/{k}"
        med = {v: {m: statistics.median(rd[name][m] for rd in rounds[v])
                   for m in ("records_per_s", "snapshot_sync_ms")} for v in rounds}
        rate = med["new"]["records_per_s"] / med["old"]["records_per_s"]
        snap = med["new"]["snapshot_sync_ms"] / med["old"]["snapshot_sync_ms"]
        spread = {v: [round(rd[name]["records_per_s"]) for rd in rounds[v]] for v in rounds}
        result["cases"][name] = {"median": med, "rate_ratio": rate, "snapshot_ratio": snap,
                                 "records_per_s": spread}
        print(f"{name:<26}{med['old']['records_per_s']:>12,.0f}"
              f"{med['new']['records_per_s']:>12,.0f}{rate:>7.2f}"
              f"{med['old']['snapshot_sync_ms']:>13.1f}{med['new']['snapshot_sync_ms']:>13.1f}"
              f"{snap:>7.2f}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
