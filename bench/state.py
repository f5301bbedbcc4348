"""State backends measured side by side in one run: in-memory and embedded RocksDB.

Run ``python bench/state.py`` (``--quick`` for a short run, still every case).  The backends
are driven directly (no Spark: what is measured is the state backend and the checkpoint
storage, on a local temporary directory standing in for remote storage).  Keys are strings
``k<i>``, values small tuples (~40 bytes pickled), one keyed operator subtask owning all
128 key groups.  Cases:

1. **Bytes uploaded per checkpoint**, incremental against full: a state of N keys, then
   checkpoints each after 1% (and, separately, 10%) of the keys changed at random.  Both
   RocksDB backends get the same updates; "full" (``incremental=False``) uploads every SST
   file at every checkpoint, "incremental" only the files no earlier checkpoint uploaded.
   Mean over the checkpoints after the first (which uploads everything in both); the
   in-memory backend's snapshot (all state, pickled) is shown for reference.
   Target: incremental <= 0.1x full at 1%.
2. **Synchronous phase of a snapshot against state size**: the time the task stops
   processing for a snapshot (RocksDB: spill the write cache, flush the memtable, hard-link
   the files; memory: pickle everything), median of several checkpoints each after the
   same 10,000 updates, at several state sizes.  The asynchronous part (RocksDB: the
   upload, on the task's upload thread) is shown beside it.  Target: RocksDB's does not
   grow linearly with the state (the ratio between the largest and smallest size is far
   below the ratio of the sizes).
3. **Restore time against state size**: a fresh backend restoring the last snapshot
   (RocksDB: download and verify the files, open, first read; memory: unpickle).
4. **Records/s of ``count()``** on each backend over 1,000 / 100,000 / 1,000,000 distinct
   keys, and RocksDB with its in-process cache reduced to nothing, to measure the cache.
5. **Scale** (full run only): 10,000,000 keys in one RocksDB backend, in a subprocess: load
   time, peak resident memory, a snapshot's synchronous part, and a checkpoint's bytes.

6. **Rescale 2 -> 1 -> 2**: N keys split over two subtasks (key groups 0-63, 64-127) are
   snapshotted; one subtask restores both snapshots (scale down: it keeps every key group),
   is snapshotted, and two subtasks restore that one snapshot (scale up: each keeps its
   half).  Against a plain restore at the same parallelism (2 -> 2), same backend, same
   state.  Every key is checked present once at each step.

Timing cases run in rounds, backends interleaved, medians reported.  Exit code is always 0:
a benchmark, not a test.  Results also go to ``bench/results/state.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from _common import (
    RESULTS, Runner, bench_parser, median, parse_bench_args, stamp, table, write_results,
)
from _common import console as make_console
from _common import ms as _ms

from cutline.logical import make_node
from cutline.runtime.registry import build_operator
from cutline.state.memory import MemoryStateBackend
from cutline.state.rocksdb import RocksDBStateBackend
from cutline.storage.checkpoints import CheckpointStorage

DEFAULT_OUT = RESULTS / "state.json"
MAXP = 128
GROUPS = range(MAXP)
TARGET_INCREMENTAL = 0.1  # incremental / full bytes at 1% changed, at most
UPDATES_PER_CHECKPOINT = 10_000  # case 2


def value(i: int, version: int = 0) -> tuple:
    return (i, f"user-{i}", version, 1.5)


class Bench:
    """A temporary directory with the checkpoint storage and the backends' local dirs."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="cutline-bench-state-")
        self.storage = CheckpointStorage(os.path.join(self.dir, "checkpoints"), "bench")
        self.n = 0

    def rocks(self, name: str, **kw: Any) -> RocksDBStateBackend:
        return RocksDBStateBackend(GROUPS, MAXP, name=name,
                                   directory=os.path.join(self.dir, "local"), **kw)

    def checkpoint(self, backend: Any) -> dict:
        """Snapshot + upload; bytes written and the time of each part."""
        self.n += 1
        t0 = time.perf_counter()
        snap = backend.snapshot()
        t1 = time.perf_counter()
        if isinstance(snap, bytes):
            return {"sync": t1 - t0, "async": 0.0, "bytes": len(snap), "size": len(snap),
                    "blob": snap}
        blob = snap.finish(self.storage, self.n)
        t2 = time.perf_counter()
        return {"sync": t1 - t0, "async": t2 - t1, "bytes": snap.uploaded + len(blob),
                "size": snap.size + len(blob), "blob": blob}

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def load(backends: list, n: int, version: int = 0) -> None:
    for i in range(n):
        k, v = f"k{i}", value(i, version)
        for b in backends:
            b.put("v", k, v)
        if i % 1000 == 999:
            for b in backends:
                getattr(b, "after_batch", lambda: None)()


def update(backends: list, keys: list[int], version: int) -> None:
    for j, i in enumerate(keys):
        k, v = f"k{i}", value(i, version)
        for b in backends:
            b.put("v", k, v)
        if j % 1000 == 999:
            for b in backends:
                getattr(b, "after_batch", lambda: None)()


# --------------------------------------------------------------------------- case 1

def case_bytes(n_keys: int, fraction: float, checkpoints: int, seed: int) -> dict:
    bench = Bench()
    rnd = random.Random(seed)
    inc, full = bench.rocks("inc.0"), bench.rocks("full.0", incremental=False)
    mem = MemoryStateBackend(GROUPS, MAXP)
    try:
        load([inc, full, mem], n_keys)
        first = {"incremental": bench.checkpoint(inc)["bytes"],
                 "full": bench.checkpoint(full)["bytes"]}
        rows = []
        for c in range(checkpoints):
            update([inc, full, mem], rnd.sample(range(n_keys), int(n_keys * fraction)), c + 1)
            a, b = bench.checkpoint(inc), bench.checkpoint(full)
            rows.append({"incremental": a["bytes"], "full": b["bytes"],
                         "state_size": b["size"]})
        mem_bytes = len(mem.snapshot())
        mean_inc = statistics.mean(r["incremental"] for r in rows)
        mean_full = statistics.mean(r["full"] for r in rows)
        return {"keys": n_keys, "changed": fraction, "checkpoints": checkpoints,
                "first": first, "per_checkpoint": rows,
                "incremental_mean": mean_inc, "full_mean": mean_full,
                "ratio": mean_inc / mean_full,
                "incremental_median": median([r["incremental"] for r in rows]),
                "incremental_max": max(r["incremental"] for r in rows),
                "memory_snapshot_bytes": mem_bytes}
    finally:
        inc.close()
        full.close()
        bench.close()


# --------------------------------------------------------------------------- cases 2, 3

def case_sizes(sizes: list[int], checkpoints: int, restores: int, seed: int,
               memory_up_to: int) -> list[dict]:
    """Per size: sync / async time of checkpoints, and restore time, for both backends."""
    rnd = random.Random(seed)
    out = []
    for n in sizes:
        bench = Bench()
        rocks = bench.rocks("sizes.0")
        mem = MemoryStateBackend(GROUPS, MAXP) if n <= memory_up_to else None
        backends = [b for b in (rocks, mem) if b is not None]
        try:
            t0 = time.perf_counter()
            load(backends, n)
            loaded = time.perf_counter() - t0
            bench.checkpoint(rocks)  # the first one uploads everything
            res: dict[str, dict] = {"rocksdb": {"sync": [], "async": [], "bytes": []},
                                    "memory": {"sync": [], "async": [], "bytes": []}}
            last: dict[str, bytes] = {}
            for c in range(checkpoints):
                update(backends, rnd.sample(range(n), min(n, UPDATES_PER_CHECKPOINT)), c + 1)
                order = [("rocksdb", rocks), ("memory", mem)]
                if c % 2:
                    order.reverse()
                for name, b in order:
                    if b is None:
                        continue
                    r = bench.checkpoint(b)
                    for k in ("sync", "async", "bytes"):
                        res[name][k].append(r[k])
                    last[name] = r["blob"]
                    res[name]["size"] = r["size"]
            restore: dict[str, list[float]] = {"rocksdb": [], "memory": []}
            probe = f"k{n // 2}"
            for i in range(restores):
                for name in ("rocksdb", "memory") if i % 2 == 0 else ("memory", "rocksdb"):
                    if name not in last:
                        continue
                    t = time.perf_counter()
                    fresh = bench.rocks(f"restore.{i}") if name == "rocksdb" else \
                        MemoryStateBackend(GROUPS, MAXP)
                    fresh.restore([last[name]])
                    assert fresh.get("v", probe) is not None
                    restore[name].append(time.perf_counter() - t)
                    fresh.close()
            row = {"keys": n, "load_s": loaded}
            for name in ("rocksdb", "memory"):
                if not res[name]["sync"]:
                    continue
                row[name] = {"sync_median": median(res[name]["sync"]),
                             "sync_max": max(res[name]["sync"]),
                             "async_median": median(res[name]["async"]),
                             "bytes_median": median(res[name]["bytes"]),
                             "state_bytes": res[name].get("size"),
                             "restore_median": median(restore[name]),
                             "sync": res[name]["sync"], "restore": restore[name]}
            out.append(row)
        finally:
            rocks.close()
            bench.close()
    return out


# --------------------------------------------------------------------------- case 6

def _restore_into(bench: Bench, kind: str, groups: range, blobs: list, name: str) -> Any:
    if kind == "rocksdb":
        b = RocksDBStateBackend(groups, MAXP, name=name,
                                directory=os.path.join(bench.dir, "local"))
    else:
        b = MemoryStateBackend(groups, MAXP)
    b.restore(blobs)
    return b


def case_rescale(n: int, rounds: int) -> dict:
    """Seconds to restore 2 -> 2 (plain), 2 -> 1 (scale down), 1 -> 2 (scale up)."""
    halves = (range(0, MAXP // 2), range(MAXP // 2, MAXP))
    out: dict[str, Any] = {"keys": n}
    for kind in ("memory", "rocksdb"):
        times: dict[str, list[float]] = {"2->2": [], "2->1": [], "1->2": []}
        for r in range(rounds):
            bench = Bench()
            opened: list = []
            try:
                two = [_restore_into(bench, kind, g, [], f"src{r}.{i}")
                       for i, g in enumerate(halves)]
                opened += two
                for i in range(n):  # each key into the subtask owning its key group
                    k = f"k{i}"
                    for b in two:
                        if b.key_groups.start <= _group(k) < b.key_groups.stop:
                            b.put("v", k, value(i))
                blobs2 = [bench.checkpoint(b)["blob"] for b in two]
                t = time.perf_counter()
                same = [_restore_into(bench, kind, g, [blobs2[i]], f"same{r}.{i}")
                        for i, g in enumerate(halves)]
                times["2->2"].append(time.perf_counter() - t)
                opened += same
                t = time.perf_counter()
                one = _restore_into(bench, kind, GROUPS, blobs2, f"one{r}")
                times["2->1"].append(time.perf_counter() - t)
                opened.append(one)
                assert one.get("v", f"k{n - 1}") == value(n - 1)
                blob1 = bench.checkpoint(one)["blob"]
                t = time.perf_counter()
                back = [_restore_into(bench, kind, g, [blob1], f"back{r}.{i}")
                        for i, g in enumerate(halves)]
                times["1->2"].append(time.perf_counter() - t)
                opened += back
                for i in (0, n // 2, n - 1):  # each key is back in the subtask owning it
                    k = f"k{i}"
                    owner = [b for b in back if _group(k) in b.key_groups]
                    assert len(owner) == 1 and owner[0].get("v", k) == value(i), k
            finally:
                for b in opened:
                    getattr(b, "close", lambda: None)()
                bench.close()
        out[kind] = {k: median(v) for k, v in times.items()}
        out[kind]["rounds"] = times
    return out


def _group(key: str) -> int:
    from cutline.state.keygroups import key_group

    return key_group(key, MAXP)


# --------------------------------------------------------------------------- case 4

def count_rate(backend: str, keys: int, records: int, seed: int, **cache: Any) -> float:
    rnd = random.Random(seed)
    recs = [f"k{rnd.randrange(keys)}" for _ in range(records)]
    node = make_node(0, "count", "count", key_fn=lambda r: r)
    op = build_operator(node, 0, 1, MAXP, state_backend=backend)
    if cache:
        op.state.close()
        op.state = RocksDBStateBackend(GROUPS, MAXP, name="count.0", **cache)
        op._cached = True
    try:
        # warm: every key seen once (the steady state of a long-running job)
        for i in range(0, min(keys, records), 1000):
            op.process([f"k{j}" for j in range(i, min(i + 1000, keys))])
        t = time.perf_counter()
        for i in range(0, records, 1000):
            op.process(recs[i:i + 1000])
        return records / (time.perf_counter() - t)
    finally:
        op.close()


COUNT_CASES = [("memory", {}), ("rocksdb", {}),
               ("rocksdb, no cache", {"cache_entries": 1, "dirty_entries": 1})]


def case_count(keysets: list[int], records: int, rounds: int, seed: int) -> list[dict]:
    out = []
    for keys in keysets:
        rates: dict[str, list[float]] = {name: [] for name, _ in COUNT_CASES}
        for r in range(rounds):
            k = r % len(COUNT_CASES)
            for name, cache in COUNT_CASES[k:] + COUNT_CASES[:k]:
                backend = "memory" if name == "memory" else "rocksdb"
                rates[name].append(count_rate(backend, keys, records, seed + r, **cache))
        out.append({"keys": keys, "records": records,
                    **{name: {"median": median(v), "rounds": v} for name, v in rates.items()}})
    return out


# --------------------------------------------------------------------------- case 5

def peak_rss() -> int:
    """This process's peak resident set (VmHWM; unlike ru_maxrss it is not inherited from
    the parent across fork + exec)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def scale_child(n: int) -> dict:
    """Run in a subprocess: n keys in one RocksDB backend; peak RSS of that process."""
    bench = Bench()
    b = bench.rocks("scale.0")
    try:
        t0 = time.perf_counter()
        load([b], n)
        loaded = time.perf_counter() - t0
        first = bench.checkpoint(b)
        update([b], random.Random(1).sample(range(n), UPDATES_PER_CHECKPOINT), 1)
        second = bench.checkpoint(b)
        rss = peak_rss()
        return {"keys": n, "load_s": loaded, "peak_rss_bytes": rss,
                "state_bytes": second["size"], "first_checkpoint_bytes": first["bytes"],
                "sync_s": second["sync"], "async_s": second["async"],
                "incremental_bytes": second["bytes"]}
    finally:
        b.close()
        bench.close()


def case_scale(n: int) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--scale-child", str(n)],
                          capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-2000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- report

def mb(n: float | None) -> str:
    return "-" if n is None else f"{n / 1e6:,.2f} MB"


def ms(s: float | None) -> str:
    return _ms(s, ",.1f")


def main(argv: list[str] | None = None) -> int:
    ap = bench_parser(__doc__, DEFAULT_OUT, (3, 1), quick="short run (smoke test), every case")
    ap.add_argument("--smoke", action="store_true",
                    help="quick at a tenth of the sizes (CI's smoke test: every case once; "
                         "not for numbers)")
    ap.add_argument("--scale-child", type=int, default=None, help=argparse.SUPPRESS)
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--smoke" in argv and "--quick" not in argv:
        argv.append("--quick")
    args = parse_bench_args(ap, argv)
    if args.scale_child:
        print(json.dumps(scale_child(args.scale_child)))
        return 0
    console = make_console(150)
    quick, rounds = args.quick, args.rounds
    tenth = 10 if args.smoke else 1
    p = {
        "bytes_keys": 100_000 // tenth if quick else 1_000_000,
        "bytes_checkpoints": 6 if quick else 20,
        "sizes": [n // tenth for n in (50_000, 200_000, 600_000)] if quick else [
            100_000, 1_000_000, 3_000_000],
        "memory_up_to": 3_000_000,
        "sync_checkpoints": 3 if quick else 5,
        "restores": 2 if quick else 3,
        "count_keys": [1_000, 100_000] if quick else [1_000, 100_000, 1_000_000],
        "count_records": 200_000 // tenth if quick else 500_000,
        "scale_keys": None if quick else 10_000_000,
        "rescale_keys": 100_000 // tenth if quick else 1_000_000,
    }
    console.print(f"[bold]cutline state backend benchmark[/]  {'quick, ' if quick else ''}"
                  f"{rounds} round(s); Python {platform.python_version()}, "
                  f"{os.cpu_count()} CPUs")
    runner = Runner(console, 40)
    results: dict[str, Any] = {
        "benchmark": "cutline state backends: memory vs rocksdb", **stamp(),
        "cpus": os.cpu_count(), "quick": quick, "rounds": rounds, "parameters": p,
        "target_incremental_ratio_at_1pct": TARGET_INCREMENTAL, "errors": runner.errors}

    def run(name: str, fn, *a: Any) -> Any:
        return runner.run(name, lambda: fn(*a))

    # 1. bytes
    results["bytes"] = [r for r in (
        run(f"bytes, {int(f * 100)}% of keys changed", case_bytes, p["bytes_keys"], f,
            p["bytes_checkpoints"], 7) for f in (0.01, 0.10)) if r is not None]
    # 2 + 3. sync phase and restore against size
    results["sizes"] = run("sync phase and restore vs size", case_sizes, p["sizes"],
                           p["sync_checkpoints"], p["restores"], 11, p["memory_up_to"]) or []
    # 4. count() records/s
    results["count"] = run("count() records/s", case_count, p["count_keys"],
                           p["count_records"], rounds, 3) or []
    # 6. rescale 2 -> 1 -> 2
    results["rescale"] = run(f"rescale 2->1->2, {p['rescale_keys']:,} keys", case_rescale,
                             p["rescale_keys"], rounds)
    # 5. scale
    results["scale"] = run(f"scale: {p['scale_keys']:,} keys", case_scale,
                           p["scale_keys"]) if p["scale_keys"] else None

    # ------------------------------------------------------------------ tables
    t = table("1. bytes uploaded per checkpoint (mean after the first)",
              ("keys changed", "state", "full", "incremental", "incremental / full",
               "incremental max", "memory snapshot", "target"), left=(), no_wrap=False)
    for r in results["bytes"]:
        ok = r["ratio"] <= TARGET_INCREMENTAL
        t.add_row(f"{r['changed']:.0%} of {r['keys']:,}", mb(r["per_checkpoint"][-1]["state_size"]),
                  mb(r["full_mean"]), mb(r["incremental_mean"]), f"{r['ratio']:.3f}x",
                  mb(r["incremental_max"]), mb(r["memory_snapshot_bytes"]),
                  (f"<= {TARGET_INCREMENTAL}x " + ("✓" if ok else "✗"))
                  if r["changed"] == 0.01 else "-")
    console.print(t)

    t = table(f"2-3. snapshot synchronous phase (after {UPDATES_PER_CHECKPOINT:,} "
              "updates) and restore, against state size",
              ("keys", "rocksdb state", "rocksdb sync", "rocksdb async (upload)",
               "rocksdb restore", "memory state", "memory sync", "memory restore"),
              left=(), no_wrap=False)
    for r in results["sizes"]:
        ro, me = r.get("rocksdb") or {}, r.get("memory") or {}
        t.add_row(f"{r['keys']:,}", mb(ro.get("state_bytes")), ms(ro.get("sync_median")),
                  ms(ro.get("async_median")), ms(ro.get("restore_median")),
                  mb(me.get("state_bytes")), ms(me.get("sync_median")),
                  ms(me.get("restore_median")))
    console.print(t)
    if results.get("rescale"):
        r = results["rescale"]
        t = table(f"6. rescale 2 -> 1 -> 2: restore seconds, {r['keys']:,} keys "
                  "(median of rounds)", ("backend", "2 -> 2 (same parallelism)", "2 -> 1",
                                         "1 -> 2", "(2->1 + 1->2) / 2x(2->2)"),
                  left=(), no_wrap=False)
        for kind in ("memory", "rocksdb"):
            x = r.get(kind) or {}
            same = x.get("2->2")
            ratio = (x["2->1"] + x["1->2"]) / (2 * same) if same else None
            r.setdefault("ratios", {})[kind] = ratio
            t.add_row(kind, ms(same), ms(x.get("2->1")), ms(x.get("1->2")),
                      f"{ratio:.2f}x" if ratio else "-")
        console.print(t)
    sizes = [r for r in results["sizes"] if r.get("rocksdb")]
    if len(sizes) >= 2:
        lo, hi = sizes[0], sizes[-1]
        growth = hi["rocksdb"]["sync_median"] / lo["rocksdb"]["sync_median"]
        size_growth = hi["keys"] / lo["keys"]
        results["sync_growth"] = {"keys_ratio": size_growth, "rocksdb_sync_ratio": growth}
        mem = [r for r in sizes if r.get("memory")]
        if len(mem) >= 2:
            results["sync_growth"]["memory_sync_ratio"] = (
                mem[-1]["memory"]["sync_median"] / mem[0]["memory"]["sync_median"])
        verdict = "✓ not linear" if growth < size_growth / 4 else "✗"
        console.print(f"state {size_growth:.0f}x larger: rocksdb sync phase {growth:.2f}x "
                      f"{verdict}; memory sync phase "
                      f"{results['sync_growth'].get('memory_sync_ratio', float('nan')):.1f}x")

    t = table("4. count() records/s (median of rounds; keys warmed once)",
              ("distinct keys", "memory", "rocksdb", "rocksdb / memory", "rocksdb, no cache¹",
               "cache speed-up"), left=(), no_wrap=False)
    for r in results["count"]:
        m, ro, nc = (r[k]["median"] for k in ("memory", "rocksdb", "rocksdb, no cache"))
        t.add_row(f"{r['keys']:,}", f"{m:,.0f}", f"{ro:,.0f}", f"{ro / m:.2f}x",
                  f"{nc:,.0f}", f"{ro / nc:.1f}x")
    console.print(t)
    console.print("¹ cache of 1 entry: every read from RocksDB, writes batched per 1,000 "
                  "records", style="dim")

    if results.get("scale"):
        s = results["scale"]
        t = table("5. scale: one RocksDB backend (subprocess)",
                  ("keys", "load", "peak RSS", "state", "sync phase", "upload",
                   f"checkpoint after {UPDATES_PER_CHECKPOINT:,} updates"),
                  left=(), no_wrap=False)
        t.add_row(f"{s['keys']:,}", f"{s['load_s']:.1f} s", mb(s["peak_rss_bytes"]),
                  mb(s["state_bytes"]), ms(s["sync_s"]), ms(s["async_s"]),
                  mb(s["incremental_bytes"]))
        console.print(t)

    write_results(args.out, results, console)
    return 0


if __name__ == "__main__":
    sys.exit(main())
