"""The streaming runtime on Spark, measured side by side in one run.

Run ``python bench/runtime.py`` (``--quick`` for a short run, still every case).  One
embedded Spark session (``embedded_session(slots=2)``, i.e. ``local[2,8]``) serves every
Spark case.  Cases:

1. **Checkpoint overhead**: ``GeneratorSource -> map(parse) -> key_by -> count -> sink``,
   rate unlimited, checkpoints "off" (``interval=1e9``: only the final checkpoint) against
   "on" (``interval=1.0``).  Target: on >= 0.95x off.
2. **Checkpoint duration**: p50 / p99 of the "on" runs' checkpoints (final one excluded)
   relative to the 1 s interval.  The brief gives no target; we use p99 < 1.0x (a checkpoint
   finishes before the next is due, so checkpoints never queue up).
3. **Unaligned vs aligned under backpressure**: ``GeneratorSource -> key_by -> process``
   where the keyed operator is slow (it sleeps 5 ms every 100 records: ~50 us/record, GIL
   released), parallelism 2 behind a hash exchange, rate unlimited, interval 0.5 s.  Median
   checkpoint duration (final excluded), unaligned / aligned.  Target: <= 0.1x.
4. **Records/s per task** against a bare Python loop in this process doing the same work
   (generate, parse, dict count, build the ``(key, n)`` output) over the same records:
   (a) the pipeline at parallelism 1, one Spark task (the key_by exchange stays, in
   process), records / processing time, the other core left to Spark's JVM and the driver as
   an executor core is on a cluster; (b) case 1's "on" runs at parallelism 2, records per
   CPU-second of the tasks' Python processes (every thread: operators, pickling, sockets,
   the TCP shuffle) against the loop's records per CPU-second.  Target: >= 0.5x for both.
   (c) case 1's "on" runs, records / processing time / 2 slots, is reported: on a 2-core
   machine the two tasks share the cores with the JVM and the driver, so it also measures
   waiting for a core.  The threads engine (``engine="threads"``, no Spark, all subtasks on
   threads of this process, one GIL) is a reference row.
5. **Recovery**: case 1's pipeline rate limited (10,000 records/s) into an exactly-once
   ``CollectSink``, ``Kill(after_checkpoint=1, delay=0.5)`` against the same run without
   failure: kill -> new attempt started, kill -> first checkpoint of the new attempt
   completed ("caught up", as the brief defines it), total job duration of both, and the
   committed output checked row for row against the failure-free result.  No target.
6. **TLS**: case 1's "on" pipeline with ``Pipeline(tls=True)`` (every channel between the
   tasks and every control connection in TLS 1.3, a certificate made for the run) against
   case 1's "on" runs of the same round: throughput ratio, TLS / plaintext.  No target
   (reported): the price of encryption on this machine.

**Throughput** is records / *processing time*; for Spark, processing time runs from the
moment the driver started attempt 0 (every task registered and was told to start; a watcher
thread polls the driver every 5 ms) to the completion of the final checkpoint (every record
went through the sink and was committed).  It leaves out the Spark stage launch and the stage
teardown after the final checkpoint, which are the same for every case.  End-to-end rates
(records / ``JobResult.duration``) are printed next to it.  For the threads engine the
window starts when the threads start (``JobResult.duration`` back from the return).

Cases 1, 3 and 4 write to ``cutline.DiscardSink`` (it drops and counts records), so the
"off" runs don't hold millions of output rows in memory until the one final commit.

The machine may be shared and noisy: cases run in rounds, in an order that rotates each
round, and medians are reported.  A ratio within the measured noise (half the spread of the
per-round ratios) of its target is "undecided"; with one round (``--quick``) the noise is
not measured.  Exit code is always 0: this is a benchmark, not a test.  Results also go to
``bench/results/runtime.json``.
"""

from __future__ import annotations

import collections
import os
import platform
import sys
import time
from typing import Any

from _common import (
    RESULTS, AttemptWatcher, Runner, Workdir, bench_parser, cutline_in_spark_task,
    discard_sink, fmt, git_state, median, ms, noise_of, parse_bench_args, percentile, rotated,
    spark_session, stamp, stop_quietly, styled, table, verdict, write_results,
)
from _common import console as make_console

from cutline import CheckpointConfig, Pipeline
from cutline.connectors import CollectSink, GeneratorSource

DEFAULT_OUT = RESULTS / "runtime.json"

SLOTS = 2
PARALLELISM = 2
OFF_INTERVAL = 1e9
ON_INTERVAL = 1.0
BP_INTERVAL = 0.5
KEYS = 1000

TARGET_OVERHEAD = 0.95  # on / off throughput, at least
TARGET_DURATION = 1.0  # p99 checkpoint duration / interval, below (ours: the brief has none)
TARGET_UNALIGNED = 0.1  # unaligned / aligned median checkpoint duration, at most
TARGET_PER_TASK = 0.5  # per-task records/s / bare loop records/s, at least

JOB_TIMEOUT = 300.0  # seconds; a hung job fails its run, not the benchmark

# --------------------------------------------------------------------------- workload
# Top-level functions and classes: Spark ships them (this module is __main__, pickled by
# value), and the bare loop calls the very same ones.


def make_record(i: int) -> str:
    """A CSV-ish line: ``"u<key>,<i>"``, 1,000 keys spread over the index."""
    return f"u{(i * 7919) % KEYS:03d},{i}"


def parse(line: str) -> tuple[str, int]:
    k, v = line.split(",")
    return (k, int(v))


def key_of(record: tuple[str, int]) -> str:
    return record[0]


SLOW_EVERY, SLOW_SLEEP = 100, 0.005  # 5 ms every 100 records: ~50 us a record


def mod_key(i: int) -> int:
    return i % KEYS


_slow_calls = [0]  # per process (per Spark task's copy of this module's globals)


def slow_count(ctx: Any, record: int):
    """A keyed running count that is slow: sleeps 5 ms every 100 records (GIL released)."""
    _slow_calls[0] += 1
    if _slow_calls[0] % SLOW_EVERY == 0:
        time.sleep(SLOW_SLEEP)
    n = ctx.value_state("count", 0)
    n.update(n.value + 1)
    return ((record % KEYS, n.value),)


def bare_loop(n: int) -> tuple[int, int]:
    """What the map -> key_by -> count pipeline does, as one plain loop in one process."""
    counts: dict[str, int] = {}
    get = counts.get
    out = None
    for i in range(n):
        record = parse(make_record(i))
        k = key_of(record)
        c = get(k, 0) + 1
        counts[k] = c
        out = (k, c)  # count() emits (key, n) for every record; the sink drops it
    assert out is None or out[1] == counts[out[0]]
    return sum(counts.values()), len(counts)


def expected_rows(n: int) -> collections.Counter:
    """What a failure-free run of the recovery pipeline commits: (key, 1..count)."""
    totals = collections.Counter(make_record(i).split(",", 1)[0] for i in range(n))
    return collections.Counter((k, c) for k, t in totals.items() for c in range(1, t + 1))


# --------------------------------------------------------------------------- pipelines


def throughput_pipeline(name: str, n: int, interval: float, storage: str,
                        rate: float | None = None, sink: Any = None,
                        parallelism: int = PARALLELISM, tls: bool = False) -> Pipeline:
    cfg = CheckpointConfig(interval=interval, storage=storage)
    p = Pipeline(name, parallelism=parallelism, checkpoint=cfg, tls=tls)
    (p.source(GeneratorSource(count=n, fn=make_record, rate=rate), uid="lines")
       .map(parse, uid="parse")
       .key_by(key_of)
       .count(uid="count")
       .sink(sink if sink is not None else discard_sink(), uid="out"))
    return p


def backpressure_pipeline(name: str, n: int, unaligned: bool, storage: str) -> Pipeline:
    cfg = CheckpointConfig(interval=BP_INTERVAL, storage=storage, unaligned=unaligned)
    p = Pipeline(name, parallelism=PARALLELISM, checkpoint=cfg)
    (p.source(GeneratorSource(count=n), uid="ints")
       .key_by(mod_key)
       .process(slow_count, uid="slow")
       .sink(discard_sink(), uid="out"))
    return p


# --------------------------------------------------------------------------- running


def _ckpt(c: Any) -> dict:
    return {"id": c.id, "attempt": c.attempt, "started": c.started, "completed": c.completed,
            "duration": c.duration, "alignment": c.alignment, "bytes": c.bytes,
            "in_flight": c.in_flight, "final": c.final}


def run_spark(pipeline: Pipeline, spark: Any, records: int, kill: Any = None) -> dict:
    watcher = AttemptWatcher()

    def on_start(driver: Any) -> None:
        watcher(driver)
        if kill is not None:
            kill(driver)

    # Both clocks, back to back: CheckpointRecord times are time.monotonic(), Kill's are
    # time.time().
    m0 = time.monotonic()
    w0 = time.time()
    m1 = time.monotonic()
    mono_at_wall0 = (m0 + m1) / 2
    result = pipeline.run(spark, on_start=on_start, timeout=JOB_TIMEOUT)
    t_end = time.monotonic()
    start = watcher.starts.get(0, t_end - result.duration)
    return _summarise(result, records, start, t_end, watcher.starts, mono_at_wall0, w0)


def run_threads_engine(pipeline: Pipeline, records: int) -> dict:
    result = pipeline.run(engine="threads", timeout=JOB_TIMEOUT)
    t_end = time.monotonic()
    start = t_end - result.duration  # run_threads' own t0, just before the threads start
    return _summarise(result, records, start, t_end, {0: start}, None, None)


def _summarise(result: Any, records: int, start: float, t_end: float, starts: dict,
               mono_at_wall0: float | None, wall0: float | None) -> dict:
    finals = [c for c in result.checkpoints if c.final]
    end = finals[-1].completed if finals else t_end
    processing = end - start
    cpu = sum(getattr(result, "cpu_seconds", {}).values()) or None
    return {
        "cpu": cpu,  # CPU seconds of the tasks' Python processes (every thread), last attempt
        "rate_per_cpu": records / cpu if cpu else None,
        "records": records,
        "duration": result.duration,
        "processing": processing,
        "startup": start - (t_end - result.duration),
        "rate": records / processing,
        "rate_end_to_end": records / result.duration,
        "attempts": result.attempts,
        "attempt_starts": {str(k): v for k, v in starts.items()},
        "checkpoints": [_ckpt(c) for c in result.checkpoints],
        "mono_at_wall0": mono_at_wall0,
        "wall0": wall0,
    }


# --------------------------------------------------------------------------- cases


def case_off(ctx: dict) -> dict:
    with Workdir() as d:
        p = throughput_pipeline("bench-off", ctx["records"], OFF_INTERVAL, f"file://{d}/ck")
        return run_spark(p, ctx["spark"], ctx["records"])


def case_on(ctx: dict) -> dict:
    with Workdir() as d:
        p = throughput_pipeline("bench-on", ctx["records"], ON_INTERVAL, f"file://{d}/ck")
        return run_spark(p, ctx["spark"], ctx["records"])


def case_tls(ctx: dict) -> dict:
    with Workdir() as d:
        p = throughput_pipeline("bench-tls", ctx["records"], ON_INTERVAL, f"file://{d}/ck",
                                tls=True)
        return run_spark(p, ctx["spark"], ctx["records"])


def case_bare(ctx: dict) -> dict:
    n = ctx["records"]
    c0, t0 = time.process_time(), time.perf_counter()
    total, keys = bare_loop(n)
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    if total != n or keys != KEYS:
        raise AssertionError(f"bare loop counted {total} records over {keys} keys")
    return {"records": n, "processing": dt, "rate": n / dt, "cpu": cpu, "rate_per_cpu": n / cpu}


def case_one_task(ctx: dict) -> dict:
    """The same pipeline at parallelism 1: one Spark task, the other core left to Spark's JVM
    and the driver, as an executor core is on a cluster.  The key_by exchange is still there
    (a hash-partitioned channel, in process)."""
    with Workdir() as d:
        n = ctx["records"] // 2
        p = throughput_pipeline("bench-one-task", n, ON_INTERVAL, f"file://{d}/ck",
                                parallelism=1)
        return run_spark(p, ctx["spark"], n)


def case_threads(ctx: dict) -> dict:
    with Workdir() as d:
        n = ctx["records_threads"]
        p = throughput_pipeline("bench-threads", n, ON_INTERVAL, f"file://{d}/ck")
        return run_threads_engine(p, n)


def case_aligned(ctx: dict) -> dict:
    with Workdir() as d:
        p = backpressure_pipeline("bench-aligned", ctx["records_bp"], False, f"file://{d}/ck")
        return run_spark(p, ctx["spark"], ctx["records_bp"])


def case_unaligned(ctx: dict) -> dict:
    with Workdir() as d:
        p = backpressure_pipeline("bench-unaligned", ctx["records_bp"], True, f"file://{d}/ck")
        return run_spark(p, ctx["spark"], ctx["records_bp"])


def _recovery_run(ctx: dict, kill: bool) -> dict:
    from cutline.spark.faults import Kill

    n = ctx["records_recovery"]
    with Workdir() as d:
        sink = CollectSink(str(d / "out"))
        p = throughput_pipeline("bench-kill" if kill else "bench-nofail", n, ON_INTERVAL,
                                f"file://{d}/ck", rate=ctx["rate"], sink=sink)
        killer = Kill(after_checkpoint=1, delay=0.5) if kill else None
        out = run_spark(p, ctx["spark"], n, kill=killer)
        rows = collections.Counter(sink.results())
    out["output_exact"] = rows == ctx["expected_recovery"]
    out["output_rows"] = sum(rows.values())
    if killer is not None:
        out["killed"] = [list(k) for k in killer.killed]
        if killer.killed:
            _slot, _pid, wall = killer.killed[0]
            kill_mono = out["mono_at_wall0"] + (wall - out["wall0"])
            out["kill_at"] = kill_mono - out["attempt_starts"].get("0", kill_mono)
            restarted = [v for k, v in out["attempt_starts"].items() if int(k) >= 1]
            out["kill_to_restart"] = min(restarted) - kill_mono if restarted else None
            after = [c for c in out["checkpoints"] if c["attempt"] >= 1]
            first = min(after, key=lambda c: c["completed"]) if after else None
            out["kill_to_caught_up"] = first["completed"] - kill_mono if first else None
            out["first_checkpoint_after"] = first
    return out


def case_nofail(ctx: dict) -> dict:
    return _recovery_run(ctx, kill=False)


def case_kill(ctx: dict) -> dict:
    return _recovery_run(ctx, kill=True)


OFF, ON, BARE, THREADS = "checkpoints off", "checkpoints on (1 s)", "bare loop", "threads engine"
ONE = "one task (parallelism 1)"
TLS = "checkpoints on (1 s), TLS"
ALIGNED, UNALIGNED = "aligned (backpressure)", "unaligned (backpressure)"
NOFAIL, KILLED = "rate-limited, no failure", "rate-limited, kill -9"

GROUPS: list[list[tuple[str, Any]]] = [
    [(OFF, case_off), (ON, case_on), (BARE, case_bare), (THREADS, case_threads),
     (ONE, case_one_task), (TLS, case_tls)],
    [(ALIGNED, case_aligned), (UNALIGNED, case_unaligned)],
    [(NOFAIL, case_nofail), (KILLED, case_kill)],
]
GROUP_NAMES = {"throughput": 0, "backpressure": 1, "recovery": 2}


# --------------------------------------------------------------------------- main


def make_ctx(quick: bool, records: int | None = None) -> dict[str, Any]:
    """The sizes of the runs (``--quick`` or not); ``spark`` is added by the caller."""
    records = records or (600_000 if quick else 3_000_000)
    ctx: dict[str, Any] = {
        "records": records,
        "records_threads": max(10_000, records // 3),
        "records_bp": 60_000 if quick else 320_000,
        "records_recovery": 30_000 if quick else 100_000,
        "rate": 10_000.0,
    }
    ctx["expected_recovery"] = expected_rows(ctx["records_recovery"])
    return ctx


def warm_up(spark: Any) -> None:
    """Start the Python workers and import everything once, unmeasured."""
    with Workdir() as d:
        run_spark(throughput_pipeline("bench-warmup", 20_000, ON_INTERVAL, f"file://{d}/ck"),
                  spark, 20_000)
    with Workdir() as d:
        run_spark(backpressure_pipeline("bench-warmup-bp", 2_000, True, f"file://{d}/ck"),
                  spark, 2_000)
    bare_loop(50_000)


def main(argv: list[str] | None = None) -> int:
    ap = bench_parser(__doc__, DEFAULT_OUT, (3, 1), quick="short run (smoke test), every case")
    ap.add_argument("--records", type=int, default=None,
                    help="records per throughput run (default 3,000,000; quick 600,000)")
    ap.add_argument("--only", choices=sorted(GROUP_NAMES), action="append", default=None,
                    help="run only these case groups (repeatable): throughput = cases 1, 2, "
                         "4 and 6, backpressure = case 3, recovery = case 5")
    args = parse_bench_args(ap, argv)
    groups = [GROUPS[GROUP_NAMES[g]] for g in sorted(set(args.only), key=GROUP_NAMES.get)] \
        if args.only else GROUPS

    console = make_console(150)
    quick, rounds = args.quick, args.rounds
    ctx = make_ctx(quick, args.records)
    records = ctx["records"]

    t_bench = time.monotonic()
    console.print(f"[bold]cutline runtime benchmark[/]  {'quick, ' if quick else ''}{rounds} "
                  f"round(s); {records:,} records per throughput run, "
                  f"{ctx['records_bp']:,} under backpressure, {ctx['records_recovery']:,} at "
                  f"{ctx['rate']:,.0f}/s for recovery; Python {platform.python_version()}")
    spark = spark_session(SLOTS)
    ctx["spark"] = spark
    console.print(f"Spark {spark.version}, master {spark.sparkContext.master}", style="dim")
    in_task = cutline_in_spark_task(spark)
    warm_up(spark)

    runner = Runner(console, 26, {name: [] for g in GROUPS for name, _ in g})
    runs, errors = runner.runs, runner.errors
    for r in range(rounds):
        for group in groups:
            for name, fn in rotated(group, r):
                runner.run(name, lambda fn=fn: fn(ctx), r, rounds,
                           lambda out: f"{out['rate']:,.0f} records/s" if "rate" in out else "")

    ok = {name: [x for x in v if x is not None] for name, v in runs.items()}

    def paired(a: str, b: str, f) -> list[float]:
        """Per-round f(run of a, run of b), rounds where both ran."""
        return [f(x, y) for x, y in zip(runs[a], runs[b]) if x is not None and y is not None]

    def med_of(name: str, key: str) -> float | None:
        return median([x[key] for x in ok[name]])

    # 1. Checkpoint overhead.
    off_rate, on_rate = med_of(OFF, "rate"), med_of(ON, "rate")
    r1_rounds = paired(ON, OFF, lambda on, off: on["rate"] / off["rate"])
    r1 = on_rate / off_rate if on_rate and off_rate else None
    n1, p1 = noise_of(r1_rounds), median(r1_rounds)
    v1 = verdict(r1, TARGET_OVERHEAD, True, n1, p1)

    # 2. Checkpoint durations of the "on" runs (final checkpoints excluded).
    on_durs = [c["duration"] for x in ok[ON] for c in x["checkpoints"] if not c["final"]]
    on_finals = [c["duration"] for x in ok[ON] for c in x["checkpoints"] if c["final"]]
    p50, p99 = percentile(on_durs, 50), percentile(on_durs, 99)
    r2_p50 = p50 / ON_INTERVAL if p50 is not None else None
    r2_p99 = p99 / ON_INTERVAL if p99 is not None else None
    v2 = verdict(r2_p99, TARGET_DURATION, False, None)

    # 3. Unaligned vs aligned under backpressure (final checkpoints excluded).
    def bp(name: str, key: str) -> list[float]:
        return [c[key] for x in ok[name] for c in x["checkpoints"] if not c["final"]]

    al_med, un_med = median(bp(ALIGNED, "duration")), median(bp(UNALIGNED, "duration"))
    r3 = un_med / al_med if al_med and un_med is not None else None

    def round_median_ratio(un: dict, al: dict) -> float | None:
        u = median([c["duration"] for c in un["checkpoints"] if not c["final"]])
        a = median([c["duration"] for c in al["checkpoints"] if not c["final"]])
        return u / a if u is not None and a else None

    r3_rounds = [x for x in paired(UNALIGNED, ALIGNED, round_median_ratio) if x is not None]
    n3, p3 = noise_of(r3_rounds), median(r3_rounds)
    v3 = verdict(r3, TARGET_UNALIGNED, False, n3, p3)
    un_inflight = bp(UNALIGNED, "in_flight")
    al_align = median(bp(ALIGNED, "alignment"))

    # 4. Per-task records/s against the bare loop.
    bare_rate = med_of(BARE, "rate")
    spark_task = on_rate / SLOTS if on_rate else None
    threads_task = med_of(THREADS, "rate") / SLOTS if ok[THREADS] else None
    r4 = spark_task / bare_rate if spark_task and bare_rate else None
    r4t = threads_task / bare_rate if threads_task and bare_rate else None
    r4_rounds = paired(ON, BARE, lambda on, b: on["rate"] / SLOTS / b["rate"])
    r4t_rounds = paired(THREADS, BARE, lambda t, b: t["rate"] / SLOTS / b["rate"])
    n4, n4t = noise_of(r4_rounds), noise_of(r4t_rounds)
    p4, p4t = median(r4_rounds), median(r4t_rounds)
    v4 = verdict(r4, TARGET_PER_TASK, True, n4, p4)
    v4t = verdict(r4t, TARGET_PER_TASK, True, n4t, p4t)
    # 4b. The same, charged by CPU: records per CPU-second of a task's process (every thread:
    # operators, pickling, sockets) against the bare loop's records per CPU-second.  On a
    # 2-core machine the two tasks share the cores with Spark's JVM and the driver, so
    # wall-clock per task (4c) also measures waiting for a core.
    bare_cpu_rate = med_of(BARE, "rate_per_cpu")
    on_cpu_rate = med_of(ON, "rate_per_cpu")
    r4c = on_cpu_rate / bare_cpu_rate if on_cpu_rate and bare_cpu_rate else None
    r4c_rounds = paired(ON, BARE, lambda on, b: on["rate_per_cpu"] / b["rate_per_cpu"]
                        if on.get("rate_per_cpu") else None)
    r4c_rounds = [x for x in r4c_rounds if x is not None]
    n4c, p4c = noise_of(r4c_rounds), median(r4c_rounds)
    v4c = verdict(r4c, TARGET_PER_TASK, True, n4c, p4c)
    # 4a. One task with a core to itself: parallelism 1, wall clock.
    one_rate = med_of(ONE, "rate")
    r4o = one_rate / bare_rate if one_rate and bare_rate else None
    r4o_rounds = paired(ONE, BARE, lambda o, b: o["rate"] / b["rate"])
    n4o, p4o = noise_of(r4o_rounds), median(r4o_rounds)
    v4o = verdict(r4o, TARGET_PER_TASK, True, n4o, p4o)

    # 6. TLS: throughput with every channel and control connection in TLS / without.
    tls_rate = med_of(TLS, "rate")
    r6 = tls_rate / on_rate if tls_rate and on_rate else None
    r6_rounds = paired(TLS, ON, lambda t, on: t["rate"] / on["rate"])
    n6, p6 = noise_of(r6_rounds), median(r6_rounds)
    tls_cpu = med_of(TLS, "rate_per_cpu")
    # per CPU-second of the tasks' processes: what TLS costs them, whatever else the
    # machine is running (wall clock on a shared 2-core box is mostly noise)
    r6c_rounds = [x for x in paired(TLS, ON, lambda t, on: t["rate_per_cpu"] / on["rate_per_cpu"]
                                    if t.get("rate_per_cpu") and on.get("rate_per_cpu")
                                    else None) if x is not None]
    r6c = tls_cpu / on_cpu_rate if tls_cpu and on_cpu_rate else None
    n6c, p6c = noise_of(r6c_rounds), median(r6c_rounds)

    # 5. Recovery.
    kills = [x for x in ok[KILLED] if x.get("killed")]
    to_restart = median([x.get("kill_to_restart") for x in kills])
    to_caught_up = median([x.get("kill_to_caught_up") for x in kills])
    kill_at = median([x.get("kill_at") for x in kills])
    dur_kill = med_of(KILLED, "duration")
    dur_nofail = med_of(NOFAIL, "duration")
    r5 = dur_kill / dur_nofail if dur_kill and dur_nofail else None
    exact = all(x["output_exact"] for x in ok[KILLED] + ok[NOFAIL]) if ok[KILLED] else None
    not_killed = len(ok[KILLED]) - len(kills)

    # ------------------------------------------------------------------ tables
    runs_t = table(f"runs (median of {rounds} round(s); processing time = attempt 0 "
                   "started -> final checkpoint completed)",
                   ("case", "records", "processing", "records/s", "records/s per task",
                    "end-to-end records/s", "checkpoints", "attempts"))
    for name, v in ok.items():
        if not v:
            runs_t.add_row(name, *["-"] * 7)
            continue
        rate = median([x["rate"] for x in v])
        e2e = median([x.get("rate_end_to_end") for x in v])
        ncp = median([len(x.get("checkpoints", [])) for x in v]) if "checkpoints" in v[0] \
            else None
        runs_t.add_row(
            name, f"{v[0]['records']:,}", f"{median([x['processing'] for x in v]):.2f} s",
            f"{rate:,.0f}",
            f"{rate / SLOTS:,.0f}" if name in (ON, OFF, THREADS, TLS) else
            (f"{rate:,.0f} (1 process)" if name == BARE else
             f"{rate:,.0f} (1 task)" if name == ONE else "-"),
            fmt(e2e, ",.0f"), fmt(ncp, ".0f"),
            fmt(median([x.get("attempts") for x in v]), ".0f"))
    console.print(runs_t)

    cp_t = table("checkpoints (final excluded; p99 of few samples is near the max)",
                 ("runs", "interval", "n", "p50", "p99", "max", "median alignment",
                  "median in-flight records", "median size"), left=("runs",))
    for name, interval in ((ON, ON_INTERVAL), (ALIGNED, BP_INTERVAL), (UNALIGNED, BP_INTERVAL)):
        d = bp(name, "duration")
        cp_t.add_row(name, f"{interval:g} s", str(len(d)), ms(percentile(d, 50)),
                     ms(percentile(d, 99)), ms(max(d) if d else None),
                     ms(median(bp(name, "alignment"))), fmt(median(bp(name, "in_flight")), ",.0f"),
                     fmt(median(bp(name, "bytes")), ",.0f", " B"))
    console.print(cp_t)

    if ok[KILLED]:
        rec_t = table(f"recovery: {ctx['records_recovery']:,} records at "
                      f"{ctx['rate']:,.0f}/s, Kill(after_checkpoint=1, delay=0.5)",
                      ("round", "killed at", "kill -> new attempt", "kill -> its 1st checkpoint",
                       "restart -> 1st checkpoint", "attempts", "duration", "no failure",
                       "output"), left=())
        for x, y in zip(runs[KILLED], runs[NOFAIL]):
            if x is None:
                continue
            rec_t.add_row(str(x["round"]), fmt(x.get("kill_at"), ".2f", " s"),
                          fmt(x.get("kill_to_restart"), ".2f", " s"),
                          fmt(x.get("kill_to_caught_up"), ".2f", " s"),
                          fmt(x["kill_to_caught_up"] - x["kill_to_restart"]
                              if x.get("kill_to_caught_up") is not None
                              and x.get("kill_to_restart") is not None else None, ".2f", " s"),
                          str(x["attempts"]),
                          f"{x['duration']:.2f} s",
                          fmt(y["duration"] if y else None, ".2f", " s"),
                          "exact" if x["output_exact"] else "[red]DIFFERS[/]")
        console.print(rec_t)

    summary: list[dict] = [
        {"case": "1. throughput, checkpoints on (1 s) / off",
         "measured": f"{fmt(on_rate, ',.0f')} vs {fmt(off_rate, ',.0f')} records/s",
         "ratio": r1, "paired": p1, "target": f">= {TARGET_OVERHEAD}x", "noise": n1,
         "verdict": v1},
        {"case": "2. checkpoint duration p50 / interval",
         "measured": f"p50 {ms(p50)} of {ON_INTERVAL:g} s ({len(on_durs)} checkpoints)",
         "ratio": r2_p50, "target": "- (reported)", "noise": None, "verdict": "-"},
        {"case": "2. checkpoint duration p99 / interval",
         "measured": f"p99 {ms(p99)} of {ON_INTERVAL:g} s",
         "ratio": r2_p99, "target": f"< {TARGET_DURATION}x (ours)", "noise": None,
         "verdict": v2},
        {"case": "3. backpressure: unaligned / aligned duration",
         "measured": f"{ms(un_med)} vs {ms(al_med)}; unaligned stores "
                     f"{fmt(median(un_inflight), ',.0f')} in-flight records",
         "ratio": r3, "paired": p3, "target": f"<= {TARGET_UNALIGNED}x", "noise": n3,
         "verdict": v3},
        {"case": "4a. records/s, 1 task (parallelism 1) / bare loop",
         "measured": f"{fmt(one_rate, ',.0f')} vs {fmt(bare_rate, ',.0f')}",
         "ratio": r4o, "paired": p4o, "target": f">= {TARGET_PER_TASK}x", "noise": n4o,
         "verdict": v4o},
        {"case": "4b. records/CPU-s per task (par. 2) / bare loop",
         "measured": f"{fmt(on_cpu_rate, ',.0f')} vs {fmt(bare_cpu_rate, ',.0f')}",
         "ratio": r4c, "paired": p4c, "target": f">= {TARGET_PER_TASK}x", "noise": n4c,
         "verdict": v4c},
        {"case": f"4c. records/s per task (par. 2, {os.cpu_count()} cores) / bare",
         "measured": f"{fmt(spark_task, ',.0f')} vs {fmt(bare_rate, ',.0f')}",
         "ratio": r4, "paired": p4, "target": "- (reported)", "noise": n4,
         "verdict": "-"},
        {"case": "4d. records/s per task, threads engine / bare",
         "measured": f"{fmt(threads_task, ',.0f')} vs {fmt(bare_rate, ',.0f')}",
         "ratio": r4t, "paired": p4t, "target": "- (reference)",
         "noise": n4t,
         "verdict": "-"},
        {"case": "5. recovery: duration with kill / without",
         "measured": f"{fmt(dur_kill, '.2f', ' s')} vs {fmt(dur_nofail, '.2f', ' s')}; kill -> "
                     f"new attempt {fmt(to_restart, '.2f', ' s')}, -> first checkpoint "
                     f"{fmt(to_caught_up, '.2f', ' s')}; output "
                     f"{'exact' if exact else 'n/a' if exact is None else 'DIFFERS'}",
         "ratio": r5, "target": "- (reported)", "noise": None, "verdict": "-"},
        {"case": "6. TLS: records/s with TLS / without",
         "measured": f"{fmt(tls_rate, ',.0f')} vs {fmt(on_rate, ',.0f')} records/s",
         "ratio": r6, "paired": p6, "target": "- (reported)", "noise": n6, "verdict": "-"},
        {"case": "6. TLS: records/CPU-s with TLS / without",
         "measured": f"{fmt(tls_cpu, ',.0f')} vs {fmt(on_cpu_rate, ',.0f')} per CPU-s",
         "ratio": r6c, "paired": p6c, "target": "- (reported)", "noise": n6c, "verdict": "-"},
    ]
    def noise_text(row: dict) -> str:
        if row["noise"] is not None:
            return f"±{row['noise']:.3f}"
        if row["verdict"] in ("PASS", "FAIL", "undecided") and row["case"][0] in "134":
            return "not measured" if rounds < 2 else "-"
        return "-"

    cols = ("case", "measured", "ratio", "paired", "target", "noise", "verdict")
    sum_t = table("cutline runtime benchmark: summary", cols,
                  left=("case", "measured", "target", "verdict"),
                  no_wrap=[c for c in cols if c != "measured"])
    for row in summary:
        sum_t.add_row(row["case"], row["measured"], fmt(row["ratio"], ".3f", "x"),
                      fmt(row.get("paired"), ".3f", "x"),
                      row["target"], noise_text(row), styled(row["verdict"]))
    console.print(sum_t)
    console.print("ratio: of the medians over rounds; paired: median of the per-round ratios; "
                  "noise: half the spread of the per-round ratios.  A verdict is undecided "
                  "when the ratio is within the noise of its target, or when ratio and paired "
                  "ratio fall on different sides of it.", style="dim")
    if not_killed:
        console.print(f"{not_killed} kill run(s) finished before the kill happened",
                      style="yellow")
    if errors:
        console.print(f"{len(errors)} run(s) failed; see 'errors' in the JSON", style="red")
    elapsed = time.monotonic() - t_bench
    console.print(f"benchmark took {elapsed:.0f} s", style="dim")

    result = {
        "benchmark": "cutline runtime on embedded Spark: checkpoint overhead, durations, "
                     "unaligned vs aligned, per-task rate, recovery, TLS",
        **stamp(),
        "spark": spark.version,
        "master": spark.sparkContext.master,
        "git": git_state(),
        "cutline_in_spark_task": in_task,
        "quick": quick,
        "rounds": rounds,
        "groups": args.only or sorted(GROUP_NAMES, key=GROUP_NAMES.get),
        "elapsed_s": elapsed,
        "throughput_definition": "records / (final checkpoint completed - attempt 0 started), "
                                 "both time.monotonic() in the driver; threads engine: from "
                                 "the threads' start",
        "config": {k: v for k, v in ctx.items() if k not in ("spark", "expected_recovery")}
        | {"slots": SLOTS, "parallelism": PARALLELISM, "on_interval": ON_INTERVAL,
           "off_interval": OFF_INTERVAL, "backpressure_interval": BP_INTERVAL,
           "slow_operator": f"sleep {SLOW_SLEEP}s every {SLOW_EVERY} records"},
        "summary": {
            "checkpoint_overhead": {"on_rate": on_rate, "off_rate": off_rate, "ratio": r1,
                                    "per_round": r1_rounds, "paired": p1, "noise": n1,
                                    "target": TARGET_OVERHEAD, "verdict": v1},
            "checkpoint_duration": {"interval": ON_INTERVAL, "n": len(on_durs), "p50": p50,
                                    "p99": p99, "p50_ratio": r2_p50, "p99_ratio": r2_p99,
                                    "final_durations": on_finals,
                                    "target_p99_ratio": TARGET_DURATION, "verdict": v2},
            "unaligned_vs_aligned": {"aligned_median": al_med, "unaligned_median": un_med,
                                     "ratio": r3, "per_round": r3_rounds, "paired": p3,
                                     "noise": n3,
                                     "aligned_alignment_median": al_align,
                                     "unaligned_in_flight_median": median(un_inflight),
                                     "unaligned_in_flight_max": max(un_inflight, default=None),
                                     "target": TARGET_UNALIGNED, "verdict": v3},
            "per_task_rate": {"bare_loop_rate": bare_rate, "spark_per_task": spark_task,
                              "threads_per_task": threads_task, "ratio_spark": r4,
                              "ratio_threads": r4t, "per_round_spark": r4_rounds,
                              "per_round_threads": r4t_rounds, "paired_spark": p4,
                              "paired_threads": p4t, "noise_spark": n4,
                              "noise_threads": n4t, "target": TARGET_PER_TASK,
                              "verdict_spark_wall": v4, "verdict_threads": v4t,
                              "one_task_rate": one_rate, "ratio_one_task": r4o,
                              "per_round_one_task": r4o_rounds, "noise_one_task": n4o,
                              "verdict_one_task": v4o,
                              "bare_loop_rate_per_cpu": bare_cpu_rate,
                              "spark_rate_per_cpu": on_cpu_rate, "ratio_per_cpu": r4c,
                              "per_round_per_cpu": r4c_rounds, "noise_per_cpu": n4c,
                              "verdict_per_cpu": v4c},
            "tls": {"tls_rate": tls_rate, "plain_rate": on_rate, "ratio": r6,
                    "per_round": r6_rounds, "paired": p6, "noise": n6,
                    "tls_rate_per_cpu": tls_cpu, "plain_rate_per_cpu": on_cpu_rate,
                    "ratio_per_cpu": r6c, "per_round_per_cpu": r6c_rounds,
                    "paired_per_cpu": p6c, "noise_per_cpu": n6c},
            "recovery": {"kill_at_median": kill_at, "kill_to_restart_median": to_restart,
                         "kill_to_caught_up_median": to_caught_up,
                         "duration_killed_median": dur_kill,
                         "duration_no_failure_median": dur_nofail, "ratio": r5,
                         "output_exact": exact, "runs_without_kill": not_killed},
        },
        "runs": runs,
        "errors": errors,
    }
    write_results(args.out, result, console)
    stop_quietly(spark)
    return 0


if __name__ == "__main__":
    sys.exit(main())
