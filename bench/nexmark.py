"""Nexmark on cutline and on Spark Structured Streaming, side by side: throughput at saturation,
latency at a fixed rate, checkpoint duration, and kill -9 to caught up.

Run ``python bench/nexmark.py`` (``--quick``: a small input, one round).  The input is
``--events`` Nexmark events (``cutline nexmark generate``: the reference's mix and
distributions, 10,000 events per second of event time, out of order within groups of 100,
i.e. by less than 10 ms) in Parquet files of 50,000 events (at least 4), and a last file holding a
far-future sentinel bid (Spark closes windows only when its watermark passes them).  One
embedded Spark session (``local[2,8]``) runs both systems.  Every query
(``examples/nexmark/queries.py``; ``tests/examples/test_nexmark_queries.py`` checks that the two
systems' results are equal) runs:

- on cutline at parallelism 2 with checkpoints every 1 s into a ``DiscardSink`` (Nexmark's
  blackhole), from ``FileSource(parquet)``; q0-q2, q5 and q7 also in their columnar form
  (batch streams reading only the columns they use; q5 and q7 window on batches, then per
  record on what is left).  Processing time: attempt 0 started -> the final checkpoint
  completed.
- on Spark with ``spark.sql.shuffle.partitions=2``, ``trigger(availableNow=True)`` (the
  whole backlog in one micro-batch: Spark's best case), into the ``noop`` sink.  Processing
  time: the first micro-batch's trigger -> the end of the last micro-batch.

**Latency** (``--only latency``; ``--rate`` events/s, default 500, for
``--latency-seconds``, default 25, quick 8; the first ``--warmup`` s, default 5, quick 2,
not counted): a writer thread writes Nexmark events as a Parquet file every 0.1 s into a
directory both systems follow, event time following the wall clock (out of order within
groups of 10; a file holds whole groups) and notes when each file became visible. A result
row's latency is *committed - determined*: determined is when the first file holding the
event time the row needs became visible (its own event's; q3: the later of the person and
the auction; q8: the later of the person and the seller's first auction in the window;
windows: the end + the watermark delay, the first moment a watermark could pass it; q4: its
auction's expiry + the delay). *Committed*: cutline exactly-once at a 0.1 s checkpoint
interval into a ``CollectSink`` (its part file appears when the checkpoint commits); Spark
through ``foreachBatch`` (rows collected and pickled), committed when
``<checkpoint>/commits/<id>`` appears. Spark's triggers: the default (as fast as possible)
and, for ``--short-trigger-queries`` (default q0 q3 q7), ``processingTime`` 100 ms (it
starts a micro-batch as soon as the last ends when that took over 100 ms, as the default
does); real-time mode is probed once (PySpark 4.3 has it, but it refuses the file source:
"The input stream FileStreamSource is not supported in Real-time Mode") and used if it runs.
*Growth*: the slope of each commit's median latency against time (about 0 when a system
keeps up with the input; 1 - capacity / rate when it falls behind). One live run of each
system (q1, 8 s) goes first, unmeasured: Spark's first ``foreachBatch`` query over live
input in a session is much slower than the next. **Checkpoint duration**: cutline's
checkpoint stats in the latency runs; Spark's per micro-batch ``walCommit`` +
``commitOffsets`` + its state stores' ``commitTimeMs``, and ``addBatch``.

**Kill to caught up** (``--only kill``; ``--kill-seconds`` of input, default 50, the kill at
20%): cutline: ``kill -9`` of one task's Spark Python worker (Spark restarts the barrier stage,
the job restores its latest checkpoint).  Spark: the query runs in a child process with its
own session; ``kill -9`` of its process group (the driver's Python and JVM, which runs the
query in local mode) and a new child restarts it from its checkpoint location at once, as a
Spark user recovers.  Caught up: the first commit from which on every result for 10 s (or to
the end of the run) is within twice that system's failure-free p99 (its default trigger for
Spark, which the kill runs use; at least 0.5 s); "> N": not caught up by the run's last
commit, N s after the kill.

Records/s = events in the backlog / processing time.  One unmeasured warm-up run of each
system goes first; rounds rotate the order of the cases; medians are reported, with the
noise (half the spread of the per-round ratios).  The ratio
is cutline / Spark (cutline's better form where it has two).  Results: ``bench/results/
nexmark.json``.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import dataclasses
import importlib.util
import json
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from _common import (
    LoadSampler, conditions,
    RESULTS, AttemptWatcher, Runner, Workdir, bench_parser, fmt, git_state, median, noise_of,
    parse_bench_args, percentile, positive_float, positive_int, pyplot, rotated,
    spark_processing, spark_session, stamp, stop_quietly, styled, table, verdict,
    write_results,
)
from _common import console as make_console
from _common import input_files as input_dir_files

from cutline.connectors import DiscardSink

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = RESULTS / "nexmark.json"
SLOTS = PARALLELISM = 2
EVENTS = (1_000_000, 100_000)  # full, quick
PER_FILE = 50_000
OUT_OF_ORDER = 100
JOB_TIMEOUT = 900.0
TARGET_P99 = 0.25  # cutline at a 0.1 s checkpoint interval / Spark's best trigger
# throughput, cutline (its better form) / Spark: >= 2x where Spark's query runs Python logic
# (q4: applyInPandasWithState), >= 1.5x Spark SQL on the stateless queries and q5 / q7
TARGET_THROUGHPUT = {"q4": 2.0} | {q: 1.5 for q in ("q0", "q1", "q2", "q5", "q7")}
CUTLINE, COLUMNAR, SPARK = "cutline", "cutline columnar", "spark"


def _run_module() -> Any:
    path = HERE.parent / "examples" / "nexmark" / "run.py"
    spec = importlib.util.spec_from_file_location("nexmark_run", path)
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules["nexmark_run"] = mod
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


R = _run_module()
Q = R.Q


def cutline_case(ctx: dict, query: str, columnar: bool) -> dict:
    with Workdir() as d:
        sink = DiscardSink(str(d / "count"))
        p = R.cutline_pipeline(query, ctx["input"], sink, f"file://{d}/ck", ctx["max_delay"],
                               PARALLELISM, columnar=columnar)
        Q.ship_by_value()
        watch = AttemptWatcher()
        t0 = time.monotonic()
        result = p.run(ctx["spark"], on_start=watch, timeout=JOB_TIMEOUT)
        t_end = time.monotonic()
        finals = [c for c in result.checkpoints if c.final]
        end = finals[-1].completed if finals else t_end
        start = watch.started if watch.started is not None else t0
        rows = sink.count(p.name)
    n = ctx["events"]
    durations = sorted(c.duration for c in result.checkpoints if not c.final)
    return {"records": n, "processing": end - start, "rate": n / (end - start),
            "end_to_end": t_end - t0, "rows": rows, "attempts": result.attempts,
            "checkpoints": len(result.checkpoints),
            "checkpoint_p50": median(durations), "checkpoint_max": max(durations, default=None)}


def spark_case(ctx: dict, query: str) -> dict:
    with Workdir() as d:
        t0 = time.monotonic()
        q = R.start_spark(ctx["spark"], query, ctx["input"], str(d), ctx["max_delay"],
                          sink="noop")
        R.await_spark(q, JOB_TIMEOUT)
        t_end = time.monotonic()
        processing = spark_processing(q.recentProgress)
        # what the noop sink was given (-1 where Spark does not count it): recorded beside
        # cutline's rows, not compared (update and complete modes count rows differently)
        sink_rows = [p.get("sink", {}).get("numOutputRows", -1) for p in q.recentProgress]
    n = ctx["events"]
    return {"records": n, "processing": processing, "rate": n / processing,
            "end_to_end": t_end - t0,
            "sink_rows": sum(sink_rows) if sink_rows and min(sink_rows) >= 0 else None}


def run_case(ctx: dict, query: str, system: str) -> dict:
    if system == SPARK:
        return spark_case(ctx, query)
    return cutline_case(ctx, query, system == COLUMNAR)


def cases(queries: list[str]) -> list[tuple[str, str, str]]:
    out = []
    for q in queries:
        out.append((q, CUTLINE, f"{q} {CUTLINE}"))
        if q in Q.COLUMNAR:
            out.append((q, COLUMNAR, f"{q} {COLUMNAR}"))
        out.append((q, SPARK, f"{q} {SPARK}"))
    return out


def summarise(runs: dict, queries: list[str]) -> list[dict]:
    rows = []
    for q in queries:
        def rates(system: str, q: str = q) -> list:
            return [r["rate"] if r else None for r in runs.get(f"{q} {system}", [])]

        mine = {s: rates(s) for s in (CUTLINE, COLUMNAR)}
        best = COLUMNAR if median(mine[COLUMNAR]) and (
            median(mine[COLUMNAR]) or 0) > (median(mine[CUTLINE]) or 0) else CUTLINE
        spark = rates(SPARK)
        per = [a / b for a, b in zip(mine[best], spark) if a and b]
        m, s = median(mine[best]), median(spark)
        ratio, target = (m / s if m and s else None), TARGET_THROUGHPUT.get(q)
        rows.append({"query": q, "cutline": median(mine[CUTLINE]),
                     "cutline_columnar": median(mine[COLUMNAR]), "spark": s,
                     "best_cutline": best, "ratio": ratio, "noise": noise_of(per),
                     "per_round": per, "target": target,
                     "verdict": verdict(ratio, target, True, noise_of(per), median(per))
                     if target else "-",
                     "checkpoint_p50": median([r.get("checkpoint_p50") for r in
                                               runs.get(f"{q} {CUTLINE}", []) if r])})
    return rows


# --------------------------------------------------------------------------- latency

WRITE_PERIOD = 0.1  # latency runs: one input file every 0.1 s
POLL = 0.02  # cutline's file source: listing period when idle (Spark's polls every 10 ms)
LATENCY_INTERVAL = 0.1  # cutline's checkpoint interval in latency and kill runs (the target's)
LATENCY_OUT_OF_ORDER = 10  # events shuffled within groups of 10 (a file holds whole groups)
CUT_EO = "cutline EO 0.1 s"
SPARK_DEFAULT, SPARK_SHORT, SPARK_RT = "default trigger", "processingTime 100 ms", "real-time"
SPARK_TRIGGERS = {SPARK_DEFAULT: {}, SPARK_SHORT: {"processingTime": "100 milliseconds"},
                  SPARK_RT: {"realTime": "5 seconds"}}
CAUGHT_UP_FACTOR, CAUGHT_UP_FLOOR = 2.0, 0.5  # bound: 2x the failure-free p99, >= 0.5 s
KILL_AT = 0.2  # kill runs: the kill this far into the input
KEEPS_UP = 0.1  # a run keeps up when its latency grows by at most 0.1 s per s of run


class LiveInput(threading.Thread):
    """Writes Nexmark events at ``rate`` events/s as Parquet files, one every 0.1 s, into
    ``directory``, and notes when each became visible and the event times it holds.

    Event time follows the wall clock (``base_time_ms`` = the start, ``events_per_second``
    = ``rate``); a file holds whole out-of-order groups, so the files' event-time ranges do
    not overlap and :meth:`visible` maps an event time to the moment an event at or after
    it could first be read.  What the latency of a result row needs is kept (auctions,
    persons, q2's bids, bids per auction for q4)."""

    def __init__(self, directory: Path, rate: float, seconds: float,
                 done_after: float | None = None) -> None:
        super().__init__(daemon=True, name="nexmark-input")
        from cutline.connectors.nexmark import Nexmark, NexmarkConfig

        self.directory, self.rate, self.seconds, self.done_after = \
            directory, rate, seconds, done_after
        per_file = int(round(rate * WRITE_PERIOD))
        if per_file % LATENCY_OUT_OF_ORDER:
            raise ValueError(f"--rate must make files of whole groups of "
                             f"{LATENCY_OUT_OF_ORDER} events (rate x {WRITE_PERIOD} s), "
                             f"got {rate:g}")
        self.per_file = per_file
        self.t0 = time.time()  # set again by start()
        self.config = NexmarkConfig(events_per_second=rate, out_of_order=LATENCY_OUT_OF_ORDER)
        self.gen = Nexmark(self.config)
        self.visible_at: list[float] = []  # per file: renamed into place (wall clock)
        self.max_ts: list[int] = []  # per file: its newest event time (ms)
        self.auctions: dict[int, tuple] = {}  # id -> (dateTime, seller, category, expires)
        self.persons: dict[int, int] = {}  # id -> dateTime
        self.q2: dict[tuple, int] = {}  # (auction, price) -> dateTime, q2's bids
        self.bids: dict[int, list[int]] = collections.defaultdict(list)  # auction -> times
        self.first_auction: dict[tuple, int] = {}  # (seller, q8's window start) -> dateTime
        self.events = 0
        self.error: BaseException | None = None

    def start(self) -> None:
        """Event time starts now (a file's events are at most 0.1 s older than it)."""
        from cutline.connectors.nexmark import Nexmark

        self.t0 = time.time()
        base = int(self.t0 * 1000) - int(WRITE_PERIOD * 1000)
        self.config = dataclasses.replace(self.config, base_time_ms=base)
        self.gen = Nexmark(self.config)
        super().start()

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # noqa: BLE001 - reported by the run
            self.error = exc

    def _run(self) -> None:
        import numpy as np
        import pyarrow.parquet as pq

        k = 0
        while k * WRITE_PERIOD < self.seconds - 1e-9:
            delay = self.t0 + k * WRITE_PERIOD - time.time()
            if delay > 0:
                time.sleep(delay)
            numbers = np.arange(k * self.per_file, (k + 1) * self.per_file, dtype=np.int64)
            name = f"ev-{k:06d}.parquet"
            tmp = self.directory / f".{name}.tmp"
            pq.write_table(pa_table(self.gen.batch(numbers)), tmp)
            os.rename(tmp, self.directory / name)
            self.visible_at.append(time.time())
            self._note(self.gen.records(numbers))
            self.events += len(numbers)
            k += 1
        if self.done_after is not None:
            time.sleep(self.done_after)
            (self.directory / "_DONE").write_text("")

    def _note(self, records: list[dict]) -> None:
        newest = 0
        for e in records:
            if e["person"] is not None:
                p = e["person"]
                self.persons[p["id"]] = p["dateTime"]
                newest = max(newest, p["dateTime"])
            elif e["auction"] is not None:
                a = e["auction"]
                self.auctions[a["id"]] = (a["dateTime"], a["seller"], a["category"],
                                          a["expires"])
                start = a["dateTime"] - a["dateTime"] % (Q.WINDOW * 1000)
                self.first_auction.setdefault((a["seller"], start), a["dateTime"])
                newest = max(newest, a["dateTime"])
            else:
                b = e["bid"]
                self.bids[b["auction"]].append(b["dateTime"])
                if b["auction"] % Q.SKIP == 0:
                    self.q2.setdefault((b["auction"], b["price"]), b["dateTime"])
                newest = max(newest, b["dateTime"])
        self.max_ts.append(max(newest, self.max_ts[-1] if self.max_ts else 0))

    def visible(self, ts_ms: float | None) -> float | None:
        """When the first file holding an event time >= ``ts_ms`` became visible (None: no
        file did, the result is made only by the end of the input)."""
        if ts_ms is None:
            return None
        k = bisect.bisect_left(self.max_ts, ts_ms)
        return self.visible_at[k] if k < len(self.visible_at) else None

    def q4_closings(self) -> dict[int, list[int]]:
        """Category -> the expiry times of its auctions that close with a price (a bid
        between start and end), in order: q4's n-th row of a category needs the n-th."""
        out: dict[int, list[int]] = collections.defaultdict(list)
        for aid, (start, _, category, end) in self.auctions.items():
            if any(start <= t <= end for t in self.bids.get(aid, ())):
                out[category].append(end)
        return {c: sorted(v) for c, v in out.items()}


def pa_table(batch: Any) -> Any:
    import pyarrow as pa

    return pa.Table.from_batches([batch])


def determined_ms(query: str, row: tuple, inp: LiveInput, closings: dict) -> float | None:
    """The event time from which on result ``row`` of ``query`` can exist: its own event's
    (per-event results), both sides' (q3's and q8's joins), a window's end + the watermark delay
    (windows: only an event that late moves a watermark past the end), q4: its auction's
    expiry + the delay."""
    delay = inp.config.max_delay * 1000
    if query in ("q0", "q1"):
        return row[3]
    if query == "q2":
        return inp.q2.get((row[0], row[1]))
    if query == "q3":
        a = inp.auctions.get(row[3])
        if a is None or a[1] not in inp.persons:
            return None
        return max(a[0], inp.persons[a[1]])
    if query == "q4":
        ends = closings.get(row[0], [])
        n = int(row[2])
        return ends[n - 1] + delay if 0 < n <= len(ends) else None
    if query == "q5":
        return row[1] + delay
    if query == "q7":
        return row[0] + Q.WINDOW * 1000 + delay
    if query == "q8":  # the person and the seller's first auction of the window are in
        # (both systems can emit then: Spark's windowed join, cutline's keyed process)
        opened, registered = inp.first_auction.get((row[0], row[2])), inp.persons.get(row[0])
        return None if opened is None or registered is None else max(opened, registered)
    if query == "q11":
        return row[3] + delay
    if query == "q18":
        return row[2]
    raise ValueError(query)


def latencies(query: str, committed: list[tuple[float, list[tuple]]], inp: LiveInput,
              warmup: float) -> list[tuple[float, float]]:
    """(committed, latency) of every result row the input made after the warm-up:
    ``committed`` is (when committed, rows) per commit, in order."""
    closings = inp.q4_closings() if query == "q4" else {}
    out = []
    for when, rows in committed:
        for row in rows:
            seen = inp.visible(determined_ms(query, row, inp, closings))
            if seen is not None and seen - inp.t0 >= warmup:
                out.append((when, when - seen))
    return out


def growth(points: list[tuple[float, float]]) -> float | None:
    """How fast latency grows during the run: the least-squares slope of each commit's
    median latency against its commit time (s per s; about 0 when the system keeps up, 1 -
    capacity / rate when it falls behind).  None with fewer than 4 commits."""
    by_commit: dict[float, list[float]] = collections.defaultdict(list)
    for when, lat in points:
        by_commit[when].append(lat)
    if len(by_commit) < 4:
        return None
    xs = sorted(by_commit)
    ys = [median(by_commit[x]) or 0.0 for x in xs]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var if var else None


def latency_summary(points: list[tuple[float, float]]) -> dict:
    lat = [x for _, x in points]
    return {"n": len(lat), "p50": percentile(lat, 50), "p99": percentile(lat, 99),
            "max": max(lat) if lat else None, "growth": growth(points),
            "cdf": [round(percentile(lat, q / 2) or 0, 4) for q in range(201)] if lat else []}


def caught_up(points: list[tuple[float, float]], kill: float, bound: float,
              hold: float = 10.0) -> float | None:
    """Seconds from ``kill`` to the first commit from which on every result for ``hold``
    seconds (up to the first commit after that, or to the end of the run) is within
    ``bound`` (None: never, in the run).  A slow result later than that is noise of the
    machine, not the recovery."""
    slowest: dict[float, float] = {}
    for when, lat in points:
        if when >= kill:
            slowest[when] = max(lat, slowest.get(when, lat))
    commits = sorted(slowest)
    for i, t in enumerate(commits):
        # up to the first commit at or after t + hold: a stall shows in what it commits
        end = bisect.bisect_left(commits, t + hold)
        if max(slowest[w] for w in commits[i:end + 1]) <= bound:
            return t - kill
    return None


class Stamps(threading.Thread):
    """Stamps each file of ``directory`` (recursively one level: ``glob``) when first seen."""

    def __init__(self, directory: Path, pattern: str) -> None:
        super().__init__(daemon=True, name="stamps")
        self.directory, self.pattern = directory, pattern
        self.seen: dict[Path, float] = {}
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            now = time.time()
            for f in self.directory.glob(self.pattern):
                if f not in self.seen and not f.name.startswith("."):
                    self.seen[f] = now
            self._halt.wait(0.01)

    def stop(self) -> None:
        time.sleep(0.03)
        self._halt.set()
        self.join(timeout=5)


def cutline_live(ctx: dict, query: str, kill_at: float | None = None) -> dict:
    """``query`` on cutline over live input, exactly-once (``CollectSink``) at a 0.1 s
    checkpoint interval: the latency of every result row; ``kill_at``: ``kill -9`` of one
    task's Spark Python worker that many seconds into the input."""
    from cutline import CheckpointConfig, Pipeline
    from cutline.connectors import CollectSink
    from vs_spark import FollowUntilDone

    seconds = ctx["kill_seconds"] if kill_at is not None else ctx["latency_seconds"]
    with Workdir() as d:
        (d / "in").mkdir()
        inp = LiveInput(d / "in", ctx["rate"], seconds, done_after=1.0)
        p = Pipeline(f"nexmark-live-{query}", parallelism=PARALLELISM,
                     checkpoint=CheckpointConfig(interval=LATENCY_INTERVAL,
                                                 storage=f"file://{d}/ck"))
        source = FollowUntilDone(str(d / "in"), format="parquet", follow=True,
                                 poll_interval=POLL, step=POLL / 2)
        sink = CollectSink(str(d / "out"))
        Q.build(query, p.source(source, uid="events"), inp.config.max_delay).sink(sink,
                                                                                   uid="out")
        stamps = Stamps(d / "out" / "committed", "*/part-*.pkl")
        killed: dict = {}

        def kill(driver: Any) -> None:
            time.sleep(max(0.0, inp.t0 + kill_at - time.time()))
            pids = driver.task_pids
            slot = sorted(pids)[0]
            killed.update(time=time.time(), slot=slot, pid=pids[slot],
                          what=f"the Spark Python worker running task {slot} of "
                               f"{len(pids)}")
            os.kill(pids[slot], signal.SIGKILL)

        def begin(driver: Any) -> None:
            stamps.start()
            inp.start()
            if kill_at is not None:
                threading.Thread(target=kill, args=(driver,), daemon=True).start()

        Q.ship_by_value()
        result = p.run(ctx["spark"], on_start=AttemptWatcher(begin), timeout=JOB_TIMEOUT)
        inp.join(timeout=30)
        stamps.stop()
        if inp.error is not None:
            raise RuntimeError(f"input writer failed: {inp.error!r}")
        committed = []
        for f, when in sorted(stamps.seen.items(), key=lambda kv: kv[1]):
            with open(f, "rb") as fh:
                committed.append((when, [tuple(r) for r in pickle.load(fh)["records"]]))
    points = latencies(query, committed, inp, ctx["warmup"])
    durations = [c.duration for c in result.checkpoints if not c.final]
    out = latency_summary(points) | {
        "events": inp.events, "checkpoints": len(result.checkpoints),
        "attempts": result.attempts,
        "checkpoint_p50": percentile(durations, 50), "checkpoint_p99": percentile(durations, 99),
        "checkpoint_max": max(durations, default=None)}
    if kill_at is not None:
        out |= {"killed": killed, "points": points}
    return out


def start_spark_live(spark: Any, query: str, inp: Path, out: Path, ck: Path,
                     max_delay: float, trigger: dict) -> Any:
    """``query`` as a Spark streaming query over the live input directory ``inp``: every
    micro-batch's rows pickled to ``out/batch-<id>.pkl`` by ``foreachBatch`` (a batch
    counts as committed when Spark writes ``<ck>/commits/<id>``, right after)."""
    Q.ship_by_value()
    for k, v in Q.SPARK_CONF.get(query, {}).items():
        spark.conf.set(k, v)
    df, mode = Q.spark_query(query, Q.spark_events(spark, str(inp)), max_delay)

    def write(batch_df: Any, batch_id: int) -> None:
        rows = [tuple(r) for r in batch_df.collect()]
        tmp = out / f".batch-{batch_id:06d}.tmp"
        tmp.write_bytes(pickle.dumps(rows))
        os.replace(tmp, out / f"batch-{batch_id:06d}.pkl")

    w = (df.writeStream.foreachBatch(write).outputMode(mode)
         .option("checkpointLocation", str(ck)))
    return (w.trigger(**trigger) if trigger else w).start()


def spark_committed(query: str, out: Path, commits: dict[Path, float]
                    ) -> list[tuple[float, list[tuple]]]:
    """(committed, rows) per micro-batch, in order; complete mode (q4, q18): the rows that
    changed since the previous batch's table."""
    got: list[tuple[float, list[tuple]]] = []
    before: set = set()
    for f, when in sorted(commits.items(), key=lambda kv: int(kv[0].name)):
        path = out / f"batch-{int(f.name):06d}.pkl"
        if not path.exists():
            continue
        rows = pickle.loads(path.read_bytes())
        if query in Q.FINAL:
            now = set(rows)
            rows, before = [r for r in rows if r not in before], now
        got.append((when, rows))
    return got


def spark_durations(progress: list[dict]) -> dict:
    """Per micro-batch with input: its checkpoint work (offset log ``walCommit``, commit log
    ``commitOffsets``, state stores' ``commitTimeMs``), ``addBatch`` and the whole trigger."""
    ck, add, total = [], [], []
    for p in progress:
        if p["numInputRows"] <= 0:
            continue
        d = p["durationMs"]
        state = sum(s.get("commitTimeMs", 0) for s in p.get("stateOperators", []))
        ck.append((d.get("walCommit", 0) + d.get("commitOffsets", 0) + state) / 1000)
        add.append(d.get("addBatch", 0) / 1000)
        total.append(d.get("triggerExecution", 0) / 1000)
    return {"micro_batches": len(total), "checkpoint_p50": percentile(ck, 50),
            "checkpoint_p99": percentile(ck, 99), "add_batch_p50": percentile(add, 50),
            "batch_p50": percentile(total, 50), "batch_p99": percentile(total, 99)}


def input_files(inp: LiveInput) -> dict[str, None]:
    return {f"ev-{k:06d}.parquet": None for k in range(len(inp.visible_at))}


def wait_committed(ck: Path, inp: LiveInput, failed: Any, settle: Any,
                   timeout: float = 180.0) -> None:
    """Until Spark committed a micro-batch holding every input file, and the batch after it
    (a batch without input: what the last watermark closed), if one comes within
    ``settle()`` seconds.  (``isTriggerActive`` cannot tell: it is true on every idle poll
    for new files, so waiting for it to stay false waited out the timeout.)"""
    from vs_spark import _all_committed

    deadline = time.monotonic() + timeout
    while not _all_committed(ck, input_files(inp)):
        error = failed()
        if error:
            raise RuntimeError(f"Spark query failed: {error}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"Spark did not commit every input file within {timeout:.0f} s "
                               "of the last")
        time.sleep(0.05)
    done = len(list((ck / "commits").glob("[0-9]*")))
    until = min(deadline, time.monotonic() + settle())
    while len(list((ck / "commits").glob("[0-9]*"))) <= done and time.monotonic() < until:
        time.sleep(0.05)


def settle_time(progress: list) -> float:
    """How long to wait for a micro-batch without input after the last with input: 3 s
    plus twice the median micro-batch (at most 30 s)."""
    batch = spark_durations([json.loads(p.json) if hasattr(p, "json") else p
                             for p in progress])["batch_p50"] or 0.0
    return min(30.0, 3.0 + 2.0 * batch)


def spark_live(ctx: dict, query: str, trigger: str) -> dict:
    """``query`` on Spark over live input with ``trigger``: the latency of every result row
    and the micro-batches' durations."""
    spark = ctx["spark"]
    with Workdir() as d:
        for sub in ("in", "out"):
            (d / sub).mkdir()
        inp = LiveInput(d / "in", ctx["rate"], ctx["latency_seconds"])
        q = start_spark_live(spark, query, d / "in", d / "out", d / "ck",
                             inp.config.max_delay, SPARK_TRIGGERS[trigger])
        stamps = Stamps(d / "ck" / "commits", "[0-9]*")
        try:
            deadline = time.monotonic() + 60
            while q.lastProgress is None and time.monotonic() < deadline:
                time.sleep(0.01)  # its first (empty) trigger: the query is up and listing
            stamps.start()
            inp.start()
            inp.join()
            if inp.error is not None:
                raise RuntimeError(f"input writer failed: {inp.error!r}")
            wait_committed(d / "ck", inp, lambda: q.exception(),
                           lambda: settle_time(q.recentProgress))
        finally:
            q.stop()
            if stamps.is_alive():
                stamps.stop()
        committed = spark_committed(query, d / "out", stamps.seen)
        progress = [json.loads(p.json) if hasattr(p, "json") else p for p in q.recentProgress]
    points = latencies(query, committed, inp, ctx["warmup"])
    return latency_summary(points) | {"events": inp.events} | spark_durations(progress)


def spark_child(argv: list[str]) -> int:
    """``--spark-child QUERY INPUT OUT CK MAX_DELAY``: run ``query`` in this process's own
    Spark session (default trigger) until killed; ``OUT/_ready`` once it is up."""
    query, inp, out, ck, max_delay = argv
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # Spark's q18 keeps millions of keys in its state store, in the JVM's heap: 1 GB (the
    # default) ran out at 5,000,000 events
    spark = spark_session(SLOTS, shuffle_partitions=PARALLELISM, driver_memory="6g")
    q = start_spark_live(spark, query, Path(inp), Path(out), Path(ck), float(max_delay), {})
    while q.lastProgress is None and q.exception() is None:
        time.sleep(0.01)
    (Path(out) / "_ready").write_text("")
    q.awaitTermination()
    return 1


def spark_kill(ctx: dict, query: str, kill_at: float) -> dict:
    """``query`` on Spark (default trigger) in a child process of its own, over live input;
    ``kill_at`` seconds into the input the child's whole process group (the Spark driver's
    Python and JVM, which runs the query in local mode, and its Python workers) gets
    ``kill -9``, and a new child restarts the query from its checkpoint location at once."""
    with Workdir() as d:
        for sub in ("in", "out"):
            (d / sub).mkdir()
        inp = LiveInput(d / "in", ctx["rate"], ctx["kill_seconds"])
        args = [sys.executable, str(Path(__file__).resolve()), "--spark-child", query,
                str(d / "in"), str(d / "out"), str(d / "ck"), str(inp.config.max_delay)]

        def child() -> subprocess.Popen:
            return subprocess.Popen(args, start_new_session=True, stdout=subprocess.DEVNULL,
                                    stderr=open(d / f"child-{time.time():.0f}.log", "w"))

        proc = child()
        stamps = Stamps(d / "ck" / "commits", "[0-9]*")
        killed: dict = {}
        try:
            deadline = time.monotonic() + 180
            while not (d / "out" / "_ready").exists():
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the Spark child process did not start its query")
                time.sleep(0.05)
            stamps.start()
            inp.start()
            time.sleep(max(0.0, inp.t0 + kill_at - time.time()))
            killed = {"time": time.time(), "pid": proc.pid,
                      "what": "the Spark application's process group (driver Python + JVM)"}
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            proc = child()
            inp.join()
            if inp.error is not None:
                raise RuntimeError(f"input writer failed: {inp.error!r}")
            wait_committed(d / "ck", inp,
                           lambda: proc.poll() is not None and f"exit {proc.returncode}",
                           lambda: 10.0)
            restart = (d / "out" / "_ready").stat().st_mtime
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            if stamps.is_alive():
                stamps.stop()
        committed = spark_committed(query, d / "out", stamps.seen)
    points = latencies(query, committed, inp, ctx["warmup"])
    return latency_summary(points) | {"events": inp.events, "killed": killed,
                                      "restarted_ready": restart - killed["time"],
                                      "points": points}


def probe_real_time(spark: Any, directory: str) -> dict:
    """Whether Spark's real-time mode runs a Nexmark query here: q0 over the event files
    (update mode, a ``foreach`` sink: real-time mode's allowlist has it), for 10 s."""
    with Workdir() as d:
        try:
            df, _ = Q.spark_query("q0", Q.spark_events(spark, directory), 0.0)
            q = (df.writeStream.foreach(lambda row: None).outputMode("update")
                 .option("checkpointLocation", str(d / "ck"))
                 .trigger(**SPARK_TRIGGERS[SPARK_RT]).start())
            ok = not q.awaitTermination(10) and q.exception() is None
            error = None if ok else str(q.exception())
            q.stop()
        except Exception as exc:  # noqa: BLE001 - reported: real-time mode is not usable
            ok, error = False, str(exc)
    first = (error or "").strip().splitlines()[:3]
    return {"usable": ok, "error": " ".join(first)[:400] if error else None}


def spark_triggers(ctx: dict, query: str) -> list[str]:
    """Spark's triggers measured for ``query``: the default; ``processingTime`` 100 ms for
    the ``--short-trigger-queries`` (with micro-batches over 100 ms it starts each batch as
    soon as the last ends, as the default does); real-time mode if the probe ran it."""
    return [SPARK_DEFAULT] + ([SPARK_SHORT] if query in ctx["short_trigger_queries"] else []) \
        + ([SPARK_RT] if ctx["real_time"]["usable"] else [])


def latency_cases(ctx: dict) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for q in ctx["latency_queries"]:
        out.append((f"lat {q} {CUT_EO}", lambda q=q: cutline_live(ctx, q)))
        for t in spark_triggers(ctx, q):
            out.append((f"lat {q} spark {t}", lambda q=q, t=t: spark_live(ctx, q, t)))
    return out


def kill_cases(ctx: dict) -> list[tuple[str, Any]]:
    at = ctx["kill_seconds"] * KILL_AT
    out: list[tuple[str, Any]] = []
    for q in ctx["kill_queries"]:
        out.append((f"kill {q} cutline", lambda q=q: cutline_live(ctx, q, kill_at=at)))
        out.append((f"kill {q} spark", lambda q=q: spark_kill(ctx, q, at)))
    return out


def describe(o: dict) -> str:
    if "rate" in o:
        return f"{o['rate']:>10,.0f} records/s"
    return f"p50 {fmt(o['p50'], '.3f')} s  p99 {fmt(o['p99'], '.3f')} s  n {o['n']:,}"


def summarise_latency(runs: dict, queries: list[str], triggers: list[str]) -> list[dict]:
    rows = []
    for q in queries:
        def med(name: str, key: str) -> float | None:
            return median([r.get(key) for r in runs.get(name, []) if r])

        spark = {t: med(f"lat {q} spark {t}", "p99") for t in triggers}
        measured = {t: v for t, v in spark.items() if v is not None}
        best = min(measured, key=lambda t: measured[t]) if measured else None
        mine = med(f"lat {q} {CUT_EO}", "p99")
        cut_runs = runs.get(f"lat {q} {CUT_EO}", [])
        best_runs = runs.get(f"lat {q} spark {best}", []) if best else []
        per = [a["p99"] / b["p99"] for a, b in zip(cut_runs, best_runs)
               if a and b and a["p99"] and b["p99"]]
        ratio = mine / spark[best] if mine and best and spark[best] else None
        rows.append({
            "query": q, "cutline_p50": med(f"lat {q} {CUT_EO}", "p50"), "cutline_p99": mine,
            "cutline_checkpoint_p50": med(f"lat {q} {CUT_EO}", "checkpoint_p50"),
            "cutline_checkpoint_p99": med(f"lat {q} {CUT_EO}", "checkpoint_p99"),
            "spark_p50": {t: med(f"lat {q} spark {t}", "p50") for t in triggers},
            "spark_p99": spark, "spark_best": best,
            "spark_checkpoint_p50": {t: med(f"lat {q} spark {t}", "checkpoint_p50")
                                     for t in triggers},
            "spark_add_batch_p50": {t: med(f"lat {q} spark {t}", "add_batch_p50")
                                    for t in triggers},
            "spark_batch_p50": {t: med(f"lat {q} spark {t}", "batch_p50") for t in triggers},
            "cutline_growth": med(f"lat {q} {CUT_EO}", "growth"),
            "spark_growth": {t: med(f"lat {q} spark {t}", "growth") for t in triggers},
            "ratio": ratio, "noise": noise_of(per), "per_round": per,
            "verdict": verdict(ratio, TARGET_P99, False, noise_of(per), median(per))})
    return rows


def summarise_kills(runs: dict, queries: list[str], latency: list[dict]) -> list[dict]:
    """Seconds from the kill to caught up: back under twice the system's failure-free p99
    (Spark: its default trigger's, which the kill runs use; at least 0.5 s) for ``hold`` s."""
    p99 = {r["query"]: r for r in latency}
    rows = []
    for q in queries:
        row: dict = {"query": q}
        for system in ("cutline", "spark"):
            lat = p99.get(q, {})
            base = lat.get("cutline_p99") if system == "cutline" else \
                (lat.get("spark_p99") or {}).get(SPARK_DEFAULT)
            bound = max(CAUGHT_UP_FLOOR, CAUGHT_UP_FACTOR * base) if base else None
            times, spans, what = [], [], None
            for r in runs.get(f"kill {q} {system}", []):
                if r and bound is not None and r.get("killed"):
                    points, at = [tuple(p) for p in r["points"]], r["killed"]["time"]
                    times.append(caught_up(points, at, bound))
                    spans.append(max((w for w, _ in points), default=at) - at)
                    what = r["killed"].get("what")
            # None in a round: not caught up by the run's last commit, ``after_kill`` s on
            row[system] = {"bound": bound, "caught_up": median(times), "per_round": times,
                           "after_kill": spans, "killed": what}
        rows.append(row)
    return rows


def caught_up_text(side: dict) -> str:
    """The median seconds to caught up, or "> N" (not caught up in the run, N s after the
    kill)."""
    if side["caught_up"] is not None:
        return fmt(side["caught_up"], ".2f")
    return f"> {min(side['after_kill']):.0f}" if side["after_kill"] else "-"


def _per_query(plt: Any, rows: list[dict], draw: Any, labels: tuple[str, str, str],
               path: Path) -> str:
    """One small plot per query (``draw(ax, row)``), five to a line, saved to ``path``;
    ``labels``: the x axis, the y axis and the title."""
    n = len(rows)
    cols = min(5, n)
    lines = (n + cols - 1) // cols
    fig, axes = plt.subplots(lines, cols, figsize=(3.2 * cols, 2.6 * lines), squeeze=False)
    for ax, row in zip(axes.flat, rows):
        draw(ax, row)
        ax.set_title(row["query"], fontsize=9)
        ax.set_xlabel(labels[0], fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    axes.flat[0].set_ylabel(labels[1], fontsize=8)
    axes.flat[0].legend(fontsize=6)
    fig.suptitle(labels[2], fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def plot(result: dict, stem: Path) -> list[str]:
    """Latency CDFs per query (cutline and every Spark trigger), latency around the kills,
    and the ratio bars."""
    plt = pyplot()
    paths = []
    runs, lat = result["runs"], result.get("latency") or []

    def cdfs(ax: Any, row: dict) -> None:
        q = row["query"]
        names = [(CUT_EO, f"lat {q} {CUT_EO}")] + [
            (f"Spark {t}", f"lat {q} spark {t}") for t in row["spark_p99"]]
        for label, name in names:
            got = [r for r in runs.get(name, []) if r and r.get("cdf")]
            if got:
                ax.plot(got[0]["cdf"], [i / 2 for i in range(201)], label=label)
        ax.set_xscale("log")

    def around_kill(ax: Any, row: dict) -> None:
        for system, colour in (("cutline", "tab:blue"), ("spark", "tab:red")):
            got = [r for r in runs.get(f"kill {row['query']} {system}", [])
                   if r and r.get("killed")]
            if got:
                at = got[0]["killed"]["time"]
                pts = sorted((w - at, x) for w, x in got[0]["points"])
                ax.plot([x for x, _ in pts], [y for _, y in pts], ".", ms=2, color=colour,
                        label=system)
        ax.axvline(0, color="grey", lw=1)
        ax.set_yscale("log")

    if lat:
        paths.append(_per_query(
            plt, lat, cdfs, ("latency, s", "percentile",
                             f"Nexmark event-to-committed-result latency at "
                             f"{result['rate']:,.0f} events/s (first round)"),
            stem.with_name(stem.name + "-latency.png")))
    if result.get("kills"):
        paths.append(_per_query(
            plt, result["kills"], around_kill,
            ("s since kill -9", "latency, s", "Latency of each result around a kill -9 "
             "(cutline: a task's Python worker; Spark: the application, restarted)"),
            stem.with_name(stem.name + "-kill.png")))
    tp = {r["query"]: r["ratio"] for r in result.get("summary") or []}
    p99 = {r["query"]: r["ratio"] for r in lat}
    queries = [q for q in Q.QUERIES if tp.get(q) or p99.get(q)]
    if queries:
        panels = [(tp, TARGET_THROUGHPUT, "throughput, cutline / Spark (higher is better; "
                   "dashes: the target)", "tab:blue"),
                  (p99, TARGET_P99, "p99 latency, cutline / Spark's best trigger (lower is "
                   "better)", "tab:orange")]
        panels = [x for x in panels if x[0]]
        fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 3.4),
                                 squeeze=False)
        for ax, (values, target, title, colour) in zip(axes.flat, panels):
            ax.bar(queries, [values.get(q) or 0 for q in queries], color=colour)
            if isinstance(target, dict):  # a target per query (or none)
                for i, q in enumerate(queries):
                    if target.get(q):
                        ax.hlines(target[q], i - 0.45, i + 0.45, color="grey", ls="--", lw=1)
            else:
                ax.axhline(target, color="grey", ls="--", lw=1)
            ax.set_title(title, fontsize=9)
            ax.tick_params(labelsize=8)
        fig.tight_layout()
        path = stem.with_name(stem.name + "-ratios.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(str(path))
    return paths


SETTINGS = ("quick", "rate", "latency_seconds", "kill_seconds", "warmup")  # equal to merge


def _part(name: str) -> tuple[str, str] | None:
    """A run's (part, query): "lat q8 ..." -> ("lat", "q8"), "q8 spark" -> ("throughput",
    "q8"); None for the warm-ups."""
    words = name.split()
    if words[0] in ("lat", "kill"):
        return words[0], words[1]
    return ("throughput", words[0]) if words[0] in Q.QUERIES else None


def merge_into(old: dict, new: dict) -> dict:
    """The results ``old`` with what ``new`` measured in place of theirs (per part and
    query: runs, and the rows of the tables); "merged" lists each merge (what, when, git
    state, load).  Refused when the settings of the runs differ."""
    differ = [k for k in SETTINGS if old.get(k) != new.get(k)]
    if differ:
        raise SystemExit("--merge-into: the runs' settings differ: " + ", ".join(
            f"{k} {old.get(k)} there, {new.get(k)} here" for k in differ))
    done = {_part(n) for n in new["runs"]} - {None}
    runs = {n: r for n, r in old["runs"].items() if _part(n) not in done}
    runs |= {n: r for n, r in new["runs"].items() if _part(n) in done}
    out = old | {"runs": {n: runs[n] for n in sorted(runs, key=_run_order)}}
    for key in ("summary", "latency", "kills"):
        rows = {r["query"]: r for r in old.get(key) or []} | {
            r["query"]: r for r in new.get(key) or []}
        out[key] = [rows[q] for q in Q.QUERIES if q in rows]
    out["merged"] = (old.get("merged") or []) + [{
        "runs": sorted(f"{part} {q}" for part, q in done), "rounds": new.get("rounds"),
        "stamp": new["stamp"], "git": new["git"], "load": new["load"],
        "errors": new["errors"]}]
    return out


def _run_order(name: str) -> tuple:
    part = _part(name)
    if part is None:
        return (0, 0, name)
    order = {"throughput": 1, "lat": 2, "kill": 3}[part[0]]
    return (order, Q.QUERIES.index(part[1]), name)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--spark-child"]:
        return spark_child(argv[1:])
    ap = bench_parser(__doc__, DEFAULT_OUT, (3, 1))
    ap.add_argument("--events", type=positive_int, default=None,
                    help=f"events in the backlog (default {EVENTS[0]:,}, quick {EVENTS[1]:,})")
    ap.add_argument("--queries", nargs="*", default=list(Q.QUERIES), choices=Q.QUERIES,
                    metavar="QUERY")
    ap.add_argument("--only", choices=["throughput", "latency", "kill"], action="append",
                    help="run only these parts (default: all three)")
    ap.add_argument("--rate", type=positive_float, default=500.0,
                    help="latency and kill runs: events/s written (default 500)")
    ap.add_argument("--latency-seconds", type=positive_float, default=None,
                    help="latency runs: seconds of input (default 25, quick 8)")
    ap.add_argument("--kill-seconds", type=positive_float, default=None,
                    help=f"kill runs: seconds of input, the kill at {KILL_AT * 100:.0f}%% "
                         "(default 50, quick 40)")
    ap.add_argument("--warmup", type=positive_float, default=None,
                    help="latency runs: seconds of input not counted (default 5, quick 2)")
    ap.add_argument("--short-trigger-queries", nargs="*", default=None, choices=Q.QUERIES,
                    metavar="QUERY", help="latency runs: queries Spark also runs with "
                    "processingTime 100 ms (default q0 q3 q7, quick q0)")
    ap.add_argument("--latency-queries", nargs="*", default=None, choices=Q.QUERIES,
                    metavar="QUERY", help="latency runs (default --queries; quick q0 q7)")
    ap.add_argument("--kill-queries", nargs="*", default=None, choices=Q.QUERIES,
                    metavar="QUERY", help="kill runs (default --queries; quick q0)")
    ap.add_argument("--merge-into", type=Path, default=None, metavar="RESULTS",
                    help="also merge this run into an earlier results file of the same "
                    "settings (its queries' runs and rows replace those there; plots redrawn)")
    args = parse_bench_args(ap, argv)
    only = set(args.only or ["throughput", "latency", "kill"])
    events = args.events or EVENTS[1 if args.quick else 0]
    console = make_console()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # Spark's q18 keeps millions of keys in its state store, in the JVM's heap: 1 GB (the
    # default) ran out at 5,000,000 events
    spark = spark_session(SLOTS, shuffle_partitions=PARALLELISM, driver_memory="6g")
    for conf in Q.SPARK_CONF.values():
        for k, v in conf.items():
            spark.conf.set(k, v)
    runner = Runner(console, width=34)
    lat_queries = args.latency_queries if args.latency_queries is not None else (
        ["q0", "q7"] if args.quick else args.queries)
    kill_queries = args.kill_queries if args.kill_queries is not None else (
        ["q0"] if args.quick else args.queries)
    load0 = os.getloadavg()
    machine = conditions()
    load = LoadSampler()
    load.start()
    try:
        with Workdir("cutline-nexmark-") as d:
            t = time.monotonic()
            cfg = R.generate(str(d / "in"), events, 10_000.0, OUT_OF_ORDER,
                             files=max(2 * PARALLELISM, events // PER_FILE))
            machine["input"] = input_dir_files(d / "in")
            console.print(f"{events:,} Nexmark events written in "
                          f"{time.monotonic() - t:.1f} s; {args.rounds} round(s)")
            ctx = {"spark": spark, "input": str(d / "in"), "events": events + 1,
                   "max_delay": cfg.max_delay, "rate": args.rate,
                   "latency_seconds": args.latency_seconds or (8.0 if args.quick else 25.0),
                   "kill_seconds": args.kill_seconds or (40.0 if args.quick else 50.0),
                   "warmup": args.warmup or (2.0 if args.quick else 5.0),
                   "short_trigger_queries": args.short_trigger_queries
                   if args.short_trigger_queries is not None
                   else (["q0"] if args.quick else ["q0", "q3", "q7"]),
                   "latency_queries": lat_queries if "latency" in only else [],
                   "kill_queries": kill_queries if "kill" in only else []}
            ctx["real_time"] = probe_real_time(spark, str(d / "in"))
            console.print(f"Spark real-time mode: {ctx['real_time']}", style="dim")
            todo: list[tuple[str, Any]] = []
            if "throughput" in only:
                todo += [(name, lambda q=q, s=system: run_case(ctx, q, s))
                         for q, system, name in cases(args.queries)]
            todo += latency_cases(ctx) + kill_cases(ctx)
            # warm-up, not measured: Spark's JIT and Python workers, cutline's imports
            runner.run("warm-up spark", lambda: spark_case(ctx, "q1"))
            runner.run("warm-up cutline", lambda: cutline_case(ctx, "q1", False))
            if ctx["latency_queries"] or ctx["kill_queries"]:
                # the first query over live input in a session is slow on Spark (its
                # foreachBatch callback path): q0 p50 25 s against 2.6 s for the next
                live = ctx | {"latency_seconds": min(8.0, ctx["latency_seconds"])}
                runner.run("warm-up spark live", lambda: spark_live(live, "q1", SPARK_DEFAULT))
                runner.run("warm-up cutline live", lambda: cutline_live(live, "q1"))
            for r in range(args.rounds):
                for name, fn in rotated(todo, r):
                    runner.run(name, fn, r, args.rounds, describe=describe)
    finally:
        stop_quietly(spark)
    load1 = os.getloadavg()
    load.stop()
    triggers = [SPARK_DEFAULT, SPARK_SHORT] + ([SPARK_RT] if ctx["real_time"]["usable"]
                                               else [])
    rows = summarise(runner.runs, args.queries) if "throughput" in only else []
    lat_rows = summarise_latency(runner.runs, ctx["latency_queries"], triggers)
    kill_rows = summarise_kills(runner.runs, ctx["kill_queries"], lat_rows)
    if rows:
        tab = table(f"Nexmark, {events:,} events: records/s at saturation (median of "
                  f"{args.rounds} round(s))",
                  ["query", "cutline", "cutline columnar", "Spark", "cutline / Spark",
                   "noise", "target", "cutline checkpoint p50"], left=("query",))
        for row in rows:
            tab.add_row(row["query"], fmt(row["cutline"], ",.0f"),
                      fmt(row["cutline_columnar"], ",.0f"), fmt(row["spark"], ",.0f"),
                      fmt(row["ratio"], ".2f", "x"), fmt(row["noise"], ".2f"),
                      f">= {row['target']:.1f}x {styled(row['verdict'])}" if row["target"]
                      else "-",
                      fmt(row["checkpoint_p50"] and row["checkpoint_p50"] * 1000, ".0f",
                          " ms"))
        console.print(tab)
    if lat_rows:
        tab = table(f"Nexmark latency, event -> committed result, at {args.rate:,.0f} events/s "
                  f"(p50 / p99, s; cutline exactly-once at a {LATENCY_INTERVAL} s checkpoint "
                  "interval)", ["query", "cutline", *[f"Spark {x}" for x in triggers],
                                "best", "p99 cutline / best", "target <= 0.25",
                                "growth (s/s) cutline / Spark"],
                  left=("query", "best"))
        for row in lat_rows:
            tab.add_row(row["query"], f"{fmt(row['cutline_p50'])} / {fmt(row['cutline_p99'])}",
                      *[f"{fmt(row['spark_p50'][x])} / {fmt(row['spark_p99'][x])}"
                        for x in triggers], row["spark_best"] or "-",
                      fmt(row["ratio"], ".3f"), styled(row["verdict"]),
                      f"{fmt(row['cutline_growth'], '.2f')} / "
                      f"{fmt(row['spark_growth'].get(row['spark_best']), '.2f')}")
        console.print(tab)
        tab = table("Checkpoint duration, p50 (s): cutline's checkpoints (0.1 s interval, live "
                  "input); Spark's per micro-batch walCommit + commitOffsets + state commit, "
                  "and addBatch", ["query", "cutline p50", "cutline p99",
                                   *[f"Spark {x} ckpt / addBatch" for x in triggers]],
                  left=("query",))
        for row in lat_rows:
            tab.add_row(row["query"], fmt(row["cutline_checkpoint_p50"]),
                      fmt(row["cutline_checkpoint_p99"]),
                      *[f"{fmt(row['spark_checkpoint_p50'][x])} / "
                        f"{fmt(row['spark_add_batch_p50'][x])}" for x in triggers])
        console.print(tab)
    if kill_rows:
        tab = table("kill -9 to caught up (s): back under 2x the failure-free p99 (>= 0.5 s) "
                  "for 10 s.  cutline: one task's Spark Python worker; Spark: the "
                  "application (driver Python + JVM), restarted from its checkpoint",
                  ["query", "cutline", "cutline bound", "Spark", "Spark bound"],
                  left=("query",))
        for row in kill_rows:
            c, s_ = row["cutline"], row["spark"]
            tab.add_row(row["query"], caught_up_text(c), fmt(c["bound"], ".2f"),
                      caught_up_text(s_), fmt(s_["bound"], ".2f"))
        console.print(tab)
    failures = [{"case": e["case"], "round": e.get("round"), "error": e["error"]}
                for e in runner.errors] + rows_disagree(runner.runs)
    result = {"stamp": stamp(), "git": git_state(), "events": events, "rounds": args.rounds,
              "conditions": machine, "failures": failures,
              "quick": args.quick, "rate": args.rate, "load": {"before": load0,
                                                               "after": load1,
                                                               **load.summary()},
              "latency_seconds": ctx["latency_seconds"], "kill_seconds": ctx["kill_seconds"],
              "warmup": ctx["warmup"], "real_time": ctx["real_time"],
              "summary": rows, "latency": lat_rows, "kills": kill_rows,
              "runs": runner.runs, "errors": runner.errors}
    try:
        result["plots"] = plot(result, args.out.with_suffix(""))
    except Exception as exc:  # noqa: BLE001 - the numbers matter more than the pictures
        console.print(f"plots failed: {exc!r}", style="yellow")
        result["plots"] = []
    write_results(args.out, result, console)
    if args.merge_into:
        merged = merge_into(json.loads(args.merge_into.read_text()), result)
        merged["plots"] = plot(merged, args.merge_into.with_suffix(""))
        write_results(args.merge_into, merged, console, note=" (merged)")
    if failures:
        console.print(f"[red]{len(failures)} run(s) FAILED[/] (an error, or cutline's rows "
                      "differing between rounds or forms): the benchmark fails", style="bold")
        return 1
    return 0


ROWS_COMPARED = ("q0", "q1", "q2")  # stateless: Spark's noop sink gets the rows cutline does


def rows_disagree(runs: dict) -> list[dict]:
    """Throughput runs of one query whose output rows are not all the same number: cutline
    per record and columnar, every round, and for ``ROWS_COMPARED`` Spark's (the rows its
    ``noop`` sink was given).  The stateful queries' Spark rows are recorded, not compared
    (update and complete modes, the sentinel's windows); ``tests/examples/test_nexmark_queries.py``
    compares both systems' rows on a small input."""
    counts: dict[str, dict[int, list[str]]] = {}
    for name, rs in runs.items():
        query, _, system = name.partition(" ")
        key = "rows" if system in (CUTLINE, COLUMNAR) else \
            "sink_rows" if system == SPARK and query in ROWS_COMPARED else None
        if key is None:
            continue
        for r in rs:
            if r is not None and r.get(key) is not None:
                counts.setdefault(query, {}).setdefault(r[key], []).append(
                    f"{system} round {r.get('round')}")
    return [{"case": f"{q} rows", "round": None,
             "error": "the runs disagree on the rows: " + "; ".join(
                 f"{n:,} rows in {', '.join(w)}" for n, w in sorted(c.items()))}
            for q, c in counts.items() if len(c) > 1]


if __name__ == "__main__":
    raise SystemExit(main())
