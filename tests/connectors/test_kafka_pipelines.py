"""KafkaSource in whole pipelines against a real Kafka-protocol broker (Tansu): keyed counts
and event-time windows with exact output, on the threads engine and on Spark (with ``kill
-9`` of Python workers), a rescaled restore (2 -> 1 -> 2) with partitions moved, and an
idle partition that stops holding the watermark back.

Every run compares its output with what is computed offline from the records produced: a
running count emits each ``(key, n)`` for n = 1 .. the key's count exactly once; a window
count equals the offline count of its (key, window), and no record is late.
"""

from __future__ import annotations

import collections
import json
import random
import time

import pytest

pytest.importorskip("confluent_kafka")

from kafka_util import unique_topic  # noqa: E402

from cutline import CheckpointConfig, Pipeline, tumbling  # noqa: E402
from cutline.connectors import CollectSink, KafkaSource  # noqa: E402

KEYS = 7
SIZE = 5  # tumbling window, seconds
DELAY = 2.0  # at most this much out of order within a partition; the watermark's max_delay
SPAN = 200.0  # seconds of event time every partition covers
BASE = 1_000_000.0  # from this time on


def keyed_topic(broker, partitions: int, n: int, seed: int = 1) -> tuple[str, collections.Counter]:
    """``n`` JSON records ``{"k", "i"}`` keyed by ``k`` (librdkafka's key partitioner)."""
    rng = random.Random(seed)
    topic = broker.create_topic(unique_topic("count"), partitions)
    want: collections.Counter = collections.Counter()
    records = []
    for i in range(n):
        k = f"k{rng.randrange(KEYS)}"
        want[k] += 1
        records.append((k, json.dumps({"k": k, "i": i})))
    broker.produce(topic, records)
    return topic, want


def expected_pairs(want: collections.Counter) -> list[tuple[str, int]]:
    return sorted((k, c) for k, n in want.items() for c in range(1, n + 1))


def key_of(r):
    return r["k"]


def value_of(rec):
    return rec.value


def slow_value_of(rec):
    if random.random() < 0.02:
        time.sleep(0.004)
    return rec.value


def paced_value_of(rec):
    time.sleep(0.0005)
    return rec.value


def build_count(tmp, broker, topic, *, parallelism=2, interval=0.2, slow=False,
                name="kafka-count", bounded=True, fn=None):
    cfg = CheckpointConfig(interval=interval, storage=f"file://{tmp}/chk")
    p = Pipeline(name, parallelism=parallelism, checkpoint=cfg)
    out = CollectSink(str(tmp / "out"))
    src = KafkaSource(broker.bootstrap, topic, value_format="json",
                      stopping_offsets="latest" if bounded else None)
    (p.source(src, uid="kafka")
     .map(fn or (slow_value_of if slow else value_of), uid="values")
     .key_by(key_of).count(uid="count")
     .sink(out, uid="out"))
    return p, out


def test_bounded_keyed_count_on_threads_is_exact(kafka_broker, tmp_path):
    topic, want = keyed_topic(kafka_broker, 4, 5000)
    p, out = build_count(tmp_path, kafka_broker, topic)
    result = p.run(engine="threads", timeout=120)
    assert result.attempts == 1
    assert sorted(out.results()) == expected_pairs(want)


@pytest.mark.parametrize("engine", ["threads", pytest.param("spark", marks=pytest.mark.slow)])
def test_rescaled_restores_2_1_2_move_partitions_with_their_offsets(kafka_broker, tmp_path,
                                                                     engine, request):
    """Stopped with a savepoint at parallelism 2, resumed at 1, stopped again, resumed at
    2 to the end: every count exactly once (the source neither skips nor repeats)."""
    run = {"engine": "threads"} if engine == "threads" else \
        {"spark": request.getfixturevalue("spark")}
    topic, want = keyed_topic(kafka_broker, 5, 16_000, seed=2)
    total, savepoint = sum(want.values()), None
    for par, share in ((2, 0.25), (1, 0.55)):
        p, out = build_count(tmp_path, kafka_broker, topic, parallelism=par,
                             fn=paced_value_of)
        job = p.start(timeout=120, restore_from=savepoint, **run)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and len(out.results()) < share * total:
            time.sleep(0.02)
        savepoint = job.stop_with_savepoint(60)
        job.result(60)
        assert len(out.results()) < total, "the job ended before the savepoint"
    p, out = build_count(tmp_path, kafka_broker, topic, parallelism=2)
    result = p.run(timeout=300, restore_from=savepoint, **run)
    assert result.restored_from is not None
    assert sorted(out.results()) == expected_pairs(want)


# ------------------------------------------------------------------ event time


def timed_topic(broker, rates: list[int], seed: int = 3) -> tuple[str, collections.Counter]:
    """One partition per entry of ``rates``: ``rates[p]`` records over ``SPAN`` seconds of
    event time (their Kafka timestamps), up to ``DELAY`` s out of order; 0 = an idle
    partition.  Returns the count per (key, window start) computed offline."""
    rng = random.Random(seed)
    topic = broker.create_topic(unique_topic("time"), len(rates))
    counts: collections.Counter = collections.Counter()
    for p, n in enumerate(rates):
        records = []
        for i in range(n):
            t = BASE + max(0.0, i * SPAN / n - rng.uniform(0, DELAY))
            ms = int(t * 1000)  # (a timestamp of 0 would be "now" to the producer)
            k = f"k{rng.randrange(KEYS)}"
            counts[(k, int(ms / 1000 // SIZE) * SIZE)] += 1
            records.append({"key": k, "value": k, "timestamp": ms, "partition": p})
        if records:
            broker.produce(topic, records)
    return topic, counts


RATES = [100, 300, 900, 2000, 150, 600, 1200, 0]  # 8 partitions, the last idle


def kafka_ts(rec):
    return rec.timestamp


def record_key(rec):
    return rec.key


def build_windows(tmp, broker, topic, *, parallelism=2, interval=0.2, bounded=True,
                  idle_timeout=None, slow=False, stateless_first=False):
    cfg = CheckpointConfig(interval=interval, storage=f"file://{tmp}/chk")
    p = Pipeline("kafka-windows", parallelism=parallelism, checkpoint=cfg)
    out, late = CollectSink(str(tmp / "out")), CollectSink(str(tmp / "late"))
    src = KafkaSource(broker.bootstrap, topic, key_format="str", value_format="str",
                      stopping_offsets="latest" if bounded else None)
    records = p.source(src, uid="kafka")
    if stateless_first:  # chained stateless operators before the timestamps
        records = (records.map(slow_identity, uid="m").filter(always, uid="f")
                   .flat_map(one, uid="fm"))
    stamped = records.assign_timestamps(kafka_ts, max_delay=DELAY,
                                        idle_timeout=idle_timeout, uid="time")
    if slow:
        stamped = stamped.map(slow_identity, uid="slow")
    counts = stamped.key_by(record_key).window(tumbling(SIZE)).count(uid="counts")
    counts.sink(out, uid="out")
    counts.late().sink(late, uid="late")
    return p, out, late


def always(_rec):
    return True


def one(rec):
    return [rec]


def slow_identity(rec):
    if random.random() < 0.02:
        time.sleep(0.004)
    return rec


def window_counts(out) -> collections.Counter:
    got: collections.Counter = collections.Counter()
    for r in out.results():
        w = (r.key, int(r.start))
        assert w not in got, f"window {w} emitted twice"
        got[w] = r.value
    return got


def assert_windows(out, late, want):
    late_rows = list(late.results())
    assert not late_rows, f"{len(late_rows)} records late, e.g. {late_rows[:3]}"
    got = window_counts(out)
    wrong = {w for w in want.keys() | got.keys() if got[w] != want[w]}
    assert not wrong, (f"{len(wrong)} of {len(want)} windows wrong, e.g. "
                       f"{[(w, got[w], want[w]) for w in sorted(wrong)[:3]]}")


def test_event_time_over_8_partitions_on_threads_equals_the_offline_counts(kafka_broker,
                                                                            tmp_path):
    topic, want = timed_topic(kafka_broker, RATES)
    p, out, late = build_windows(tmp_path, kafka_broker, topic)
    result = p.run(engine="threads", timeout=120)
    assert result.attempts == 1
    assert_windows(out, late, want)


def test_stateless_operators_before_assign_timestamps_keep_a_watermark_per_partition(
        kafka_broker, tmp_path):
    """source -> map -> filter -> flat_map -> assign_timestamps: a batch is still one
    partition's records when it reaches the assigner, so the watermark stays per partition
    (as Flink's WatermarkStrategy in fromSource): the windows equal the offline counts, no
    record late (with a watermark per subtask over interleaved partitions of different
    rates thousands were)."""
    topic, want = timed_topic(kafka_broker, RATES, seed=5)
    p, out, late = build_windows(tmp_path, kafka_broker, topic, stateless_first=True)
    result = p.run(engine="threads", timeout=120)
    assert result.attempts == 1
    assert_windows(out, late, want)


def test_an_idle_partition_stops_holding_the_watermark_back(kafka_broker, tmp_path):
    """Unbounded: partition 7 never gets a record.  Without idleness no window would
    fire; with ``idle_timeout`` every window the other partitions' watermarks passed does,
    with its exact count."""
    topic, want = timed_topic(kafka_broker, RATES, seed=4)
    p, out, late = build_windows(tmp_path, kafka_broker, topic, bounded=False,
                                 idle_timeout=0.5)
    closed = {w for w in want if w[1] + SIZE <= BASE + SPAN - 2 * DELAY - SIZE}
    job = p.start(engine="threads", timeout=120)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not closed <= set(window_counts(out)):
            time.sleep(0.2)
    finally:
        job.cancel("the test has what it needs")
    got = window_counts(out)
    assert closed <= set(got), f"{len(closed - set(got))} closed windows never fired"
    assert {w: got[w] for w in closed} == {w: want[w] for w in closed}
    assert not list(late.results())


# ------------------------------------------------------------------ Spark


@pytest.mark.slow
def test_bounded_keyed_count_on_spark_with_three_kills_is_exact(spark, kafka_broker,
                                                                tmp_path):
    from cutline.spark.chaos import Chaos

    topic, want = keyed_topic(kafka_broker, 4, 40_000, seed=5)
    # (paced: about 10 s an attempt, so that three kills land mid-stream on a quiet
    # machine too; with slow=True a CI run ended after two)
    p, out = build_count(tmp_path, kafka_broker, topic, fn=paced_value_of, interval=0.2)
    chaos = Chaos(kills=3, seed=27, mean_delay=1.0)
    result = p.run(spark=spark, timeout=600, on_start=chaos)
    assert len(chaos.killed) == 3, chaos.killed
    assert result.attempts >= 4
    assert sorted(out.results()) == expected_pairs(want)


@pytest.mark.slow
def test_event_time_over_8_partitions_on_spark_equals_the_offline_counts(spark, kafka_broker,
                                                                         tmp_path):
    topic, want = timed_topic(kafka_broker, [r * 5 for r in RATES], seed=6)
    p, out, late = build_windows(tmp_path, kafka_broker, topic, slow=True)
    from cutline.spark.chaos import Chaos

    chaos = Chaos(kills=2, seed=28, mean_delay=1.0)
    result = p.run(spark=spark, timeout=600, on_start=chaos)
    assert len(chaos.killed) == 2, chaos.killed
    assert result.attempts >= 3
    assert_windows(out, late, want)


# ------------------------------------------------------------------ operations


def _get(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as r:  # noqa: S310 - loopback
        return r.read().decode()


def test_lag_and_a_stalled_broker_show_in_the_live_line_dashboard_and_metrics(
        kafka_broker, tmp_path):
    """Unbounded: lag per partition reaches the driver (live line, dashboard, /metrics);
    the broker stopped by SIGSTOP makes the live line say the source is stalled, naming
    the broker; resumed, the job goes on and every count arrives exactly once."""
    import io

    from rich.console import Console

    from cutline.driver.dashboard import Dashboard, JobView

    topic, want = keyed_topic(kafka_broker, 3, 3000, seed=8)
    cfg = CheckpointConfig(interval=0.2, storage=f"file://{tmp_path}/chk")
    p = Pipeline("kafka-ops", parallelism=2, checkpoint=cfg)
    out = CollectSink(str(tmp_path / "out"))
    src = KafkaSource(kafka_broker.bootstrap, topic, value_format="json", stall_after=1.0,
                      broker_timeout=60.0)
    (p.source(src, uid="kafka").map(value_of, uid="values")
     .key_by(key_of).count(uid="count").sink(out, uid="out"))
    console = Console(file=io.StringIO(), width=400)
    job = p.start(engine="threads", timeout=120, progress=console)

    def wait(cond, what, timeout=30.0):
        deadline = time.monotonic() + timeout
        while not cond():
            assert time.monotonic() < deadline, what
            time.sleep(0.05)

    try:
        wait(lambda: len(out.results()) == sum(want.values()), "the first records")
        driver = job.driver
        wait(lambda: driver.run.source_lag() == {"kafka": 0}, "lag 0 once all is read")
        assert "lag 0" in live_line(driver)
        board = Dashboard(JobView(driver, "threads"))
        try:
            metrics = _get(board.url.replace("/?", "/metrics?"))
            snap = json.loads(_get(board.url.replace("/?", "/api/job?")))
        finally:
            board.stop()
        lines = [x for x in metrics.splitlines() if x.startswith("cutline_source_lag_records{")]
        assert len(lines) == 3 and all(x.endswith(" 0.0") for x in lines), lines
        assert all(any(f'split="{topic}/{q}"' in x for x in lines) for q in range(3)), lines
        kafka = next(o for o in snap["operators"] if o["uid"] == "kafka")
        assert kafka["lag"] == 0 and kafka["stalled"] == []

        kafka_broker.pause()
        try:
            wait(lambda: driver.run.stalled_sources(), "a stalled source", timeout=20)
            stalled = driver.run.stalled_sources()
            assert all(kafka_broker.bootstrap in why and "not answering" in why
                       for why in stalled.values()), stalled
            live = live_line(driver)
            assert "stalled: kafka." in live and "not answering" in live, live
        finally:
            kafka_broker.resume()
        wait(lambda: not driver.run.stalled_sources(), "no longer stalled", timeout=20)
        more, _ = keyed_topic_append(kafka_broker, topic, 600, want)
        wait(lambda: len(out.results()) == sum(want.values()), "the records after the stall")
    finally:
        job.cancel("the test has what it needs")
    assert sorted(out.results()) == expected_pairs(want)


def live_line(driver) -> str:
    """The text of the live line (a non-terminal console shows only the last one)."""
    from types import SimpleNamespace

    from cutline.report import Progress

    shown: list = []
    progress = Progress()
    progress.live = SimpleNamespace(update=shown.append)
    progress.update(driver)
    return shown[-1]


def keyed_topic_append(broker, topic, n, want, seed=9):
    """``n`` more records like :func:`keyed_topic`'s, counted into ``want``."""
    rng = random.Random(seed)
    records = []
    for i in range(n):
        k = f"k{rng.randrange(KEYS)}"
        want[k] += 1
        records.append((k, json.dumps({"k": k, "i": -i})))
    broker.produce(topic, records)
    return n, want


def test_new_topics_of_a_pattern_are_read_while_running(kafka_broker, tmp_path):
    """A pattern source: a topic created while the job runs (Tansu cannot add partitions
    to a topic; a new topic's partitions are new partitions all the same) is discovered
    and read from its earliest offset; every count exactly once."""
    prefix = unique_topic("grow")
    first = kafka_broker.create_topic(prefix + "-a", 2)
    want: collections.Counter = collections.Counter()
    keyed_topic_append(kafka_broker, first, 500, want, seed=10)
    cfg = CheckpointConfig(interval=0.2, storage=f"file://{tmp_path}/chk")
    p = Pipeline("kafka-grow", parallelism=2, checkpoint=cfg)
    out = CollectSink(str(tmp_path / "out"))
    src = KafkaSource(kafka_broker.bootstrap, pattern=prefix + r"-.*", value_format="json",
                      discovery_interval=0.3)
    (p.source(src, uid="kafka").map(value_of, uid="values")
     .key_by(key_of).count(uid="count").sink(out, uid="out"))
    job = p.start(engine="threads", timeout=120)
    try:
        deadline = time.monotonic() + 30
        while len(out.results()) < 500 and time.monotonic() < deadline:
            time.sleep(0.05)
        second = kafka_broker.create_topic(prefix + "-b", 3)
        keyed_topic_append(kafka_broker, second, 700, want, seed=11)
        deadline = time.monotonic() + 30
        while len(out.results()) < sum(want.values()) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        job.cancel("the test has what it needs")
    assert sorted(out.results()) == expected_pairs(want)


def test_a_broker_gone_for_good_fails_the_job_naming_it(tmp_path):
    from kafka_util import start_broker

    from cutline.driver.dataflow import JobFailed

    broker = start_broker()
    try:
        topic, _ = keyed_topic(broker, 2, 200)
        cfg = CheckpointConfig(interval=0.2, storage=f"file://{tmp_path}/chk")
        p = Pipeline("kafka-gone", parallelism=2, checkpoint=cfg)
        out = CollectSink(str(tmp_path / "out"))
        src = KafkaSource(broker.bootstrap, topic, value_format="json", broker_timeout=3.0)
        (p.source(src, uid="kafka").map(value_of).key_by(key_of).count().sink(out))
        job = p.start(engine="threads", timeout=120)
        deadline = time.monotonic() + 30
        while len(out.results()) < 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        broker.stop()
        t0 = time.monotonic()
        with pytest.raises(JobFailed, match=rf"broker\(s\) {broker.bootstrap} did not answer"):
            job.result(60)
        assert time.monotonic() - t0 < 20
    finally:
        broker.stop()


SMALL_QUEUE = {"queued.max.messages.kbytes": 16, "fetch.message.max.bytes": 8192,
               "fetch.max.bytes": 16384, "message.max.bytes": 16384}


@pytest.mark.slow
def test_the_broker_paused_20_s_on_spark_stalls_visibly_and_loses_nothing(spark, kafka_broker,
                                                                        tmp_path):
    """SIGSTOP for 20 s mid-run: the driver hears from the executors that the source is
    stalled, naming the broker; after SIGCONT the job ends with exact counts."""
    topic, want = keyed_topic(kafka_broker, 4, 40_000, seed=12)
    cfg = CheckpointConfig(interval=0.2, storage=f"file://{tmp_path}/chk")
    p = Pipeline("kafka-pause", parallelism=2, checkpoint=cfg)
    out = CollectSink(str(tmp_path / "out"))
    src = KafkaSource(kafka_broker.bootstrap, topic, value_format="json",
                      stopping_offsets="latest", stall_after=2.0, broker_timeout=120.0,
                      config=SMALL_QUEUE)  # so that the pause bites before the input is read
    (p.source(src, uid="kafka").map(paced_value_of, uid="values")
     .key_by(key_of).count(uid="count").sink(out, uid="out"))
    seen: list = []

    def pause(driver):
        def run():
            deadline = time.monotonic() + 120
            while not driver.run.checkpoints and time.monotonic() < deadline:
                time.sleep(0.05)
            kafka_broker.pause()
            try:
                end = time.monotonic() + 20
                while time.monotonic() < end:
                    seen.extend(driver.run.stalled_sources().values())
                    time.sleep(0.2)
            finally:
                kafka_broker.resume()

        import threading

        threading.Thread(target=run, daemon=True).start()

    result = p.run(spark=spark, timeout=600, on_start=pause)
    assert result.duration > 20
    assert seen and all(kafka_broker.bootstrap in why for why in seen), seen[:3]
    assert sorted(out.results()) == expected_pairs(want)


def test_completed_checkpoints_commit_offsets_to_the_group(kafka_broker, tmp_path):
    """With group_id, the offsets of each completed checkpoint are committed to the group
    (for lag tools): after a bounded run, the group's offsets are the partitions' ends."""
    from confluent_kafka import Consumer, TopicPartition
    from kafka_util import end_offsets

    topic, want = keyed_topic(kafka_broker, 3, 2000, seed=13)
    group = unique_topic("group")
    cfg = CheckpointConfig(interval=0.2, storage=f"file://{tmp_path}/chk")
    p = Pipeline("kafka-group", parallelism=2, checkpoint=cfg)
    out = CollectSink(str(tmp_path / "out"))
    src = KafkaSource(kafka_broker.bootstrap, topic, value_format="json", group_id=group,
                      stopping_offsets="latest")
    (p.source(src, uid="kafka").map(value_of).key_by(key_of).count().sink(out))
    p.run(engine="threads", timeout=120)
    assert sorted(out.results()) == expected_pairs(want)
    c = Consumer({"bootstrap.servers": kafka_broker.bootstrap, "group.id": group})
    committed = {tp.partition: tp.offset
                 for tp in c.committed([TopicPartition(topic, q) for q in range(3)], 10)}
    c.close()
    assert committed == end_offsets(kafka_broker.bootstrap, topic)


def test_columnar_kafka_batches_with_event_time_windows(kafka_broker, tmp_path):
    """``KafkaSource(...).batches(schema, metadata=("timestamp",))``: Arrow batches, event
    time from the Kafka timestamp column, per-partition watermarks: exact windows."""
    import pyarrow as pa

    rng = random.Random(14)
    topic = kafka_broker.create_topic(unique_topic("cols"), 4)
    want: collections.Counter = collections.Counter()
    for q, n in enumerate([300, 900, 100, 0]):
        records = []
        for i in range(n):
            t = BASE + max(0.0, i * SPAN / n - rng.uniform(0, DELAY))
            k = f"k{rng.randrange(KEYS)}"
            want[(k, int(int(t * 1000) / 1000 // SIZE) * SIZE)] += 1
            records.append({"value": json.dumps({"k": k}), "timestamp": int(t * 1000),
                            "partition": q})
        if records:
            kafka_broker.produce(topic, records)
    cfg = CheckpointConfig(interval=0.2, storage=f"file://{tmp_path}/chk")
    p = Pipeline("kafka-columnar", parallelism=2, checkpoint=cfg)
    out, late = CollectSink(str(tmp_path / "out")), CollectSink(str(tmp_path / "late"))
    src = KafkaSource(kafka_broker.bootstrap, topic, stopping_offsets="latest").batches(
        pa.schema([("k", pa.string())]), batch_rows=64, metadata=("timestamp",))
    counts = (p.source(src, uid="kafka")
              .assign_timestamps("timestamp", max_delay=DELAY, uid="time")
              .key_by("k").window(tumbling(SIZE)).count(uid="counts"))
    counts.rows().sink(out, uid="out")
    counts.late().rows().sink(late, uid="late")
    p.run(engine="threads", timeout=120)
    assert not list(late.results())
    got = collections.Counter()
    for r in out.results():
        w = (r["k"], int(r["start"]))
        assert w not in got
        got[w] = r["count"]
    assert got == want


def parse_value(rec):
    return rec._replace(value=json.loads(rec.value))


def test_undecodable_records_go_to_the_dead_letter_sink_named(kafka_broker, tmp_path):
    """Read bytes, decode in a map with on_error="dead_letter": the bad record is a dead
    letter naming its topic, partition and offset; the others are counted exactly."""
    topic = kafka_broker.create_topic(unique_topic("dead"), 2)
    kafka_broker.produce(topic, [json.dumps({"k": "a"}), "{oops", json.dumps({"k": "b"})],
                         partition=1)
    kafka_broker.produce(topic, [json.dumps({"k": "a"})], partition=0)
    cfg = CheckpointConfig(interval=0.2, storage=f"file://{tmp_path}/chk")
    dead = CollectSink(str(tmp_path / "dead"))
    p = Pipeline("kafka-dead", parallelism=2, checkpoint=cfg, dead_letter=dead)
    out = CollectSink(str(tmp_path / "out"))
    (p.source(KafkaSource(kafka_broker.bootstrap, topic, stopping_offsets="latest"),
              uid="kafka")
     .map(parse_value, on_error="dead_letter", uid="parse")
     .map(lambda r: r.value["k"]).key_by(lambda k: k).count().sink(out))
    p.run(engine="threads", timeout=120)
    assert sorted(out.results()) == [("a", 1), ("a", 2), ("b", 1)]
    (letter,) = dead.results()
    assert f"Kafka topic {topic!r} partition 1 offset 1" in letter["position"], letter
    assert letter["record"].value == b"{oops" and letter["operator"] == "parse"
