"""cutline against Spark Structured Streaming: the same workloads, the same input, side by side.

Run ``python bench/vs_spark.py`` (``--quick`` for a short run, every workload).  Every
throughput run is a process of its own (``python bench/vs_spark.py --child SPEC``; see
*Timing*): cutline runs as a user runs it (``Pipeline.run()`` on the embedded ``local[2,8]``
context it starts, parallelism 2), Spark's own streaming queries in a session of their own
(``spark_session``: ``local[2,8]``, the JVM at full speed, ``spark.sql.shuffle.partitions=2``,
so a stateful Spark query also uses both slots, as cutline does at parallelism 2).  The
latency runs and the profile share one session in this process (``embedded_session(slots=2)``
with the same settings): cutline as its barrier stage, Spark's queries on it.  Both systems
checkpoint to a fresh local directory per run.

**Input** (the same for both): JSON-lines files of events ``{"ts", "user", "kind", "value",
"page"}``, 1,000 users.  Spark reads them with its file stream source (``readStream.json``
with the schema), cutline with ``cutline.connectors.FileSource`` (``json.loads`` per line).
The throughput backlog is files of ``--events-per-file`` events (default 100,000, the size
of users' files; issue 30 found 1,000-line files measuring Spark's listing and planning).
``ts`` is event time in whole milliseconds: in the backlog 1,000 events per second of event
time, each up to 1 s behind the newest before it (deterministic), files numbered and dated
in that order; so no record is late for a 2 s watermark delay, in either system.  Workload
4's backlog is the same files and a last one holding a far-future sentinel event: Spark
keeps a window open until its watermark passes it, and cutline fires every window at the
end of its input anyway; the sentinel's window is left out of every check.

**Workloads**

1. *stateless*: parse, ``keep`` (drop views and values < 10, ~2/3 pass), ``enrich`` (add
   ``score`` and ``section``), write Parquet.  cutline: ``filter(keep).map(enrich)`` into
   ``ParquetSink``.  Spark, Python logic: ``mapInPandas`` calling the very same ``keep`` and
   ``enrich`` per record, into the Parquet file sink.  1b, for honesty: Spark with SQL
   built-ins only (``where`` + ``select``, JVM), same output.
2. *keyed*: a running aggregate per user with Python logic: every event emits ``(user,
   count, sum, ts)`` with the user's count and sum so far.  cutline: ``key_by(user)
   .process(running_aggregate)`` with a value state.  Spark: ``groupBy(user)
   .applyInPandasWithState`` (vectorised pandas: ``cumsum`` per user and micro-batch, the
   Spark idiom), append mode, into the Parquet file sink.
3. *keyed-sql*: the same aggregate with Spark's built-in aggregation (``groupBy(user).agg(
   count, sum, max(ts))``, JVM), update mode, written as Parquet by ``foreachBatch``: one row
   per updated user and micro-batch.  cutline per record: workload 2's runs.
4. *windowed*: a count per user per 10 s tumbling window of event time (``ts``), with a
   watermark of bounded out-of-orderness (2 s: newest event time seen - 2 s; a window
   ``[start, end)`` is emitted once the watermark reaches ``end``), one row ``(user, start,
   end, count)`` per user and window, Parquet.  cutline: ``assign_timestamps(ts, max_delay=2)
   .key_by(user).window(tumbling(10)).count()``, each ``WindowResult`` mapped to that row.
   Spark, SQL (4b): ``withWatermark("event_time", "2 seconds").groupBy(window(event_time,
   "10 seconds"), user).count()``, append mode, Parquet file sink.  Spark, Python logic (4):
   ``groupBy(user).applyInPandasWithState`` with ``EventTimeTimeout``: the user's counts per
   window start in its state, windows emitted once the watermark passes their end, the
   timeout at the earliest open window's end.  (``transformWithStateInPandas`` exists in
   PySpark 4.1 but its worker needs ``google.protobuf``, which cutline's environment does
   not install: it fails to start here.)

**The columnar path** (issue 15; ``cutline-columnar``): workloads 1b and 3 on cutline's
batch streams, the counterparts of Spark's SQL queries on the same files.  The source reads
Arrow record batches with pyarrow's JSON reader and the same schema Spark is given
(``FileSource(...).batches(schema)``); 1b is ``where`` + ``with_column`` (score, section) +
``select`` with column expressions, 3 is ``key_by("user").agg(count, sum(value),
max(ts))``: one row per user and record batch, an update stream like Spark's update mode,
checked the same way (the latest count of every user adds up to the input).  Both write
Parquet (``ParquetSink``, Arrow straight to the file).  Targets (issue 15): throughput >=
4x Spark SQL's on both.

**Throughput** (records/s at saturation): a backlog of files written before the run, read to
the end.  cutline checkpoints every 1 s.  Spark runs ``trigger(availableNow=True)``
(micro-batches back to back: the fastest trigger; a 1 s trigger is the same or slower) with
no ``maxFilesPerTrigger``: the whole backlog is one micro-batch.  That is Spark's best case:
at saturation a micro-batch takes everything that arrived during the previous one, so
batches grow and Spark's rate tends to its one-big-batch rate.  A reference row (one round,
not in ``--quick``) splits the backlog into 4 micro-batches (``maxFilesPerTrigger``), as a
production stream that bounds its batches would.

**Timing** (one rule for both systems, issue 30): every throughput run (cutline per record and
columnar, Spark with Python logic and SQL, the reference row, ``--files-per-subtask``'s runs)
is a fresh process; this process takes the time just before it spawns it and when it exits
(``run_child``): *end to end*, the headline, with everything a user waits for (interpreter,
imports, the JVM and Spark's context, planning, stage launch, reading, committing, the
program's exit; what it leaves running, Spark's JVM ending, is waited for untimed before the
next run).  Beside it, each run's own *processing time*, by the system's clock: cutline,
attempt 0 started (every task registered and started; a watcher polls the driver every 5 ms) ->
the final checkpoint completed (every record committed); Spark, the first micro-batch's trigger
-> the end of the last one (``StreamingQueryProgress`` ``timestamp`` + ``triggerExecution``:
its output and commit log are written by then; with or without input, as a watermark closes the
last windows in a batch without input).  Records/s = input events (workload 4: + the sentinel)
/ time.  The run's output is read and checked by this process after the run, outside its timed
span.

**CPU** of every throughput run: ``records/CPU-s, all`` counts everything the run used, the
same way for both systems: the run's process tree (its Python driver, Spark's JVM, the
PySpark daemon and its Python workers: cutline's task processes, Spark's ``mapInPandas``
workers), read by the run just before it exits (``tree_cpu``), start-up included.  cutline's
runs also report ``records/CPU-s, tasks``: its task processes only.

**Latency** (event written -> result committed) at a fixed input rate below saturation
(``--rate``, default 500 events/s), both systems on this process's session (warmed up first
on a small backlog: every throughput case once): they measure event -> committed by their
own clocks, not a process's wall time.  A writer thread in this process writes a file every
0.1 s, each record stamped ``ts = time.time()`` just before its file is written and renamed
into the directory (names starting with ``.`` are ignored by both sources).  The writer
starts once the system is ready (cutline: attempt 0 started; Spark: first progress event).
Each run writes ``--latency-seconds`` of input (default 120: issue 30's two minutes at
least); events written in its first ``--warmup`` seconds (default 20: Spark's first
micro-batches, cutline's first checkpoints) are not counted.  *Committed*:

* cutline: the committed Parquet file holding the record appears in the output directory
  (the sink renames it there when the checkpoint completes); a thread polls the directory
  every 10 ms and stamps each file when first seen;
* Spark file sink (1, 1b, 2): the micro-batch's ``_spark_metadata/<batch>`` entry appears
  (readers of the sink see the batch from then on), polled the same way;
* Spark ``foreachBatch`` (3): ``time.time()`` when the batch function returns (Spark writes
  its commit log right after); each event is mapped to its batch through the file source's
  log, ``<checkpoint>/sources/0``.

Latency = committed - ts, over the records of the output (1, 1b, 2) or over every event (3).
Configurations: cutline exactly-once at a 1 s checkpoint interval (the issue's setting);
labelled extras, cutline exactly-once at 0.1 s and cutline "visible on write" (a sink that
publishes each batch at once: at-least-once, no two-phase commit); Spark with a 1 s trigger
and with the fastest trigger (``processingTime="0 seconds"``).  cutline's file source lists
the directory every 20 ms when idle (Spark's file source polls every 10 ms).  Every
exactly-once committed output waits for its checkpoint: p99 >= the interval.

**Window-result latency** (workload 4; ``--window-latency-seconds`` of input, default 120,
quick 14, so that windows close during the run): the writer stamps each event's ``ts`` its
file's stamp minus up to 1 s of disorder, and notes when each file was renamed into place.
A window *closes* at the first moment a file holding an event time >= its end + 2 s was in
the directory: only then can a watermark pass its end, no result can exist earlier.
Latency = committed - closed, per result row (user, window), for the windows the input
closed after the warm-up (the end of input closes the others, in cutline only).  cutline
exactly-once at a 0.1 s (the target's) and a 1 s checkpoint interval; Spark SQL and Python
logic at a 1 s and the fastest trigger.  Spark emits a window in the micro-batch after the
one whose input moved its watermark past the end (a batch without input if need be); the
run waits for every closed window's result.  cutline's watermark is per source split (the
minimum of its two readers'), Spark's is global: that cost is part of cutline's numbers.

**Ratios** are cutline / Spark: throughput end to end (the headline) against Spark's better
variant, with the ratio of the processing rates beside it; p99 latency against Spark's lower
p99 of its two triggers.  Targets are judged on the headline.  Targets (issue 8): on the
Python-logic workloads (1, 2) throughput >= 2x and p99 <= 0.1x; workloads 1b and 3 are
reported.  Targets (issue 14), workload 4: throughput >= 2x Spark's Python logic,
window-result p99 at a 0.1 s checkpoint interval <= 0.25x Spark's Python logic at its best
trigger; against SQL (4b) both are reported.  ``--workloads 1b,3`` runs only what those
workloads need.

**Output checked**: every throughput run's output is checked against what the input holds
(workload 4: one row per user and window with the input's count), and workload 4's outputs
are compared across systems (``windowed_check``: cutline's Parquet output equals Spark SQL's,
through a digest of the sorted rows).  Latency runs of workload 4 check their window counts
too (cutline: every window; Spark: the windows the input closed).

The machine may be shared and noisy: runs go in rounds, in an order that rotates each
round; medians are reported, with the noise (half the spread of the per-round ratios).
``--profile`` (on in a full run) runs each cutline throughput pipeline once more, on this
process's session, under ``py-spy`` and splits the tasks' CPU samples by where they are
spent.  Results go to ``bench/results/vs_spark.json`` with plots ``vs_spark-throughput.png``
(records/s end to end) and ``vs_spark-latency.png`` next to it.

**Failures and conditions** (issue 30): a run that fails or whose output is wrong counts in no
figure, and the benchmark exits with code 1 (2 for bad arguments); ``--break-output`` makes
cutline's pipelines drop one input event, to show it.  Workload 1's output is checked row for
row (an order-free digest of the rows against the input's kept events enriched), workloads 2
and 3 per user (each user's last count is its count in the input), workload 4 per window; a
throughput run whose job restarted (more than one attempt) fails too.  The results record the
cores, versions, the input files, the load before and during the benchmark and during every run
(its start and highest, and others' runnable threads); a run that shared the machine (on
average more than 0.25 runnable threads per core outside the run's process tree, sampled from
``/proc`` once a second: ``is_loaded``; a throughput run's tree is its own process, a latency
run's this process with its Spark JVM and workers) is marked ``loaded`` and left out of the
tables and plots (``--keep-loaded`` keeps it, for smoke tests).  Throughput runs go after
warm-up rounds at full size, in fresh processes and not counted, until each case's last two
end-to-end times are within 10% (``--settle``; ``--max-warmup``, default at most 4 rounds;
quick none); each ratio has a 95% bootstrap interval of its per-round ratios (``paired_ci``;
``paired_processing_ci`` for the processing rates').
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.parse
from pathlib import Path
from typing import Any

from _common import (
    LOADED_OTHERS_PER_CORE, RESULTS, AttemptWatcher, LoadSampler, Runner, RunFailed, Workdir,
    bench_parser, bootstrap_ci, conditions, cutline_in_spark_task, fmt, git_state, input_files,
    is_loaded, median, ms, noise_of, non_negative_float, parse_bench_args, percentile,
    positive_float, positive_int, pyplot, rotated, run_child, settled, spark_batches,
    spark_processing, spark_session, stamp, stop_quietly, styled, table, tree_cpu, verdict,
    write_results,
)
from _common import console as make_console
from _common import job_of
from rich.console import Console

import cutline
from cutline import CheckpointConfig, Pipeline
from cutline.connectors import FileSource, ParquetSink
from cutline.connectors.files import FileReader

DEFAULT_OUT = RESULTS / "vs_spark.json"

SLOTS = PARALLELISM = 2
REF_BATCHES = 4  # reference row: Spark with the backlog split into this many micro-batches
INTERVAL = 1.0  # cutline checkpoint interval (the issue's setting)
SHORT_INTERVAL = 0.1  # labelled extra
USERS = 1000
EVENTS_PER_FILE = 100_000  # backlog files: users' sizes (issue 30; --events-per-file)
WRITE_PERIOD = 0.1  # latency: one file every 0.1 s
POLL = 0.02  # cutline's file source: listing period when idle, latency runs
WATCH = 0.01  # output directory polling
TARGET_THROUGHPUT = 2.0  # cutline / Spark, at least (Python-logic workloads)
TARGET_P99 = 0.1  # cutline / Spark, at most (Python-logic workloads)
JOB_TIMEOUT = 300.0
RUN_TIMEOUT = JOB_TIMEOUT + 120.0  # a throughput run's process, spawn to exit

STATELESS, KEYED, KEYED_SQL, WINDOWED = "stateless", "keyed", "keyed-sql", "windowed"
CUTLINE, SPARK_PY, SPARK_SQL = "cutline", "spark-python", "spark-sql"
COLUMNAR = "cutline-columnar"  # cutline's batch streams (issue 15), workloads 1b and 3
TARGET_COLUMNAR = 4.0  # cutline columnar / Spark SQL, at least (issue 15: workloads 1b, 3)
WORKLOAD_TITLES = {
    STATELESS: "1. stateless parse + filter + map -> Parquet",
    KEYED: "2. keyed running aggregate, Python logic",
    KEYED_SQL: "3. keyed aggregate, Spark SQL built-in",
    WINDOWED: "4. windowed count per user per 10 s",
}
SPARK_API = {(STATELESS, SPARK_PY): "mapInPandas", (STATELESS, SPARK_SQL): "SQL built-ins",
             (KEYED, SPARK_PY): "applyInPandasWithState", (KEYED_SQL, SPARK_SQL): "SQL aggregation",
             (WINDOWED, SPARK_PY): "applyInPandasWithState",
             (WINDOWED, SPARK_SQL): "SQL window aggregation"}
# Workload 4 needs cutline's windows (issue 14); bench/ab.py may measure an older cutline.
HAS_WINDOWS = hasattr(cutline, "tumbling")
SKIPPED = {} if HAS_WINDOWS else {
    WINDOWED: "this cutline has no windows (no event time, watermarks or timers)"}
# The columnar path needs batch streams (issue 15); bench/ab.py may measure an older cutline.
HAS_BATCHES = hasattr(FileSource, "batches")

# Workload 4: windows of event time, a watermark, input out of order but never late.
WINDOW = 10  # seconds of event time, tumbling
MAX_DELAY = 2.0  # watermark = newest event time seen - MAX_DELAY (both systems)
DISORDER = 1.0  # an event is up to this far behind the newest before it (< MAX_DELAY)
EVENT_RATE = 1000  # backlog: events per second of event time
BASE_TS = 1_700_000_000  # backlog: event time of the first event
SENTINEL_TS = BASE_TS + 10**7  # far future: its watermark closes every real window in Spark
SENTINEL = "sentinel"  # its user; its own window is left out of every comparison
WINDOW_LATENCY_SECONDS = (120.0, 14.0)  # latency runs of workload 4, (full, quick)
TARGET_WINDOW_P99 = 0.25  # cutline at a 0.1 s checkpoint interval / Spark's best trigger
TARGET_SPLITS = 0.8  # workload 4, many files per subtask / one (issue 25), at least

# --------------------------------------------------------------------------- workloads
# Top-level functions: Spark ships them by value (this module is __main__), and both
# systems call the very same Python logic.

KINDS = ("view", "click", "buy", "scroll")
EVENT_SCHEMA = "ts double, user string, kind string, value long, page string"
STATELESS_SCHEMA = "ts double, user string, kind string, value long, score double, section string"
STATELESS_COLUMNS = ["ts", "user", "kind", "value", "score", "section"]
KEYED_SCHEMA = "user string, count long, sum long, ts double"
WINDOWED_SCHEMA = "user string, start double, end double, count long"
WINDOWED_COLUMNS = ["user", "start", "end", "count"]


def make_event(i: int, ts: float) -> dict:
    return {"ts": ts, "user": f"u{(i * 7919) % USERS:04d}", "kind": KINDS[(i // 3) % 4],
            "value": i % 100, "page": f"/p{i % 7}/item{i % 500}"}


def keep(e: dict) -> bool:
    return e["kind"] != "view" and e["value"] >= 10


def enrich(e: dict) -> dict:
    return {"ts": e["ts"], "user": e["user"], "kind": e["kind"], "value": e["value"],
            "score": e["value"] * 1.5 + 1.0, "section": e["page"].split("/")[1]}


def user_of(e: dict) -> str:
    return e["user"]


def running_aggregate(ctx: Any, e: dict):
    """cutline: the user's count and sum so far, emitted for every event."""
    state = ctx.value_state("agg", (0, 0))
    count, total = state.value
    count, total = count + 1, total + e["value"]
    state.update((count, total))
    return ({"user": ctx.key, "count": count, "sum": total, "ts": e["ts"]},)


def event_time(e: dict) -> float:
    return e["ts"]


def window_row(r: Any) -> dict:
    """cutline: a ``WindowResult`` as the row Spark writes (window bounds as epoch seconds)."""
    return {"user": r.key, "start": float(r.start), "end": float(r.end), "count": r.value}


def disorder(i: int) -> float:
    """How far event ``i`` lags behind the newest event time so far: deterministic, in
    [0, DISORDER), in whole milliseconds."""
    return ((i * 7919) % 1000) / 1000 * DISORDER


def window_start(ts: float, window: float = WINDOW) -> float:
    """The start of the tumbling window (``window`` seconds) holding ``ts`` (timestamps are
    whole milliseconds, so cutline's ``ts - ts % size``, Spark's window() on microseconds and
    this agree)."""
    return float(int(ts // window) * window)


def stateless_batches(frames):
    """Spark ``mapInPandas``: ``keep`` and ``enrich`` per record, as cutline calls them."""
    import pandas as pd

    for pdf in frames:
        rows = [enrich(e) for e in pdf.to_dict("records") if keep(e)]
        yield pd.DataFrame(rows, columns=STATELESS_COLUMNS)


def running_aggregate_pandas(key, frames, state):
    """Spark ``applyInPandasWithState``: the same running aggregate, vectorised per user."""
    import numpy as np
    import pandas as pd

    count, total = state.get if state.exists else (0, 0)
    for pdf in frames:
        counts = count + np.arange(1, len(pdf) + 1)
        sums = total + pdf["value"].cumsum().to_numpy()
        yield pd.DataFrame({"user": key[0], "count": counts, "sum": sums,
                            "ts": pdf["ts"].to_numpy()})
        count, total = int(counts[-1]), int(sums[-1])
    state.update((count, total))


def window_counts_pandas(key, frames, state):
    """Spark ``applyInPandasWithState`` with an event-time timeout, as a Spark user writes a
    window in Python: the user's count per window start in its state (vectorised per
    micro-batch), every window whose end the watermark has reached emitted, the timeout set
    to the earliest open window's end (it fires when the watermark passes it)."""
    import json

    import numpy as np
    import pandas as pd

    # the state is JSON text: PySpark 4.3.0 cannot read an array column of a state schema
    # (KeyError 'elementType' in StructType.fromJson on the worker)
    counts = {s: c for s, c in json.loads(state.get[0])} if state.exists else {}
    for pdf in frames:
        starts, n = np.unique(np.floor(pdf["ts"].to_numpy() / WINDOW) * WINDOW,
                              return_counts=True)
        for s, c in zip(starts.tolist(), n.tolist()):
            counts[s] = counts.get(s, 0) + c
    watermark = state.getCurrentWatermarkMs() / 1000
    due = sorted(s for s in counts if s + WINDOW <= watermark)
    if due:
        yield pd.DataFrame({"user": key[0], "start": due, "end": [s + WINDOW for s in due],
                            "count": [counts.pop(s) for s in due]})
    if counts:
        state.update((json.dumps(list(counts.items())),))
        # an event-time timeout fires once the watermark is past it: at the window's end
        state.setTimeoutTimestamp(int(round((min(counts) + WINDOW) * 1000)) - 1)
    else:
        state.remove()


class FollowUntilDone(FileSource):
    """``FileSource(follow=True)`` that ends once ``_DONE`` exists and every file is read
    (a latency run must end; files starting with ``_`` are not input)."""

    def create_reader(self) -> "FollowUntilDoneReader":
        return FollowUntilDoneReader(self)


class FollowUntilDoneReader(FileReader):
    def read_batch(self, max_records: int) -> list | None:
        out = super().read_batch(max_records)
        if out == [] and os.path.exists(os.path.join(self._root, "_DONE")):
            self._list()
            if self._pick() is None:
                return None
        return out


class VisibleOnWriteSink:
    """Publishes every batch as a Parquet file at once (write, then rename): at-least-once,
    no two-phase commit.  Measures the pipeline's own latency, without waiting for a
    checkpoint; not comparable with exactly-once output."""

    name = "visible-on-write"

    def __init__(self, path: str) -> None:
        self.path = path

    def create_writer(self) -> "VisibleOnWriteWriter":
        return VisibleOnWriteWriter(self.path)


class VisibleOnWriteWriter:
    def __init__(self, path: str) -> None:
        self.path, self.n, self.subtask = path, 0, 0

    def open(self, subtask: int, parallelism: int, job: str) -> None:
        self.subtask = subtask
        os.makedirs(self.path, exist_ok=True)

    def write(self, batch: list) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        keys = dict.fromkeys(k for r in batch for k in r)
        table = pa.Table.from_pydict({k: [r.get(k) for r in batch] for k in keys})
        tmp = os.path.join(self.path, f".{self.subtask}-{self.n}.tmp")
        pq.write_table(table, tmp)
        os.rename(tmp, os.path.join(self.path, f"visible-{self.subtask}-{self.n}.parquet"))
        self.n += 1

    def pre_commit(self, checkpoint_id: int) -> dict:
        return {}

    def commit(self, handles: list) -> None:
        pass

    def abort(self, handles: list) -> None:
        pass

    def recover(self, handles: list) -> None:
        pass

    def close(self) -> None:
        pass


BREAK_OUTPUT = False  # --break-output: cutline's pipelines drop event 0 (the checks must fail)
BROKEN = make_event(0, BASE_TS)  # its user and event time tell it apart (ts: backlog_ts(0))


def not_broken(e: dict) -> bool:
    return not (e["user"] == BROKEN["user"] and e["ts"] == BROKEN["ts"])


def cutline_pipeline(name: str, workload: str, source: Any, sink: Any, storage: str,
                     interval: float) -> Pipeline:
    p = Pipeline(name, parallelism=PARALLELISM,
                 checkpoint=CheckpointConfig(interval=interval, storage=storage))
    s = p.source(source, uid="events")
    if BREAK_OUTPUT:
        s = s.filter(not_broken, uid="broken")
    if workload == STATELESS:
        s = s.filter(keep, uid="keep").map(enrich, uid="enrich")
    elif workload == WINDOWED:
        s = (s.assign_timestamps(event_time, max_delay=MAX_DELAY, uid="stamps")
             .key_by(user_of).window(cutline.tumbling(WINDOW)).count(uid="counts")
             .map(window_row, uid="rows"))
    else:
        s = s.key_by(user_of).process(running_aggregate, uid="aggregate")
    s.sink(sink, uid="out")
    return p


def event_arrow_schema() -> Any:
    """``EVENT_SCHEMA`` as the Arrow schema the columnar source reads with (Spark's
    ``readStream.schema(EVENT_SCHEMA).json``: the same columns and types)."""
    import pyarrow as pa

    return pa.schema([("ts", pa.float64()), ("user", pa.string()), ("kind", pa.string()),
                      ("value", pa.int64()), ("page", pa.string())])


def section_of(batch: Any) -> Any:
    """Columnar ``enrich``'s ``section``: ``page.split("/")[1]`` for a whole batch (Spark
    SQL's ``split(page, "/")[1]``)."""
    import pyarrow.compute as pc

    return pc.list_element(pc.split_pattern(batch["page"], "/"), 1)


def columnar_pipeline(name: str, workload: str, source: Any, sink: Any, storage: str,
                      interval: float) -> Pipeline:
    """Workloads 1b and 3 on cutline's batch streams, the Spark SQL queries' counterparts:
    ``where`` + ``with_column`` + ``select`` (column expressions, no Python per record), and
    ``key_by(user).agg(count, sum, max(ts))`` (one row per user and batch: an update stream,
    as Spark's update mode writes one row per user and micro-batch)."""
    import pyarrow.compute as pc

    p = Pipeline(name, parallelism=PARALLELISM,
                 checkpoint=CheckpointConfig(interval=interval, storage=storage))
    s = p.source(source.batches(event_arrow_schema()), uid="events")
    if BREAK_OUTPUT:
        s = s.where(~((pc.field("user") == BROKEN["user"]) & (pc.field("ts") == BROKEN["ts"])),
                    uid="broken")
    if workload == STATELESS:
        s = (s.where((pc.field("kind") != "view") & (pc.field("value") >= 10), uid="keep")
             .with_column("score", pc.field("value") * 1.5 + 1.0, uid="score")
             .with_column("section", section_of, uid="section")
             .select(*STATELESS_COLUMNS, uid="enrich"))
    elif workload in (KEYED, KEYED_SQL):
        s = s.key_by("user").agg(count="count", sum=("value", "sum"), ts=("ts", "max"),
                                 uid="aggregate")
    elif workload == WINDOWED:  # rows (user, start, end, count), as Spark SQL's 4b
        s = (s.assign_timestamps("ts", max_delay=MAX_DELAY, uid="stamps")
             .key_by("user").window(cutline.tumbling(WINDOW)).count(uid="counts"))
    else:
        raise ValueError(f"no columnar pipeline for {workload}")
    s.sink(sink, uid="out")
    return p


def spark_frame(spark: Any, workload: str, engine: str, input_dir: str,
                max_files: int | None = None) -> Any:
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    reader = spark.readStream.schema(EVENT_SCHEMA)
    if max_files:
        reader = reader.option("maxFilesPerTrigger", max_files)
    df = reader.json(input_dir)
    if workload == WINDOWED:
        df = (df.withColumn("event_time", F.timestamp_seconds("ts"))
              .withWatermark("event_time", f"{MAX_DELAY:g} seconds"))
    if (workload, engine) == (WINDOWED, SPARK_SQL):
        w = F.window("event_time", f"{WINDOW} seconds")
        return (df.groupBy(w, "user").count()
                .select("user", (F.unix_micros("window.start") / 1e6).alias("start"),
                        (F.unix_micros("window.end") / 1e6).alias("end"), "count"))
    if (workload, engine) == (WINDOWED, SPARK_PY):
        return df.groupBy("user").applyInPandasWithState(
            window_counts_pandas, WINDOWED_SCHEMA, "windows string", "append",
            GroupStateTimeout.EventTimeTimeout)
    if (workload, engine) == (STATELESS, SPARK_PY):
        return df.mapInPandas(stateless_batches, STATELESS_SCHEMA)
    if (workload, engine) == (STATELESS, SPARK_SQL):
        return (df.where((F.col("kind") != "view") & (F.col("value") >= 10))
                .select("ts", "user", "kind", "value",
                        (F.col("value") * 1.5 + 1.0).alias("score"),
                        F.split("page", "/").getItem(1).alias("section")))
    if (workload, engine) == (KEYED, SPARK_PY):
        return df.groupBy("user").applyInPandasWithState(
            running_aggregate_pandas, KEYED_SCHEMA, "count long, sum long", "append",
            GroupStateTimeout.NoTimeout)
    if (workload, engine) == (KEYED_SQL, SPARK_SQL):
        return df.groupBy("user").agg(F.count("*").alias("count"), F.sum("value").alias("sum"),
                                      F.max("ts").alias("ts"))
    raise ValueError(f"no Spark query for {workload} on {engine}")


def start_spark(df: Any, workload: str, out: Path, checkpoint: Path, trigger: dict,
                commits: dict[int, float]) -> Any:
    if workload == KEYED_SQL:
        def write_batch(batch_df: Any, batch_id: int) -> None:
            batch_df.write.mode("append").parquet(str(out / f"batch-{batch_id}"))
            commits[batch_id] = time.time()

        w = df.writeStream.outputMode("update").foreachBatch(write_batch)
    else:
        w = df.writeStream.format("parquet").outputMode("append").option("path", str(out))
    return w.option("checkpointLocation", str(checkpoint)).trigger(**trigger).start()


# --------------------------------------------------------------------------- input


def backlog_ts(i: int) -> float:
    """Event ``i``'s event time in the backlog: ``EVENT_RATE`` events per second, each up to
    ``DISORDER`` behind the newest before it, whole milliseconds."""
    return round(BASE_TS + i / EVENT_RATE - disorder(i), 3)


def write_backlog(directory: Path, records: int, files: int, window: float = WINDOW, *,
                  stateless: bool = True, processes: int = 1) -> dict:
    """``records`` events in ``files`` JSON-lines files; what a correct run outputs
    (``window_counts``: the count per (user, start of its ``window``-second tumbling
    window), ``user_counts``: the count per user; neither written to JSON; with
    ``stateless``, workload 1's kept rows and their digest).  Files are numbered and dated
    in event-time order (Spark reads the oldest first).  ``processes`` > 1 writes files in
    that many processes, compact JSON (orjson where installed): for large inputs."""
    directory.mkdir(parents=True, exist_ok=True)
    bounds = [records * k // files for k in range(files + 1)]
    now = time.time()
    jobs = [(directory, k, bounds[k], bounds[k + 1], now - files + k, window, stateless,
             processes > 1) for k in range(files)]
    if processes > 1:
        import multiprocessing

        with multiprocessing.get_context("fork").Pool(processes) as pool:
            parts = pool.imap_unordered(_backlog_file, jobs, chunksize=1)
            totals = _add_up(parts)
    else:
        totals = _add_up(map(_backlog_file, jobs))
    kept, digest, windows, users = totals
    return {"records": records, "files": files, "kept": kept if stateless else None,
            "windows": len(windows),
            "bytes": sum(f.stat().st_size for f in directory.iterdir()),
            "stateless_digest": digest % (1 << 64) if stateless else None,
            "window_counts": dict(windows), "user_counts": dict(users)}


def _backlog_file(job: tuple) -> tuple[int, int, collections.Counter, collections.Counter]:
    """One backlog file (``write_backlog``): its kept rows, their digest, its counts."""
    directory, k, lo, hi, mtime, window, stateless, compact = job
    events = [make_event(i, backlog_ts(i)) for i in range(lo, hi)]
    kept = digest = 0
    if stateless:
        passed = [enrich(e) for e in events if keep(e)]
        kept, digest = len(passed), rows_digest(passed)
    windows = collections.Counter((e["user"], window_start(e["ts"], window)) for e in events)
    users = collections.Counter(e["user"] for e in events)
    path = directory / f"ev-{k:06d}.jsonl"
    if compact:
        try:
            import orjson

            path.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in events))
        except ImportError:
            path.write_text("".join(json.dumps(e, separators=(",", ":")) + "\n"
                                    for e in events))
    else:
        path.write_text("".join(json.dumps(e) + "\n" for e in events))
    os.utime(path, (mtime, mtime))
    return kept, digest, windows, users


def _add_up(parts: Any) -> tuple[int, int, collections.Counter, collections.Counter]:
    kept = digest = 0
    windows: collections.Counter = collections.Counter()
    users: collections.Counter = collections.Counter()
    for k, d, w, u in parts:
        kept, digest = kept + k, digest + d
        windows.update(w)
        users.update(u)
    return kept, digest, windows, users


def rows_digest(rows: list[dict]) -> int:
    """An order-free digest of workload 1's output rows: the sum of a stable 64-bit hash of
    each row (equal multisets of rows, equal digests, in any process)."""
    blake = hashlib.blake2b
    return sum(int.from_bytes(blake(repr(tuple(r[c] for c in STATELESS_COLUMNS)).encode(),
                                    digest_size=8).digest(), "little") for r in rows)


def windowed_backlog(backlog: Path, directory: Path) -> Path:
    """Workload 4's input: the backlog's files (hard links) and, last, a file with one
    far-future sentinel event.  Spark emits a window once its watermark has passed it, so
    without the sentinel it would keep the last windows open; cutline fires every window
    at the end of its input anyway.  The sentinel's own window is left out of the checks."""
    directory.mkdir(parents=True, exist_ok=True)
    for f in sorted(backlog.iterdir()):
        os.link(f, directory / f.name)
    last = directory / "ev-999999-sentinel.jsonl"
    last.write_text(json.dumps(make_event(0, SENTINEL_TS) | {"user": SENTINEL}) + "\n")
    later = time.time() + 1
    os.utime(last, (later, later))
    return directory


class RateWriter(threading.Thread):
    """Writes ``rate`` events/s for ``seconds``: one file per ``WRITE_PERIOD``, written
    under a ``.`` name and renamed into place; each event stamped just before its file is
    written.  With ``done_after``, writes ``_DONE`` that many seconds after the last file.

    ``windowed`` (workload 4): event ``j``'s event time is its stamp minus ``disorder(j)``
    (out of order by up to ``DISORDER``, never late), and the writer notes when each file
    became visible with the newest event time written so far, and the count per (user,
    window start) a correct run outputs."""

    def __init__(self, directory: Path, rate: float, seconds: float,
                 done_after: float | None = None, windowed: bool = False) -> None:
        super().__init__(daemon=True, name="rate-writer")
        self.directory, self.rate, self.seconds, self.done_after = \
            directory, rate, seconds, done_after
        self.windowed = windowed
        self.files: dict[str, tuple[float, int]] = {}  # name -> (ts, events)
        self.visible: list[tuple[float, float]] = []  # (renamed into place, newest ts so far)
        self.window_counts: collections.Counter = collections.Counter()
        self.events = 0
        self.t0: float | None = None
        self.t_end: float | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # noqa: BLE001 - reported by the run
            self.error = exc

    def _run(self) -> None:
        t0 = self.t0 = time.time()
        k = i = 0
        while True:
            due = t0 + k * WRITE_PERIOD
            if due - t0 >= self.seconds - 1e-9:
                break
            delay = due - time.time()
            if delay > 0:
                time.sleep(delay)
            n = int(self.rate * (k + 1) * WRITE_PERIOD) - int(self.rate * k * WRITE_PERIOD)
            name = f"ev-{k:06d}.jsonl"
            tmp = self.directory / f".{name}.tmp"
            ts = time.time()
            if self.windowed:
                events = [make_event(j, round(ts - disorder(j), 3)) for j in range(i, i + n)]
                self.window_counts.update((e["user"], window_start(e["ts"])) for e in events)
            else:
                events = [make_event(j, ts) for j in range(i, i + n)]
            tmp.write_text("".join(json.dumps(e) + "\n" for e in events))
            os.rename(tmp, self.directory / name)
            if self.windowed:
                newest = max([e["ts"] for e in events] + [v[1] for v in self.visible[-1:]])
                self.visible.append((time.time(), newest))
            self.files[name] = (ts, n)
            i += n
            k += 1
            self.events = i
        self.t_end = time.time()
        if self.done_after is not None:
            time.sleep(self.done_after)
            (self.directory / "_DONE").write_text("")


    def window_closes(self) -> dict[float, float]:
        """Window end -> when that window closed: the first moment a file holding an event
        time >= end + MAX_DELAY was in the input directory, so that a watermark of
        (newest event time - MAX_DELAY) could pass the end.  No result for the window can
        exist earlier.  Only the windows the input closed."""
        closes: dict[float, float] = {}
        ends = sorted({s + WINDOW for _, s in self.window_counts})
        k = 0
        for seen, newest in self.visible:
            while k < len(ends) and ends[k] + MAX_DELAY <= newest:
                closes[ends[k]] = seen
                k += 1
        return closes


class DirWatcher(threading.Thread):
    """Stamps each file of ``directory`` (matching ``wanted``) when first seen."""

    def __init__(self, directory: Path, wanted: Any) -> None:
        super().__init__(daemon=True, name="dir-watcher")
        self.directory, self.wanted = directory, wanted
        self.seen: dict[str, float] = {}
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                with os.scandir(self.directory) as it:
                    now = time.time()
                    for e in it:
                        if e.name not in self.seen and self.wanted(e.name):
                            self.seen[e.name] = now
            except FileNotFoundError:
                pass
            self._halt.wait(WATCH)

    def stop(self) -> None:
        self._halt.set()
        if self.is_alive():
            self.join(timeout=5)


def run_dir() -> Workdir:
    return Workdir("cutline-vs-spark-")


# --------------------------------------------------------------------------- output checks


def _parquet_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.parquet")
                  if not any(part.startswith(("_", ".")) for part in p.relative_to(root).parts))


def check_output(workload: str, files: list[Path], expected: dict) -> dict:
    """Rows written, and whether they are what a correct run writes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    if workload == WINDOWED:
        return check_windows(read_windows(files), expected["window_counts"]) | {"rows": rows}
    if workload == STATELESS:  # every row, as the input's kept events enriched
        digest = sum(rows_digest(pq.read_table(f, columns=STATELESS_COLUMNS).to_pylist())
                     for f in files) % (1 << 64)
        return {"rows": rows, "digest": f"{digest:016x}",
                "ok": rows == expected["kept"] and digest == expected["stateless_digest"]}
    tables = [pq.read_table(f, columns=["user", "count"]) for f in files]
    table = pa.concat_tables(tables) if tables else None
    finals: dict[str, int] = {}
    if table is not None and table.num_rows:
        t = table.group_by("user").aggregate([("count", "max")]).to_pydict()
        finals = dict(zip(t["user"], t["count_max"]))
    total = sum(finals.values())
    # each user's last count is the input's count of that user
    ok = finals == expected["user_counts"] and (workload == KEYED_SQL
                                                or rows == expected["records"])
    return {"rows": rows, "final_counts": total, "users": len(finals),
            "users_wrong": sum(finals.get(u) != c for u, c in expected["user_counts"].items()),
            "ok": ok}


def read_windows(files: list[Path]) -> list[tuple[str, float, float, int]]:
    """Workload 4's output rows ``(user, start, end, count)``."""
    import pyarrow.parquet as pq

    out: list[tuple[str, float, float, int]] = []
    for f in files:
        t = pq.read_table(f, columns=WINDOWED_COLUMNS).to_pydict()
        out.extend(zip(t["user"], t["start"], t["end"], t["count"]))
    return out


def check_windows(rows: list[tuple[str, float, float, int]], want: dict) -> dict:
    """One row per (user, window) and the counts the input holds, the sentinel's window left
    out; ``digest`` identifies the counts, to compare one system's output with another's."""
    got: dict[tuple[str, float], int] = {}
    dup = 0
    for user, start, end, count in rows:
        if user == SENTINEL:
            continue
        dup += (user, start) in got or end != start + WINDOW
        got[(user, float(start))] = count
    digest = hashlib.sha256(json.dumps(sorted(got.items())).encode()).hexdigest()[:16]
    return {"windows": len(got), "records_counted": sum(got.values()),
            "duplicates_or_bad_bounds": dup, "digest": digest,
            "ok": dup == 0 and got == want}


# --------------------------------------------------------------------------- throughput


def backlog_of(ctx: dict, workload: str) -> tuple[Path, int]:
    """A workload's input directory and its number of events (workload 4: + the sentinel)."""
    if workload == WINDOWED:
        return ctx["backlog_windowed"], ctx["expected"]["records"] + 1
    return ctx["backlog"], ctx["expected"]["records"]


def throughput_spec(ctx: dict, workload: str, system: str, d: Path,
                    max_files: int | None = None) -> dict:
    """What one throughput run does (``system`` on ``workload``'s backlog; Spark:
    ``max_files`` per micro-batch, if given), and where it writes: under ``d``."""
    backlog, _ = backlog_of(ctx, workload)
    return {"system": system, "workload": workload, "input": str(backlog),
            "max_files": max_files, "break_output": BREAK_OUTPUT, "out": str(d / "out"),
            "checkpoint": str(d / "ck"), "result": str(d / "result.json")}


def run_cutline(spark: Any, spec: dict, on_attempt: Any = None) -> dict:
    """cutline's throughput run: its pipeline (per record, or columnar) on ``spark``, or, with
    ``None``, on the embedded session ``Pipeline.run()`` starts, as a user runs it.
    Processing time: attempt 0 started -> final checkpoint completed; ``in_session``: the
    call to ``run()`` -> its return (with ``None``, the session's start included)."""
    columnar = spec["system"] == COLUMNAR
    build = columnar_pipeline if columnar else cutline_pipeline
    p = build(f"vs-{'col-' if columnar else ''}{spec['workload']}", spec["workload"],
              FileSource(spec["input"]), ParquetSink(spec["out"]),
              f"file://{spec['checkpoint']}", INTERVAL)
    watch = AttemptWatcher(on_attempt)
    t0 = time.monotonic()
    result = p.run(spark, on_start=watch, timeout=JOB_TIMEOUT)
    t_end = time.monotonic()
    finals = [c for c in result.checkpoints if c.final]
    end = finals[-1].completed if finals else t_end
    start = watch.started if watch.started is not None else t0
    return {"processing": end - start, "in_session": t_end - t0,
            "checkpoints": len(result.checkpoints), "attempts": result.attempts,
            "checkpoint_durations": [c.duration for c in result.checkpoints if not c.final],
            "cpu": sum(getattr(result, "cpu_seconds", {}).values()) or None}


def run_spark(spark: Any, spec: dict) -> dict:
    """Spark's throughput run: its query on ``spark`` with ``trigger(availableNow=True)``.
    Processing time: the first micro-batch's trigger -> the end of the last micro-batch,
    with or without input (a stateful query with a watermark emits what the last input's
    watermark closed in a batch without input); ``in_session``: the query's ``start()`` ->
    its termination."""
    df = spark_frame(spark, spec["workload"], spec["system"], spec["input"], spec["max_files"])
    t0 = time.monotonic()
    q = start_spark(df, spec["workload"], Path(spec["out"]), Path(spec["checkpoint"]),
                    {"availableNow": True}, {})
    try:
        if not q.awaitTermination(JOB_TIMEOUT):
            raise TimeoutError(f"Spark query not finished within {JOB_TIMEOUT:.0f} s")
        if q.exception() is not None:
            raise RuntimeError(f"Spark query failed: {q.exception()}")
    finally:
        if q.isActive:
            q.stop()
    t_end = time.monotonic()
    progress = q.recentProgress
    batches = spark_batches(progress)
    every = spark_batches(progress, with_empty=True)
    return {"processing": spark_processing(progress), "in_session": t_end - t0,
            "micro_batches": len(batches),
            "batches_without_input": len({b["batch"] for b in every}
                                         - {b["batch"] for b in batches}),
            "max_files_per_trigger": spec["max_files"],
            "batch_ms": [b["ms"] for b in batches]}


def check_run(spec: dict, expected: dict) -> dict:
    """A throughput run's output, read after the run: what it committed (cutline: the
    ``ParquetSink``'s committed part files; Spark: its file sink's or ``foreachBatch``'s
    Parquet files) against what the input holds (:func:`check_output`)."""
    out = Path(spec["out"])
    workload = spec["workload"]
    if spec["system"] in (CUTLINE, COLUMNAR):
        files = [Path(f) for f in ParquetSink(str(out)).committed_files()]
        # the columnar aggregate writes an update stream, as Spark SQL's workload 3 does
        if spec["system"] == COLUMNAR and workload in (KEYED, KEYED_SQL):
            workload = KEYED_SQL
    else:
        files = _parquet_files(out)
    return check_output(workload, files, expected)


def rates(run: dict, n: int) -> dict:
    """``run`` with its rates for ``n`` input events: ``rate`` (records / processing time),
    ``rate_end_to_end`` (records / end to end, where measured), records per CPU-second of
    the whole run (``cpu_all``) and, for cutline, of its task processes (``cpu``)."""
    run.update({"records": n, "rate": n / run["processing"],
                "records_per_cpu_second_all": n / run["cpu_all"] if run.get("cpu_all")
                else None})
    if "end_to_end" in run:
        run["rate_end_to_end"] = n / run["end_to_end"]
    if "cpu" in run:
        run["records_per_cpu_second"] = n / run["cpu"] if run["cpu"] else None
    return run


def throughput(ctx: dict, workload: str, system: str, max_files: int | None = None) -> dict:
    """One throughput run of ``system`` (``CUTLINE``, ``COLUMNAR``, ``SPARK_PY``,
    ``SPARK_SQL``) on ``workload``: in a fresh process when ``ctx["fresh"]`` (the benchmark's
    runs: :func:`fresh_run`), else on ``ctx["spark"]`` in this process (``bench/ab.py``'s
    servers, ``bench/ab_file_source.py``; the warm-up and the profile of the in-process
    parts), its CPU then this process's and its Spark JVM's tree (:class:`CpuMeter`)."""
    if ctx.get("fresh"):
        return fresh_run(ctx, workload, system, max_files)
    _, n = backlog_of(ctx, workload)
    meter = CpuMeter(ctx["spark"])
    with run_dir() as d:
        spec = throughput_spec(ctx, workload, system, d, max_files)
        cpu0 = meter.read()
        if system in (CUTLINE, COLUMNAR):
            run = run_cutline(ctx["spark"], spec, ctx.get("on_attempt"))
        else:
            run = run_spark(ctx["spark"], spec)
        cpu1 = meter.read()
        run["cpu_all"] = cpu1 - cpu0 if cpu0 is not None and cpu1 is not None else None
        run["output"] = check_run(spec, ctx["expected"])
    return rates(run, n)


def fresh_run(ctx: dict, workload: str, system: str, max_files: int | None = None) -> dict:
    """A throughput run by issue 30's rule: a fresh process (``python bench/vs_spark.py
    --child SPEC``: :func:`child_main`) timed by :func:`run_child` from just before the spawn
    to its exit (``end_to_end``, with the run's ``load``); the run's own figures from its
    result file; its output checked here, after the run.  A run that exits non-zero, times
    out or restarts raises :class:`RunFailed`; a wrong output is ``output["ok"]`` False, as
    in-process runs report it."""
    _, n = backlog_of(ctx, workload)
    with run_dir() as d:
        spec = throughput_spec(ctx, workload, system, d, max_files)
        (d / "spec.json").write_text(json.dumps(spec))
        run = run_child([str(Path(__file__).resolve()), "--child", str(d / "spec.json")],
                        d / "result.json", RUN_TIMEOUT)
        if run.get("attempts", 1) != 1:
            raise RunFailed(f"the job restarted ({run['attempts']} attempts)")
        run["output"] = check_run(spec, ctx["expected"])
    return rates(run, n)


def child_main(spec_path: str) -> int:
    """``--child SPEC``: one throughput run in this fresh process.  cutline runs as a user
    runs it (``Pipeline.run()``, its embedded session), Spark in its own session with the
    settings the benchmark gives it (:func:`spark_session`, ``local[2,8]``, 2 shuffle
    partitions).  Its figures (processing time, attempts, micro-batches, and ``cpu_all``:
    this process and every one under it, read just before it exits) go to the spec's result
    file; then it exits, as a user's program does."""
    global BREAK_OUTPUT
    from pyspark import SparkContext, cloudpickle

    spec = json.loads(Path(spec_path).read_text())
    BREAK_OUTPUT = spec["break_output"]
    # Spark's workers cannot import bench/: what of it they run goes by value
    for module in (sys.modules[__name__], sys.modules["_common"]):
        cloudpickle.register_pickle_by_value(module)
    if spec["system"] in (CUTLINE, COLUMNAR):
        out = run_cutline(None, spec)
    else:
        out = run_spark(spark_session(SLOTS, shuffle_partitions=PARALLELISM), spec)
    out["master"] = getattr(SparkContext._active_spark_context, "master", None)
    out["cpu_all"] = tree_cpu()  # the driver, Spark's JVM, its daemon and Python workers
    Path(spec["result"]).write_text(json.dumps(out))
    return 0


class CpuMeter:
    """CPU seconds of everything an in-process run uses: this process (cutline's driver,
    Spark's py4j client) and Spark's JVM with every process under it (the PySpark daemon,
    its Python workers: cutline's task processes, Spark's ``mapInPandas`` workers).  Linux
    only (``/proc``); ``None`` elsewhere.  A delta over one run is that run's CPU, both
    systems counted the same way."""

    def __init__(self, spark: Any) -> None:
        proc = getattr(getattr(spark.sparkContext, "_gateway", None), "proc", None)
        self.jvm = getattr(proc, "pid", None)

    def read(self) -> float | None:
        jvm = tree_cpu(self.jvm) if self.jvm is not None else None
        return None if jvm is None else time.process_time() + jvm


# --------------------------------------------------------------------------- latency


def _ts_column(path: Path | str) -> list[float]:
    import pyarrow.parquet as pq

    return pq.read_table(path, columns=["ts"]).column("ts").to_pylist()


def _latency_summary(lat: list[float], writer: RateWriter, seconds: float) -> dict:
    return {"n": len(lat), "p50": percentile(lat, 50), "p90": percentile(lat, 90),
            "p99": percentile(lat, 99), "max": max(lat) if lat else None,
            "events_written": writer.events,
            "rate_written": writer.events / seconds if seconds else None,
            # the distribution, compactly: percentiles 0, 0.5, 1, ..., 100
            "cdf": [round(percentile(lat, q / 2), 4) for q in range(201)] if lat else []}


CUT_EO, CUT_EO_SHORT, CUT_VISIBLE = "cutline exactly-once 1 s", "cutline exactly-once 0.1 s", \
    "cutline visible on write"
SPARK_1S, SPARK_FAST = "trigger 1 s", "fastest trigger"
REF = f"{REF_BATCHES} micro-batches"
SHORT = {CUT_EO: "EO 1 s", CUT_EO_SHORT: "EO 0.1 s", CUT_VISIBLE: "visible on write",
         SPARK_1S: "1 s", SPARK_FAST: "fastest"}


def input_seconds(ctx: dict, workload: str) -> float:
    """Seconds of input of a latency run (workload 4: long enough for windows to close)."""
    return ctx["window_latency_seconds"] if workload == WINDOWED else ctx["latency_seconds"]


def window_latencies(rows: list[tuple[str, float, float, int]], seen: float,
                     closes: dict[float, float], t0: float, warmup: float) -> list[float]:
    """Workload 4: committed (``seen``) - when the window closed, for each result row of a
    window the input closed after the warm-up (the end of input closes the others in
    cutline)."""
    return [seen - closes[end] for _, _, end, _ in rows
            if end in closes and closes[end] - t0 >= warmup]


def cutline_latency(ctx: dict, workload: str, config: str) -> dict:
    interval = SHORT_INTERVAL if config == CUT_EO_SHORT else INTERVAL
    windowed = workload == WINDOWED
    seconds = input_seconds(ctx, workload)
    with run_dir() as d:
        inp, out = d / "in", d / "out"
        inp.mkdir()
        out.mkdir()
        sink = VisibleOnWriteSink(str(out)) if config == CUT_VISIBLE else ParquetSink(str(out))
        source = FollowUntilDone(str(inp), follow=True, poll_interval=POLL, step=POLL / 2)
        p = cutline_pipeline(f"vs-lat-{workload}", workload, source, sink, f"file://{d}/ck",
                             interval)
        # _DONE (end of input) once every counted event had time to be committed by a
        # periodic checkpoint, not by the final one
        drain = interval + 0.5 if ctx["quick"] else 2 * interval + 1.0
        writer = RateWriter(inp, ctx["rate"], seconds, done_after=drain, windowed=windowed)
        watcher = DirWatcher(out, lambda n: n.endswith(".parquet") and not n.startswith("."))

        def begin(driver: Any) -> None:
            watcher.start()
            writer.start()

        result = p.run(ctx["spark"], on_start=AttemptWatcher(begin), timeout=JOB_TIMEOUT)
        writer.join(timeout=30)
        time.sleep(2 * WATCH)
        watcher.stop()
        if writer.error is not None:
            raise RuntimeError(f"input writer failed: {writer.error!r}")
        finals = [c.id for c in result.checkpoints if c.final]
        final_part = re.compile(rf"^part-\d+-{finals[-1]}-\d+\.parquet$") if finals else None
        lat: list[float] = []
        in_final = 0
        closes = writer.window_closes() if windowed else {}
        all_rows: list[tuple[str, float, float, int]] = []
        for name, seen in watcher.seen.items():
            if windowed:
                rows = read_windows([out / name])
                all_rows.extend(rows)
                part = window_latencies(rows, seen, closes, writer.t0, ctx["warmup"])
            else:
                part = [seen - t for t in _ts_column(out / name)
                        if t - writer.t0 >= ctx["warmup"]]
            lat.extend(part)
            if final_part is not None and final_part.match(name):
                in_final += len(part)
    out_summary = _latency_summary(lat, writer, seconds)
    out_summary.update({"interval": interval, "checkpoints": len(result.checkpoints),
                        "committed_by_final_checkpoint": in_final})
    if windowed:  # every window: the end of input fires those the input did not close
        out_summary.update(_windows_measured(closes, writer, ctx["warmup"]))
        out_summary["output"] = check_windows(all_rows, dict(writer.window_counts))
    return out_summary


def _windows_measured(closes: dict[float, float], writer: RateWriter, warmup: float) -> dict:
    assert writer.t0 is not None
    return {"windows_closed": sum(1 for c in closes.values() if c - writer.t0 >= warmup),
            "window_results_closed": sum(1 for (_, s) in writer.window_counts
                                         if closes.get(s + WINDOW, -math.inf) - writer.t0
                                         >= warmup)}


def _source_log(checkpoint: Path) -> dict[str, int]:
    """File name -> micro-batch, from Spark's file source log (compacted entries included)."""
    batch_of: dict[str, int] = {}
    log_dir = checkpoint / "sources" / "0"
    if not log_dir.exists():
        return batch_of
    for f in log_dir.iterdir():
        if f.name.startswith("."):
            continue
        for line in f.read_text().splitlines()[1:]:
            entry = json.loads(line)
            batch_of[entry["path"].rsplit("/", 1)[-1]] = int(entry["batchId"])
    return batch_of


def _all_committed(checkpoint: Path, files: dict) -> bool:
    """Every file is in a micro-batch whose commit log entry exists (``numInputRows`` would
    not do: it counts rows after filters pushed into the JSON scan)."""
    batch_of = _source_log(checkpoint)
    if any(name not in batch_of for name in files):
        return False
    last = max((batch_of[name] for name in files), default=-1)
    return last < 0 or (checkpoint / "commits" / str(last)).exists()


def _local(uri: str) -> str:
    return urllib.parse.unquote(urllib.parse.urlparse(uri).path)


def _sink_files(out: Path, seen: dict[str, float]) -> list[tuple[float, Path]]:
    """Spark file sink: (when its ``_spark_metadata`` entry was first seen, file) of each
    file the sink committed, from the metadata log entries in ``seen`` (compacted ones
    included)."""
    meta = out / "_spark_metadata"
    found: dict[str, float] = {}

    def batch_no(name: str) -> int:
        return int(name.split(".")[0])

    for name, when in sorted(seen.items(), key=lambda kv: batch_no(kv[0])):
        for line in (meta / name).read_text().splitlines()[1:]:
            entry = json.loads(line)
            if entry.get("action", "add") == "add" and entry["path"] not in found:
                found[entry["path"]] = when
    return [(when, Path(_local(path))) for path, when in found.items()]


def _wait_for_windows(q: Any, out: Path, watcher: DirWatcher, writer: RateWriter,
                      timeout: float) -> None:
    """Workload 4 on Spark: wait until the sink holds a result for every (user, window)
    the input closed.  Spark emits a window in the micro-batch after the one whose input
    moved its watermark past the end (a batch without input, if need be)."""
    closes = writer.window_closes()
    want = {(u, s) for u, s in writer.window_counts if s + WINDOW in closes}
    have: set[tuple[str, float]] = set()
    read: set[Path] = set()
    deadline = time.monotonic() + timeout
    while True:
        for _, path in _sink_files(out, dict(watcher.seen)):
            if path not in read:
                read.add(path)
                have.update((u, s) for u, s, _, _ in read_windows([path]))
        if want <= have:
            return
        if q.exception() is not None:
            raise RuntimeError(f"Spark query failed: {q.exception()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"Spark emitted {len(want & have)} of the {len(want)} window "
                               f"results the input closed within {timeout:.0f} s")
        time.sleep(0.05)


def spark_latency(ctx: dict, workload: str, engine: str, config: str) -> dict:
    spark = ctx["spark"]
    trigger = {"processingTime": "1 second" if config == SPARK_1S else "0 seconds"}
    windowed = workload == WINDOWED
    seconds = input_seconds(ctx, workload)
    with run_dir() as d:
        inp, out, ck = d / "in", d / "out", d / "ck"
        inp.mkdir()
        commits: dict[int, float] = {}
        df = spark_frame(spark, workload, engine, str(inp))
        q = start_spark(df, workload, out, ck, trigger, commits)
        writer = RateWriter(inp, ctx["rate"], seconds, windowed=windowed)
        watcher = DirWatcher(out / "_spark_metadata", lambda n: not n.startswith("."))
        try:
            deadline = time.monotonic() + 30
            while q.lastProgress is None and time.monotonic() < deadline:
                time.sleep(0.01)  # the query's first (empty) trigger: it is up and listing
            watcher.start()
            writer.start()
            writer.join()
            if writer.error is not None:
                raise RuntimeError(f"input writer failed: {writer.error!r}")
            # Spark's Python windows take seconds per micro-batch: allow them more
            wait = 150.0 if windowed else 60.0
            deadline = time.monotonic() + wait
            while not _all_committed(ck, writer.files):
                if q.exception() is not None:
                    raise RuntimeError(f"Spark query failed: {q.exception()}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"Spark did not commit every input file within "
                                       f"{wait:.0f} s of the last")
                time.sleep(0.05)
            if windowed:
                _wait_for_windows(q, out, watcher, writer, 150.0)
            time.sleep(2 * WATCH)
        finally:
            watcher.stop()
            q.stop()
        batches = spark_batches(q.recentProgress)
        lat: list[float] = []
        t0, warm = writer.t0, ctx["warmup"]
        closes = writer.window_closes() if windowed else {}
        all_rows: list[tuple[str, float, float, int]] = []
        if workload == KEYED_SQL:
            for name, batch in _source_log(ck).items():
                ts, n = writer.files[name]
                if ts - t0 >= warm and batch in commits:
                    lat.extend([commits[batch] - ts] * n)
        else:
            for seen, path in _sink_files(out, watcher.seen):
                if windowed:
                    rows = read_windows([path])
                    all_rows.extend(rows)
                    lat.extend(window_latencies(rows, seen, closes, t0, warm))
                else:
                    lat.extend(seen - t for t in _ts_column(path) if t - t0 >= warm)
    out_summary = _latency_summary(lat, writer, seconds)
    durations = [b["ms"]["triggerExecution"] / 1000 for b in batches]
    out_summary.update({
        "micro_batches": len(batches), "batch_p50": median(durations),
        "batch_max": max(durations, default=None),
        "batches_over_1s": sum(1 for x in durations if x > 1.0),
        "rows_per_batch_p50": median([b["rows"] for b in batches])})
    if windowed:  # the windows the input closed (Spark keeps the others open)
        out_summary.update(_windows_measured(closes, writer, warm))
        out_summary["batches_without_input"] = len(
            {b["batch"] for b in spark_batches(q.recentProgress, with_empty=True)}
            - {b["batch"] for b in batches})
        want = {k: v for k, v in writer.window_counts.items() if k[1] + WINDOW in closes}
        out_summary["output"] = check_windows(
            [r for r in all_rows if r[2] in closes], want)
    return out_summary


# --------------------------------------------------------------------------- profile

CATEGORIES = [  # (name, test on a leaf frame "function (file:line)"), first match wins
    ("file source: read lines, parse JSON", lambda f: "json/" in f or "connectors/files.py" in f
     or "fsspec/" in f or "connectors/arrow_files.py" in f),
    ("columnar operators, aggregation", lambda f: "runtime/batches.py" in f),
    ("key hashing (columnar)", lambda f: "state/arrow_keys.py" in f),
    ("user functions", lambda f: "vs_spark.py" in f),
    ("sink: Parquet", lambda f: "parquet" in f or "pyarrow" in f),
    ("channels: pickling, sockets", lambda f: "runtime/channels.py" in f or "pickle" in f
     or "socket" in f),
    ("operators, keyed state", lambda f: "runtime/operators.py" in f or "cutline/state/" in f),
    ("task loop, checkpoints", lambda f: "runtime/task.py" in f or "runtime/control.py" in f
     or "cutline/storage/" in f or "msgpack" in f),
    ("threading, locks", lambda f: "threading.py" in f or "queue.py" in f),
    ("imports (a fresh Python worker)", lambda f: "importlib" in f),
    ("PySpark worker", lambda f: "daemon.py" in f or "pyspark/" in f),
]


def _py_spy() -> str | None:
    local = Path(sys.executable).parent / "py-spy"
    return str(local) if local.exists() else shutil.which("py-spy")


def summarise_profile(raw_files: list[Path]) -> dict:
    """py-spy raw (collapsed) stacks -> CPU samples by category and by function (self)."""
    by_cat: collections.Counter = collections.Counter()
    by_fn: collections.Counter = collections.Counter()
    total = 0
    for path in raw_files:
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            if not stack or not count.isdigit():
                continue
            n = int(count)
            leaf = re.sub(r":\d+\)$", ")", stack.split(";")[-1])
            total += n
            by_fn[leaf] += n
            by_cat[next((name for name, test in CATEGORIES if test(leaf)), "other")] += n
    share = (lambda c: {k: v / total for k, v in c.most_common()}) if total else (lambda c: {})
    return {"samples": total, "categories": share(by_cat),
            "top_functions": dict(list(share(by_fn).items())[:15])}


def profile_cutline(ctx: dict, console: Console, workdir: Path) -> dict:
    spy = _py_spy()
    if spy is None:
        return {"skipped": "py-spy not found"}
    out: dict[str, Any] = {}
    runs = [(tp_name(STATELESS, CUTLINE), STATELESS, False),
            (tp_name(KEYED, CUTLINE), KEYED, False)]
    if HAS_BATCHES:
        runs += [(tp_name(STATELESS, COLUMNAR), STATELESS, True),
                 (tp_name(KEYED_SQL, COLUMNAR), KEYED_SQL, True)]
    for name, workload, columnar in runs:
        if ctx.get("workloads") and not serves(name) & ctx["workloads"]:
            continue
        label = f"{workload} columnar" if columnar else workload
        procs: list[subprocess.Popen] = []
        raws: list[Path] = []

        def attach(driver: Any, label: str = label) -> None:
            for slot, pid in sorted(job_of(driver).attempt.pids.items()):
                raw = workdir / f"profile-{label.replace(' ', '-')}-{slot}.txt"
                raws.append(raw)
                procs.append(subprocess.Popen(
                    [spy, "record", "--pid", str(pid), "--rate", "200", "--format", "raw",
                     "--nonblocking", "--output", str(raw)],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

        try:
            run = throughput(ctx | {"on_attempt": attach, "fresh": False}, workload,
                             COLUMNAR if columnar else CUTLINE)
        finally:
            for p in procs:
                p.send_signal(2)  # py-spy writes its output on SIGINT
            for p in procs:
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()
        out[label] = summarise_profile(raws) | {"rate_under_profiler": run["rate"]}
        console.print(f"  profile: {label:<18} {run['rate']:,.0f} records/s under py-spy, "
                      f"{out[label]['samples']:,} samples", style="dim")
    return out


# --------------------------------------------------------------------------- running


def describe(out: dict) -> str:
    """A run's progress line: its rates (throughput) or percentiles (latency)."""
    if "rate" in out:
        extra = f"processing {out['processing']:6.2f} s {out['rate']:>10,.0f} records/s"
        if "end_to_end" in out:
            extra = (f"end to end {out['end_to_end']:6.2f} s {out['rate_end_to_end']:>10,.0f} "
                     f"records/s, {extra}, cpu {fmt(out.get('cpu_all'), '.1f')} s, load "
                     f"{out['load']['max']:.1f}{'  LOADED' if is_loaded(out['load']) else ''}")
        if not out["output"]["ok"]:
            extra += "  [red]output WRONG[/]"
        return extra
    extra = f"p50 {ms(out['p50'])}, p99 {ms(out['p99'])} ({out['n']:,} records)"
    if "output" in out and not out["output"]["ok"]:
        extra += "  [red]output WRONG[/]"
    return extra


def tp_name(workload: str, engine: str, variant: str = "") -> str:
    return f"tp | {workload} | {engine}{' | ' + variant if variant else ''}"


def lat_name(workload: str, engine: str, config: str) -> str:
    return f"lat | {workload} | {engine} | {config}"


def throughput_cases(ctx: dict) -> list[tuple[str, Any]]:
    pairs = [(STATELESS, CUTLINE), (STATELESS, SPARK_PY), (STATELESS, SPARK_SQL),
             (KEYED, CUTLINE), (KEYED, SPARK_PY), (KEYED_SQL, SPARK_SQL)]
    if HAS_BATCHES:  # workloads 1b and 3 on cutline's batch streams
        pairs += [(STATELESS, COLUMNAR), (KEYED_SQL, COLUMNAR)]
    if HAS_WINDOWS:
        pairs += [(WINDOWED, CUTLINE), (WINDOWED, SPARK_PY), (WINDOWED, SPARK_SQL)]
    return [(tp_name(w, s), lambda w=w, s=s: throughput(ctx, w, s)) for w, s in pairs]


def split_variant(k: int) -> str:
    return f"{k} file{'s' if k > 1 else ''}/subtask"


def split_cases(ctx: dict, workdir: Path) -> list[tuple[str, Any]]:
    """Workload 4 (issue 25) over the same events in ``k`` files per subtask, for each
    ``k`` of ``--files-per-subtask``: cutline per record and columnar, each reading its
    files aligned (a watermark per file, the file furthest behind read next); Spark SQL
    (4b, one micro-batch) on the same files, the peer in the same run."""
    cases = []
    for k in ctx["files_per_subtask"]:
        sub = dict(ctx)
        add_backlog(sub, workdir / f"files-{k}", ctx["records"], files=k * PARALLELISM)
        ctx.setdefault("split_backlogs", {})[k] = {
            key: v for key, v in sub["expected"].items()
            if key not in ("window_counts", "user_counts")}
        v = split_variant(k)
        cases += [(tp_name(WINDOWED, s, v), lambda sub=sub, s=s: throughput(sub, WINDOWED, s))
                  for s in (CUTLINE, COLUMNAR, SPARK_SQL)]
    return cases


def reference_cases(ctx: dict) -> list[tuple[str, Any]]:
    k = max(1, -(-ctx["expected"]["files"] // REF_BATCHES))
    return [(tp_name(w, SPARK_PY, REF),
             lambda w=w: throughput(ctx, w, SPARK_PY, max_files=k))
            for w in (STATELESS, KEYED) + ((WINDOWED,) if HAS_WINDOWS else ())]


def latency_cases(ctx: dict) -> list[tuple[str, Any]]:
    cases = []
    smoke = ctx.get("smoke")  # every code path once: the headline configuration of each pair
    cut_configs = [CUT_EO] + ([] if smoke else [CUT_VISIBLE]) + (
        [] if ctx["quick"] else [CUT_EO_SHORT])
    for w in (STATELESS, KEYED):
        for c in cut_configs:
            cases.append((lat_name(w, CUTLINE, c), lambda w=w, c=c: cutline_latency(ctx, w, c)))
    if HAS_WINDOWS:  # window results: 0.1 s is the target's interval, 1 s the default's
        for c in (CUT_EO_SHORT,) if smoke else (CUT_EO_SHORT, CUT_EO):
            cases.append((lat_name(WINDOWED, CUTLINE, c),
                          lambda c=c: cutline_latency(ctx, WINDOWED, c)))
    spark = [(STATELESS, SPARK_PY), (KEYED, SPARK_PY), (KEYED_SQL, SPARK_SQL)]
    if not ctx["quick"]:
        spark.insert(1, (STATELESS, SPARK_SQL))
    if HAS_WINDOWS:
        spark += [(WINDOWED, SPARK_PY), (WINDOWED, SPARK_SQL)]
    for w, e in spark:
        # quick: Spark's Python windows only at its fastest trigger (its micro-batches take
        # seconds per 1,000 users: a 1 s trigger is the same or slower), saving minutes
        for c in (SPARK_FAST,) if smoke or ctx["quick"] and (w, e) == (WINDOWED, SPARK_PY) \
                else (SPARK_1S, SPARK_FAST):
            cases.append((lat_name(w, e, c), lambda w=w, e=e, c=c: spark_latency(ctx, w, e, c)))
    return cases


def cutline_only(cases: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    return [(name, fn) for name, fn in cases if name.split(" | ")[2] == CUTLINE]


def warm_up(ctx: dict, console: Console) -> None:
    """Start the Python workers of this process's session (``ctx["spark"]``) and JIT-compile
    both systems on it once, unmeasured, before the runs that share it (latency, profile;
    ``bench/ab.py``'s servers): every throughput case of the workloads asked for, on a small
    backlog, in this process (Spark's first query in a fresh JVM is many times slower than
    the next ones)."""
    small = dict(ctx) | {"fresh": False}
    with run_dir() as d:
        add_backlog(small, d, 4_000, 4)
        cases = picked(ctx, throughput_cases(small))
        for _, fn in (cutline_only(cases) if ctx.get("cutline_only") else cases):
            fn()
    console.print("  warm-up done", style="dim")


WORKLOAD_LABELS = ("1", "1b", "2", "3", "4", "4b")


def serves(name: str) -> set[str]:
    """The workload labels (``WORKLOAD_LABELS``) a case's runs count for: cutline's
    per-record stateless runs are workload 1's and 1b's, its keyed ones 2's and 3's."""
    _, w, engine = name.split(" | ")[:3]
    py, sql = {STATELESS: ("1", "1b"), KEYED: ("2", "3"), KEYED_SQL: ("3", "3"),
               WINDOWED: ("4", "4b")}[w]
    if engine == CUTLINE:
        return {py, sql}
    return {py} if engine == SPARK_PY else {sql}


def picked(ctx: dict, cases: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """The cases of the workloads asked for (``--workloads``; all by default)."""
    wanted = ctx.get("workloads")
    return cases if not wanted else [(n, fn) for n, fn in cases if serves(n) & wanted]


# --------------------------------------------------------------------------- summary


def summarise(runs: dict) -> list[dict]:
    ok = {k: [x for x in v if x is not None] for k, v in runs.items()}

    def med(name: str, key: str) -> float | None:
        return median([x[key] for x in ok.get(name, []) if x.get(key) is not None])

    def per_round(a: str, b: str, key: str) -> list[float]:
        return [x[key] / y[key] for x, y in zip(runs.get(a, []), runs.get(b, []))
                if x is not None and y is not None and x.get(key) and y.get(key)]

    rows: list[dict] = []

    def add(case: str, cut: str, spark: str, key: str, target: float | None, at_least: bool,
            label: str, kind: str, workload: str) -> None:
        """A row: cutline's ``key`` against Spark's, judged against ``target``; beside the
        end-to-end rate (the headline), the processing rate's ratio."""
        beside = "rate" if key == "rate_end_to_end" else None
        a, b = med(cut, key), med(spark, key)
        ratio = a / b if a is not None and b else None
        pr = per_round(cut, spark, key)
        noise, paired = noise_of(pr), median(pr)
        v = verdict(ratio, target, at_least, noise, paired) if target is not None else "-"
        row = {"case": case, "kind": kind, "workload": workload, "cutline": cut,
               "spark": spark, "key": key, "cutline_value": a, "spark_value": b,
               "ratio": ratio, "per_round": pr, "paired": paired, "noise": noise,
               "paired_ci": bootstrap_ci(pr),
               "target": target, "at_least": at_least, "target_label": label, "verdict": v}
        if beside is not None:
            pa, pb = med(cut, beside), med(spark, beside)
            pp = per_round(cut, spark, beside)
            row.update({"cutline_processing": pa, "spark_processing": pb,
                        "ratio_processing": pa / pb if pa is not None and pb else None,
                        "per_round_processing": pp, "paired_processing": median(pp),
                        "paired_processing_ci": bootstrap_ci(pp)})
        rows.append(row)

    # Throughput: cutline / Spark (one micro-batch: Spark's best).
    for label, w, cw, e, target in (("1", STATELESS, STATELESS, SPARK_PY, TARGET_THROUGHPUT),
                                    ("1b", STATELESS, STATELESS, SPARK_SQL, None),
                                    ("2", KEYED, KEYED, SPARK_PY, TARGET_THROUGHPUT),
                                    ("3", KEYED_SQL, KEYED, SPARK_SQL, None),
                                    ("4", WINDOWED, WINDOWED, SPARK_PY, TARGET_THROUGHPUT),
                                    ("4b", WINDOWED, WINDOWED, SPARK_SQL, None)):
        if w == WINDOWED and not HAS_WINDOWS:
            continue
        add(f"{label} {w}: throughput / {SPARK_API[w, e]}", tp_name(cw, CUTLINE),
            tp_name(w, e), "rate_end_to_end", target, True,
            f">= {target:g}x" if target else "- (reported)", "throughput", w)
    # The columnar path (issue 15): against Spark SQL on the same files, and against
    # cutline's per-record pipeline of the same workload; throughput and CPU.
    for label, w, cw in (("1b", STATELESS, STATELESS), ("3", KEYED_SQL, KEYED)):
        col = tp_name(w, COLUMNAR)
        if not ok.get(col):
            continue
        add(f"{label} {w}: columnar throughput / {SPARK_API[w, SPARK_SQL]}", col,
            tp_name(w, SPARK_SQL), "rate_end_to_end", TARGET_COLUMNAR, True,
            f">= {TARGET_COLUMNAR:g}x", "throughput", w)
        add(f"{label} {w}: columnar records per CPU-s / {SPARK_API[w, SPARK_SQL]} (all "
            "processes)", col, tp_name(w, SPARK_SQL), "records_per_cpu_second_all", None,
            True, "- (reported)", "cpu", w)
        add(f"{label} {w}: columnar / cutline per record, throughput", col,
            tp_name(cw, CUTLINE), "rate_end_to_end", None, True, "- (reported)", "throughput",
            w)
        add(f"{label} {w}: columnar / cutline per record, records per CPU-s of the tasks",
            col, tp_name(cw, CUTLINE), "records_per_cpu_second", None, True, "- (reported)",
            "cpu", w)
    for label, w in (("1", STATELESS), ("2", KEYED), ("4", WINDOWED)):
        ref = tp_name(w, SPARK_PY, REF)
        if ok.get(ref):
            add(f"{label} {w}: throughput / {SPARK_API[w, SPARK_PY]}, {REF_BATCHES} batches",
                tp_name(w, CUTLINE), ref, "rate_end_to_end", None, True, "- (reference)",
                "throughput", w)

    # Many files per subtask (issue 25): k files / 1 file per subtask, and against Spark SQL.
    ks = sorted({int(n.rsplit(" | ", 1)[1].split()[0]) for n in ok if n.endswith("/subtask")})
    for k in ks:
        for e in (CUTLINE, COLUMNAR):
            name = tp_name(WINDOWED, e, split_variant(k))
            if k != ks[0] and ok.get(name):
                add(f"4 windowed, {e}: {split_variant(k)} / {split_variant(ks[0])}, throughput",
                    name, tp_name(WINDOWED, e, split_variant(ks[0])), "rate_end_to_end",
                    TARGET_SPLITS, True, f">= {TARGET_SPLITS:g}x", "throughput", WINDOWED)
            if ok.get(name):
                add(f"4b windowed, {e}: {split_variant(k)}, throughput / "
                    f"{SPARK_API[WINDOWED, SPARK_SQL]}", name,
                    tp_name(WINDOWED, SPARK_SQL, split_variant(k)), "rate_end_to_end", None,
                    True, "- (reported)", "throughput", WINDOWED)

    # Latency: cutline p99 / Spark's lower p99 of its two triggers.
    def spark_best(workload: str, engine: str) -> str | None:
        names = [lat_name(workload, engine, c) for c in (SPARK_1S, SPARK_FAST)]
        have = [(med(n, "p99"), n) for n in names if med(n, "p99") is not None]
        return min(have)[1] if have else None

    for label, w, cw, e, target in (("1", STATELESS, STATELESS, SPARK_PY, TARGET_P99),
                                    ("1b", STATELESS, STATELESS, SPARK_SQL, None),
                                    ("2", KEYED, KEYED, SPARK_PY, TARGET_P99),
                                    ("3", KEYED_SQL, KEYED, SPARK_SQL, None),
                                    ("4", WINDOWED, WINDOWED, SPARK_PY, TARGET_WINDOW_P99),
                                    ("4b", WINDOWED, WINDOWED, SPARK_SQL, None)):
        sb = spark_best(w, e)
        if sb is None:
            continue
        trig = sb.rsplit(" | ", 1)[1]
        # window results: the target is at a 0.1 s checkpoint interval (issue 14)
        head = CUT_EO_SHORT if w == WINDOWED else CUT_EO
        for c in (CUT_EO, CUT_EO_SHORT, CUT_VISIBLE):
            cn = lat_name(cw, CUTLINE, c)
            if not ok.get(cn):
                continue
            headline = c == head
            t = target if headline else None
            tl = (f"<= {t:g}x" if t is not None else
                  "- (reported)" if headline else "- (labelled extra)")
            add(f"{label} {w}: p99 {SHORT[c]} / {SPARK_API[w, e]} {SHORT[trig]}", cn, sb,
                "p99", t, False, tl, "latency", w)
    return rows


def windowed_check(runs: dict) -> dict | None:
    """Workload 4's throughput runs: cutline's window counts equal Spark SQL's (and Spark's
    Python logic's).  Each run's output (the Parquet files it committed) is reduced to a
    digest of its sorted (user, window start, count) rows, the sentinel's window left out;
    equal digests are equal outputs.  Each is also checked against the counts the input
    holds (``ok``)."""
    names = {e: [n for n in runs if n.startswith(tp_name(WINDOWED, e))]
             for e in (CUTLINE, SPARK_SQL, SPARK_PY)}
    if not any(names.values()):
        return None
    outs = {e: [r["output"] for n in ns for r in runs[n] if r is not None]
            for e, ns in names.items()}
    digests = {e: sorted({o["digest"] for o in v}) for e, v in outs.items()}
    same = len(digests[CUTLINE]) == 1 and digests[CUTLINE] == digests[SPARK_SQL]
    return {"digests": digests,
            "windows": sorted({o["windows"] for v in outs.values() for o in v}),
            "cutline_equals_spark_sql": same,
            "every_run_equals_the_input_counts": all(o["ok"] for v in outs.values() for o in v)}


# --------------------------------------------------------------------------- plots


def plot(result: dict, runs: dict, stem: Path) -> list[str]:
    plt = pyplot()
    written = []
    ok = {k: [x for x in v if x is not None] for k, v in runs.items()}

    # Throughput bars: median records/s end to end, whiskers at the per-round min and max.
    groups: list[tuple[str, list[tuple[str, str]], str]] = [
        (STATELESS, [(CUTLINE, ""), (COLUMNAR, ""), (SPARK_PY, ""), (SPARK_SQL, ""),
                     (SPARK_PY, REF)], ""),
        (KEYED, [(CUTLINE, ""), (SPARK_PY, ""), (SPARK_PY, REF)], ""),
        # cutline per record: workload 2's runs
        (KEYED_SQL, [(CUTLINE, ""), (COLUMNAR, ""), (SPARK_SQL, "")], ""),
        (WINDOWED, [(CUTLINE, ""), (SPARK_PY, ""), (SPARK_SQL, ""), (SPARK_PY, REF)], "")]
    # --files-per-subtask: workload 4 over k files per subtask, a group per k
    groups += [(WINDOWED, [(e, v) for e in (CUTLINE, COLUMNAR, SPARK_SQL)],
                f"windowed count,\n{v}")
               for v in sorted({n.rsplit(" | ", 1)[1] for n in ok if n.endswith("/subtask")},
                               key=lambda v: int(v.split()[0]))]
    colors = {CUTLINE: "#1f77b4", COLUMNAR: "#17becf", SPARK_PY: "#ff7f0e",
              SPARK_SQL: "#2ca02c"}
    if not any(k.startswith("tp |") and v for k, v in ok.items()):
        groups = []
    fig, ax = plt.subplots(figsize=(12, 4.8))
    x, ticks, labels, top = 0.0, [], [], 0.0
    for workload, bars, title in groups:
        start = x
        for engine, variant in bars:
            name = tp_name(KEYED if engine == CUTLINE and workload == KEYED_SQL else workload,
                           engine, variant)
            vals = [r["rate_end_to_end"] for r in ok.get(name, [])]
            if not vals:
                continue
            m = median(vals)
            ref = variant == REF
            ax.bar(x, m / 1000, color=colors[engine], alpha=0.55 if ref else 1.0,
                   hatch="//" if ref else None,
                   yerr=[[(m - min(vals)) / 1000], [(max(vals) - m) / 1000]], capsize=3,
                   label=f"{engine}{' (' + variant + ')' if ref else ''}")
            ax.text(x, max(vals) / 1000, f"{m / 1000:.0f}k", ha="center", va="bottom",
                    fontsize=8)
            top = max(top, max(vals) / 1000)
            x += 1
        if x == start:  # a workload not run (--workloads)
            continue
        ticks.append((start + x - 1) / 2)
        labels.append(title or
                      WORKLOAD_TITLES[workload].split(". ", 1)[1].replace(", ", ",\n"))
        x += 0.8
    handles, names = ax.get_legend_handles_labels()
    uniq = dict(zip(names, handles))
    ax.legend(uniq.values(), uniq.keys(), fontsize=8, loc="upper center", ncol=4)
    ax.set_ylim(0, top * 1.25 or 1)
    ax.set_xticks(ticks, labels, fontsize=8)
    ax.set_ylabel("records/s end to end (thousands), median of rounds")
    ax.set_title(f"Throughput end to end (each run a fresh process, spawn -> exit), "
                 f"{result['config']['records']:,} events, Spark local[2,8] (cutline: "
                 f"Pipeline.run(), checkpoint 1 s; Spark: availableNow)", fontsize=9)
    fig.tight_layout()
    path = stem.with_name(stem.name + "-throughput.png")
    if groups:
        fig.savefig(path, dpi=110)
        written.append(str(path))
    plt.close(fig)
    if not any(k.startswith("lat |") and v for k, v in ok.items()):
        return written

    # Latency CDFs: one panel per workload, pooled over rounds.
    panels = [(STATELESS, [(CUTLINE, c) for c in (CUT_EO, CUT_EO_SHORT, CUT_VISIBLE)]
               + [(e, c) for e in (SPARK_PY, SPARK_SQL) for c in (SPARK_1S, SPARK_FAST)]),
              (KEYED, [(CUTLINE, c) for c in (CUT_EO, CUT_EO_SHORT, CUT_VISIBLE)]
               + [(SPARK_PY, c) for c in (SPARK_1S, SPARK_FAST)]),
              (KEYED_SQL, [(CUTLINE, c) for c in (CUT_EO, CUT_EO_SHORT, CUT_VISIBLE)]
               + [(SPARK_SQL, c) for c in (SPARK_1S, SPARK_FAST)]),
              (WINDOWED, [(CUTLINE, c) for c in (CUT_EO, CUT_EO_SHORT)]
               + [(e, c) for e in (SPARK_PY, SPARK_SQL) for c in (SPARK_1S, SPARK_FAST)])]
    def runs_of(workload: str, engine: str, config: str) -> list[dict]:
        src_w = KEYED if (workload == KEYED_SQL and engine == CUTLINE) else workload
        return ok.get(lat_name(src_w, engine, config), [])

    # the workloads measured (--workloads may leave some out): a panel each
    panels = [pn for pn in panels if any(runs_of(pn[0], e, c) for e, c in pn[1])]
    if not panels:
        return written
    styles = {CUT_EO: ("#1f77b4", "-"), CUT_EO_SHORT: ("#1f77b4", "--"),
              CUT_VISIBLE: ("#1f77b4", ":"), SPARK_1S: (None, "-"), SPARK_FAST: (None, "--")}
    fig, grid = plt.subplots(1, len(panels), figsize=(max(5 * len(panels), 8), 4.6), sharey=True,
                             squeeze=False)
    axes = grid[0]
    for ax, (workload, lines) in zip(axes, panels):
        for engine, config in lines:
            src_w = KEYED if (workload == KEYED_SQL and engine == CUTLINE) else workload
            # rounds pooled with equal weight: each round's percentiles 0, 0.5, ..., 100
            lat = sorted(x for r in runs_of(workload, engine, config) for x in r["cdf"])
            if not lat:
                continue
            color, ls = styles[config]
            color = color or colors[engine]
            ys = [(i + 1) / len(lat) for i in range(len(lat))]
            label = f"{engine}: {config}" if engine != CUTLINE else config
            if src_w != workload:
                label = f"{config} (workload 2's runs)"
            ax.plot([v * 1000 for v in lat], ys, color=color, linestyle=ls, linewidth=1.6,
                    label=label)
        ax.set_xscale("log")
        ax.set_xlabel("window closed -> result committed (ms, log)" if workload == WINDOWED
                      else "event written -> result committed (ms, log)")
        ax.set_title(WORKLOAD_TITLES[workload], fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.axhline(0.99, color="grey", linewidth=0.6)
        ax.legend(fontsize=7, loc="lower right")
    axes[0].set_ylabel("fraction of records (workload 4: of window results)")
    fig.suptitle(f"End-to-end latency at {result['config']['rate']:,.0f} events/s, pooled over "
                 f"{result['latency_rounds']} round(s) (grey line: p99)", fontsize=10)
    fig.tight_layout()
    path = stem.with_name(stem.name + "-latency.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(str(path))
    return written


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = bench_parser(__doc__, DEFAULT_OUT, (5, 1), rounds_help="throughput rounds",
                      quick="short run (about 2 minutes), every workload, fewer configurations",
                      out_help="JSON results file; plots are written next to it")
    ap.add_argument("--latency-rounds", type=positive_int, default=None,
                    help="latency rounds (default 2, quick 1)")
    ap.add_argument("--records", type=positive_int, default=None,
                    help="events in the throughput backlog (default 2,000,000; quick 100,000)")
    ap.add_argument("--events-per-file", type=positive_int, default=EVENTS_PER_FILE,
                    help="throughput backlog: events per file (default "
                         f"{EVENTS_PER_FILE:,}: users' file sizes; at least one file per "
                         "subtask)")
    ap.add_argument("--rate", type=positive_float, default=500.0,
                    help="latency runs: input events/s (default 500)")
    ap.add_argument("--latency-seconds", type=positive_float, default=None,
                    help="latency runs: seconds of input (default 120, quick 3)")
    ap.add_argument("--window-latency-seconds", type=positive_float, default=None,
                    help="latency runs of workload 4: seconds of input (default "
                         f"{WINDOW_LATENCY_SECONDS[0]:g}, quick {WINDOW_LATENCY_SECONDS[1]:g}; "
                         f"a {WINDOW} s window closes {MAX_DELAY:g} s after its end)")
    ap.add_argument("--warmup", type=non_negative_float, default=None,
                    help="latency runs: seconds of input not counted (default 20, quick 1)")
    ap.add_argument("--only", choices=["throughput", "latency", "profile"], action="append",
                    default=None, help="run only these parts (repeatable)")
    ap.add_argument("--profile", action=argparse.BooleanOptionalAction, default=None,
                    help="profile cutline's tasks with py-spy (default: on, off with --quick)")
    ap.add_argument("--smoke", action="store_true",
                    help="quick, and each latency pair at one configuration only (CI's "
                         "smoke test: every code path once; not for numbers)")
    ap.add_argument("--workloads", type=workload_labels, default=None,
                    help="run only these workloads, comma separated (of "
                         f"{','.join(WORKLOAD_LABELS)}; e.g. 1b,3: the columnar path "
                         "against Spark SQL)")
    ap.add_argument("--files-per-subtask", type=positive_ints, default=None,
                    help="run only workload 4 over the backlog cut into each of these "
                         "numbers of files per subtask (e.g. 1,16: issue 25's aligned "
                         "split watermarks), cutline per record and columnar, Spark SQL")
    ap.add_argument("--max-warmup", type=int, default=None,
                    help="throughput: warm-up rounds at full size, not counted, until each "
                         "case's last two are within --settle (default at most 4; quick 0)")
    ap.add_argument("--settle", type=positive_float, default=0.10,
                    help="warm when a case's last two warm-up times are this close (0.10)")
    ap.add_argument("--break-output", action="store_true",
                    help="cutline's pipelines drop one input event: the output checks must "
                         "fail the runs and the benchmark (exit code 1)")
    ap.add_argument("--keep-loaded", action="store_true",
                    help="summarise runs that shared the machine too (more than "
                         f"{LOADED_OTHERS_PER_CORE} others' runnable threads per core; "
                         "smoke tests; never for published figures)")
    ap.add_argument("--cutline-only", action="store_true",
                    help="skip Spark's own queries (bench/ab.py: they do not change with "
                         "cutline's version); no cutline / Spark ratios then")
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--smoke" in argv and "--quick" not in argv:
        argv.append("--quick")  # --smoke is --quick with fewer latency runs
    args = parse_bench_args(ap, argv)
    args.latency_rounds = args.latency_rounds or (1 if args.quick else 2)
    if args.max_warmup is None:
        args.max_warmup = 0 if args.quick else 4
    if args.max_warmup < 0:
        ap.error("--max-warmup must be >= 0")
    args.records = args.records or (100_000 if args.quick else 2_000_000)
    args.latency_seconds = args.latency_seconds or (3.0 if args.quick else 120.0)
    if args.window_latency_seconds is None:
        args.window_latency_seconds = WINDOW_LATENCY_SECONDS[1 if args.quick else 0]
    if args.warmup is None:
        args.warmup = 1.0 if args.quick else 20.0
    if HAS_WINDOWS and args.window_latency_seconds < args.warmup + WINDOW + MAX_DELAY:
        ap.error(f"--window-latency-seconds ({args.window_latency_seconds:g} s) must be at "
                 f"least --warmup + {WINDOW + MAX_DELAY:g} s: no {WINDOW} s window would "
                 "close after the warm-up")
    if args.warmup >= args.latency_seconds:
        ap.error(f"--warmup ({args.warmup:g} s) must be shorter than --latency-seconds "
                 f"({args.latency_seconds:g} s): no event would be measured")
    if args.rate * WRITE_PERIOD < 1:
        ap.error(f"--rate {args.rate:g} is below {1 / WRITE_PERIOD:g} events/s: the writer "
                 f"writes a file every {WRITE_PERIOD:g} s and each needs an event")
    if args.records < 2 * PARALLELISM:
        ap.error(f"--records must be at least {2 * PARALLELISM}")
    if args.out.exists() and args.out.is_dir():
        ap.error(f"--out {args.out} is a directory; give a file name such as vs_spark.json")
    parts = set(args.only or (["splits"] if args.files_per_subtask else
                              ["throughput", "latency", "profile"]))
    if args.profile is None:
        args.profile = not args.quick
    if args.only is None and not args.profile:
        parts.discard("profile")
    args.parts = parts
    if args.files_per_subtask and args.out == DEFAULT_OUT:  # not the main results
        args.out = DEFAULT_OUT.with_name("vs_spark-splits.json")
    return args


def positive_ints(text: str) -> list[int]:
    try:
        got = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected whole numbers, comma separated: "
                                         f"{text!r}") from None
    if not got or got[0] < 1:
        raise argparse.ArgumentTypeError(f"expected whole numbers >= 1: {text!r}")
    return got


def workload_labels(text: str) -> set[str]:
    got = {w.strip() for w in text.split(",") if w.strip()}
    bad = got - set(WORKLOAD_LABELS)
    if bad or not got:
        raise argparse.ArgumentTypeError(f"unknown workload(s) {', '.join(sorted(bad)) or text!r}"
                                         f"; choose from {', '.join(WORKLOAD_LABELS)}")
    return got


def make_ctx(spark: Any, args: argparse.Namespace) -> dict[str, Any]:
    """What the cases read: the session and the sizes of the runs."""
    return {"spark": spark, "quick": args.quick, "smoke": args.smoke, "rate": args.rate,
            "latency_seconds": args.latency_seconds, "warmup": args.warmup,
            "window_latency_seconds": args.window_latency_seconds,
            "cutline_only": args.cutline_only, "workloads": getattr(args, "workloads", None),
            "files_per_subtask": getattr(args, "files_per_subtask", None),
            "records": args.records}


def backlog_files(records: int, per_file: int = EVENTS_PER_FILE) -> int:
    """How many files ``records`` events take at ``per_file`` a file (at least one per
    subtask)."""
    return max(PARALLELISM, -(-records // per_file))


def add_backlog(ctx: dict, directory: Path, records: int, files: int | None = None,
                per_file: int = EVENTS_PER_FILE) -> None:
    """Write the throughput runs' input under ``directory`` (and workload 4's: the same
    files and a sentinel)."""
    files = files or backlog_files(records, per_file)
    ctx["backlog"] = directory / "backlog"
    ctx["expected"] = write_backlog(ctx["backlog"], records, files,
                                    processes=min(os.cpu_count() or 1, files)
                                    if records >= 1_000_000 else 1)
    if HAS_WINDOWS:
        ctx["backlog_windowed"] = windowed_backlog(ctx["backlog"], directory / "windowed")


def warm_rounds(runner: Runner, cases: list[tuple[str, Any]], most: int, tolerance: float,
                console: Console) -> dict[str, list[float]]:
    """Rounds at the benchmark's size, not counted, until each case's last two end-to-end
    times are within ``tolerance`` of each other (at most ``most`` rounds): only warm rounds
    count (the page cache, the JVM's class-data archive, a first run's one-off costs).  Each
    case's warm-up end-to-end times."""
    seen: dict[str, list[float]] = {name: [] for name, _ in cases}
    for r in range(most):
        todo = [(n, fn) for n, fn in cases if not settled(seen[n], tolerance)]
        if not todo:
            break
        for name, fn in rotated(todo, r):
            out = runner.run(f"warm-up {name}", fn, sample_load=False)
            if out is not None:
                seen[name].append(out["end_to_end"])
    unsettled = [n for n, t in seen.items() if not settled(t, tolerance)]
    if most and unsettled:
        console.print(f"  not settled after {most} warm-up round(s): {', '.join(unsettled)}",
                      style="yellow")
    return seen


def failed_runs(runs: dict, errors: list[dict], check: dict | None) -> list[dict]:
    """Every run that failed or whose output is wrong (each such run is set to ``None`` in
    ``runs``: it counts in no figure), and a cross-system window check that failed."""
    failures = [{"case": e["case"], "round": e.get("round"), "error": e["error"]}
                for e in errors]
    for name, rs in runs.items():
        for i, r in enumerate(rs):
            if r is not None and (r.get("output") or {}).get("ok") is False:
                failures.append({"case": name, "round": r.get("round"),
                                 "error": f"wrong output: {r['output']}"})
                rs[i] = None
    if check is not None and not (check["cutline_equals_spark_sql"]
                                  and check["every_run_equals_the_input_counts"]):
        failures.append({"case": "windowed_check", "round": None, "error": str(check)})
    return failures


def quiet_runs(runs: dict, keep_loaded: bool) -> dict:
    """``runs`` with each run that shared the machine (:func:`is_loaded`: more than 0.25
    runnable threads per core outside this process's tree on average) marked ``loaded``
    and, unless ``keep_loaded``, left out (``None``)."""
    out = {}
    for name, rs in runs.items():
        out[name] = []
        for r in rs:
            if r is not None and "load" in r:
                r["loaded"] = is_loaded(r["load"])
            out[name].append(None if r is not None and r.get("loaded") and not keep_loaded
                             else r)
    return out


def main(argv: list[str] | None = None) -> int:
    global BREAK_OUTPUT
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return child_main(argv[1])
    args = parse_args(argv)
    BREAK_OUTPUT = args.break_output
    console = make_console(200)
    t_bench = time.monotonic()
    machine = conditions()
    load = LoadSampler()
    load.start()
    files = backlog_files(args.records, args.events_per_file)
    console.print(f"[bold]cutline vs Spark Structured Streaming[/]  "
                  f"{'quick, ' if args.quick else ''}{args.rounds} throughput round(s) of "
                  f"{args.records:,} events in {files:,} files; {args.latency_rounds} latency "
                  f"round(s) of {args.latency_seconds:g} s at {args.rate:,.0f} events/s; "
                  f"Python {platform.python_version()}")
    spark = in_task = None  # this process's session: for the latency runs and the profile
    workdir = Path(tempfile.mkdtemp(prefix="cutline-vs-spark-input-"))
    ctx = make_ctx(None, args) | {"fresh": True}  # throughput: a fresh process per run
    runner = Runner(console, 46)
    runs, errors = runner.runs, runner.errors
    only = cutline_only if args.cutline_only else list
    profile: dict | None = None
    warm: dict[str, list[float]] = {}
    try:
        if args.parts & {"throughput", "profile"}:
            add_backlog(ctx, workdir, args.records, per_file=args.events_per_file)
            machine["input"] = input_files(ctx["backlog"])
            console.print(f"  backlog: {ctx['expected']['bytes'] / 1e6:.1f} MB, "
                          f"{ctx['expected']['kept']:,} events pass the filter, "
                          f"{ctx['expected']['windows']:,} windows (user, {WINDOW} s)",
                          style="dim")
        if "throughput" in args.parts:
            cases = only(picked(ctx, throughput_cases(ctx)))
            warm |= warm_rounds(runner, cases, args.max_warmup, args.settle, console)
            for r in range(args.rounds):
                for name, fn in rotated(cases, r):  # rotate: no case always first
                    runner.run(name, fn, r, args.rounds, describe, sample_load=False)
            if not args.quick:  # one round: Spark's per-batch cost, for reference
                for name, fn in only(picked(ctx, reference_cases(ctx))):
                    runner.run(name, fn, 0, 1, describe, sample_load=False)
        if "splits" in args.parts:
            cases = only(split_cases(ctx, workdir))
            warm |= warm_rounds(runner, cases, args.max_warmup, args.settle, console)
            for r in range(args.rounds):
                for name, fn in rotated(cases, r):
                    runner.run(name, fn, r, args.rounds, describe, sample_load=False)
        if args.parts & {"latency", "profile"}:
            # A stateful Spark query gets as many shuffle partitions as cutline has subtasks.
            spark = ctx["spark"] = spark_session(SLOTS, shuffle_partitions=PARALLELISM)
            console.print(f"Spark {spark.version}, master {spark.sparkContext.master}: the "
                          "latency runs' session", style="dim")
            in_task = cutline_in_spark_task(spark)
            warm_up(ctx, console)
        if "latency" in args.parts:
            cases = only(picked(ctx, latency_cases(ctx)))
            for r in range(args.latency_rounds):
                for name, fn in rotated(cases, r * 5):
                    runner.run(name, fn, r, args.latency_rounds, describe)
        if "profile" in args.parts:
            try:
                profile = profile_cutline(ctx, console, workdir)
            except Exception as exc:  # noqa: BLE001
                errors.append({"case": "profile", "error": repr(exc),
                               "trace": traceback.format_exc()[-3000:]})
                console.print(f"  profile FAILED: {exc}", style="red")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    load.stop()
    check = windowed_check(runs)
    failures = failed_runs(runs, errors, check)
    quiet = quiet_runs(runs, args.keep_loaded)
    summary = summarise(quiet)
    masters = {r["master"] for rs in runs.values() for r in rs if r and r.get("master")}
    if spark is not None:
        masters.add(spark.sparkContext.master)
    elapsed = time.monotonic() - t_bench
    machine.update({"load_during": load.summary(), "load_after": list(os.getloadavg()),
                    "loaded_runs_summarised": args.keep_loaded})
    result = {
        "benchmark": "cutline vs Spark Structured Streaming: same workloads, same input files",
        **stamp(),
        "cpus": os.cpu_count(), "spark": machine["versions"]["pyspark"],
        "master": sorted(masters),
        "git": git_state(), "cutline_in_spark_task": in_task, "cutline_only": args.cutline_only,
        "workloads": sorted(args.workloads) if args.workloads else None,
        "quick": args.quick, "rounds": args.rounds,
        "latency_rounds": args.latency_rounds, "elapsed_s": elapsed,
        "command": "python bench/vs_spark.py" + (" " + " ".join(argv)).rstrip(),
        "config": {"records": args.records, "files": files, "users": USERS,
                   "events_per_file": args.events_per_file,
                   "files_per_subtask": args.files_per_subtask,
                   "split_backlogs": ctx.get("split_backlogs"),
                   "rate": args.rate, "latency_seconds": args.latency_seconds,
                   "warmup": args.warmup, "write_period": WRITE_PERIOD,
                   "window_latency_seconds": args.window_latency_seconds,
                   "window": WINDOW, "max_delay": MAX_DELAY, "disorder": DISORDER,
                   "backlog_event_rate": EVENT_RATE,
                   "cutline_interval": INTERVAL, "cutline_short_interval": SHORT_INTERVAL,
                   "cutline_parallelism": PARALLELISM, "spark_shuffle_partitions": PARALLELISM,
                   "cutline_poll_interval": POLL, "watch_interval": WATCH,
                   "expected": {k: v for k, v in (ctx.get("expected") or {}).items()
                                if k not in ("window_counts", "user_counts")} or None},
        "definitions": {
            "throughput": "records / time, each run a fresh process. end_to_end (the "
                          "headline, rate_end_to_end): this process's clock from just before "
                          "it spawns the run to the run's exit. processing (rate): cutline, "
                          "attempt 0 started -> final checkpoint completed; Spark, first "
                          "micro-batch trigger -> end of the last micro-batch (progress "
                          "timestamp + triggerExecution); availableNow, whole backlog in one "
                          "micro-batch unless max_files_per_trigger is set",
            "cpu": "cpu_all: CPU seconds of a throughput run's process tree (the driver, "
                   "Spark's JVM, the PySpark daemon and its Python workers), read by the run "
                   "just before it exits, start-up included; cpu (cutline): its task "
                   "processes only",
            "latency": "committed - ts; ts stamped just before the event's file is written and "
                       "renamed into the input directory. committed: cutline, the committed "
                       "Parquet file first seen in the output directory (10 ms polling); Spark "
                       "file sink, _spark_metadata/<batch> first seen; Spark foreachBatch, "
                       "return of the batch function",
            "window_latency": "workload 4: committed - when the window closed, per result row "
                              "(user, window); closed: the first moment a file holding an "
                              f"event time >= window end + {MAX_DELAY:g} s (the watermark "
                              "delay) was in the input directory; windows closed in the "
                              "warm-up, or only by the end of input, are not counted",
            "ratio": "cutline / Spark: throughput end to end (ratio_processing: processing "
                     "time) against Spark's one-micro-batch run, p99 against Spark's lower "
                     "p99 of its two triggers",
        },
        "conditions": machine,
        "break_output": args.break_output,
        "failures": failures,
        "windowed_check": check,
        "skipped": {w: SKIPPED[w] for w in SKIPPED},
        "summary": summary,
        "warm_up": {name: {"end_to_end": times, "settled": settled(times, args.settle)}
                    for name, times in warm.items() if args.max_warmup},
        "profile": profile,
        "runs": runs,
        "errors": errors,
    }
    print_tables(console, result, quiet)
    try:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        if runs:
            result["plots"] = plot(result, quiet, args.out.with_suffix(""))
    except OSError as exc:  # a benchmark: report, don't fail
        console.print(f"could not write plots next to {args.out}: {exc}", style="yellow")
    write_results(args.out, result, console, indent=1,
                  note=f", plots {', '.join(result.get('plots', []))}" if runs else "")
    console.print(f"benchmark took {elapsed:.0f} s", style="dim")
    stop_quietly(spark)
    if failures:
        console.print(f"[red]{len(failures)} run(s) FAILED[/] (an error or a wrong output; "
                      "left out of every figure): the benchmark fails", style="bold")
        for f in failures[:10]:
            console.print(f"  {f['case']} (round {f['round']}): {f['error'][:300]}",
                          style="red")
        return 1
    return 0


def print_tables(console: Console, result: dict, runs: dict) -> None:
    c = result["conditions"]
    v = c["versions"]
    during = c["load_during"]
    console.print(f"conditions: {c['cores']} cores, load before {c['load_before'][0]:.1f}, "
                  f"during {fmt(during['min'], '.1f')}-{fmt(during['max'], '.1f')} (runs "
                  f"with others' threads above {LOADED_OTHERS_PER_CORE:g} per core "
                  f"{'kept' if c['loaded_runs_summarised'] else 'left out'}); Spark "
                  f"{v['pyspark']}, pyarrow {v['pyarrow']}, Python {v['python']}; input "
                  + (f"{c['input']['files']} files, {c['input']['bytes']:,} bytes"
                     if "input" in c else "-"))
    ok = {k: [x for x in v if x is not None] for k, v in runs.items()}
    tp = table(f"throughput, each run a fresh process: end to end (spawn -> exit) and "
               f"processing time (the system's own clock); medians of {result['rounds']} "
               "round(s) [95% CI]",
               ("workload", "system", "end to end\ns", "records/s\nend to end",
                "processing\ns", "records/s\nprocessing", "records/CPU-s\nall",
                "records/CPU-s\ntasks", "micro-\nbatches", "check-\npoints",
                "runs (loaded,\nfailed)"),
               left=("workload", "system"), no_wrap=("workload", "system"))
    for name, every in result["runs"].items():
        if not name.startswith("tp |"):
            continue
        v = ok.get(name, [])
        _, workload, system = name.split(" | ", 2)
        e2e = [x["end_to_end"] for x in v]
        ci = bootstrap_ci(e2e)
        tp.add_row(workload, system.replace(" | ", ", "),
                   fmt(median(e2e), ".2f") + (f" [{ci[0]:.2f}-{ci[1]:.2f}]" if ci else ""),
                   fmt(median([x["rate_end_to_end"] for x in v]), ",.0f"),
                   fmt(median([x["processing"] for x in v]), ".2f"),
                   fmt(median([x["rate"] for x in v]), ",.0f"),
                   fmt(median([x.get("records_per_cpu_second_all") for x in v]), ",.0f"),
                   fmt(median([x.get("records_per_cpu_second") for x in v]), ",.0f"),
                   fmt(median([x.get("micro_batches") for x in v]), ".0f"),
                   fmt(median([x.get("checkpoints") for x in v]), ".0f"),
                   f"{len(every)} ({sum(1 for x in every if x and x.get('loaded'))}, "
                   f"{sum(x is None for x in every)})")
    for w in SKIPPED:
        tp.add_row(w, "-", "skipped", *[""] * 8)
    console.print(tp)

    lt = table(f"latency, event written -> committed, at {result['config']['rate']:,.0f} "
               f"events/s (median of {result['latency_rounds']} round(s))",
               ("workload", "system", "configuration", "p50", "p90", "p99", "max", "records",
                "Spark batch p50", "batches > 1 s"), left=("workload", "system", "configuration"))
    for name, v in ok.items():
        if not name.startswith("lat |") or not v:
            continue
        _, workload, system, config = name.split(" | ")
        lt.add_row(workload, system, config, ms(median([x["p50"] for x in v])),
                   ms(median([x["p90"] for x in v])), ms(median([x["p99"] for x in v])),
                   ms(median([x["max"] for x in v])), f"{median([x['n'] for x in v]):,.0f}",
                   ms(median([x.get("batch_p50") for x in v])),
                   fmt(median([x.get("batches_over_1s") for x in v]), ".0f"))
    for w in SKIPPED:
        lt.add_row(w, "-", "skipped", *[""] * 7)
    console.print(lt)
    if HAS_WINDOWS:
        console.print(f"workload 4: latency from the window's close (the first input file with "
                      f"an event time >= its end + {MAX_DELAY:g} s) to its result committed, "
                      f"per (user, window) result; records = results", style="dim")
    check = result.get("windowed_check")
    if check:
        same = check["cutline_equals_spark_sql"] and check["every_run_equals_the_input_counts"]
        console.print(f"workload 4 output: cutline's window counts "
                      f"{'[green]equal[/]' if same else '[red]DIFFER from[/]'} Spark SQL's "
                      f"(digests {check['digests']}; windows {check['windows']}); every run "
                      f"equals the input's counts: {check['every_run_equals_the_input_counts']}")

    prof = result.get("profile") or {}
    if prof and "skipped" not in prof:
        pt = table("where cutline's task processes spend CPU (py-spy, self samples)",
                   ["category"] + [f"{w} ({prof[w]['rate_under_profiler']:,.0f}/s under py-spy)"
                                   for w in prof], left=("category",), no_wrap=("category",))
        cats = [c for c, _ in CATEGORIES] + ["other"]
        for c in cats:
            pt.add_row(c, *[fmt(prof[w]["categories"].get(c, 0) * 100, ".1f", "%") for w in prof])
        console.print(pt)

    st = table("cutline vs Spark: ratios (cutline / Spark); throughput end to end, "
               "processing beside",
               ("case", "cutline", "Spark", "ratio", "paired [95% CI]", "processing, paired",
                "target", "noise", "verdict"), left=("case", "target", "verdict"),
               no_wrap=("case", "target", "verdict"))
    for row in result["summary"]:
        unit = (lambda x: fmt(x, ",.0f", "/s")) if row["kind"] in ("throughput", "cpu") \
            else ms
        ci = row["paired_ci"]
        st.add_row(row["case"], unit(row["cutline_value"]), unit(row["spark_value"]),
                   fmt(row["ratio"], ".3f", "x"), fmt(row["paired"], ".3f", "x")
                   + (f" [{ci[0]:.2f}-{ci[1]:.2f}]" if ci else ""),
                   fmt(row.get("paired_processing"), ".3f", "x"), row["target_label"],
                   fmt(row["noise"], ".3f"), styled(row["verdict"]))
    for w in SKIPPED:
        st.add_row(f"4 {w}", *["-"] * 7, "skipped")
    console.print(st)
    console.print("ratio: of the medians over rounds; paired: median of the per-round ratios "
                  "[95% bootstrap interval]; noise: half their spread; targets are judged on "
                  "them.  Throughput: records/s end to end (each run a fresh process, timed "
                  "from its spawn to its exit); processing: the per-round ratios of records / "
                  "the systems' own processing times; Spark's whole backlog in one micro-batch "
                  "(its best case).  p99: against Spark's lower p99 of a 1 s and the fastest "
                  "trigger (workload 4: of window results, cutline at a 0.1 s checkpoint "
                  "interval for the target).", style="dim")
    for w, why in SKIPPED.items():
        console.print(f"{WORKLOAD_TITLES[w]}: skipped, {why}.", style="yellow")
    if result["errors"]:
        console.print(f"{len(result['errors'])} run(s) failed; see 'errors' in the JSON",
                      style="red")


if __name__ == "__main__":
    sys.exit(main())
