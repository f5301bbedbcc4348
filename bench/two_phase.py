"""Before / after of issue 28 items 1-3 (two-phase aggregation, vectorised keyed state,
update streams sized by time), side by side in interleaved rounds.

Run ``python bench/two_phase.py --before /tmp/before/src`` where ``/tmp/before`` is a
``git worktree add /tmp/before <rev>`` of the code before them (``--after`` defaults to
this tree's ``src``).  Each tree's runs go to a process with ``PYTHONPATH`` set to its
``src`` (its Spark workers inherit it: every run's sink records which ``cutline`` its
tasks imported, and a run whose tasks imported another tree fails the benchmark).

**Input** (written once under ``--data``): ``--records`` (2 M) JSON lines ``{"ts", "user",
"value"}`` in files of ``--lines-per-file`` (100,000), ``--users`` (10,000) keys, 1,000
events per second of event time up to 0.9 s out of order.

**Queries**, parallelism 2, checkpoints every 1 s, the embedded Spark session
(``Pipeline.run()``):

* ``keyed columnar``: ``FileSource.batches(schema).key_by("user").count()``; before: one
  row per key per input batch merged key by key; after: the default, one partial per key
  and checkpoint from each source subtask (the combine), merged into numpy columns, one row
  per changed key per checkpoint.  ``keyed columnar after (updates=batch)``: the old
  output with the vectorised state, no combine.
* ``window columnar``: ``assign_timestamps("ts", max_delay=2).key_by("user")
  .window(tumbling(60)).count()``; after: the combine sends partials per key and window.
* ``keyed records``: ``FileSource`` (``json.loads`` per line) ``.key_by(user).count()``;
  before and after the default (a row per record: the same code path); after with
  ``updates="checkpoint"`` (the combine; a row per changed key per checkpoint).

**Timing**: each tree's runs go to one process of its own (``--serve``), which keeps the
embedded Spark session between runs (a first round of every case warms up, not measured); the
processing time (attempt 0 started -> final checkpoint completed, polled every 5 ms) is
the figure, beside ``Pipeline.run()``'s wall time; rounds rotate the cases' order.
Ratios are before / after of the same round's processing times, their median (and range)
over the rounds.  **Checked**: every run's output (the latest count per key, per key and
window) equals the input's counts computed in Python as it was written.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
AFTER = HERE.parent.parent / "src"
WINDOW = 60
CASES = {  # name -> (tree, query, options)
    "keyed columnar before": ("before", "keyed-col", {}),
    "keyed columnar after": ("after", "keyed-col", {}),
    "keyed columnar after (updates=batch)": ("after", "keyed-col", {"updates": "batch"}),
    "window columnar before": ("before", "window-col", {}),
    "window columnar after": ("after", "window-col", {}),
    "keyed records before": ("before", "keyed-rec", {}),
    "keyed records after": ("after", "keyed-rec", {}),
    "keyed records after (updates=checkpoint)": ("after", "keyed-rec",
                                                {"updates": "checkpoint"}),
}
PAIRS = [("keyed columnar before", "keyed columnar after"),
         ("keyed columnar before", "keyed columnar after (updates=batch)"),
         ("window columnar before", "window columnar after"),
         ("keyed records before", "keyed records after"),
         ("keyed records before", "keyed records after (updates=checkpoint)")]


# --------------------------------------------------------------------------- input

def event(i: int, users: int) -> dict:
    return {"ts": i / 1000 - (i * 7919 % 10) / 10, "user": f"u{i * 7 % users:05d}",
            "value": i % 100}


def ensure_input(data: Path, records: int, per_file: int, users: int) -> Path:
    d = data / f"{records}-{per_file}-{users}"
    if (d / "expected.pkl").exists():
        return d
    (d / "in").mkdir(parents=True, exist_ok=True)
    keyed: dict = {}
    windows: dict = {}
    for f in range(0, records, per_file):
        with open(d / "in" / f"part-{f // per_file:05d}.jsonl", "w") as out:
            for i in range(f, min(records, f + per_file)):
                e = event(i, users)
                out.write(json.dumps(e) + "\n")
                keyed[e["user"]] = keyed.get(e["user"], 0) + 1
                w = (e["user"], float(e["ts"] - e["ts"] % WINDOW))
                windows[w] = windows.get(w, 0) + 1
    with open(d / "expected.pkl", "wb") as fh:
        pickle.dump({"keyed": keyed, "window": windows}, fh)
    return d


# --------------------------------------------------------------------------- the child

class LatestSink:
    """Keeps the latest value per key (user, or user and window start); at each pre-commit
    the keys changed since the last one go to ``<path>/<subtask>-<checkpoint>.pkl`` with the
    path of the ``cutline`` package the task imported."""

    name = "latest"

    def __init__(self, path: str) -> None:
        self.path = path

    def create_writer(self) -> "LatestWriter":
        return LatestWriter(self.path)


class LatestWriter:
    def __init__(self, path: str) -> None:
        self.path, self.changed, self.subtask = path, {}, 0

    def open(self, subtask: int, parallelism: int, job: str) -> None:
        import cutline

        self.subtask, self.package = subtask, cutline.__file__
        os.makedirs(self.path, exist_ok=True)

    def write(self, batch: list) -> None:
        first = batch[0] if batch else None
        if first is None:
            return
        if hasattr(first, "num_rows"):
            for b in batch:
                cols = b.to_pydict()
                keys = zip(cols["user"], cols["start"]) if "start" in cols else cols["user"]
                self.changed.update(zip(keys, cols["count"]))
        elif hasattr(first, "start"):
            self.changed.update(((r.key, float(r.start)), r.value) for r in batch)
        else:
            self.changed.update(batch)

    def pre_commit(self, checkpoint_id: int) -> dict:
        name = os.path.join(self.path, f"{self.subtask}-{checkpoint_id:08d}.pkl")
        with open(name + ".tmp", "wb") as f:
            pickle.dump((self.package, self.changed), f)
        os.rename(name + ".tmp", name)
        self.changed = {}
        return {}

    def commit(self, handles: list) -> None:
        pass

    abort = recover = commit

    def close(self) -> None:
        pass


def user_of(e: dict) -> str:
    return e["user"]


def child(spec: dict) -> dict:
    import pyarrow as pa

    import cutline
    from cutline import CheckpointConfig, Pipeline
    from cutline.connectors import FileSource

    query, opts = spec["query"], spec["options"]
    p = Pipeline(f"two-phase-{query}", parallelism=2, checkpoint=CheckpointConfig(
        interval=1.0, storage=f"file://{spec['checkpoint']}"))
    source = FileSource(spec["input"])
    if query == "keyed-col":
        s = p.source(source.batches(pa.schema([("user", pa.string())])), uid="events")
        s = s.key_by("user").count(uid="counts", **opts)
    elif query == "window-col":
        s = p.source(source.batches(pa.schema([("ts", pa.float64()), ("user", pa.string())])),
                     uid="events")
        s = (s.assign_timestamps("ts", max_delay=2, uid="stamps").key_by("user")
             .window(cutline.tumbling(WINDOW)).count(uid="counts"))
    else:
        s = p.source(source, uid="events").key_by(user_of).count(uid="counts", **opts)
    s.sink(LatestSink(spec["out"]), uid="out")
    starts: list[float] = []

    def watch(driver: Any) -> None:
        def poll() -> None:
            while not driver.done.is_set():
                if driver.run.attempt.started and not starts:
                    starts.append(time.monotonic())
                time.sleep(0.005)
        threading.Thread(target=poll, daemon=True).start()

    t0 = time.monotonic()
    result = p.run(on_start=watch, timeout=1800, progress=False)
    wall = time.monotonic() - t0
    finals = [c for c in result.checkpoints if c.final]
    end = finals[-1].completed if finals else time.monotonic()
    return {"processing": end - (starts[0] if starts else t0), "run": wall,
            "attempts": result.attempts, "plan": result.plan,
            "package": cutline.__file__}


# --------------------------------------------------------------------------- per batch

def per_batch(args: argparse.Namespace) -> list[dict]:
    """Item 2 alone, in this process: one keyed aggregation subtask (count, sum, max, mean)
    fed the same record batches, its state merged key by key (``merge_partial`` per key and
    aggregate, the code before) or as numpy columns, interleaved batch by batch; seconds per
    batch (the ``group_by`` included, as the operator runs it), on memory and RocksDB."""
    import numpy as np
    import pyarrow as pa

    from cutline.logical import AggSpec, ColumnKey, make_node
    from cutline.runtime.registry import build_operator

    rows, keys = args.batch_rows, args.users
    spec = AggSpec(("user",), (("n", None, "count"), ("total", "value", "sum"),
                               ("hi", "value", "max"), ("avg", "value", "mean")), "batch")
    node = make_node(0, "agg", "aggregate", spec, key_fn=ColumnKey(("user",)), columnar=True)
    rng = np.random.default_rng(7)
    users = np.array([f"u{u:05d}" for u in range(keys)])
    batches = [pa.record_batch({"user": pa.array(users[rng.integers(0, keys, rows)]),
                                "value": pa.array(rng.integers(0, 100, rows))})
               for _ in range(args.batches)]
    out = []
    for backend in ("memory", "rocksdb"):
        ops = {}
        for mode in ("key by key", "columns"):
            op = build_operator(node, 0, 1, 128, state_backend=backend)
            if mode == "key by key":
                op.vectorised = False  # (None: columns, chosen on the first batch)
            ops[mode] = op
        grouped = [ops["columns"]._grouped([b]) for b in batches]
        ops["columns"].process([batches[0]])  # (builds its columns)
        ops["key by key"].process([batches[0]])
        times: dict[str, list[float]] = {m: [] for m in ops}
        merge: dict[str, list[float]] = {m: [] for m in ops}
        for i, b in enumerate(batches[1:]):
            for mode in (list(ops) if i % 2 else list(ops)[::-1]):
                op = ops[mode]
                t0 = time.perf_counter()
                op.process([b])
                t1 = time.perf_counter()
                key_cols, parts = grouped[i + 1]
                if mode == "columns":
                    op.columns.rows(op.columns.merge(key_cols, parts))
                else:
                    op._merge_keys(key_cols, parts)
                t2 = time.perf_counter()
                times[mode].append(t1 - t0)
                merge[mode].append(t2 - t1)
        for op in ops.values():
            op.close()
        med = {m: statistics.median(t) for m, t in times.items()}
        mm = {m: statistics.median(t) for m, t in merge.items()}
        out.append({"backend": backend, "rows": rows, "keys": keys,
                    "process_ms": {m: v * 1e3 for m, v in med.items()},
                    "merge_ms": {m: v * 1e3 for m, v in mm.items()},
                    "process_speedup": med["key by key"] / med["columns"],
                    "merge_speedup": mm["key by key"] / mm["columns"]})
        print(f"per batch, {backend:7s}: {rows} rows, {keys} keys: process() key by key "
              f"{med['key by key'] * 1e3:7.1f} ms, columns {med['columns'] * 1e3:7.1f} ms "
              f"(x{med['key by key'] / med['columns']:.2f}); the merge into state and the "
              f"output alone {mm['key by key'] * 1e3:7.1f} ms vs {mm['columns'] * 1e3:7.1f} ms "
              f"(x{mm['key by key'] / mm['columns']:.2f})", flush=True)
    return out


# --------------------------------------------------------------------------- the parent

def read_output(out: Path) -> tuple[dict, set]:
    latest: dict = {}
    packages = set()
    for f in sorted(out.glob("*.pkl"), key=lambda f: int(f.stem.split("-")[1])):
        with open(f, "rb") as fh:
            package, changed = pickle.load(fh)
        packages.add(package)
        latest.update(changed)
    return latest, packages


class Server:
    """A process running one tree's runs one after another (``--serve``): the embedded
    Spark session starts once, with the first run (a warm-up, not measured)."""

    def __init__(self, src: str) -> None:
        self.src = src
        self.proc = subprocess.Popen([sys.executable, str(HERE), "--serve"], text=True,
                                     env=dict(os.environ, PYTHONPATH=str(src)),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def run(self, spec_path: Path) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{spec_path}\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if line.strip() != "done":
            raise SystemExit(f"the run of {spec_path} failed ({self.src}): {line!r}")

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=120)


def run_case(name: str, args: argparse.Namespace, data: Path, n: int,
             servers: dict[str, Server]) -> dict:
    tree, query, opts = CASES[name]
    src = args.before if tree == "before" else args.after
    work = Path(args.work) / f"{query}-{tree}-{n}-{abs(hash(name)) % 10**6}"
    subprocess.run(["rm", "-rf", str(work)], check=True)
    work.mkdir(parents=True)
    spec = {"query": query, "options": opts, "input": str(data / "in"),
            "out": str(work / "out"), "checkpoint": str(work / "ck"),
            "result": str(work / "result.json")}
    (work / "spec.json").write_text(json.dumps(spec))
    t0 = time.monotonic()
    servers[tree].run(work / "spec.json")
    total = time.monotonic() - t0
    res = json.loads((work / "result.json").read_text())
    res["end_to_end"] = total
    latest, packages = read_output(work / "out")
    want_pkg = str(Path(src).resolve())
    if not all(str(Path(p).resolve()).startswith(want_pkg) for p in packages | {res["package"]}):
        raise SystemExit(f"{name}: ran {packages | {res['package']}}, not {want_pkg}")
    with open(data / "expected.pkl", "rb") as fh:
        expected = pickle.load(fh)["window" if query == "window-col" else "keyed"]
    if latest != expected:
        bad = [k for k in set(latest) | set(expected) if latest.get(k) != expected.get(k)]
        raise SystemExit(f"{name}: output differs from the input's counts on {len(bad)} "
                         f"keys, e.g. {sorted(bad)[:3]}")
    res["combined"] = "combine[" in res["plan"]
    subprocess.run(["rm", "-rf", str(work)], check=True)
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--serve", action="store_true", help="(runs the specs named on stdin)")
    ap.add_argument("--before", help="the src directory of the code before")
    ap.add_argument("--after", default=str(AFTER))
    ap.add_argument("--records", type=int, default=2_000_000)
    ap.add_argument("--lines-per-file", type=int, default=100_000)
    ap.add_argument("--users", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cases", default=";".join(CASES), help="case names, ;-separated")
    ap.add_argument("--data", default="/tmp/cutline-two-phase")
    ap.add_argument("--work", default="/tmp/cutline-two-phase/runs")
    ap.add_argument("--out", type=Path, default=HERE.parent / "results" / "two_phase.json")
    ap.add_argument("--per-batch", action="store_true",
                    help="only the per-batch state merge (item 2), in this process")
    ap.add_argument("--batch-rows", type=int, default=100_000)
    ap.add_argument("--batches", type=int, default=21)
    args = ap.parse_args(argv)
    if args.per_batch:
        per_batch(args)
        return 0
    if args.serve:
        proto = os.fdopen(os.dup(1), "w")  # the parent reads "done" here; the rest: stderr
        os.dup2(2, 1)
        for line in sys.stdin:
            spec = json.loads(Path(line.strip()).read_text())
            Path(spec["result"]).write_text(json.dumps(child(spec)))
            print("done", file=proto, flush=True)
        return 0
    if not args.before:
        ap.error("--before: the src directory of the code before (a git worktree's)")
    data = ensure_input(Path(args.data), args.records, args.lines_per_file, args.users)
    cases = args.cases.split(";")
    runs: dict[str, list[dict]] = {c: [] for c in cases}
    servers = {"before": Server(args.before), "after": Server(args.after)}
    for c in cases:  # warm-up, one run of each case: the session starts, code loads
        res = run_case(c, args, data, args.records, servers)
        print(f"warm-up {c:42s} processing {res['processing']:6.2f} s", flush=True)
    for r in range(args.rounds):
        order = cases[r % len(cases):] + cases[:r % len(cases)]
        for c in order:
            res = run_case(c, args, data, args.records, servers)
            runs[c].append(res)
            print(f"round {r + 1} {c:42s} processing {res['processing']:6.2f} s, "
                  f"run {res['run']:6.2f} s, end to end {res['end_to_end']:6.2f} s"
                  f"{', combined' if res['combined'] else ''}", flush=True)
    for server in servers.values():
        server.close()
    summary = []
    for before, after in PAIRS:
        if before not in runs or after not in runs:
            continue
        ratios = [b["processing"] / a["processing"] for b, a in zip(runs[before], runs[after])]
        e2e = [b["end_to_end"] / a["end_to_end"] for b, a in zip(runs[before], runs[after])]
        summary.append({"before": before, "after": after,
                        "before_s": statistics.median(x["processing"] for x in runs[before]),
                        "after_s": statistics.median(x["processing"] for x in runs[after]),
                        "speedup": statistics.median(ratios),
                        "speedup_range": [min(ratios), max(ratios)],
                        "end_to_end_speedup": statistics.median(e2e)})
    print()
    for s in summary:
        print(f"{s['after']:42s} vs before: processing {s['before_s']:6.2f} -> "
              f"{s['after_s']:6.2f} s, x{s['speedup']:.2f} (rounds "
              f"{s['speedup_range'][0]:.2f}-{s['speedup_range'][1]:.2f}), end to end "
              f"x{s['end_to_end_speedup']:.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"records": args.records, "users": args.users,
                                    "lines_per_file": args.lines_per_file,
                                    "rounds": args.rounds, "runs": runs,
                                    "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
