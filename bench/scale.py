"""Speed at users' sizes (issue 28 item 6), measured by issue 30's rules: a keyed count and a
tumbling-window count over 2 M and 20 M records, cutline per record and columnar, against
Spark Structured Streaming SQL at its best settings, with the pyarrow reference, in one run.

Run ``python bench/scale.py`` (one command: input, search, warm-up, rounds, checks, table,
``bench/results/scale.json`` and ``scale.png``).  Smaller: ``--sizes 20000 --lines-per-file
5000 --rounds 1 --max-warmup 0``.

**Input**: ``bench/vs_spark.py``'s events (``write_backlog``: ``{"ts", "user", "kind",
"value", "page"}``, 1,000 users, 1,000 events per second of event time, up to 1 s out of
order), JSON lines, ``--lines-per-file`` (100,000) per file; written once per size under
``--data`` and reused.  The window query reads the same files and a last one holding a
far-future sentinel event (``windowed_backlog``: Spark's watermark must pass the last real
window to emit it); the sentinel's window is left out of every check.

**Queries**: *keyed*: the count per user (cutline ``key_by(user).count()``, an update
stream; Spark ``groupBy("user").count()``, update mode).  *window*: the count per user and
60 s tumbling window of event time, watermark 2 s behind the newest event (cutline
``assign_timestamps(max_delay=2).key_by(user).window(tumbling(60)).count()``; Spark
``withWatermark`` + ``groupBy(window(event_time, "60 seconds"), user).count()``, append
mode).  Both at parallelism 2 / 2 slots (``local[2]``).

**Cases**: ``cutline`` (per record: ``FileSource``, ``json.loads`` per line), ``cutline
columnar`` (``FileSource.batches`` with the columns the query reads), checkpoints every 1 s,
the keyed count's update stream sized by time (a row per key per checkpoint, as Spark's
update mode writes one per key per micro-batch; ``--updates record``: a row per record), run
as a user runs it (``Pipeline.run()``, its embedded session); the columnar runs write their
record batches with cutline's ``ParquetSink`` (exactly-once, files committed per
checkpoint), as Spark writes Parquet; the per-record runs into a sink that keeps the latest
value per key (per checkpoint, the keys changed since the last one are pickled);
``spark sql`` with ``trigger(availableNow=True)`` at its best settings: a search over
``maxFilesPerTrigger`` and ``spark.sql.shuffle.partitions`` (one run each after one warm-up
run, the shortest end to end wins; ``--spark-grid``), the heap sized for the input
(``--spark-heap``, default 2g up to 1 GB of input, else 4g), the keyed query's rows written
as Parquet per micro-batch (``foreachBatch``), the window's by the Parquet file sink;
``spark sql rocksdb``: the same with the RocksDB state store and changelog checkpointing;
``pyarrow 1 core``: ``pyarrow.json.read_json`` with the schema of the columns read, then
``Table.group_by().aggregate(count)`` per file and the partials merged, one thread;
``pyarrow pool``: the same per file in a pool of one process per core.  The reference of
what two cores of pyarrow alone do is ``pyarrow 1 core`` x cores (its rate times the
cores) and ``pyarrow pool`` (measured).

**Timing** (one rule for every case): each run is a fresh process; this process takes the
time just before it spawns it and when it exits: *end to end*, the headline.  Beside it
each run's own processing time: cutline, attempt 0 started (every task registered) -> final
checkpoint completed; Spark, the first micro-batch's trigger -> the end of the last
micro-batch (``StreamingQueryProgress``); pyarrow, the first read -> the merged result.
*CPU*: the run's process tree (the driver, Spark's JVM, the PySpark daemon and its Python
workers, a pool's workers), read by the run just before it exits.  Records/s = input
records / time; records per CPU-second = input records / CPU.

**Warm, repeated**: every case runs until its last two end-to-end times are within
``--settle`` (10%) of each other (at most ``--max-warmup`` runs); only the runs after that
count: ``--rounds`` (5) rounds, the cases in an order rotating each round.  Medians with
a 95% bootstrap confidence interval; ratios per round (cutline / Spark SQL at its best,
same round), their median and interval.  *Cost growth*: median end-to-end time at the
largest size / at the smallest.

**Checked**: after every run (outside its timed span) this process reads the run's output
and compares it with the input's counts, computed in plain Python as the input was written
(count per user; count per user and window): any difference fails the run, and the
benchmark exits with code 1.  Spark's physical plan is checked too: the ``ReadSchema`` of
its file scan must be the columns cutline's columnar source reads.  ``--break-output``
drops one input record in cutline's queries (to show that the check fails the benchmark).

**Conditions**: cores, the load average before the benchmark and during every run, the
versions (Python, Spark, pyarrow, Java, the commit), the input files' count and sizes, in
the results file and the tables.  A run is marked ``loaded`` and left out of the headline
figures (they are ``-`` when no run was quiet) when, sampled once a second from ``/proc``,
more than 0.25 threads per core outside its own processes were runnable on average (what
else the machine did: a run's own threads raise the load average, a Spark query's to
about 3 on 2 cores); results without that sample use the 1-minute load, above 1.5 per
core.

``bytewax -w2`` (the keyed query only; when Bytewax is installed, ``pip install
bytewax==0.21.1``: it is not a dependency): Bytewax's ``DirSource`` over the same files,
``json.loads`` per line, ``count_final`` per user, two worker threads, no recovery; its
end-to-end time is issue 28's wall-to-wall peer (``x bytewax`` in the tables: its time over
the case's, per round).

Not here: latency (issue 30's two-minute runs with both triggers and a JVM-side sink timed
by listener timestamps are not built).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import vs_spark as vs  # the events, their input files and what a correct run outputs
from _common import (
    LOADED_OTHERS_PER_CORE, RESULTS, AttemptWatcher, RunFailed, bootstrap_ci, conditions, cores,
    fmt, input_files, is_loaded, median, positive_float, positive_int, pyplot, rotated,
    run_child, settled, spark_processing, spark_session, table, tree_cpu, write_results,
)
from _common import console as make_console

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = RESULTS / "scale.json"
DEFAULT_DATA = Path(os.environ.get("TMPDIR", "/tmp")) / "cutline-scale-data"
SIZES = (2_000_000, 20_000_000)
LINES_PER_FILE = 100_000
PARALLELISM = 2
INTERVAL = 1.0
WINDOW = 60  # seconds of event time, tumbling
MAX_DELAY = vs.MAX_DELAY
RUN_TIMEOUT = 1800.0

KEYED, WINDOWED = "keyed", "window"
QUERIES = (KEYED, WINDOWED)
CUTLINE, COLUMNAR = "cutline", "cutline columnar"
SPARK, SPARK_ROCKS = "spark sql", "spark sql rocksdb"
ARROW_1, ARROW_POOL = "pyarrow 1 core", "pyarrow pool"
BYTEWAX = "bytewax -w2"
SYSTEMS = (CUTLINE, COLUMNAR, SPARK, SPARK_ROCKS, ARROW_1, ARROW_POOL, BYTEWAX)
ONLY = {BYTEWAX: (KEYED,)}  # systems that run some queries only
COLUMNS = {KEYED: ["user"], WINDOWED: ["ts", "user"]}  # what each query reads
SPARK_TYPES = {"ts": "double", "user": "string"}
DEFAULT_GRID = "all,4,16x2,8"  # maxFilesPerTrigger values x shuffle partitions
ROCKSDB = {
    "spark.sql.streaming.stateStore.providerClass":
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
}
# --break-output drops event 0 (user u0000, the first event time) in cutline's queries
BROKEN_USER, BROKEN_TS = vs.make_event(0, vs.backlog_ts(0))["user"], vs.backlog_ts(0)


# --------------------------------------------------------------------------- input


def ensure_input(data: Path, records: int, lines_per_file: int, console: Any) -> dict:
    """The input of one size under ``data/<records>-<lines>``, written once and reused:
    ``backlog`` (the keyed query's files), ``windowed`` (the same and the sentinel) and
    ``expected.pkl`` (counts per user and per (user, window start))."""
    root = data / f"{records}-{lines_per_file}"
    expected = root / "expected.pkl"
    if expected.exists():
        return {"root": root, **pickle.loads(expected.read_bytes())}
    shutil.rmtree(root, ignore_errors=True)
    files = max(1, -(-records // lines_per_file))
    console.print(f"writing {records:,} events in {files} files under {root} ...", style="dim")
    t0 = time.monotonic()
    out = vs.write_backlog(root / "backlog", records, files, window=WINDOW, stateless=False,
                           processes=cores())
    vs.windowed_backlog(root / "backlog", root / "windowed")
    want = {"records": records, "files": files, "user_counts": out["user_counts"],
            "window_counts": out["window_counts"]}
    expected.write_bytes(pickle.dumps(want))
    console.print(f"  written in {time.monotonic() - t0:.0f} s", style="dim")
    return {"root": root, **want}


# --------------------------------------------------------------------------- the runs
# Everything below down to ``child_main`` runs in a run's own process.


class LatestSink:
    """Keeps the latest value per key of what it is given, ``(key, count)`` records or window
    results (the per-record runs); at each pre-commit the subtask
    writes the keys changed since the last one to ``<path>/<subtask>-<checkpoint>.pkl``, so
    the parent can rebuild the output (later checkpoints win).  A benchmark's sink: it
    commits nothing else (the runs are failure-free; a restarted run fails its check)."""

    name = "latest"

    def __init__(self, path: str) -> None:
        self.path = path

    def create_writer(self) -> LatestWriter:
        return LatestWriter(self.path)


class LatestWriter:
    def __init__(self, path: str) -> None:
        self.path, self.changed, self.subtask = path, {}, 0

    def open(self, subtask: int, parallelism: int, job: str) -> None:
        self.subtask = subtask
        os.makedirs(self.path, exist_ok=True)

    def write(self, batch: list) -> None:
        if not batch:
            return
        if hasattr(batch[0], "start"):  # WindowResult
            self.changed.update(((r.key, float(r.start)), r.value) for r in batch)
        else:  # (key, count)
            self.changed.update(batch)

    def pre_commit(self, checkpoint_id: int) -> dict:
        if self.changed:
            name = os.path.join(self.path, f"{self.subtask}-{checkpoint_id:08d}.pkl")
            with open(name + ".tmp", "wb") as f:
                pickle.dump(self.changed, f)
            os.rename(name + ".tmp", name)
            self.changed = {}
        return {}

    def commit(self, handles: list) -> None:
        pass

    abort = recover = commit

    def close(self) -> None:
        pass


def not_broken(e: dict) -> bool:
    return not (e["user"] == BROKEN_USER and e["ts"] == BROKEN_TS)


def arrow_schema(query: str) -> Any:
    import pyarrow as pa

    types = {"ts": pa.float64(), "user": pa.string()}
    return pa.schema([(c, types[c]) for c in COLUMNS[query]])


def cutline_pipeline(spec: dict) -> Any:
    import pyarrow.compute as pc

    import cutline
    from cutline import CheckpointConfig, Pipeline
    from cutline.connectors import FileSource, ParquetSink

    query, columnar = spec["query"], spec["system"] == COLUMNAR
    p = Pipeline(f"scale-{query}{'-col' if columnar else ''}", parallelism=PARALLELISM,
                 checkpoint=CheckpointConfig(interval=INTERVAL,
                                             storage=f"file://{spec['checkpoint']}"))
    source = FileSource(spec["input"])
    # columnar: the record batches into Parquet as they come (exactly-once), as Spark writes
    # its rows; per record: the latest value per key (the records are Python objects)
    sink = ParquetSink(spec["out"]) if columnar else LatestSink(spec["out"])
    if columnar:
        # broken: event 0 is told apart by its time, so the keyed query reads ``ts`` too
        s = p.source(source.batches(arrow_schema(WINDOWED if spec["break_output"] else query)),
                     uid="events")
        if spec["break_output"]:
            s = s.where(~((pc.field("user") == BROKEN_USER) & (pc.field("ts") == BROKEN_TS)),
                        uid="broken")
        if query == KEYED:
            s = s.key_by("user").count(uid="counts")
        else:
            s = (s.assign_timestamps("ts", max_delay=MAX_DELAY, uid="stamps")
                 .key_by("user").window(cutline.tumbling(WINDOW)).count(uid="counts"))
    else:
        s = p.source(source, uid="events")
        if spec["break_output"]:
            s = s.filter(not_broken, uid="broken")
        if query == KEYED:
            s = s.key_by(vs.user_of).count(uid="counts", **updates_arg(spec["updates"]))
        else:
            s = (s.assign_timestamps(vs.event_time, max_delay=MAX_DELAY, uid="stamps")
                 .key_by(vs.user_of).window(cutline.tumbling(WINDOW)).count(uid="counts"))
    s.sink(sink, uid="out")
    return p


def updates_arg(updates: str) -> dict:
    """``count(updates=...)`` where this cutline has it (``{}`` where it does not: one row
    per record, the only way then)."""
    import inspect

    from cutline.api import KeyedStream

    return {"updates": updates} if "updates" in inspect.signature(
        KeyedStream.count).parameters else {}


def run_cutline(spec: dict) -> dict:
    from pyspark import cloudpickle

    for module in (vs, sys.modules["_common"]):  # Spark's workers cannot import bench/
        cloudpickle.register_pickle_by_value(module)
    p = cutline_pipeline(spec)
    watch = AttemptWatcher()
    t0 = time.monotonic()
    result = p.run(on_start=watch, timeout=RUN_TIMEOUT)
    t_end = time.monotonic()
    finals = [c for c in result.checkpoints if c.final]
    end = finals[-1].completed if finals else t_end
    start = watch.started if watch.started is not None else t0
    return {"processing": end - start, "attempts": result.attempts,
            "checkpoints": len(result.checkpoints),
            "task_cpu": sum(getattr(result, "cpu_seconds", {}).values()) or None}


def spark_frame(df: Any, query: str) -> Any:
    """The query on the events ``df`` (streaming or, to check its plan, batch)."""
    from pyspark.sql import functions as F

    if query == KEYED:
        return df.groupBy("user").count()
    return (df.withColumn("event_time", F.timestamp_seconds("ts"))
            .withWatermark("event_time", f"{MAX_DELAY:g} seconds")
            .groupBy(F.window("event_time", f"{WINDOW} seconds"), "user").count()
            .select("user", (F.unix_micros("window.start") / 1e6).alias("start"), "count"))


def spark_query(spark: Any, spec: dict) -> Any:
    reader = spark.readStream.schema(vs.EVENT_SCHEMA)
    if spec["max_files"]:
        reader = reader.option("maxFilesPerTrigger", spec["max_files"])
    df = spark_frame(reader.json(spec["input"]), spec["query"])
    out, ck = spec["out"], spec["checkpoint"]
    if spec["query"] == KEYED:
        def write_batch(batch_df: Any, batch_id: int) -> None:
            batch_df.write.mode("append").parquet(os.path.join(out, f"batch-{batch_id:06d}"))

        w = df.writeStream.outputMode("update").foreachBatch(write_batch)
    else:
        w = df.writeStream.format("parquet").outputMode("append").option("path", out)
    return w.option("checkpointLocation", ck).trigger(availableNow=True).start()


def read_schema(plan: str) -> list[str]:
    import re

    return re.findall(r"ReadSchema: (struct<[^>]*>)", plan)


def run_spark(spec: dict) -> dict:
    spark = spark_session(PARALLELISM, spec["partitions"], spec["heap"])
    for k, v in (ROCKSDB if spec["system"] == SPARK_ROCKS else {}).items():
        spark.conf.set(k, v)
    q = spark_query(spark, spec)
    if not q.awaitTermination(RUN_TIMEOUT):
        q.stop()
        raise TimeoutError(f"Spark query not finished within {RUN_TIMEOUT:.0f} s")
    if q.exception() is not None:
        raise RuntimeError(f"Spark query failed: {q.exception()}")
    progress = q.recentProgress
    # the last micro-batch's physical plan; when that batch read no file (a window query's
    # last batch only moves the watermark), the same query's plan over the same files read
    # as a batch (the same optimiser prunes the columns)
    scanned = read_schema(q._jsq.explainInternal(False))
    plan_of = "last micro-batch"
    if not scanned:
        batch = spark_frame(spark.read.schema(vs.EVENT_SCHEMA).json(spec["input"]),
                            spec["query"])
        scanned = read_schema(batch._jdf.queryExecution().executedPlan().toString())
        plan_of = "the query read as a batch"
    return {"processing": spark_processing(progress),
            "micro_batches": sum(1 for p in progress if p["numInputRows"] > 0),
            "read_schema": scanned, "read_schema_of": plan_of,
            "state_store": spark.conf.get("spark.sql.streaming.stateStore.providerClass",
                                          "default").rsplit(".", 1)[-1]}


def _arrow_partial(path: str, query: str, single: bool) -> Any:
    """One file's counts per key (per user; per user and window start) as an Arrow table."""
    import pyarrow.compute as pc
    import pyarrow.json as pj

    table = pj.read_json(path, read_options=pj.ReadOptions(use_threads=not single,
                                                           block_size=64 << 20),
                         parse_options=pj.ParseOptions(explicit_schema=arrow_schema(query),
                                                       unexpected_field_behavior="ignore"))
    keys = ["user"]
    if query == WINDOWED:
        table = table.append_column("start", pc.multiply(
            pc.floor(pc.divide(table["ts"], float(WINDOW))), float(WINDOW)))
        keys = ["user", "start"]
    return table.group_by(keys, use_threads=not single).aggregate([("user", "count")])


def _arrow_pool_part(args: tuple[str, str]) -> Any:
    import pyarrow as pa

    pa.set_cpu_count(1)
    return _arrow_partial(args[0], args[1], True)


def run_pyarrow(spec: dict) -> dict:
    """pyarrow alone: read each file with the schema, count per key, merge the partials."""
    import pyarrow as pa

    query = spec["query"]
    paths = sorted(str(f) for f in Path(spec["input"]).iterdir()
                   if f.is_file() and not f.name.startswith((".", "_")))
    t0 = time.monotonic()
    if spec["system"] == ARROW_1:
        pa.set_cpu_count(1)
        pa.set_io_thread_count(1)
        parts = [_arrow_partial(f, query, True) for f in paths]
    else:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(cores()) as pool:
            parts = list(pool.map(_arrow_pool_part, [(f, query) for f in paths]))
    keys = ["user"] + (["start"] if query == WINDOWED else [])
    merged = pa.concat_tables(parts).group_by(keys, use_threads=False).aggregate(
        [("user_count", "sum")])
    processing = time.monotonic() - t0
    cols = merged.to_pydict()
    keyed = zip(cols["user"], cols["start"]) if query == WINDOWED else cols["user"]
    with open(os.path.join(spec["out"], "result.pkl"), "wb") as f:
        pickle.dump(dict(zip(keyed, cols["user_count_sum"])), f)
    return {"processing": processing}


def run_bytewax(spec: dict) -> dict:
    """Bytewax (issue 28's wall-to-wall peer): its ``DirSource`` (the files as partitions,
    lines in batches of 1,000), ``json.loads`` per line, ``count_final`` per user, two
    worker threads (``-w2``, as the issue measured it), no recovery (no snapshots)."""
    import bytewax.operators as op
    from bytewax.connectors.files import DirSource
    from bytewax.dataflow import Dataflow
    from bytewax.run import cli_main
    from bytewax.testing import TestingSink

    if spec["query"] != KEYED:
        raise ValueError(f"bytewax runs the keyed query only, not {spec['query']!r}")
    got: list = []
    flow = Dataflow("scale")
    lines = op.input("in", flow, DirSource(Path(spec["input"]), glob_pat="*.jsonl"))
    counts = op.count_final("count", op.map("parse", lines, json.loads), vs.user_of)
    op.output("out", counts, TestingSink(got))
    t0 = time.monotonic()
    cli_main(flow, workers_per_process=2)
    processing = time.monotonic() - t0
    with open(os.path.join(spec["out"], "result.pkl"), "wb") as f:
        pickle.dump(dict(got), f)
    return {"processing": processing}


def child_main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    os.makedirs(spec["out"], exist_ok=True)
    if spec["system"] in (CUTLINE, COLUMNAR):
        out = run_cutline(spec)
    elif spec["system"] in (SPARK, SPARK_ROCKS):
        out = run_spark(spec)
    elif spec["system"] == BYTEWAX:
        out = run_bytewax(spec)
    else:
        out = run_pyarrow(spec)
    out["cpu"] = tree_cpu()  # this process and all under it (JVM, daemon, workers, pool)
    Path(spec["result"]).write_text(json.dumps(out))
    return 0  # and exit as a user's program does


# --------------------------------------------------------------------------- checks


def read_output(system: str, query: str, out: Path) -> dict:
    """What a run wrote, as {key: count} (key: user, or (user, window start))."""
    got: dict = {}
    if system == COLUMNAR:  # committed Parquet parts by subtask and checkpoint: later wins
        from cutline.connectors import ParquetSink

        add_parquet_counts(got, ParquetSink(str(out)).committed_files(), query)
    elif system == CUTLINE:
        parts = sorted(out.glob("*.pkl"), key=lambda f: int(f.stem.split("-")[1]))
        for f in parts:
            got.update(pickle.loads(f.read_bytes()))
    elif system in (ARROW_1, ARROW_POOL, BYTEWAX):
        got = pickle.loads((out / "result.pkl").read_bytes())
    elif query == KEYED:  # update mode, a directory per micro-batch: the latest count wins
        add_parquet_counts(got, sorted(p for p in out.iterdir()
                                       if p.name.startswith("batch-")), query)
    else:
        add_parquet_counts(got, [p for p in out.rglob("*.parquet") if not any(
            s.startswith(("_", ".")) for s in p.relative_to(out).parts)], query)
    if query == WINDOWED:
        got = {(u, float(s)): c for (u, s), c in got.items() if u != vs.SENTINEL}
    else:
        got.pop(vs.SENTINEL, None)
    return got


def add_parquet_counts(got: dict, paths: list, query: str) -> None:
    """The counts Parquet ``paths`` (files or directories) hold, read in order into ``got``:
    a later count of a user wins (an update stream); a window written twice fails the run."""
    import pyarrow.parquet as pq

    for path in paths:
        if query == KEYED:
            t = pq.read_table(path, columns=["user", "count"]).to_pydict()
            got.update(zip(t["user"], t["count"]))
            continue
        t = pq.read_table(path, columns=["user", "start", "count"]).to_pydict()
        keys = list(zip(t["user"], t["start"]))
        twice = next((k for k in keys if k in got), None)
        if twice is not None:
            raise RunFailed(f"window {twice} written twice")
        got.update(zip(keys, t["count"]))


def check_output(system: str, query: str, out: Path, expected: dict) -> dict:
    """The run's output against the input's counts; a difference raises :class:`RunFailed`
    naming the first keys that differ."""
    want = expected["user_counts"] if query == KEYED else expected["window_counts"]
    got = read_output(system, query, out)
    if got != want:
        keys = sorted(set(got) | set(want), key=str)
        bad = [k for k in keys if got.get(k) != want.get(k)]
        raise RunFailed(f"output differs from the input's counts at {len(bad)} of "
                        f"{len(want)} keys, e.g. " + ", ".join(
                            f"{k}: {got.get(k)} != {want.get(k)}" for k in bad[:3]))
    return {"keys": len(got), "records_counted": sum(got.values()), "ok": True}


def check_read_schema(run: dict, query: str) -> None:
    want = "struct<" + ",".join(f"{c}:{SPARK_TYPES[c]}" for c in COLUMNS[query]) + ">"
    if run.get("read_schema") != [want]:
        raise RunFailed(f"Spark's file scan reads {run.get('read_schema')}, cutline reads "
                        f"{want}: the column pruning differs")


# --------------------------------------------------------------------------- the parent


class Bench:
    def __init__(self, args: argparse.Namespace, console: Any) -> None:
        self.args, self.console = args, console
        self.work = Path(args.work)
        self.work.mkdir(parents=True, exist_ok=True)
        self.ncores = cores()
        self.failures: list[dict] = []
        self.n = 0

    def heap(self, size_bytes: int) -> str:
        if self.args.spark_heap:
            return self.args.spark_heap
        return "2g" if size_bytes <= 1 << 30 else "4g"

    def run(self, system: str, query: str, data: dict, spark: dict | None = None,
            phase: str = "round") -> dict | None:
        """One run in a fresh process, its output checked; None (and logged) if it failed."""
        self.n += 1
        d = self.work / f"run-{self.n:05d}"
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir()
        inp = data["root"] / ("windowed" if query == WINDOWED else "backlog")
        spark = spark or {}
        spec = {"system": system, "query": query, "input": str(inp), "out": str(d / "out"),
                "checkpoint": str(d / "ck"), "result": str(d / "result.json"),
                "break_output": self.args.break_output and system in (CUTLINE, COLUMNAR),
                "max_files": spark.get("max_files"), "partitions": spark.get("partitions"),
                "heap": spark.get("heap"), "updates": self.args.updates}
        (d / "spec.json").write_text(json.dumps(spec))
        label = f"{data['records']:,} {query:<6} {system:<17}" + (
            f" [{spark_label(spark)}]" if spark else "")
        try:
            r = run_child([str(Path(__file__).resolve()), "--child", str(d / "spec.json")],
                          d / "result.json", self.args.timeout)
            if system in (SPARK, SPARK_ROCKS):
                check_read_schema(r, query)
            if r.get("attempts", 1) != 1:
                raise RunFailed(f"the job restarted ({r['attempts']} attempts)")
            r["output"] = check_output(system, query, d / "out", data)
        except (RunFailed, OSError, ValueError) as exc:
            self.failures.append({"phase": phase, "records": data["records"],
                                  "query": query, "system": system, "spark": spark,
                                  "error": str(exc)[-3000:]})
            self.console.print(f"  {phase:<8} {label} FAILED: {str(exc)[-600:]}", style="red")
            return None
        finally:
            shutil.rmtree(d, ignore_errors=True)
        n = data["records"] + (1 if query == WINDOWED else 0)
        r.update({"records": n, "rate_end_to_end": n / r["end_to_end"],
                  "rate_processing": n / r["processing"],
                  "records_per_cpu_second": n / r["cpu"] if r.get("cpu") else None,
                  "loaded": is_loaded(r["load"], self.ncores), "spark": spark or None})
        self.console.print(
            f"  {phase:<8} {label} end to end {r['end_to_end']:7.2f} s  processing "
            f"{r['processing']:7.2f} s  cpu {fmt(r.get('cpu'), '.1f')} s  load "
            f"{r['load']['max']:.1f}{'  LOADED' if r['loaded'] else ''}", style="dim")
        return r

    def search_spark(self, query: str, data: dict) -> tuple[dict, list[dict]]:
        """Spark SQL's best settings for this query and size: one warm-up run, then one run
        of each setting of the grid; the shortest end to end wins."""
        heap = self.heap(input_files(data["root"] / "backlog")["bytes"])
        grid = [{"max_files": mf, "partitions": sp, "heap": heap}
                for mf, sp in parse_grid(self.args.spark_grid, data["files"])]
        if len(grid) == 1:
            return grid[0], []
        self.run(SPARK, query, data, grid[0], phase="search")
        tried = []
        for g in grid:
            r = self.run(SPARK, query, data, g, phase="search")
            tried.append({**g, "end_to_end": r and r["end_to_end"],
                          "processing": r and r["processing"]})
        ok = [t for t in tried if t["end_to_end"] is not None]
        if not ok:
            return grid[0], tried
        best = min(ok, key=lambda t: t["end_to_end"])
        return {k: best[k] for k in ("max_files", "partitions", "heap")}, tried

    def measure(self, records: int) -> dict:
        args, console = self.args, self.console
        data = ensure_input(Path(args.data), records, args.lines_per_file, console)
        files = {q: input_files(data["root"] / ("windowed" if q == WINDOWED else "backlog"))
                 for q in args.queries}
        out: dict[str, Any] = {"records": records, "input": files, "queries": {}}
        for query in args.queries:
            systems = [s for s in SYSTEMS if s in args.systems
                       and query in ONLY.get(s, QUERIES)]
            best, tried = ({}, [])
            if SPARK in systems or SPARK_ROCKS in systems:
                best, tried = self.search_spark(query, data)
                console.print(f"  Spark SQL's best for {query} at {records:,}: "
                              f"{spark_label(best)}", style="bold")
            conf = {s: best if s in (SPARK, SPARK_ROCKS) else None for s in systems}
            warm: dict[str, list[float]] = {s: [] for s in systems}
            for _ in range(args.max_warmup):
                todo = [s for s in systems if not settled(warm[s], args.settle)]
                if not todo:
                    break
                for s in todo:
                    r = self.run(s, query, data, conf[s], phase="warm-up")
                    if r is not None:
                        warm[s].append(r["end_to_end"])
            runs: dict[str, list] = {s: [] for s in systems}
            for rnd in range(args.rounds):
                for s in rotated(systems, rnd):
                    r = self.run(s, query, data, conf[s], phase=f"round {rnd + 1}")
                    runs[s].append(r)
            out["queries"][query] = {
                "spark_best": best, "spark_search": tried,
                "warm_up": {s: {"runs": warm[s], "settled": settled(warm[s], args.settle)}
                            for s in systems},
                "runs": runs}
        return out


def spark_label(spark: dict) -> str:
    mf = spark.get("max_files")
    return (f"maxFilesPerTrigger {mf or 'all'}, {spark.get('partitions')} shuffle "
            f"partitions, heap {spark.get('heap')}")


def parse_grid(text: str, files: int) -> list[tuple[int | None, int]]:
    """``"all,4,16x2,8"``: maxFilesPerTrigger values (``all``: none; a number: that many
    files, at most the input's) x shuffle partitions."""
    try:
        mfs, sps = text.split("x")
        max_files = sorted({None if m == "all" else min(int(m), files) for m in mfs.split(",")},
                           key=lambda m: m or 10**9)
        parts = [int(p) for p in sps.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--spark-grid takes FILES,...xPARTITIONS,... (e.g. {DEFAULT_GRID}), got "
            f"{text!r}") from None
    if any(p < 1 for p in parts) or any(m is not None and m < 1 for m in max_files):
        raise argparse.ArgumentTypeError(f"--spark-grid: numbers must be >= 1, got {text!r}")
    return [(m, p) for m in max_files for p in parts]


# --------------------------------------------------------------------------- summary


def summarise(sizes: list[dict], ncores: int) -> list[dict]:
    """One row per size, query and system: medians and 95% intervals over the quiet runs,
    and the ratios per round against Spark SQL at its best and the pyarrow reference."""
    rows = []
    for size in sizes:
        for query, q in size["queries"].items():
            runs = q["runs"]
            quiet = {s: [r for r in rs if r is not None and not r["loaded"]]
                     for s, rs in runs.items()}
            by_round = {s: [None if r is None or r["loaded"] else r for r in rs]
                        for s, rs in runs.items()}
            arrow1 = median([r["rate_end_to_end"] for r in quiet.get(ARROW_1, [])])
            arrow1_proc = median([r["rate_processing"] for r in quiet.get(ARROW_1, [])])
            for s, rs in runs.items():
                ok = quiet[s]
                e2e = [r["end_to_end"] for r in ok]
                proc = [r["processing"] for r in ok]
                row: dict[str, Any] = {
                    "records": size["records"], "query": query, "system": s,
                    "runs": len(rs), "failed": sum(r is None for r in rs),
                    "loaded": sum(1 for r in rs if r is not None and r["loaded"]),
                    "end_to_end": median(e2e), "end_to_end_ci": bootstrap_ci(e2e),
                    "processing": median(proc), "processing_ci": bootstrap_ci(proc),
                    "rate_end_to_end": median([r["rate_end_to_end"] for r in ok]),
                    "rate_processing": median([r["rate_processing"] for r in ok]),
                    "records_per_cpu_second": median([r["records_per_cpu_second"]
                                                      for r in ok]),
                    "cpu": median([r.get("cpu") for r in ok]),
                    "load_max": max((r["load"]["max"] for r in rs if r is not None),
                                    default=None),
                    "spark": q["spark_best"] if s in (SPARK, SPARK_ROCKS) else None}
                for peer, key in ((SPARK, "vs_spark"), (SPARK_ROCKS, "vs_spark_rocksdb"),
                                  (BYTEWAX, "vs_bytewax")):
                    if peer in by_round and s != peer:
                        per = [b["end_to_end"] / a["end_to_end"]
                               for a, b in zip(by_round[s], by_round[peer]) if a and b]
                        per_p = [b["processing"] / a["processing"]
                                 for a, b in zip(by_round[s], by_round[peer]) if a and b]
                        row[key] = median(per)
                        row[key + "_ci"] = bootstrap_ci(per)
                        row[key + "_processing"] = median(per_p)
                if arrow1 and row["rate_end_to_end"]:
                    row["vs_pyarrow_cores"] = row["rate_end_to_end"] / (arrow1 * ncores)
                    row["vs_pyarrow_cores_processing"] = \
                        row["rate_processing"] / (arrow1_proc * ncores)
                rows.append(row)
    by = {(r["records"], r["query"], r["system"]): r for r in rows}
    sizes_n = sorted({r["records"] for r in rows})
    if len(sizes_n) > 1:
        lo, hi = sizes_n[0], sizes_n[-1]
        for r in rows:
            small = by.get((lo, r["query"], r["system"]))
            if r["records"] == hi and small and small["end_to_end"] and r["end_to_end"]:
                r["cost_growth"] = r["end_to_end"] / small["end_to_end"]
                r["cost_growth_processing"] = r["processing"] / small["processing"]
                r["cost_growth_of_records"] = hi / lo
    return rows


def print_table(console: Any, rows: list[dict], result: dict) -> None:
    c = result["conditions"]
    v = c["versions"]
    t = table(f"scale: records/s end to end (process start to exit) and processing; "
              f"medians of quiet runs [95% CI]; {c['cores']} cores, load before "
              f"{c['load_before'][0]:.1f}; Spark {v.get('pyspark')}, pyarrow "
              f"{v.get('pyarrow')}, Python {v.get('python')}",
              ["records", "query", "system", "end to end s", "records/s", "processing s",
               "records/s proc", "records/CPU-s", "x Spark SQL", "x pyarrow x cores",
               "x bytewax", "growth", "runs (loaded, failed)"],
              left=("query", "system"), no_wrap=False)
    for r in rows:
        ci = r["end_to_end_ci"]
        vs_ci = r.get("vs_spark_ci")
        t.add_row(f"{r['records']:,}", r["query"], r["system"],
                  fmt(r["end_to_end"], ".2f") + (f" [{ci[0]:.2f}-{ci[1]:.2f}]" if ci else ""),
                  fmt(r["rate_end_to_end"], ",.0f"), fmt(r["processing"], ".2f"),
                  fmt(r["rate_processing"], ",.0f"), fmt(r["records_per_cpu_second"], ",.0f"),
                  fmt(r.get("vs_spark"), ".2f", "x") + (
                      f" [{vs_ci[0]:.2f}-{vs_ci[1]:.2f}]" if vs_ci else ""),
                  fmt(r.get("vs_pyarrow_cores"), ".2f", "x"),
                  fmt(r.get("vs_bytewax"), ".2f", "x"),
                  fmt(r.get("cost_growth"), ".1f", "x"),
                  f"{r['runs']} ({r['loaded']}, {r['failed']})")
    console.print(t)
    for size in result["sizes"]:
        for f in size["input"].values():
            console.print(f"  input {f['directory']}: {f['files']} files, {f['bytes']:,} bytes "
                          f"({f['smallest']:,}-{f['largest']:,})", style="dim")


def markdown(rows: list[dict], result: dict) -> str:
    """The table and its conditions as Markdown, for docs/benchmarks.md (``scale.md`` next to
    the results file): the figures the docs quote, from this run."""
    c = result["conditions"]
    v = c["versions"]
    git = v.get("git", {})
    during = [r["load_max"] for r in rows if r["load_max"] is not None]
    lines = [f"`{' '.join(['python bench/scale.py', *result['settings']['argv']])}` "
             f"({c['when']}, git `{(git.get('commit') or '?')[:7]}`"
             f"{', uncommitted src' if git.get('src_uncommitted') else ''}; {c['cores']} "
             f"cores; load before {c['load_before'][0]:.1f}, highest during a run "
             f"{max(during, default=0):.1f}; Python {v.get('python')}, Spark "
             f"{v.get('pyspark')}, pyarrow {v.get('pyarrow')}, {v.get('java')}):", "",
             "| records | query | system | end to end, s [95% CI] | records/s | processing, s "
             "| records/s, processing | records/CPU-s | × Spark SQL [95% CI] | × pyarrow × cores "
             "| × Bytewax | growth | runs (loaded, failed) |",
             "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        ci, vci = r["end_to_end_ci"], r.get("vs_spark_ci")
        lines.append(
            f"| {r['records']:,} | {r['query']} | {r['system']} | "
            f"{fmt(r['end_to_end'], '.2f')}{f' [{ci[0]:.2f}–{ci[1]:.2f}]' if ci else ''} | "
            f"{fmt(r['rate_end_to_end'], ',.0f')} | {fmt(r['processing'], '.2f')} | "
            f"{fmt(r['rate_processing'], ',.0f')} | {fmt(r['records_per_cpu_second'], ',.0f')} | "
            f"{fmt(r.get('vs_spark'), '.2f', '×')}"
            f"{f' [{vci[0]:.2f}–{vci[1]:.2f}]' if vci else ''} | "
            f"{fmt(r.get('vs_pyarrow_cores'), '.2f', '×')} | "
            f"{fmt(r.get('vs_bytewax'), '.2f', '×')} | "
            f"{fmt(r.get('cost_growth'), '.1f', '×')} | {r['runs']} ({r['loaded']}, "
            f"{r['failed']}) |")
    lines.append("")
    for size in result["sizes"]:
        for query, q in size["queries"].items():
            if q["spark_best"]:
                searched = "; ".join(f"{spark_label(t)} {fmt(t['end_to_end'], '.1f')} s"
                                     for t in q["spark_search"])
                lines.append(f"- Spark SQL's settings, {query} at {size['records']:,}: "
                             f"{spark_label(q['spark_best'])} " + (
                                 f"(the best of: {searched})" if searched else
                                 "(the only one given: `--spark-grid`; not searched)"))
        for f in size["input"].values():
            lines.append(f"- input `{Path(f['directory']).name}` at {size['records']:,}: "
                         f"{f['files']} files, {f['bytes']:,} bytes")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> str | None:
    plt = pyplot()
    queries = sorted({r["query"] for r in rows}, key=QUERIES.index)
    fig, axes = plt.subplots(1, len(queries), figsize=(6.5 * len(queries), 4.5), squeeze=False)
    for ax, query in zip(axes[0], queries):
        sizes = sorted({r["records"] for r in rows if r["query"] == query})
        systems = [s for s in SYSTEMS if any(r["system"] == s for r in rows)]
        width = 0.8 / max(1, len(systems))
        for i, s in enumerate(systems):
            vals, errs = [], [[], []]
            for n in sizes:
                r = next((x for x in rows if (x["records"], x["query"], x["system"])
                          == (n, query, s)), None)
                rate = r and r["rate_end_to_end"]
                vals.append((rate or 0) / 1e6)
                ci = r and r["end_to_end_ci"]
                if rate and ci:
                    lo, hi = r["records"] / ci[1] / 1e6, r["records"] / ci[0] / 1e6
                    errs[0].append(max(0.0, vals[-1] - lo))
                    errs[1].append(max(0.0, hi - vals[-1]))
                else:
                    errs[0].append(0)
                    errs[1].append(0)
            xs = [k + i * width for k in range(len(sizes))]
            ax.bar(xs, vals, width, yerr=errs, capsize=3, label=s)
        ax.set_xticks([k + width * (len(systems) - 1) / 2 for k in range(len(sizes))])
        ax.set_xticklabels([f"{n / 1e6:g} M" for n in sizes])
        ax.set_ylabel("M records/s, process start to exit")
        ax.set_title(f"{query} count")
        ax.legend(fontsize=7)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except OSError:
        return None
    finally:
        plt.close(fig)
    return str(path)


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=lambda t: [positive_int(x) for x in t.split(",")],
                    default=list(SIZES), help="records per run, comma-separated "
                    "(default 2000000,20000000)")
    ap.add_argument("--lines-per-file", type=positive_int, default=LINES_PER_FILE)
    ap.add_argument("--queries", type=lambda t: t.split(","), default=list(QUERIES),
                    help="keyed,window")
    ap.add_argument("--systems", type=lambda t: t.split(","), default=None,
                    help="comma-separated, of: " + ", ".join(SYSTEMS) + " (default: all; "
                    "bytewax when it is installed)")
    ap.add_argument("--rounds", type=positive_int, default=5, help="measured rounds (5)")
    ap.add_argument("--max-warmup", type=int, default=5,
                    help="warm-up runs per case at most (5; 0: none)")
    ap.add_argument("--settle", type=positive_float, default=0.10,
                    help="warm when the last two warm-up runs are this close (0.10)")
    ap.add_argument("--spark-grid", default=DEFAULT_GRID,
                    help=f"maxFilesPerTrigger values x shuffle partitions ({DEFAULT_GRID})")
    ap.add_argument("--spark-heap", default=None, help="Spark's heap (default: by input)")
    ap.add_argument("--data", default=str(DEFAULT_DATA), help="where the input is kept")
    ap.add_argument("--work", default=None, help="run directories (default: under --data)")
    ap.add_argument("--timeout", type=positive_float, default=RUN_TIMEOUT)
    ap.add_argument("--updates", choices=["checkpoint", "record"], default="checkpoint",
                    help="cutline's per-record keyed count emits a row per key per checkpoint "
                         "(as Spark's update mode per micro-batch; the default) or per record")
    ap.add_argument("--break-output", action="store_true",
                    help="cutline's queries drop one input record: the check must fail")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--no-plot", action="store_true")
    args = ap.parse_args(argv)
    if args.systems is None:
        import importlib.util

        args.systems = [s for s in SYSTEMS
                        if s != BYTEWAX or importlib.util.find_spec("bytewax") is not None]
        if BYTEWAX not in args.systems:
            print("scale: Bytewax is not installed (pip install bytewax==0.21.1): the keyed "
                  "query runs without it", file=sys.stderr)
    elif BYTEWAX in args.systems:
        import importlib.util

        if importlib.util.find_spec("bytewax") is None:
            ap.error("--systems: bytewax is not installed (pip install bytewax==0.21.1)")
    for q in args.queries:
        if q not in QUERIES:
            ap.error(f"--queries: unknown query {q!r} (keyed, window)")
    for s in args.systems:
        if s not in SYSTEMS:
            ap.error(f"--systems: unknown system {s!r} (one of {', '.join(SYSTEMS)})")
    if args.max_warmup < 0:
        ap.error("--max-warmup must be >= 0")
    try:
        parse_grid(args.spark_grid, 1)
    except argparse.ArgumentTypeError as exc:
        ap.error(str(exc))
    args.work = args.work or str(Path(args.data) / "runs")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return child_main(argv[1])
    args = parse_args(argv)
    console = make_console(200)
    cond = conditions()
    console.print(f"[bold]scale[/]: sizes {', '.join(f'{n:,}' for n in args.sizes)}, "
                  f"{args.rounds} rounds, {cond['cores']} cores, load "
                  f"{cond['load_before'][0]:.1f} (runs with more than {LOADED_OTHERS_PER_CORE} "
                  f"runnable threads per core besides their own are marked loaded)"
                  f"{', BREAK-OUTPUT' if args.break_output else ''}")
    bench = Bench(args, console)
    t0 = time.monotonic()
    sizes = [bench.measure(n) for n in args.sizes]
    rows = summarise(sizes, bench.ncores)
    result = {"benchmark": "scale", "conditions": cond | {"load_after": list(os.getloadavg())},
              "settings": {"lines_per_file": args.lines_per_file, "parallelism": PARALLELISM,
                           "checkpoint_interval": INTERVAL, "window": WINDOW,
                           "max_delay": MAX_DELAY, "rounds": args.rounds,
                           "max_warmup": args.max_warmup, "settle": args.settle,
                           "spark_grid": args.spark_grid, "break_output": args.break_output,
                           "per_record_count_updates": args.updates,
                           "argv": argv},
              "seconds": time.monotonic() - t0, "summary": rows, "sizes": sizes,
              "failures": bench.failures}
    print_table(console, rows, result)
    if not args.no_plot and rows:
        result["plot"] = plot(rows, args.out.with_suffix(".png"))
    write_results(args.out, result, console)
    try:
        args.out.with_suffix(".md").write_text(markdown(rows, result))
    except OSError as exc:
        console.print(f"could not write {args.out.with_suffix('.md')}: {exc}", style="yellow")
    if bench.failures:
        console.print(f"[red]{len(bench.failures)} run(s) FAILED[/] (wrong output, a wrong "
                      "read schema, or no clean exit): the benchmark fails", style="bold")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
