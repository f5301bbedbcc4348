"""The soak (``make soak``): one job for an hour on a Spark standalone cluster on 127.0.0.1
(a master and two one-core workers started from the installed ``pyspark``), with a
``kill -9`` every ~30 s of a random task's Python worker or of the executor JVM above it.

The job: generated events at a steady rate -> keyed exchange -> keyed count -> an
exactly-once sink of ``(user, count, index)``, checkpoints every second, in one exactly-once
mode per run (``--mode``; by default the one with the fewest soak kills so far, so runs
rotate through them).  Meanwhile it samples, every few seconds, the resident memory, open
files and threads of the driver (Python and its JVM), the executors and the task processes,
and the number of processes in the cluster's directories (orphans would pile up there).

At the end it stops the killer, stops the job with a savepoint, and runs it to the end of
its input from that savepoint (the savepoint's source positions say how far it read: that
is the input).  Then it checks:

- output: every record's index committed exactly once, each user's counts 1, 2, ... exact;
- flat: after a warm-up (the first fifth of the run), the median of the last fifth of the
  samples exceeds the median of the first fifth by no more than a bound per metric
  (:data:`BOUNDS`): no leak grows with time or with the number of restarts;
- no drift: the median checkpoint duration of the last fifth is at most 1.5 x that of the
  first fifth after warm-up, plus 0.1 s.

It writes ``bench/results/soak.json`` (every sample, kill and checkpoint) and
``bench/results/soak.png``, adds its kills to ``bench/results/kills.json``, and prints a
summary.  Exit status 0: every check passed.

    make soak                              # 60 minutes
    SOAK_MINUTES=10 SOAK_MODE=unaligned make soak
    .venv/bin/python bench/soak.py --minutes 10 --kill-every 30
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]

from _kills import load as load_tally, record  # noqa: E402
from cluster_jobs import soak_check, soak_job  # noqa: E402
from cluster_script import session, wait_for_executors  # noqa: E402
from cluster_util import Cluster, cluster_env, descendants, free_port  # noqa: E402
from cutline.spark.faults import cmdline  # noqa: E402

EXACTLY_ONCE = ("aligned", "unaligned", "aligned_timeout")

# how much a metric may grow from the first to the last fifth after warm-up (medians):
# the larger of an absolute amount and a share of where it started
BOUNDS = {"rss_mb": (32.0, 0.15), "fds": (8, 0.10), "threads": (8, 0.10), "n": (2, 0.0)}
ROLES = ("driver", "driver_jvm", "executors", "tasks")


# ---------------------------------------------------------------- processes


def proc_stats(pid: int) -> dict[str, float] | None:
    """Resident memory (MB), open files and threads of ``pid``; None if it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    if "VmRSS" not in fields:  # a zombie: gone but not reaped yet
        return None
    return {"rss_mb": int(fields["VmRSS"].split()[0]) / 1024, "fds": fds,
            "threads": int(fields["Threads"])}


def per_process(pids: list[int]) -> dict[str, float]:
    """The mean memory, open files and threads of the processes ``pids`` (the roles with
    several, executors and tasks, change their number during a restart), and how many."""
    rows = [s for s in map(proc_stats, pids) if s is not None]
    n = len(rows) or 1
    return {"rss_mb": round(sum(r["rss_mb"] for r in rows) / n, 1),
            "fds": round(sum(r["fds"] for r in rows) / n, 1),
            "threads": round(sum(r["threads"] for r in rows) / n, 1), "n": len(rows)}


def procs_under(root: Path) -> int:
    """Processes whose working directory is in ``root`` (the cluster's processes, and
    whatever they started, orphans included)."""
    n, prefix = 0, str(root)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.readlink(f"/proc/{entry}/cwd").startswith(prefix):
                    n += 1
            except OSError:
                pass
    return n


class Sampler:
    """Every ``every`` s: each role's summed memory, files and threads (and its process
    count), the processes in the cluster's directory, the attempt and checkpoints so far."""

    def __init__(self, cluster: Cluster, every: float) -> None:
        self.cluster, self.every = cluster, every
        self.samples: list[dict[str, Any]] = []
        self.stop = threading.Event()
        self.driver: Any = None
        self.t0 = time.monotonic()

    def start(self) -> None:
        threading.Thread(target=self._run, name="soak-sampler", daemon=True).start()

    def _run(self) -> None:
        while not self.stop.wait(self.every):
            try:
                self.samples.append(self.sample())
            except Exception as exc:  # noqa: BLE001 - a process went away mid-read
                print(f"soak: sample skipped: {exc!r}", flush=True)

    def sample(self) -> dict[str, Any]:
        me = os.getpid()
        jvm = [p for p in descendants(me)  # java ... deploy.SparkSubmit, not its scripts
               if (c := cmdline(p)).split(" ")[0].endswith("java") and "SparkSubmit" in c]
        workers = [int(x) for x in self.cluster.pid_file.read_text().split()]
        executors = [p for w in workers for p in descendants(w)
                     if "CoarseGrainedExecutorBackend" in cmdline(p)]
        d = self.driver
        tasks = list(d.run.task_pids.values()) if d is not None else []
        return {"t": round(time.monotonic() - self.t0, 1), "driver": per_process([me]),
                "driver_jvm": per_process(jvm), "executors": per_process(executors),
                "tasks": per_process(tasks),
                "cluster_procs": procs_under(self.cluster.root),
                "attempt": d.run.attempt.number if d is not None else None,
                "checkpoints": len(d.run.checkpoints) if d is not None else 0}


# ---------------------------------------------------------------- checks


def fifths(rows: list, t: Any, warmup: float) -> tuple[list, list]:
    """The first and last fifth (by time) of ``rows`` after ``warmup`` seconds."""
    after = [r for r in rows if t(r) >= warmup]
    if len(after) < 5:
        return after, after
    k = max(1, len(after) // 5)
    return after[:k], after[-k:]


def flatness(samples: list[dict], warmup: float) -> dict[str, dict]:
    checks = {}
    first, last = fifths(samples, lambda s: s["t"], warmup)
    for role in (*ROLES, "cluster_procs"):
        for metric, (absolute, share) in BOUNDS.items():
            if role == "cluster_procs":
                if metric != "n":
                    continue
                get = lambda s: s["cluster_procs"]  # noqa: E731
            else:
                get = lambda s, r=role, m=metric: s[r][m]  # noqa: E731
            # a role's memory, files and threads while it has processes (tasks have none
            # between a kill and the next attempt)
            has = (lambda s: True) if role == "cluster_procs" or metric == "n" else \
                (lambda s, r=role: s[r]["n"] > 0)  # noqa: E731
            a_rows, b_rows = [x for x in first if has(x)], [x for x in last if has(x)]
            if not a_rows or not b_rows:
                continue
            a = statistics.median(map(get, a_rows))
            b = statistics.median(map(get, b_rows))
            bound = max(absolute, share * a)
            checks[f"{role}.{metric}"] = {"first": a, "last": b, "growth": round(b - a, 2),
                                          "bound": round(bound, 2), "ok": b - a <= bound}
    return checks


def drift(checkpoints: list[dict], warmup: float) -> dict[str, Any]:
    first, last = fifths(checkpoints, lambda c: c["completed"], warmup)
    if not first:
        return {"ok": False, "why": "no checkpoints after warm-up"}
    a = statistics.median(c["duration"] for c in first)
    b = statistics.median(c["duration"] for c in last)
    bound = 1.5 * a + 0.1
    return {"first_median": round(a, 4), "last_median": round(b, 4), "bound": round(bound, 4),
            "ok": b <= bound}


# ---------------------------------------------------------------- the run


def pick_mode(asked: str | None) -> str:
    if asked:
        return asked
    done = {m: 0 for m in EXACTLY_ONCE}
    for r in load_tally()["runs"]:
        if r.get("kind") == "soak" and r["mode"] in done:
            done[r["mode"]] += r["kills"]
    return min(EXACTLY_ONCE, key=lambda m: (done[m], EXACTLY_ONCE.index(m)))


def stop_with_savepoint(job: Any, tries: int = 5) -> str:
    """Stop the job with a savepoint, once it runs (a kill may still be recovering)."""
    from cutline.driver.dataflow import SavepointError

    for i in range(tries):
        try:
            return job.stop_with_savepoint(timeout=300)
        except (SavepointError, RuntimeError) as exc:
            if i + 1 == tries or job.done():
                raise
            print(f"soak: savepoint failed ({exc}); again", flush=True)
            time.sleep(3)
    raise AssertionError("unreachable")


def input_read(savepoint: str) -> int:
    """How far the sources read, from the savepoint's positions (their splits' next index):
    a run to ``count`` = that index reads exactly the rest."""
    from cutline.storage.checkpoints import open_checkpoint
    from cutline.storage.schema import read_task_states

    states = read_task_states(open_checkpoint(savepoint))
    return max(n for st in states.values() if st.source_uid == "events"
               for n, _ in st.source["splits"])


def soak(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from cutline.spark.chaos import Chaos

    cluster = Cluster(work / "cluster", free_port())
    cluster.root.mkdir()
    mode = pick_mode(args.mode)
    print(f"soak: {args.minutes:g} min, mode {mode}, a kill every ~{args.kill_every:g} s "
          f"({args.executors:.0%} executor JVMs), {args.rate:g} records/s", flush=True)
    spark = None
    # the driver tells the executors which Python runs the tasks: this one (the venv's)
    os.environ.update(cluster_env())
    try:
        cluster.start_master()
        cluster.start_worker(0)
        cluster.start_worker(1)
        cluster.wait_for_workers(2)
        spark = session(cluster.url, attempts=100_000)
        wait_for_executors(spark, 2)
        p, sink = soak_job(work, mode, rate=args.rate)
        chaos = Chaos(kills=10**9, seed=args.seed, mean_delay=args.kill_every,
                      early=0.25, executors=args.executors, after_start=True)
        sampler = Sampler(cluster, args.sample_every)
        sampler.start()
        drivers: list = []

        def on_start(driver: Any) -> None:
            drivers.append(driver)
            sampler.driver = driver
            chaos(driver)

        t0, wall0 = time.monotonic(), time.time()
        job = p.start(spark=spark, on_start=on_start, progress=False)
        deadline, minute = t0 + args.minutes * 60, 1
        while time.monotonic() < deadline and not job.done():
            time.sleep(1)
            if args.verbose and time.monotonic() - t0 >= 60 * minute:
                d = drivers[0] if drivers else None
                print(f"soak: {minute} min, {len(chaos.killed)} kills, attempt "
                      f"{d.run.attempt.number if d else '-'}, "
                      f"{len(d.run.checkpoints) if d else 0} checkpoints", flush=True)
                minute += 1
        chaos.stop.set()
        savepoint = stop_with_savepoint(job)
        seconds = time.monotonic() - t0
        sampler.stop.set()
        driver = drivers[0]
        result = job.result()
        count = input_read(savepoint)
        # the rest of the input, from the savepoint, without kills
        p2, _ = soak_job(work, mode, rate=None, count=count)
        p2.run(spark=spark, restore_from=savepoint, progress=False, timeout=600)
        check = soak_check(sink.results(), count)
        c = driver.controller
        checkpoints = [{"id": r.id, "attempt": r.attempt, "started": round(r.started - t0, 3),
                        "completed": round(r.completed - t0, 3),
                        "duration": round(r.duration, 4), "bytes": r.bytes,
                        "in_flight": r.in_flight} for r in result.checkpoints]
        starts = [a.at - t0 for a in c.attempt_log]
        kills = []
        for k in chaos.killed:
            at = k["time"] - wall0
            # to the next attempt's start, and to its first completed checkpoint
            up = next((s for s in starts if s > at), None)
            done = next((x["completed"] for x in checkpoints if x["completed"] > at), None)
            kills.append({**k, "at": round(at, 1),
                          "restarted_in": round(up - at, 1) if up is not None else None,
                          "checkpoint_in": round(done - at, 1) if done is not None else None})
        warmup = seconds / 5
        all_d = [x["duration"] for x in checkpoints]
        out = {
            "mode": mode, "minutes": round(seconds / 60, 2), "rate": args.rate,
            "kill_every": args.kill_every, "seed": args.seed,
            "kills": len(kills),
            "targets": {t: sum(1 for k in kills if k["target"] == t)
                        for t in ("worker", "executor")},
            "during_recovery": sum(1 for k in kills if k["delay"] < 0.05),
            "attempts": result.attempts, "resubmitted": c.resubmitted,
            "restart_seconds": _quantiles([k["restarted_in"] for k in kills]),
            "kill_to_checkpoint_seconds": _quantiles([k["checkpoint_in"] for k in kills]),
            "checkpoints": len(checkpoints), "failed_checkpoints": len(c.failed_checkpoints),
            "checkpoint_seconds": _quantiles(all_d),
            **check, "savepoint": savepoint, "warmup": round(warmup, 1),
            "kill_log": kills, "checkpoint_log": checkpoints, "samples": sampler.samples,
        }
        return judge(out)
    finally:
        if spark is not None:
            spark.stop()
        cluster.stop()


def judge(out: dict[str, Any]) -> dict[str, Any]:
    """The checks of a run (``out`` as written to the JSON file: they can be run again)."""
    flat = flatness(out["samples"], out["warmup"])
    durations = drift(out["checkpoint_log"], out["warmup"])
    out.update(checks={"output": out["exact"], "flat": all(x["ok"] for x in flat.values()),
                       "durations": durations["ok"]},
               flatness=flat, durations=durations)
    out["ok"] = all(out["checks"].values())
    return out


def _quantiles(xs: list) -> dict[str, float | None]:
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return {"p50": None, "p95": None, "max": None}
    return {"p50": xs[len(xs) // 2], "p95": xs[int(len(xs) * 0.95)], "max": xs[-1]}


def plot(out: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(13, 8), sharex=True)
    t = [s["t"] / 60 for s in out["samples"]]
    for ax, metric, label in ((axes[0][0], "rss_mb", "resident memory (MB)"),
                              (axes[0][1], "fds", "open files"),
                              (axes[1][0], "threads", "threads")):
        for role in ROLES:
            ax.plot(t, [s[role][metric] for s in out["samples"]], label=role, lw=1)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0][0].legend(loc="upper left", fontsize=8)
    ax = axes[1][1]
    cps = out["checkpoint_log"]
    ax.scatter([c["completed"] / 60 for c in cps], [c["duration"] for c in cps], s=3,
               label="checkpoint duration (s)")
    for k in out["kill_log"]:
        ax.axvline(k["at"] / 60, color="red" if k["target"] == "executor" else "orange",
                   lw=0.5, alpha=0.6)
    ax.set_ylabel("checkpoint duration (s)")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    for a in axes[1]:
        a.set_xlabel("minutes (kills: orange = Python worker, red = executor JVM)")
    fig.suptitle(f"cutline soak: {out['minutes']:.0f} min, mode {out['mode']}, "
                 f"{out['kills']} kills, {out['attempts']} attempts, "
                 f"lost {out['lost']}, duplicated {out['duplicated']}")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def summary(out: dict[str, Any], totals: dict[str, Any] | None) -> str:
    bad = [k for k, x in out["flatness"].items() if not x["ok"]]
    d = out["durations"]
    lines = [
        f"soak: {out['minutes']:.1f} min, mode {out['mode']}: {out['kills']} kills "
        f"({out['targets']['worker']} Python workers, {out['targets']['executor']} executor "
        f"JVMs; {out['during_recovery']} while a new attempt restored), "
        f"{out['attempts']} attempts, {out['resubmitted']} resubmitted by the driver",
        f"checkpoints: {out['checkpoints']} completed, {out['failed_checkpoints']} failed; "
        f"median {d.get('first_median')} s after warm-up, {d.get('last_median')} s at the end "
        f"(bound {d.get('bound')}): {'no drift' if d['ok'] else 'DRIFT'}",
        "memory, files, threads: " + ("flat" if not bad else "GROWING: " + ", ".join(
            f"{k} +{out['flatness'][k]['growth']} (bound {out['flatness'][k]['bound']})"
            for k in bad)),
        f"committed {out['committed']:,} rows, expected {out['expected']:,}: "
        f"{out['lost']} lost, {out['duplicated']} duplicated"
        + (" -> exactly once" if out["exact"] else " -> NOT EXACT"),
    ]
    if "restart_seconds" in out:
        up, cp = out["restart_seconds"], out["kill_to_checkpoint_seconds"]
        lines.insert(1, f"from a kill to the next attempt's start: median {up['p50']} s, max "
                        f"{up['max']} s; to the next checkpoint: median {cp['p50']} s, max "
                        f"{cp['max']} s")
    if totals is not None:
        lines.append(f"kills survived in all (bench/results/kills.json): "
                     f"{totals['kills_survived']:,} {totals['by_mode']}")
    return "\n".join(lines)


def dump(out: dict[str, Any]) -> str:
    """JSON with one line per key, and per row of the long logs (samples, kills, checkpoints)."""
    rows = []
    for k, v in out.items():
        if isinstance(v, list) and v:
            body = ",\n".join(f"  {json.dumps(x)}" for x in v)
            rows.append(f" {json.dumps(k)}: [\n{body}\n ]")
        else:
            rows.append(f" {json.dumps(k)}: {json.dumps(v)}")
    return "{\n" + ",\n".join(rows) + "\n}\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float,
                    default=float(os.environ.get("SOAK_MINUTES") or 60))
    ap.add_argument("--mode", choices=EXACTLY_ONCE, default=os.environ.get("SOAK_MODE") or None,
                    help="default: the exactly-once mode with the fewest soak kills so far")
    ap.add_argument("--kill-every", type=float,
                    default=float(os.environ.get("SOAK_KILL_EVERY") or 30),
                    help="mean seconds from an attempt's start to its kill")
    ap.add_argument("--executors", type=float, default=0.33,
                    help="share of kills that hit the executor JVM, not the Python worker")
    ap.add_argument("--rate", type=float, default=300.0, help="records/s")
    ap.add_argument("--sample-every", type=float, default=5.0)
    ap.add_argument("--seed", type=int, default=int(time.time()) % 100_000)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "soak.json")
    ap.add_argument("--no-tally", action="store_true",
                    help="do not add the kills to bench/results/kills.json")
    ap.add_argument("--verbose", action="store_true", help="a line a minute")
    ap.add_argument("--check", type=Path, metavar="SOAK.json",
                    help="run the checks again on a saved result (no soak)")
    args = ap.parse_args(argv)
    if args.check:
        out = json.loads(args.check.read_text())
        out.setdefault("warmup", out["minutes"] * 60 / 5)
        print(summary(judge(out), None))
        return 0 if out["ok"] else 1
    work = Path(tempfile.mkdtemp(prefix="cutline-soak-"))
    try:
        out = soak(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(dump(out))
    plot(out, args.out.with_suffix(".png"))
    totals = None if args.no_tally else record({
        "kind": "soak", "mode": out["mode"], "kills": out["kills"], "lost": out["lost"],
        "duplicated": out["duplicated"], "targets": out["targets"],
        "attempts": out["attempts"], "minutes": out["minutes"], "ok": out["ok"]})
    print(summary(out, totals))
    print(f"soak: {args.out} and {args.out.with_suffix('.png')}")
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
