"""Nexmark on cutline and on Spark Structured Streaming, side by side, by issue 30's rules:
throughput at saturation, latency at a fixed rate, checkpoint duration, and kill -9 to
caught up.

Run ``python bench/nexmark.py`` (one command: input, warm-up, rounds, checks, tables,
``bench/results/nexmark.json`` and plots; hours: see docs/benchmarks.md).  ``--quick``: a
small input, one round, no warm-up (a smoke test, not figures).

**Input** (throughput): ``--events`` Nexmark events, default 50,000,000 (``cutline nexmark
generate``: the reference's mix and distributions, 10,000 events per second of event time,
out of order within groups of 100, i.e. by less than 10 ms) in Parquet files of
``--events-per-file`` (500,000; at least 4 files), and a last file holding a far-future
sentinel bid (Spark closes windows only when its watermark passes them).  Written once under
``--data`` and reused by later runs.  About 105 bytes per event (5.3 GB at 50 M, ~4-5 min to
write on 2 cores): the free disk is checked first (the input and twice that for the runs'
checkpoints and state), and the benchmark refuses an input that does not fit, saying so.
What limits the size is time and disk, not memory: the columnar stateless queries (q0-q2 at
10-25 M events/s) would need 0.3-0.75 G events (30-80 GB) for a 30 s run; their runs are
shorter and marked ``< 30 s`` in the table.

**Cases** (every query of ``examples/nexmark/queries.py``;
``tests/examples/test_nexmark_queries.py`` checks that the two systems' rows are equal on a
small input):

- ``cutline``: per record, at parallelism 2, checkpoints every 1 s, from
  ``FileSource(parquet)``, run as a user runs it (``Pipeline.run()``, its embedded session);
  q18's keyed state in RocksDB (``Q.STATE_BACKEND``).
- ``cutline columnar``: every query in its columnar form (batch streams reading only the
  columns they use; the joins q3, q4 and q8 pick their events on batches and join record
  by record).
- ``spark sql``: Spark's built-ins (DataFrame functions; q4 has none: its Spark query is a
  Python UDF, ``applyInPandasWithState``, and its row is named ``spark pandas udf``),
  ``spark.sql.shuffle.partitions`` 2, ``local[2]``, ``trigger(availableNow=True)`` (the whole
  backlog in one micro-batch), the heap sized for the input (``--spark-heap``; default 2 GB
  plus 1 GB per 5 M events, at most 12 GB: Spark's q18 keeps every (bidder, auction) in its
  state store, in the heap; 1 GB ran out at 5 M events).
- ``spark sql rocksdb``: the stateful queries (q3, q4, q5, q7, q8, q11, q18) again with the
  RocksDB state store and changelog checkpointing.

**Timing** (one rule for both systems): every run is a fresh process (``python
bench/nexmark.py --child SPEC``); this process takes the time just before it spawns it and
when it exits: *end to end*, the headline.  Beside it each run's own processing time:
cutline, attempt 0 started (every task registered) -> final checkpoint completed; Spark, the
first micro-batch's trigger -> the end of the last micro-batch (its progress events).  *CPU*:
the run's process tree (driver, JVM, Python workers), read just before it exits.  Records/s
= events in the backlog (with the sentinel) / time.

**Warm, repeated**: every case runs until its last two end-to-end times are within
``--settle`` (10%) of each other (at most ``--max-warmup``, 5, runs; quick: none); only the
runs after that count: ``--rounds`` (5) rounds, the cases of a query in an order rotating
each round.  Medians with a 95% bootstrap confidence interval; ratios per round (Spark's
time / cutline's, same round: > 1 means cutline is faster), their median and interval, end
to end (the headline) and processing.  cutline's better form is the one with the higher
median end-to-end rate.

**Checked** (every measured run, at benchmark scale): each run's output goes to a digest
sink computed inside the run, in both systems: the result rows (append queries) or the final
row per key (q4, q18: update output, the last value per key; Spark's complete mode's final
table), without the sentinel's rows, as (rows, and per column the sum of its integers mod
2^64, of its doubles, or of its strings' lengths).  cutline: a sink that sums each batch of
rows in Python (about 0.1 us per result row; per key, for q4 and q18, the key's latest row:
q18 keeps ~0.3 keys per bid in the sink's memory); Spark: ``foreachBatch`` running the same
sums as one aggregation per micro-batch in the JVM (the rows never leave it).  When a query's
runs are done this process compares every run's digest with Spark SQL's (whose runs must
agree with each other): a run that differs fails, counts in no figure, and the benchmark
exits with code 1.  A restarted cutline job (``attempts`` > 1) fails too.
``--break-output``: each cutline sink subtask leaves out its first result row (q4, q18: its
first key), which must fail the benchmark.

**Conditions**: cores, the load average before and after the benchmark and during every
run, Python, Spark, pyarrow and Java versions, the commit, the input's files, bytes and free
disk, in the results file and the tables.  A run is marked ``loaded`` and left out of the
headline figures when, sampled once a second from ``/proc``, more than 0.25 threads per core
outside its own processes were runnable on average (a run's own threads raise the load
average: a Spark query's to ~3 on 2 cores); without that sample, its 1-minute load above 1.5
per core.

**Latency** (``--only latency``; ``--rate`` events/s, default 500, for
``--latency-seconds``, default 120, quick 8; ``--latency-rounds``, default 3, quick 1; the
first ``--warmup`` s, default 20, quick 2, not counted, and Spark's first
``--spark-drop-batches`` micro-batches with input, default 5, quick 2, dropped): a writer
thread writes Nexmark events as a Parquet file every 0.1 s into a directory both systems
follow, event time following the wall clock (out of order within groups of 10; a file holds
whole groups) and notes when each file became visible.  A result row's latency is *committed
- determined*: determined is when the first file holding the event time the row needs became
visible (its own event's; q3: the later of the person and the auction; q8: the later of the
person and the seller's first auction in the window; windows: the end + the watermark delay,
the first moment a watermark could pass it; q4: its auction's expiry + the delay).
*Committed*: cutline exactly-once at a 0.1 s checkpoint interval into a ``CollectSink`` (its
part file appears when the checkpoint commits); Spark: the JVM's ``memory`` sink (the rows
stay in the JVM; append mode, q18 update mode), each micro-batch's rows told apart by its
progress event's ``sink.numOutputRows``, committed at the progress event's trigger start +
``triggerExecution`` (the JVM's clock, as a ``StreamingQueryListener`` receives it; the
progress events of the query, ``recentProgress``, kept up to 100,000).  q4 cannot use the
memory sink: its Spark plan (an aggregation after ``applyInPandasWithState``) is refused in
update mode and the memory sink keeps only the last table in complete mode; its rows go
through ``foreachBatch`` (the small table per category, collected), timed by the same
progress events.  Spark's triggers, for every query: the default (as fast as possible) and
``processingTime`` 100 ms (``--short-trigger-queries`` narrows it); real-time mode is probed
once (PySpark 4.3 has it, but it refuses the file source: "The input stream FileStreamSource
is not supported in Real-time Mode") and used if it runs.  *Growth*: the slope of each
commit's median latency against time (about 0 when a system keeps up with the input; 1 -
capacity / rate when it falls behind).  One live run of each system (q1, 8 s) goes first,
unmeasured.  Latency runs share one Spark session in this process (started after the
throughput runs): their clocks are the commits' own, not the process's.  **Checkpoint
duration**: cutline's checkpoint stats in the latency runs; Spark's per micro-batch
``walCommit`` + ``commitOffsets`` + its state stores' ``commitTimeMs``, and ``addBatch``.

**Kill to caught up** (``--only kill``; ``--kill-seconds`` of input, default 50, the kill at
20%, q11's at 60% (its first sessions close about 23 s in); ``--latency-rounds`` rounds):
cutline: ``kill -9`` of one task's Spark Python worker (Spark restarts the barrier stage,
the job restores its latest checkpoint). Spark: the query runs in a child process with its
own session (``foreachBatch`` to files: the rows must outlive the process), commits stamped
when ``<checkpoint>/commits/<id>`` appears; ``kill -9`` of its process group (the driver's
Python and JVM) and a new child restarts it from its checkpoint location at once, as a Spark
user recovers. Caught up: the first commit from which on every result for 10 s (or to the
end of the run) is within twice that system's failure-free p99 (its default trigger for
Spark; at least 0.5 s); "> N": not caught up by the run's last commit, N s after the kill.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import contextlib
import dataclasses
import importlib.util
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from _common import (
    LOADED_OTHERS_PER_CORE, RESULTS, AttemptWatcher, LoadSampler, Runner, RunFailed, Workdir,
    bootstrap_ci, conditions, cores, fmt, is_loaded, median, noise_of, percentile,
    positive_float, positive_int, pyplot, rotated, run_child, settled, spark_processing,
    spark_session, stamp, stop_quietly, styled, table, tree_cpu, verdict, write_results,
)
from _common import console as make_console
from _common import job_of
from _common import input_files as input_dir_files

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = RESULTS / "nexmark.json"
DEFAULT_DATA = Path(os.environ.get("TMPDIR", "/tmp")) / "cutline-nexmark-data"
SLOTS = PARALLELISM = 2
EVENTS = (50_000_000, 100_000)  # full, quick
PER_FILE = 500_000
BYTES_PER_EVENT = 110  # Parquet, measured: 105 (1 M events, 105,379,193 bytes)
OUT_OF_ORDER = 100
JOB_TIMEOUT = 900.0  # latency and kill runs
RUN_TIMEOUT = 3600.0  # one throughput run, end to end
SHORT_RUN = 30.0  # issue 30: a run shorter than this (end to end) is marked "< 30 s"
TARGET_P99 = 0.25  # cutline at a 0.1 s checkpoint interval / Spark's best trigger
# throughput, cutline (its better form) / Spark end to end: >= 2x where Spark's query runs
# Python logic (q4: applyInPandasWithState), >= 1.5x Spark SQL on the stateless queries and
# q5 / q7
TARGET_THROUGHPUT = {"q4": 2.0} | {q: 1.5 for q in ("q0", "q1", "q2", "q5", "q7")}
CUTLINE, COLUMNAR, SPARK, SPARK_ROCKS = \
    "cutline", "cutline columnar", "spark sql", "spark sql rocksdb"
SPARK_UDF, SPARK_UDF_ROCKS = "spark pandas udf", "spark pandas udf rocksdb"
SPARK_SYSTEMS = (SPARK, SPARK_ROCKS, SPARK_UDF, SPARK_UDF_ROCKS)
UDF_QUERIES = ("q4",)  # Spark SQL has no built-in for it: applyInPandasWithState
STATEFUL = ("q3", "q4", "q5", "q7", "q8", "q11", "q18")
ROCKSDB = {
    "spark.sql.streaming.stateStore.providerClass":
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
}
# the column that is -1 in the rows the sentinel bid makes (auction or bidder): left out
SENTINEL_COLUMN = {"q0": 0, "q1": 0, "q5": 2, "q7": 1, "q11": 0, "q18": 0}
MOD = 1 << 64


def _run_module() -> Any:
    path = HERE.parent / "examples" / "nexmark" / "run.py"
    spec = importlib.util.spec_from_file_location("nexmark_run", path)
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules["nexmark_run"] = mod
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


R = _run_module()
Q = R.Q


def systems_of(query: str) -> list[str]:
    """The cases of ``query``: cutline's forms, Spark's query (and with RocksDB if stateful)."""
    out = [CUTLINE] + ([COLUMNAR] if query in Q.COLUMNAR else [])
    spark = SPARK_UDF if query in UDF_QUERIES else SPARK
    out.append(spark)
    if query in STATEFUL:
        out.append(SPARK_UDF_ROCKS if query in UDF_QUERIES else SPARK_ROCKS)
    return out


def spark_peer(query: str) -> str:
    return SPARK_UDF if query in UDF_QUERIES else SPARK


# --------------------------------------------------------------------------- input


def ensure_input(data: Path, events: int, per_file: int, console: Any) -> dict:
    """The input of one size under ``data/<events>-<per_file>/in``, written once and reused
    (``meta.json``, written last, says it is complete); the free disk checked first."""
    root = data / f"{events}-{per_file}"
    meta = root / "meta.json"
    if meta.exists():
        return json.loads(meta.read_text()) | {"reused": True}
    shutil.rmtree(root, ignore_errors=True)
    data.mkdir(parents=True, exist_ok=True)
    need = events * BYTES_PER_EVENT
    free = shutil.disk_usage(data).free
    if free < 3 * need:  # the input, and the runs' checkpoints, state and spills
        raise SystemExit(
            f"--events {events:,}: the input needs ~{need / 1e9:.1f} GB and the runs about "
            f"twice that; {free / 1e9:.1f} GB are free under {data}: the disk limits the "
            f"input to ~{free // (3 * BYTES_PER_EVENT):,} events (--data elsewhere, or "
            "fewer --events)")
    files = max(2 * PARALLELISM, events // per_file)
    console.print(f"writing {events:,} Nexmark events in {files} files under {root} ...",
                  style="dim")
    t0 = time.monotonic()
    cfg = R.generate(str(root / "in"), events, 10_000.0, OUT_OF_ORDER, files=files)
    out = {"input": str(root / "in"), "events": events, "max_delay": cfg.max_delay,
           "files": input_dir_files(root / "in"), "seconds_to_write": time.monotonic() - t0}
    meta.write_text(json.dumps(out))
    console.print(f"  written in {out['seconds_to_write']:.0f} s", style="dim")
    return out | {"reused": False}


# --------------------------------------------------------------------------- digests
# What a run's output is, in both systems: (rows, per column a sum), without the sentinel's
# rows; for the update queries (q4, q18) over the final row per key.  Integers mod 2^64.


class DigestSink:
    """cutline's side: sums what it is given (rows, or record batches) per subtask and writes
    the running digest at each pre-commit to ``<path>/digest-<subtask>.json`` (the parent
    adds the subtasks').  ``broken``: leaves out the subtask's first row (update queries:
    its first key), for ``--break-output``.  The runs are failure-free (a restarted job
    fails its run), so it stages nothing."""

    name = "digest"

    def __init__(self, path: str, query: str, broken: bool = False) -> None:
        self.path, self.query, self.broken = path, query, broken

    def create_writer(self) -> DigestWriter:
        return DigestWriter(self.path, self.query, self.broken)


class DigestWriter:
    def __init__(self, path: str, query: str, broken: bool) -> None:
        self.path, self.broken = path, broken
        self.final = query in Q.FINAL
        self.k = Q.KEY_COLUMNS.get(query, 0)
        self.sentinel = SENTINEL_COLUMN.get(query)
        self.rows = 0
        self.sums: list = []
        self.latest: dict = {}  # update queries: key -> the non-key part of its latest row
        self.skip: Any = None
        self.subtask = 0

    def open(self, subtask: int, parallelism: int, job: str) -> None:
        self.subtask = subtask
        os.makedirs(self.path, exist_ok=True)

    def _add(self, values: list) -> None:
        if not self.sums:
            self.sums = [0] * len(values)
        for i, v in enumerate(values):
            self.sums[i] += v

    def write(self, batch: list) -> None:
        if not batch:
            return
        if hasattr(batch[0], "num_rows"):
            for b in batch:
                if self.final:  # an update stream of batches (q18's latest): row by row
                    for r in zip(*(c.to_pylist() for c in b.columns)):
                        self._update(r)
                else:
                    self._batch(b)
        elif self.final:
            for r in batch:
                self._update(r)
        else:
            self._rows(batch)

    def _rows(self, batch: list) -> None:
        s = self.sentinel
        if s is not None and -1 in [r[s] for r in batch]:
            batch = [r for r in batch if r[s] != -1]
        if self.broken and self.skip is None and batch:
            self.skip, batch = True, batch[1:]
        if not batch:
            return
        self.rows += len(batch)
        self._add([sum(map(len, c)) if isinstance(c[0], str) else sum(c)
                   for c in zip(*batch)])

    def _batch(self, b: Any) -> None:
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        s = self.sentinel
        if s is not None and b.num_rows:
            b = b.filter(pc.not_equal(b.column(s), -1))
        if self.broken and self.skip is None and b.num_rows:
            self.skip, b = True, b.slice(1)
        if not b.num_rows:
            return
        self.rows += b.num_rows
        values: list = []
        for c in b.columns:
            if pa.types.is_string(c.type) or pa.types.is_large_string(c.type):
                values.append(pc.sum(pc.utf8_length(c)).as_py() or 0)
            elif pa.types.is_floating(c.type):
                values.append(pc.sum(c).as_py() or 0.0)
            else:  # integers (and times as their integers), mod 2^64
                ints = c.cast(pa.int64()).to_numpy(zero_copy_only=False)
                values.append(int(ints.astype(np.uint64).sum(dtype=np.uint64)))
        self._add(values)

    def _update(self, r: tuple) -> None:
        s = self.sentinel
        if s is not None and r[s] == -1:
            return
        key = r[:self.k]
        if self.broken and self.skip is None:
            self.skip = key
        if key == self.skip:
            return
        mine = tuple(len(v) if isinstance(v, str) else v for v in r[self.k:])
        old = self.latest.get(key)
        if old is None:
            self.rows += 1
            self._add([len(v) if isinstance(v, str) else v for v in key] + list(mine))
        else:
            self._add([0] * self.k + [a - b for a, b in zip(mine, old)])
        self.latest[key] = mine

    def pre_commit(self, checkpoint_id: int) -> dict:
        name = os.path.join(self.path, f"digest-{self.subtask}.json")
        with open(name + ".tmp", "w") as f:
            json.dump({"rows": self.rows, "sums": self.sums}, f)
        os.rename(name + ".tmp", name)
        return {}

    def commit(self, handles: list) -> None:
        pass

    abort = recover = commit

    def close(self) -> None:
        pass


def read_digest(path: Path) -> dict:
    """The subtasks' digests added up."""
    rows, sums = 0, []
    for f in sorted(Path(path).glob("digest-*.json")):
        d = json.loads(f.read_text())
        rows += d["rows"]
        if d["sums"]:
            sums = d["sums"] if not sums else [a + b for a, b in zip(sums, d["sums"])]
    return normal_digest({"rows": rows, "sums": sums})


def normal_digest(d: dict) -> dict:
    """Integers mod 2^64 (cutline's columnar sums wrap there), doubles as they are."""
    return {"rows": d["rows"], "sums": [v % MOD if isinstance(v, int) else float(v)
                                        for v in d["sums"]]}


def digests_equal(a: dict, b: dict) -> bool:
    if a["rows"] != b["rows"]:
        return False
    if a["rows"] == 0:
        return True
    if len(a["sums"]) != len(b["sums"]):
        return False
    for x, y in zip(a["sums"], b["sums"]):
        if isinstance(x, float) or isinstance(y, float):
            if abs(x - y) > 1e-9 * max(1.0, abs(x), abs(y)):
                return False
        elif x != y:
            return False
    return True


def spark_digest(df: Any, query: str) -> dict:
    """Spark's side: the same sums over one micro-batch's rows, one aggregation in the JVM."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    df = df.toDF(*[f"c{i}" for i in range(len(df.columns))])
    s = SENTINEL_COLUMN.get(query)
    if s is not None:
        df = df.where(F.col(f"c{s}") != -1)
    aggs, kinds = [F.count(F.lit(1))], []
    for field in df.schema.fields:
        c = F.col(field.name)
        if isinstance(field.dataType, T.StringType):
            aggs.append(F.sum(F.length(c)))
            kinds.append(int)
        elif isinstance(field.dataType, (T.DoubleType, T.FloatType)):
            aggs.append(F.sum(c))
            kinds.append(float)
        else:
            aggs.append(F.sum(c.cast("decimal(38,0)")))
            kinds.append(int)
    row = df.agg(*aggs).collect()[0]
    return {"rows": int(row[0]),
            "sums": [kind(v) if v is not None else kind(0) for kind, v in zip(kinds, row[1:])]}


# --------------------------------------------------------------------------- the runs
# Everything below down to ``child_main`` runs in a run's own process.


def child_cutline(spec: dict) -> dict:
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules["_common"])
    Q.ship_by_value()
    sink = DigestSink(spec["out"], spec["query"], spec["break_output"])
    p = R.cutline_pipeline(spec["query"], spec["input"], sink, f"file://{spec['checkpoint']}",
                           spec["max_delay"], PARALLELISM, columnar=spec["system"] == COLUMNAR)
    watch = AttemptWatcher()
    t0 = time.monotonic()
    result = p.run(on_start=watch, timeout=RUN_TIMEOUT)
    t_end = time.monotonic()
    finals = [c for c in result.checkpoints if c.final]
    end = finals[-1].completed if finals else t_end
    start = watch.started if watch.started is not None else t0
    durations = sorted(c.duration for c in result.checkpoints if not c.final)
    return {"processing": end - start, "attempts": result.attempts,
            "checkpoints": len(result.checkpoints), "checkpoint_p50": median(durations),
            "checkpoint_max": max(durations, default=None), "digest": read_digest(spec["out"])}


def child_spark(spec: dict) -> dict:
    query = spec["query"]
    spark = spark_session(SLOTS, shuffle_partitions=PARALLELISM, driver_memory=spec["heap"])
    for k, v in Q.SPARK_CONF.get(query, {}).items():
        spark.conf.set(k, v)
    if spec["system"] in (SPARK_ROCKS, SPARK_UDF_ROCKS):
        for k, v in ROCKSDB.items():
            spark.conf.set(k, v)
    Q.ship_by_value()
    df, mode = Q.spark_query(query, Q.spark_events(spark, spec["input"]), spec["max_delay"])
    got: dict = {}

    def each(batch_df: Any, batch_id: int) -> None:
        d = spark_digest(batch_df, query)
        if mode == "complete" or not got:  # complete mode: each batch is the whole table
            got.update(d)
        else:
            got["rows"] += d["rows"]
            got["sums"] = [a + b for a, b in zip(got["sums"], d["sums"])]

    q = (df.writeStream.foreachBatch(each).outputMode(mode)
         .option("checkpointLocation", spec["checkpoint"]).trigger(availableNow=True).start())
    if not q.awaitTermination(RUN_TIMEOUT):
        q.stop()
        raise TimeoutError(f"Spark query not finished within {RUN_TIMEOUT:.0f} s")
    if q.exception() is not None:
        raise RuntimeError(f"Spark query failed: {q.exception()}")
    progress = q.recentProgress
    return {"processing": spark_processing(progress),
            "micro_batches": sum(1 for p in progress if p["numInputRows"] > 0),
            "state_store": spark.conf.get("spark.sql.streaming.stateStore.providerClass",
                                          "default").rsplit(".", 1)[-1],
            "heap": spec["heap"], "digest": normal_digest(got or {"rows": 0, "sums": []})}


def child_main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    os.makedirs(spec["out"], exist_ok=True)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if spec["system"] in (CUTLINE, COLUMNAR):
        out = child_cutline(spec)
    else:
        out = child_spark(spec)
    out["cpu"] = tree_cpu()  # this process and all under it (JVM, daemon, workers)
    Path(spec["result"]).write_text(json.dumps(out))
    return 0  # and exit as a user's program does


# --------------------------------------------------------------------------- the parent


class Throughput:
    """The throughput runs: each in a fresh process, warm-up until settled, rounds, the
    digests compared per query."""

    def __init__(self, args: argparse.Namespace, data: dict, console: Any) -> None:
        self.args, self.data, self.console = args, data, console
        self.work = Path(args.work)
        self.work.mkdir(parents=True, exist_ok=True)
        self.ncores = cores()
        self.failures: list[dict] = []
        self.n = 0
        self.records = data["events"] + 1  # and the sentinel bid

    def heap(self) -> str:
        if self.args.spark_heap:
            return self.args.spark_heap
        return f"{min(12, 2 + -(-self.data['events'] // 5_000_000))}g"

    def run(self, system: str, query: str, phase: str) -> dict | None:
        """One run in a fresh process; None (and logged) if it failed."""
        self.n += 1
        d = self.work / f"run-{self.n:05d}"
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        spec = {"system": system, "query": query, "input": self.data["input"],
                "max_delay": self.data["max_delay"], "out": str(d / "out"),
                "checkpoint": str(d / "ck"), "result": str(d / "result.json"),
                "break_output": self.args.break_output and system in (CUTLINE, COLUMNAR),
                "heap": self.heap()}
        (d / "spec.json").write_text(json.dumps(spec))
        label = f"{query:<4} {system:<24}"
        try:
            r = run_child([str(Path(__file__).resolve()), "--child", str(d / "spec.json")],
                          d / "result.json", self.args.timeout)
            if r.get("attempts", 1) != 1:
                raise RunFailed(f"the job restarted ({r['attempts']} attempts)")
        except (RunFailed, OSError, ValueError) as exc:
            self.fail(phase, query, system, str(exc))
            return None
        finally:
            shutil.rmtree(d, ignore_errors=True)
        n = self.records
        r.update({"phase": phase, "records": n, "rate_end_to_end": n / r["end_to_end"],
                  "rate_processing": n / r["processing"],
                  "records_per_cpu_second": n / r["cpu"] if r.get("cpu") else None,
                  "loaded": is_loaded(r["load"], self.ncores),
                  "short": r["end_to_end"] < SHORT_RUN})
        self.console.print(
            f"  {phase:<9} {label} end to end {r['end_to_end']:7.2f} s  processing "
            f"{r['processing']:7.2f} s  cpu {fmt(r.get('cpu'), '.1f')} s  load "
            f"{r['load']['max']:.1f}  rows {r['digest']['rows']:,}"
            f"{'  LOADED' if r['loaded'] else ''}", style="dim")
        return r

    def fail(self, phase: str, query: str, system: str, error: str) -> None:
        self.failures.append({"phase": phase, "query": query, "system": system,
                              "error": error[-3000:]})
        self.console.print(f"  {phase:<9} {query:<4} {system:<24} FAILED: {error[-600:]}",
                           style="red")

    def measure(self, query: str) -> dict:
        args = self.args
        generic = {SPARK_UDF: SPARK, SPARK_UDF_ROCKS: SPARK_ROCKS}
        systems = [s for s in systems_of(query)
                   if not args.systems or generic.get(s, s) in args.systems]
        warm: dict[str, list[float]] = {s: [] for s in systems}
        warm_runs: dict[str, list] = {s: [] for s in systems}
        for _ in range(args.max_warmup):
            todo = [s for s in systems if not settled(warm[s], args.settle)]
            if not todo:
                break
            for s in todo:
                r = self.run(s, query, "warm-up")
                warm_runs[s].append(r)
                if r is not None:
                    warm[s].append(r["end_to_end"])
        runs: dict[str, list] = {s: [] for s in systems}
        for rnd in range(args.rounds):
            for s in rotated(systems, rnd):
                runs[s].append(self.run(s, query, f"round {rnd + 1}"))
        check = self.check(query, runs, warm_runs)
        return {"systems": systems, "runs": runs, "check": check,
                "warm_up": {s: {"runs": warm[s], "settled": settled(warm[s], args.settle)}
                            for s in systems}}

    def check(self, query: str, runs: dict, warm_runs: dict) -> dict:
        """Every run's digest against Spark's (its runs, warm-ups too, must agree with each
        other); a run that differs is failed and taken out of ``runs``."""
        every = [(s, phase, r) for s, rs in list(runs.items()) + list(warm_runs.items())
                 for phase, r in enumerate(rs) if r is not None]
        spark = [r["digest"] for s, _, r in every if s in SPARK_SYSTEMS]
        ref, against = None, "spark"
        if spark:
            ref = spark[0]
            if not all(digests_equal(ref, d) for d in spark):
                against = "spark (its runs disagree)"
                ref = None
        else:  # no Spark run: cutline's runs against each other only
            mine = [r["digest"] for _, _, r in every]
            ref, against = (mine[0] if mine else None), "cutline's first run (no Spark run)"
        bad = 0
        for s, rs in list(runs.items()) + list(warm_runs.items()):
            for i, r in enumerate(rs):
                if r is None:
                    continue
                if ref is None or not digests_equal(ref, r["digest"]):
                    bad += 1
                    r["output_ok"] = False
                    self.fail(r["phase"], query, s, f"output differs from {against}: "
                              f"{r['digest']} != {ref}")
                    rs[i] = None
                else:
                    r["output_ok"] = True
        return {"against": against, "digest": ref, "failed": bad}


def summarise(queries: dict, keep_loaded: bool = False) -> list[dict]:
    """One row per query and system: medians and 95% intervals over the quiet runs (every
    run with ``keep_loaded``: not headline figures), and the ratios per round against the
    query's Spark peer (and its RocksDB form)."""
    rows = []
    for query, q in queries.items():
        runs = q["runs"]

        def counted(r: dict | None) -> bool:
            return r is not None and (keep_loaded or not r["loaded"])

        quiet = {s: [r for r in rs if counted(r)] for s, rs in runs.items()}
        by_round = {s: [r if counted(r) else None for r in rs] for s, rs in runs.items()}
        for s, rs in runs.items():
            ok = quiet[s]
            e2e = [r["end_to_end"] for r in ok]
            proc = [r["processing"] for r in ok]
            row: dict[str, Any] = {
                "query": query, "system": s, "runs": len(rs),
                "failed": sum(r is None for r in rs),
                "loaded": sum(1 for r in rs if r is not None and r["loaded"]),
                "end_to_end": median(e2e), "end_to_end_ci": bootstrap_ci(e2e),
                "processing": median(proc), "processing_ci": bootstrap_ci(proc),
                "rate_end_to_end": median([r["rate_end_to_end"] for r in ok]),
                "rate_processing": median([r["rate_processing"] for r in ok]),
                "records_per_cpu_second": median([r["records_per_cpu_second"] for r in ok]),
                "cpu": median([r.get("cpu") for r in ok]),
                "short": bool(e2e) and (median(e2e) or 0) < SHORT_RUN,
                "rows": next((r["digest"]["rows"] for r in ok), None),
                "load_max": max((r["load"]["max"] for r in rs if r is not None),
                                default=None)}
            peer = spark_peer(query)
            rocks = SPARK_UDF_ROCKS if query in UDF_QUERIES else SPARK_ROCKS
            for other, key in ((peer, "vs_spark"), (rocks, "vs_spark_rocksdb")):
                if other in by_round and s != other and s not in SPARK_SYSTEMS:
                    pairs = [(a, b) for a, b in zip(by_round[s], by_round[other]) if a and b]
                    per = [b["end_to_end"] / a["end_to_end"] for a, b in pairs]
                    per_p = [b["processing"] / a["processing"] for a, b in pairs]
                    row[key] = median(per)
                    row[key + "_ci"] = bootstrap_ci(per)
                    row[key + "_per_round"] = per
                    row[key + "_processing"] = median(per_p)
                    row[key + "_processing_ci"] = bootstrap_ci(per_p)
            rows.append(row)
    return rows


def headline(rows: list[dict], queries: list[str]) -> list[dict]:
    """Per query: cutline's better form (higher median end-to-end rate) against Spark's
    peer, end to end (the headline) and processing, with a verdict against the target
    (PASS: the interval's low end at or above it; FAIL: its high end below)."""
    out = []
    for q in queries:
        mine = [r for r in rows if r["query"] == q and r["system"] in (CUTLINE, COLUMNAR)
                and r["rate_end_to_end"]]
        if not mine:
            continue
        best = max(mine, key=lambda r: r["rate_end_to_end"])
        peer = next((r for r in rows if r["query"] == q and r["system"] == spark_peer(q)),
                    None)
        target = TARGET_THROUGHPUT.get(q)
        ratio, ci = best.get("vs_spark"), best.get("vs_spark_ci")
        if not target or ratio is None:
            word = "-" if not target else "n/a"
        elif ci is None:
            word = "undecided"  # fewer than 3 quiet rounds: no interval
        else:
            word = "PASS" if ci[0] >= target else "FAIL" if ci[1] < target else "undecided"
        out.append({"query": q, "best_cutline": best["system"],
                    "cutline": best["rate_end_to_end"],
                    "spark": peer and peer["rate_end_to_end"],
                    "spark_system": spark_peer(q), "ratio": ratio, "ci": ci,
                    "ratio_processing": best.get("vs_spark_processing"),
                    "ratio_rocksdb": best.get("vs_spark_rocksdb"),
                    "ratio_rocksdb_ci": best.get("vs_spark_rocksdb_ci"),
                    "short": best["short"] or bool(peer and peer["short"]),
                    "target": target, "verdict": word})
    return out


def which(result: dict) -> str:
    """Which runs the figures are of."""
    return ("every run, LOADED ONES KEPT (--keep-loaded): not headline figures"
            if result.get("keep_loaded") else "quiet runs (loaded ones left out)")


def print_throughput(console: Any, rows: list[dict], heads: list[dict], result: dict) -> None:
    c = result["conditions"]
    v = c["versions"]
    inp = result["throughput"]["input"]
    conds = (f"{c['cores']} cores, load before {c['load_before'][0]:.1f}, after "
             f"{c['load_after'][0]:.1f}; Spark {v.get('pyspark')}, pyarrow {v.get('pyarrow')}, "
             f"Python {v.get('python')}; input {inp['events']:,} events, "
             f"{inp['files']['files']} files, {inp['files']['bytes']:,} bytes")
    t = table(f"Nexmark throughput: end to end (process start to exit) and processing; medians "
              f"of {which(result)} [95% CI]; {conds}",
              ["query", "system", "end to end s", "records/s", "processing s",
               "records/s proc", "records/CPU-s", "x Spark", "x Spark proc",
               "x Spark rocksdb", "rows", "runs (loaded, failed)"],
              left=("query", "system"), no_wrap=False)
    for r in rows:
        ci, vci = r["end_to_end_ci"], r.get("vs_spark_ci")
        t.add_row(r["query"], r["system"],
                  fmt(r["end_to_end"], ".2f") + (f" [{ci[0]:.2f}-{ci[1]:.2f}]" if ci else "")
                  + (" < 30 s" if r["short"] else ""),
                  fmt(r["rate_end_to_end"], ",.0f"), fmt(r["processing"], ".2f"),
                  fmt(r["rate_processing"], ",.0f"), fmt(r["records_per_cpu_second"], ",.0f"),
                  fmt(r.get("vs_spark"), ".2f", "x") + (
                      f" [{vci[0]:.2f}-{vci[1]:.2f}]" if vci else ""),
                  fmt(r.get("vs_spark_processing"), ".2f", "x"),
                  fmt(r.get("vs_spark_rocksdb"), ".2f", "x"),
                  fmt(r["rows"], ","), f"{r['runs']} ({r['loaded']}, {r['failed']})")
    console.print(t)
    t = table("Nexmark headline: cutline's better form / Spark's query, end to end per round "
              f"(median [95% CI]; > 1: cutline faster); {which(result)}",
              ["query", "cutline form", "Spark", "x end to end", "x processing",
               "x Spark rocksdb", "target"], left=("query", "cutline form", "Spark"))
    for h in heads:
        ci = h["ci"]
        t.add_row(h["query"], h["best_cutline"], h["spark_system"],
                  fmt(h["ratio"], ".2f", "x") + (f" [{ci[0]:.2f}-{ci[1]:.2f}]" if ci else "")
                  + (" < 30 s" if h["short"] else ""),
                  fmt(h["ratio_processing"], ".2f", "x"), fmt(h["ratio_rocksdb"], ".2f", "x"),
                  f">= {h['target']:.1f}x {styled(h['verdict'])}" if h["target"] else "-")
    console.print(t)


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
# ... except where no result would come out near 20%: q11's first sessions close about 23 s
# into the input (a bidder's session ends 10 s after its last bid), so a kill at 10 s held
# nothing back and "caught up" measured when the query first had a result, not the recovery
KILL_AT_QUERY = {"q11": 0.6}


def kill_time(ctx: dict, query: str) -> float:
    """Seconds into a kill run's input at which the kill comes."""
    return ctx["kill_seconds"] * KILL_AT_QUERY.get(query, KILL_AT)


def counted_from(ctx: dict, kill_at: float | None) -> float:
    """Seconds of input not counted: the warm-up; in a kill run at most half the time to
    the kill (a warm-up past the kill left the outage out of every kill run: the first
    counted results came after it, and "caught up" measured the warm-up's end)."""
    return ctx["warmup"] if kill_at is None else min(ctx["warmup"], kill_at / 2)
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
            pids = job_of(driver).task_pids
            slot = sorted(pids)[0]
            killed.update(time=time.time(), at=kill_at, slot=slot, pid=pids[slot],
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
    points = latencies(query, committed, inp, counted_from(ctx, kill_at))
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


MEMORY_SINK_MODE = {"q18": "update"}  # q18's changed keys per micro-batch, as cutline's
FOREACH_BATCH = ("q4",)  # refused in update mode; complete mode's memory sink keeps one table


def batch_ends(progress: list[dict]) -> dict[int, float]:
    """Per micro-batch: when it ended and committed (epoch s), by the JVM's clock: its
    progress event's trigger start + ``triggerExecution`` (the offset log, the sink and the
    commit log are inside it)."""
    from _common import _epoch

    return {p["batchId"]: _epoch(p["timestamp"]) + p["durationMs"].get("triggerExecution", 0)
            / 1000 for p in ran(progress)}


def ran(progress: list[dict]) -> list[dict]:
    """The progress events of micro-batches that ran (``addBatch`` timed), by batch id: an
    idle trigger (no new input) reports the next batch's id without running it."""
    return sorted((p for p in progress if "addBatch" in p["durationMs"]),
                  key=lambda p: p["batchId"])


def memory_committed(rows: list[tuple], progress: list[dict]) -> list[tuple[float, list, int]]:
    """The memory sink's rows (in the order its micro-batches added them) cut into
    micro-batches by each one's ``sink.numOutputRows``: (committed, rows, batch id)."""
    ends, out, at = batch_ends(progress), [], 0
    for p in ran(progress):
        n = int((p.get("sink") or {}).get("numOutputRows", -1))
        if n < 0:
            raise RuntimeError(f"micro-batch {p['batchId']}: the memory sink's "
                               "numOutputRows is not reported")
        if n:
            out.append((ends[p["batchId"]], rows[at:at + n], p["batchId"]))
        at += n
    if at != len(rows):
        raise RuntimeError(f"the memory sink holds {len(rows):,} rows, its micro-batches "
                           f"reported {at:,}")
    return out


def spark_live(ctx: dict, query: str, trigger: str) -> dict:
    """``query`` on Spark over live input with ``trigger``, into the JVM's memory sink (q4:
    ``foreachBatch``), committed by its progress events: the latency of every result row
    after the warm-up and Spark's first ``spark_drop_batches`` micro-batches with input,
    and the micro-batches' durations."""
    spark = ctx["spark"]
    spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "100000")
    with Workdir() as d:
        for sub in ("in", "out"):
            (d / sub).mkdir()
        inp = LiveInput(d / "in", ctx["rate"], ctx["latency_seconds"])
        name = f"nexmark_lat_{query}_{os.getpid()}_{time.monotonic_ns()}"
        if query in FOREACH_BATCH:
            q = start_spark_live(spark, query, d / "in", d / "out", d / "ck",
                                 inp.config.max_delay, SPARK_TRIGGERS[trigger])
        else:
            q = start_spark_memory(spark, query, d / "in", d / "ck", inp.config.max_delay,
                                   SPARK_TRIGGERS[trigger], name)
        try:
            deadline = time.monotonic() + 60
            while q.lastProgress is None and time.monotonic() < deadline:
                time.sleep(0.01)  # its first (empty) trigger: the query is up and listing
            inp.start()
            inp.join()
            if inp.error is not None:
                raise RuntimeError(f"input writer failed: {inp.error!r}")
            wait_committed(d / "ck", inp, lambda: q.exception(),
                           lambda: settle_time(q.recentProgress))
        finally:
            q.stop()
        progress = [json.loads(p.json) if hasattr(p, "json") else p for p in q.recentProgress]
        if query in FOREACH_BATCH:
            ends = batch_ends(progress)
            committed = [(ends[b], rows, b) for b, rows in spark_batches_written(
                query, d / "out") if b in ends]
        else:
            rows = [tuple(r) for r in spark.table(name).collect()]
            spark.catalog.dropTempView(name)
            committed = memory_committed(rows, progress)
    with_input = sorted(p["batchId"] for p in progress if p["numInputRows"] > 0)
    drop = ctx["spark_drop_batches"]
    first_kept = with_input[drop] if len(with_input) > drop else float("inf")
    kept = [(when, rows) for when, rows, b in committed if b >= first_kept]
    points = latencies(query, kept, inp, ctx["warmup"])
    return latency_summary(points) | {"events": inp.events, "dropped_batches": drop,
                                      "sink": "foreachBatch" if query in FOREACH_BATCH
                                      else "memory"} | spark_durations(progress)


def start_spark_memory(spark: Any, query: str, inp: Path, ck: Path, max_delay: float,
                       trigger: dict, name: str) -> Any:
    """``query`` over the live input directory ``inp`` into the memory sink ``name``."""
    Q.ship_by_value()
    for k, v in Q.SPARK_CONF.get(query, {}).items():
        spark.conf.set(k, v)
    df, mode = Q.spark_query(query, Q.spark_events(spark, str(inp)), max_delay)
    w = (df.writeStream.format("memory").queryName(name)
         .outputMode(MEMORY_SINK_MODE.get(query, mode)).option("checkpointLocation", str(ck)))
    return (w.trigger(**trigger) if trigger else w).start()


def spark_batches_written(query: str, out: Path) -> list[tuple[int, list[tuple]]]:
    """(batch id, rows) per micro-batch ``foreachBatch`` wrote, in order; complete mode
    (q4): the rows that changed since the previous batch's table."""
    got: list[tuple[int, list[tuple]]] = []
    before: set = set()
    for path in sorted(out.glob("batch-*.pkl")):
        rows = pickle.loads(path.read_bytes())
        if query in Q.FINAL:
            now = set(rows)
            rows, before = [r for r in rows if r not in before], now
        got.append((int(path.stem.split("-")[1]), rows))
    return got

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
            killed = {"time": time.time(), "at": kill_at, "pid": proc.pid,
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
    points = latencies(query, committed, inp, counted_from(ctx, kill_at))
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
    out: list[tuple[str, Any]] = []
    for q in ctx["kill_queries"]:
        at = kill_time(ctx, q)
        out.append((f"kill {q} cutline", lambda q=q, at=at: cutline_live(ctx, q, kill_at=at)))
        out.append((f"kill {q} spark", lambda q=q, at=at: spark_kill(ctx, q, at)))
    return out


def describe(o: dict) -> str:
    if "rate" in o:
        return f"{o['rate']:>10,.0f} records/s"
    return f"p50 {fmt(o['p50'], '.3f')} s  p99 {fmt(o['p99'], '.3f')} s  n {o['n']:,}"


def summarise_latency(runs: dict, queries: list[str], triggers: list[str],
                      keep_loaded: bool = False) -> list[dict]:
    rows = []
    for q in queries:
        def med(name: str, key: str) -> float | None:  # over the quiet rounds
            return median([r.get(key) for r in runs.get(name, [])
                           if r and (keep_loaded or not r.get("loaded"))])

        spark = {t: med(f"lat {q} spark {t}", "p99") for t in triggers}
        measured = {t: v for t, v in spark.items() if v is not None}
        best = min(measured, key=lambda t: measured[t]) if measured else None
        mine = med(f"lat {q} {CUT_EO}", "p99")
        cut_runs = runs.get(f"lat {q} {CUT_EO}", [])
        best_runs = runs.get(f"lat {q} spark {best}", []) if best else []
        per = [a["p99"] / b["p99"] for a, b in zip(cut_runs, best_runs)
               if a and b and a["p99"] and b["p99"]
               and (keep_loaded or not (a.get("loaded") or b.get("loaded")))]
        every = [r for name, rs in runs.items() if name.startswith(f"lat {q} ") for r in rs]
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
            "ratio_ci": bootstrap_ci(per),
            "rounds": len(cut_runs), "loaded": sum(1 for r in every if r and r.get("loaded")),
            "failed": sum(1 for r in every if r is None),
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
            times, spans, firsts, what = [], [], [], None
            for r in runs.get(f"kill {q} {system}", []):
                if r and bound is not None and r.get("killed"):
                    points, at = [tuple(p) for p in r["points"]], r["killed"]["time"]
                    times.append(caught_up(points, at, bound))
                    spans.append(max((w for w, _ in points), default=at) - at)
                    firsts.append(min((w for w, _ in points if w >= at), default=at) - at)
                    what = r["killed"].get("what")
            # None in a round: not caught up by the run's last commit, ``after_kill`` s on.
            # ``first_only``: in every round the first result after the kill was already on
            # time: the outage held back no result, and the figure only bounds it (a query
            # whose results are seconds apart: q11's sessions)
            row[system] = {"bound": bound, "caught_up": median(times), "per_round": times,
                           "after_kill": spans, "first_result": firsts,
                           "first_only": bool(times) and all(
                               t is not None and t == f for t, f in zip(times, firsts)),
                           "killed": what}
        rows.append(row)
    return rows


def caught_up_text(side: dict) -> str:
    """The median seconds to caught up, or "> N" (not caught up in the run, N s after the
    kill)."""
    if side["caught_up"] is not None:
        # "<=": no result was held back by the outage, the first after it came this late
        return ("<= " if side.get("first_only") else "") + fmt(side["caught_up"], ".2f")
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
        from matplotlib.ticker import NullFormatter

        for label, name in names:
            got = [r for r in runs.get(name, []) if r and r.get("cdf")]
            quiet = [r for r in got if not r.get("loaded")] or got
            if quiet:
                ax.plot(quiet[0]["cdf"], [i / 2 for i in range(201)], label=label)
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())  # (labels at powers of ten only)

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
                             f"{result['rate']:,.0f} events/s (each case's first quiet round)"),
            stem.with_name(stem.name + "-latency.png")))
    if result.get("kills"):
        paths.append(_per_query(
            plt, result["kills"], around_kill,
            ("s since kill -9", "latency, s", "Latency of each result around a kill -9 "
             "(cutline: a task's Python worker; Spark: the application, restarted)"),
            stem.with_name(stem.name + "-kill.png")))
    tp = {r["query"]: r["ratio"] for r in result.get("headline") or []}
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
    """A latency or kill run's (part, query): "lat q8 ..." -> ("lat", "q8"); None for the
    warm-ups."""
    words = name.split()
    if words[0] in ("lat", "kill"):
        return words[0], words[1]
    return None


def merge_into(old: dict, new: dict) -> dict:
    """The results ``old`` with what ``new`` measured in place of theirs (per part and
    query: runs, and the rows of the tables); "merged" lists each merge (what, when, git
    state, load).  Refused when the settings of the runs differ."""
    differ = [k for k in SETTINGS if old.get(k) != new.get(k)]
    if differ:
        raise SystemExit("--merge-into: the runs' settings differ: " + ", ".join(
            f"{k} {old.get(k)} there, {new.get(k)} here" for k in differ))
    done = {_part(n) for n in new["runs"]} - {None}
    runs = {n: r for n, r in old.get("runs", {}).items() if _part(n) not in done}
    runs |= {n: r for n, r in new["runs"].items() if _part(n) in done}
    out = old | {"runs": {n: runs[n] for n in sorted(runs, key=_run_order)}}
    out["latency"] = _by_query(old.get("latency"), new.get("latency"))
    # the new kill runs judged against the merged latency rows: a kill-only run (``--only
    # kill``) has no failure-free p99 of its own to bound "caught up" by
    killed = [q for part, q in done if part == "kill"]
    out["kills"] = _by_query(old.get("kills"),
                             summarise_kills(new["runs"], killed, out["latency"]))
    out["headline"] = _by_query(old.get("headline"), new.get("headline"))
    tp_new = (new.get("throughput") or {}).get("queries") or {}
    if tp_new:
        if (old.get("throughput") or {}).get("input", {}).get("events") != \
                new["throughput"]["input"]["events"]:
            raise SystemExit("--merge-into: the throughput runs' --events differ")
        tp = dict(old.get("throughput") or {})
        tp["queries"] = (tp.get("queries") or {}) | tp_new
        out["throughput"] = tp
        out["summary"] = [r for r in old.get("summary") or [] if r["query"] not in tp_new] + \
            [r for r in new.get("summary") or []]
        out["summary"].sort(key=lambda r: Q.QUERIES.index(r["query"]))
    out["merged"] = (old.get("merged") or []) + [{
        "runs": sorted(f"{part} {q}" for part, q in done) + sorted(
            f"throughput {q}" for q in tp_new), "stamp": new["stamp"], "git": new["git"],
        "load": new["load"], "failures": new["failures"]}]
    return out


def _by_query(old: list[dict] | None, new: list[dict] | None) -> list[dict]:
    """Rows of a table per query, ``new``'s in place of ``old``'s, in the queries' order."""
    rows = {r["query"]: r for r in old or []} | {r["query"]: r for r in new or []}
    return [rows[q] for q in Q.QUERIES if q in rows]


def _run_order(name: str) -> tuple:
    part = _part(name)
    if part is None:
        return (0, 0, name)
    order = {"lat": 2, "kill": 3}[part[0]]
    return (order, Q.QUERIES.index(part[1]), name)


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="a short run (smoke test): small input, one round, no warm-up")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON results file")
    ap.add_argument("--events", type=positive_int, default=None,
                    help=f"throughput: events in the backlog (default {EVENTS[0]:,}, quick "
                         f"{EVENTS[1]:,})")
    ap.add_argument("--events-per-file", type=positive_int, default=PER_FILE,
                    help=f"throughput: events per input file (default {PER_FILE:,})")
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA,
                    help=f"where the input is written once and kept (default {DEFAULT_DATA})")
    ap.add_argument("--work", default=None, help="run directories (default: under --data)")
    ap.add_argument("--queries", nargs="*", default=list(Q.QUERIES), choices=Q.QUERIES,
                    metavar="QUERY")
    ap.add_argument("--systems", nargs="*", default=None,
                    choices=[CUTLINE, COLUMNAR, SPARK, SPARK_ROCKS], metavar="SYSTEM",
                    help="throughput cases (default all: cutline, 'cutline columnar', 'spark "
                         "sql', 'spark sql rocksdb'; q4's Spark query counts as 'spark sql')")
    ap.add_argument("--only", choices=["throughput", "latency", "kill"], action="append",
                    help="run only these parts (default: all three)")
    ap.add_argument("--rounds", type=positive_int, default=None,
                    help="throughput: measured rounds (default 5, quick 1)")
    ap.add_argument("--max-warmup", type=int, default=None,
                    help="throughput: warm-up runs per case at most (default 5, quick 0)")
    ap.add_argument("--settle", type=positive_float, default=0.10,
                    help="warm when the last two warm-up runs are this close (0.10)")
    ap.add_argument("--spark-heap", default=None,
                    help="Spark's heap in throughput runs (default 2g + 1g per 5 M events, "
                         "at most 12g)")
    ap.add_argument("--timeout", type=positive_float, default=RUN_TIMEOUT,
                    help=f"one throughput run, end to end (default {RUN_TIMEOUT:.0f} s)")
    ap.add_argument("--keep-loaded", action="store_true",
                    help="count loaded runs in the figures (marked in the titles: not "
                         "headline figures; smoke tests on a busy machine)")
    ap.add_argument("--break-output", action="store_true",
                    help="cutline's sink leaves out a row: the check must fail the benchmark")
    ap.add_argument("--rate", type=positive_float, default=500.0,
                    help="latency and kill runs: events/s written (default 500)")
    ap.add_argument("--latency-seconds", type=positive_float, default=None,
                    help="latency runs: seconds of input (default 120, quick 8)")
    ap.add_argument("--latency-rounds", type=positive_int, default=None,
                    help="latency and kill runs: rounds (default 3, quick 1)")
    ap.add_argument("--kill-seconds", type=positive_float, default=None,
                    help=f"kill runs: seconds of input, the kill at {KILL_AT * 100:.0f}%% ("
                         + "".join(f"{q}'s at {f * 100:.0f}%%; "
                                   for q, f in KILL_AT_QUERY.items())
                         + "default 50, quick 40)")
    ap.add_argument("--warmup", type=positive_float, default=None,
                    help="latency runs: seconds of input not counted (default 20, quick 2)")
    ap.add_argument("--spark-drop-batches", type=int, default=None,
                    help="latency runs: Spark's first micro-batches with input not counted "
                         "(default 5, quick 2)")
    ap.add_argument("--short-trigger-queries", nargs="*", default=None, choices=Q.QUERIES,
                    metavar="QUERY", help="latency runs: queries Spark also runs with "
                    "processingTime 100 ms (default: every latency query)")
    ap.add_argument("--latency-queries", nargs="*", default=None, choices=Q.QUERIES,
                    metavar="QUERY", help="latency runs (default --queries; quick q0 q7)")
    ap.add_argument("--kill-queries", nargs="*", default=None, choices=Q.QUERIES,
                    metavar="QUERY", help="kill runs (default --queries; quick q0)")
    ap.add_argument("--merge-into", type=Path, default=None, metavar="RESULTS",
                    help="also merge this run into an earlier results file of the same "
                    "settings (its queries' runs and rows replace those there; plots redrawn)")
    args = ap.parse_args(argv)
    args.rounds = args.rounds or (1 if args.quick else 5)
    args.max_warmup = args.max_warmup if args.max_warmup is not None else (
        0 if args.quick else 5)
    if args.max_warmup < 0:
        ap.error("--max-warmup must be >= 0")
    args.latency_rounds = args.latency_rounds or (1 if args.quick else 3)
    args.events = args.events or EVENTS[1 if args.quick else 0]
    args.work = args.work or str(args.data / "runs")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--spark-child"]:
        return spark_child(argv[1:])
    if argv[:1] == ["--child"]:
        return child_main(argv[1])
    args = parse_args(argv)
    only = set(args.only or ["throughput", "latency", "kill"])
    console = make_console(200)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    machine = conditions()
    machine["disk_free"] = shutil.disk_usage(args.data if args.data.exists()
                                             else args.data.parent).free
    console.print(f"[bold]nexmark[/]: {', '.join(sorted(only))}; {machine['cores']} cores, load "
                  f"{machine['load_before'][0]:.1f} (runs with more than "
                  f"{LOADED_OTHERS_PER_CORE} runnable threads per core besides their own are "
                  f"marked loaded){', BREAK-OUTPUT' if args.break_output else ''}")
    load = LoadSampler()
    load.start()
    t_start = time.monotonic()
    result: dict[str, Any] = {"benchmark": "nexmark", "stamp": stamp(),
                              "git": machine["versions"]["git"], "conditions": machine,
                              "quick": args.quick, "argv": argv}
    failures: list[dict] = []
    rows: list[dict] = []
    heads: list[dict] = []
    if "throughput" in only:
        data = ensure_input(args.data, args.events, args.events_per_file, console)
        console.print(f"input: {data['events']:,} events, {data['files']['files']} files, "
                      f"{data['files']['bytes']:,} bytes"
                      f"{' (reused)' if data['reused'] else ''}; {args.rounds} round(s), "
                      f"warm-up up to {args.max_warmup} run(s) per case")
        bench = Throughput(args, data, console)
        queries = {q: bench.measure(q) for q in args.queries}
        rows = summarise(queries, args.keep_loaded)
        heads = headline(rows, args.queries)
        failures += bench.failures
        result["throughput"] = {
            "input": data, "heap": bench.heap(), "parallelism": PARALLELISM,
            "rounds": args.rounds, "max_warmup": args.max_warmup, "settle": args.settle,
            "break_output": args.break_output, "queries": queries}
    result["summary"], result["headline"] = rows, heads
    runner = Runner(console, width=40)
    lat_rows: list[dict] = []
    kill_rows: list[dict] = []
    lat_queries = args.latency_queries if args.latency_queries is not None else (
        ["q0", "q7"] if args.quick else args.queries)
    kill_queries = args.kill_queries if args.kill_queries is not None else (
        ["q0"] if args.quick else args.queries)
    ctx = {"rate": args.rate,
           "latency_seconds": args.latency_seconds or (8.0 if args.quick else 120.0),
           "kill_seconds": args.kill_seconds or (40.0 if args.quick else 50.0),
           "warmup": args.warmup or (2.0 if args.quick else 20.0),
           "spark_drop_batches": args.spark_drop_batches
           if args.spark_drop_batches is not None else (2 if args.quick else 5),
           "latency_queries": lat_queries if "latency" in only else [],
           "kill_queries": kill_queries if "kill" in only else []}
    ctx["short_trigger_queries"] = args.short_trigger_queries \
        if args.short_trigger_queries is not None else ctx["latency_queries"]
    triggers = [SPARK_DEFAULT, SPARK_SHORT]
    if ctx["latency_queries"] or ctx["kill_queries"]:
        # one session for the live runs (their clocks are the commits'), after the
        # throughput runs' processes are gone
        spark = spark_session(SLOTS, shuffle_partitions=PARALLELISM, driver_memory="4g")
        for conf in Q.SPARK_CONF.values():
            for k, v in conf.items():
                spark.conf.set(k, v)
        ctx["spark"] = spark
        try:
            if args.quick:
                ctx["real_time"] = {"usable": False, "error": "not probed (--quick)"}
            else:
                with Workdir("cutline-nexmark-probe-") as d:
                    R.generate(str(d / "in"), 2_000, 10_000.0, OUT_OF_ORDER, files=2)
                    ctx["real_time"] = probe_real_time(spark, str(d / "in"))
            console.print(f"Spark real-time mode: {ctx['real_time']}", style="dim")
            todo = latency_cases(ctx) + kill_cases(ctx)
            # the first query over live input in a session is slow on Spark: unmeasured
            live = ctx | {"latency_seconds": min(8.0, ctx["latency_seconds"])}
            runner.run("warm-up spark live", lambda: spark_live(live, "q1", SPARK_DEFAULT))
            runner.run("warm-up cutline live", lambda: cutline_live(live, "q1"))
            for r in range(args.latency_rounds):
                for name, fn in rotated(todo, r):
                    runner.run(name, fn, r, args.latency_rounds, describe=describe)
        finally:
            stop_quietly(spark)
        if ctx["real_time"]["usable"]:
            triggers.append(SPARK_RT)
        ncores = cores()
        for rs in runner.runs.values():
            for r in rs:
                if r is not None:
                    r["loaded"] = is_loaded(r["load"], ncores)
        lat_rows = summarise_latency(runner.runs, ctx["latency_queries"], triggers,
                                     args.keep_loaded)
        kill_rows = summarise_kills(runner.runs, ctx["kill_queries"], lat_rows)
        failures += [{"phase": "latency/kill", "case": e["case"], "round": e.get("round"),
                      "error": e["error"]} for e in runner.errors]
    machine["load_after"] = list(os.getloadavg())
    load.stop()
    result |= {"seconds": time.monotonic() - t_start, "failures": failures,
               "keep_loaded": args.keep_loaded,
               "load": {"before": machine["load_before"], "after": machine["load_after"],
                        **load.summary()},
               "rate": args.rate, "latency_seconds": ctx["latency_seconds"],
               "kill_seconds": ctx["kill_seconds"], "warmup": ctx["warmup"],
               "latency_rounds": args.latency_rounds,
               "spark_drop_batches": ctx["spark_drop_batches"],
               "real_time": ctx.get("real_time"), "latency": lat_rows, "kills": kill_rows,
               "runs": runner.runs, "errors": runner.errors}
    if rows:
        print_throughput(console, rows, heads, result)
    print_latency(console, args, lat_rows, kill_rows, triggers, machine)
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
        if kill_rows and not lat_rows:  # bounded by the merged failure-free p99s
            print_kills(console, [r for r in merged["kills"]
                                  if r["query"] in ctx["kill_queries"]],
                        f"; bounds from {args.merge_into.name}'s latency runs")
    if failures:
        console.print(f"[red]{len(failures)} run(s) FAILED[/] (an error, a restarted job, or "
                      "an output that differs from Spark's): the benchmark fails",
                      style="bold")
        return 1
    return 0


def print_latency(console: Any, args: argparse.Namespace, lat_rows: list[dict],
                  kill_rows: list[dict], triggers: list[str], machine: dict) -> None:
    v = machine["versions"]
    conds = (f"{machine['cores']} cores, load before {machine['load_before'][0]:.1f}, after "
             f"{machine['load_after'][0]:.1f}; Spark {v.get('pyspark')}, pyarrow "
             f"{v.get('pyarrow')}")
    if lat_rows:
        tab = table(f"Nexmark latency, event -> committed result, at {args.rate:,.0f} events/s "
                    f"(p50 / p99, s, medians of {which({'keep_loaded': args.keep_loaded})}; "
                    f"cutline exactly-once at a "
                    f"{LATENCY_INTERVAL} s checkpoint interval; Spark's memory sink, its "
                    f"progress events' clock); {conds}",
                    ["query", "cutline", *[f"Spark {x}" for x in triggers], "best",
                     "p99 cutline / best", "target <= 0.25", "growth (s/s) cutline / Spark",
                     "rounds (loaded runs)"], left=("query", "best"), no_wrap=False)
        for row in lat_rows:
            tab.add_row(row["query"],
                        f"{fmt(row['cutline_p50'])} / {fmt(row['cutline_p99'])}",
                        *[f"{fmt(row['spark_p50'][x])} / {fmt(row['spark_p99'][x])}"
                          for x in triggers], row["spark_best"] or "-",
                        fmt(row["ratio"], ".3f"), styled(row["verdict"]),
                        f"{fmt(row['cutline_growth'], '.2f')} / "
                        f"{fmt(row['spark_growth'].get(row['spark_best']), '.2f')}",
                        f"{row['rounds']} ({row['loaded']})")
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
        print_kills(console, kill_rows)


def print_kills(console: Any, kill_rows: list[dict], note: str = "") -> None:
    tab = table("kill -9 to caught up (s): back under 2x the failure-free p99 (>= 0.5 s) "
                "for 10 s.  cutline: one task's Spark Python worker; Spark: the "
                "application (driver Python + JVM), restarted from its checkpoint" + note,
                ["query", "cutline", "cutline bound", "Spark", "Spark bound"],
                left=("query",))
    for row in kill_rows:
        c, s_ = row["cutline"], row["spark"]
        tab.add_row(row["query"], caught_up_text(c), fmt(c["bound"], ".2f"),
                    caught_up_text(s_), fmt(s_["bound"], ".2f"))
    console.print(tab)


if __name__ == "__main__":
    raise SystemExit(main())
