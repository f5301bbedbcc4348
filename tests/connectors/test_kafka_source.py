"""KafkaSource against a real Kafka-protocol broker (Tansu, the ``kafka_broker`` fixture):
the reader on its own (assignment, offsets, checkpoints, rescaling, bounded runs,
deserialisers, errors), then pipelines on the threads engine with exact output."""

from __future__ import annotations

import json
import time

import pytest

pytest.importorskip("confluent_kafka")

from kafka_util import unique_topic  # noqa: E402

from cutline.connectors.kafka import (  # noqa: E402
    KafkaBrokerError, KafkaRecord, KafkaRecordError, KafkaSource, KafkaTopicError, owner_of,
)
from cutline.runtime.failures import repeats  # noqa: E402


def topic_with(broker, partitions, per_partition, fmt=str):
    """A topic whose partition ``p`` holds values ``fmt(p, i)`` for i < per_partition[p]."""
    name = broker.create_topic(unique_topic(), partitions)
    for p, n in enumerate(per_partition):
        broker.produce(name, [fmt(p, i) if fmt is not str else f"{p}-{i}" for i in range(n)],
                       partition=p)
    return name


def read_all(reader, limit=100_000, timeout=20.0, until=None):
    """Read until the end of input (None), ``until`` records, or ``timeout`` seconds."""
    out = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch = reader.read_batch(100)
        if batch is None:
            return out, True
        out.extend(batch)
        if until is not None and len(out) >= until:
            return out, False
        if len(out) > limit:
            break
    return out, False


def opened(source, subtask=0, parallelism=1, state=None, states=None):
    r = source.create_reader()
    r.open(subtask, parallelism)
    if state is not None:
        r.restore(state)
    if states is not None:
        r.rescale(states)
    return r


def values(records):
    return sorted(r.value for r in records)


def test_bounded_read_all_partitions_exactly(kafka_broker):
    t = topic_with(kafka_broker, 3, [5, 0, 7])
    src = KafkaSource(kafka_broker.bootstrap, t, stopping_offsets="latest", value_format="str")
    r = opened(src)
    got, ended = read_all(r)
    r.close()
    assert ended
    assert values(got) == sorted([f"0-{i}" for i in range(5)] + [f"2-{i}" for i in range(7)])
    first = got[0]
    assert isinstance(first, KafkaRecord) and first.topic == t
    for rec in got:  # a batch comes from one partition, in offset order
        assert rec.value == f"{rec.partition}-{rec.offset}"


def test_assignment_is_deterministic_and_covers_every_partition(kafka_broker):
    t = topic_with(kafka_broker, 5, [3] * 5)
    src = KafkaSource(kafka_broker.bootstrap, t, stopping_offsets="latest", value_format="str")
    seen = []
    for s in range(3):
        r = opened(src, s, 3)
        got, ended = read_all(r)
        r.close()
        assert ended
        assert {rec.partition for rec in got} == {p for p in range(5) if owner_of(t, p, 3) == s}
        seen += got
    assert len(seen) == 15 and len({(x.partition, x.offset) for x in seen}) == 15


def test_snapshot_restore_resumes_at_the_next_offset(kafka_broker):
    t = topic_with(kafka_broker, 2, [50, 50])
    src = KafkaSource(kafka_broker.bootstrap, t, stopping_offsets="latest", value_format="str")
    r = opened(src)
    first, _ = read_all(r, until=30)
    state = r.snapshot()
    r.close()
    assert sum(state["offsets"].values()) == len(first)
    r2 = opened(src, state=state)
    rest, ended = read_all(r2)
    r2.close()
    assert ended
    assert values(first + rest) == sorted(f"{p}-{i}" for p in range(2) for i in range(50))


def test_rescale_moves_partitions_with_their_offsets(kafka_broker):
    t = topic_with(kafka_broker, 6, [20] * 6)
    src = KafkaSource(kafka_broker.bootstrap, t, stopping_offsets="latest", value_format="str")
    got, states = [], []
    for s in range(2):  # parallelism 2: each reads some, then a checkpoint
        r = opened(src, s, 2)
        part, _ = read_all(r, until=25)
        got += part
        states.append(r.snapshot())
        r.close()
    for s in range(3):  # rescaled to 3
        r = opened(src, s, 3, states=states)
        assert set(r.snapshot()["offsets"]) == {f"{t}/{p}" for p in range(6)
                                                if owner_of(t, p, 3) == s}
        rest, ended = read_all(r)
        r.close()
        assert ended
        got += rest
    assert values(got) == sorted(f"{p}-{i}" for p in range(6) for i in range(20))


def test_stopping_offsets_explicit_and_starting_offsets(kafka_broker):
    t = topic_with(kafka_broker, 2, [10, 10])
    src = KafkaSource(kafka_broker.bootstrap, t, value_format="str",
                      starting_offsets={t: {0: 3}},  # partition 1: earliest
                      stopping_offsets={t: {0: 6, 1: 2}})
    got, ended = read_all(opened(src))
    assert ended
    assert values(got) == sorted(["0-3", "0-4", "0-5", "1-0", "1-1"])


def test_starting_offsets_latest_reads_only_new_records(kafka_broker):
    t = topic_with(kafka_broker, 1, [10])
    kafka_broker.produce(t, [f"0-{i}" for i in range(10, 15)], partition=0)  # a 2nd batch
    src = KafkaSource(kafka_broker.bootstrap, t, value_format="str", starting_offsets="latest")
    r = opened(src)
    assert read_all(r, timeout=1.0) == ([], False)
    kafka_broker.produce(t, ["new"], partition=0)
    got, _ = read_all(r, until=1, timeout=10)
    r.close()
    assert [(x.value, x.offset) for x in got] == [("new", 15)]


def test_starting_timestamp_skips_earlier_records(kafka_broker):
    t = kafka_broker.create_topic(unique_topic(), 1)
    kafka_broker.produce(t, [{"value": f"v{i}", "timestamp": 1_000_000 + i * 1000}
                             for i in range(10)], partition=0)
    src = KafkaSource(kafka_broker.bootstrap, t, value_format="str",
                      starting_timestamp=1_000.0 + 6, stopping_offsets="latest")
    got, ended = read_all(opened(src))
    assert ended
    assert [x.value for x in got] == ["v6", "v7", "v8", "v9"]
    assert [x.timestamp for x in got] == [1006.0, 1007.0, 1008.0, 1009.0]


def test_committed_offsets_and_commit_on_checkpoint_completion(kafka_broker):
    t = topic_with(kafka_broker, 2, [10, 10])
    group = unique_topic("g")
    src = KafkaSource(kafka_broker.bootstrap, t, value_format="str", group_id=group,
                      starting_offsets="committed")
    r = opened(src)
    got, _ = read_all(r, until=12)
    state = r.snapshot()
    r.notify_checkpoint_complete(1, state)
    r.read_batch(1)  # serves the asynchronous commit
    time.sleep(0.5)
    r.read_batch(1)
    r.close()
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": kafka_broker.bootstrap, "group.id": group})
    committed = {tp.partition: tp.offset
                 for tp in c.committed([TopicPartition(t, 0), TopicPartition(t, 1)], 10)}
    c.close()
    assert committed == {int(k.rsplit("/", 1)[1]): v for k, v in state["offsets"].items()}
    # a new job of the group starts where the committed offsets are
    bounded = KafkaSource(kafka_broker.bootstrap, t, value_format="str", group_id=group,
                          starting_offsets="committed", stopping_offsets="latest")
    rest, ended = read_all(opened(bounded))
    assert ended
    assert values(rest) == sorted(set(f"{p}-{i}" for p in range(2) for i in range(10))
                                  - {x.value for x in got})


def test_deserialisers_keys_headers_and_timestamps(kafka_broker):
    t = kafka_broker.create_topic(unique_topic(), 1)
    kafka_broker.produce(t, [{"key": "k1", "value": json.dumps({"a": 1}), "timestamp": 5000,
                              "headers": [("h", b"x")]}], partition=0)
    src = KafkaSource(kafka_broker.bootstrap, t, key_format="str", value_format="json",
                      stopping_offsets="latest")
    (rec,), ended = read_all(opened(src))
    assert ended
    assert rec == KafkaRecord("k1", {"a": 1}, t, 0, 0, 5.0, (("h", b"x"),))
    raw = KafkaSource(kafka_broker.bootstrap, t, stopping_offsets="latest")
    (rec,), _ = read_all(opened(raw))
    assert rec.key == b"k1" and rec.value == b'{"a": 1}'
    custom = KafkaSource(kafka_broker.bootstrap, t, stopping_offsets="latest",
                         value_format=lambda b: len(b))
    (rec,), _ = read_all(opened(custom))
    assert rec.value == 8


def test_undecodable_record_names_topic_partition_and_offset(kafka_broker):
    t = kafka_broker.create_topic(unique_topic(), 2)
    kafka_broker.produce(t, ['{"a": 1}', '{"a": 2}', "not json"], partition=1)
    src = KafkaSource(kafka_broker.bootstrap, t, value_format="json",
                      stopping_offsets="latest")
    with pytest.raises(KafkaRecordError) as err:
        read_all(opened(src))
    assert (err.value.topic, err.value.partition, err.value.offset) == (t, 1, 2)
    assert f"topic {t!r} partition 1 offset 2" in str(err.value)
    assert repeats(err.value)  # fatal: the same record fails every retry


def test_missing_topic_fails_at_start_naming_it(kafka_broker):
    src = KafkaSource(kafka_broker.bootstrap, ["no-such-topic-xyz"])
    with pytest.raises(KafkaTopicError, match="no-such-topic-xyz"):
        src.check()
    with pytest.raises(KafkaTopicError, match="no-such-topic-xyz"):
        opened(src)


def test_pattern_and_new_topics_are_discovered_from_earliest(kafka_broker):
    prefix = unique_topic("pat")
    a = kafka_broker.create_topic(prefix + "-a", 2)
    kafka_broker.produce(a, ["a0", "a1"], partition=0)
    src = KafkaSource(kafka_broker.bootstrap, pattern=prefix + r"-.*", value_format="str",
                      discovery_interval=0.2)
    r = opened(src)
    got, _ = read_all(r, until=2)
    assert values(got) == ["a0", "a1"]
    b = kafka_broker.create_topic(prefix + "-b", 3)  # Tansu cannot add partitions to a topic:
    kafka_broker.produce(b, [f"b{i}" for i in range(6)])  # a new topic gives new partitions
    more, _ = read_all(r, until=6)
    r.close()
    assert values(more) == [f"b{i}" for i in range(6)]
    assert {x.topic for x in more} == {b}


def test_lag_per_partition(kafka_broker):
    t = topic_with(kafka_broker, 2, [30, 5])
    src = KafkaSource(kafka_broker.bootstrap, t, value_format="str")
    r = opened(src)
    got, _ = read_all(r, until=35)
    time.sleep(1.2)  # a statistics report
    r.read_batch(10)
    assert r.lag() == {f"{t}/0": 0, f"{t}/1": 0}
    kafka_broker.produce(t, ["x"] * 4, partition=1)
    deadline = time.monotonic() + 10
    while r.lag().get(f"{t}/1") != 4 and time.monotonic() < deadline:
        r._poll(0.2)  # fetched, not yet delivered: behind by 4
    assert r.lag()[f"{t}/1"] == 4
    r.close()


def test_broker_pause_stalls_visibly_then_resumes_without_loss(kafka_broker):
    t = topic_with(kafka_broker, 2, [10, 10])
    src = KafkaSource(kafka_broker.bootstrap, t, value_format="str", stall_after=1.0,
                      broker_timeout=30.0)
    r = opened(src)
    got, _ = read_all(r, until=20)
    kafka_broker.pause()
    try:
        deadline = time.monotonic() + 10
        while r.stalled() is None and time.monotonic() < deadline:
            assert r.read_batch(10) == []
        assert "not answering" in (r.stalled() or "")
        assert kafka_broker.bootstrap in (r.stalled() or "")
    finally:
        kafka_broker.resume()
    kafka_broker.produce(t, ["late"], partition=0)
    more, _ = read_all(r, until=1, timeout=20)
    r.close()
    assert values(got + more) == sorted([f"{p}-{i}" for p in range(2) for i in range(10)]
                                        + ["late"])


def test_broker_gone_fails_within_broker_timeout_naming_it():
    from kafka_util import start_broker

    broker = start_broker()
    try:
        t = topic_with(broker, 1, [3])
        src = KafkaSource(broker.bootstrap, t, value_format="str", broker_timeout=3.0,
                          stall_after=1.0)
        r = opened(src)
        read_all(r, until=3)
        broker.stop()
        t0 = time.monotonic()
        with pytest.raises(KafkaBrokerError, match=broker.bootstrap) as err:
            read_all(r, timeout=30)
        assert time.monotonic() - t0 < 10
        assert repeats(err.value)  # the job fails, not a retry waiting as long again
        r.close()
    finally:
        broker.stop()


def test_columnar_batches_parse_json_values(kafka_broker):
    import pyarrow as pa

    t = kafka_broker.create_topic(unique_topic(), 2)
    for p in range(2):
        kafka_broker.produce(t, [json.dumps({"k": f"k{i % 3}", "n": i}) for i in range(50)],
                             partition=p)
    schema = pa.schema([("k", pa.string()), ("n", pa.int64())])
    src = KafkaSource(kafka_broker.bootstrap, t, stopping_offsets="latest").batches(
        schema, batch_rows=16, metadata=("partition", "offset"))
    got, ended = read_all(opened(src))
    assert ended
    assert all(isinstance(b, pa.RecordBatch) and b.num_rows <= 16 for b in got)
    table = pa.Table.from_batches(got)
    assert table.schema.names == ["k", "n", "partition", "offset"]
    rows = sorted(zip(table["partition"].to_pylist(), table["offset"].to_pylist(),
                      table["n"].to_pylist()))
    assert rows == [(p, i, i) for p in range(2) for i in range(50)]


def test_columnar_bad_value_names_the_offset(kafka_broker):
    import pyarrow as pa

    t = kafka_broker.create_topic(unique_topic(), 1)
    kafka_broker.produce(t, ['{"n": 1}', '{"n": 2}', "{oops"], partition=0)
    src = KafkaSource(kafka_broker.bootstrap, t, stopping_offsets="latest").batches(
        pa.schema([("n", pa.int64())]))
    with pytest.raises(KafkaRecordError, match="partition 0 offset 2"):
        read_all(opened(src))


def test_a_bounded_read_ends_past_transaction_markers(kafka_broker):
    """A transactional producer's commit marker takes an offset that holds no record: the
    stop ("latest") is past it, and the reader still reaches it (and reports lag 0)."""
    from confluent_kafka import Producer

    t = kafka_broker.create_topic(unique_topic(), 1)
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap,
                         "transactional.id": unique_topic("tx")})
    producer.init_transactions(10)
    producer.begin_transaction()
    for i in range(5):
        producer.produce(t, value=f"v{i}".encode(), partition=0)
    producer.commit_transaction(10)
    src = KafkaSource(kafka_broker.bootstrap, t, value_format="str", stopping_offsets="latest")
    r = opened(src)
    got, ended = read_all(r, timeout=15)
    assert ended, f"the read did not reach its stop {r.snapshot()}"
    assert [x.value for x in got] == [f"v{i}" for i in range(5)]
    state = r.snapshot()
    assert state["offsets"] == state["stops"] == {f"{t}/0": 6}  # 5 records and the marker
    assert r.lag() == {f"{t}/0": 0}
    r.close()


def test_idle_partitions_leave_the_split_keys(kafka_broker):
    """With the assigner's idle timeout, a partition read to its end with nothing new for
    that long stops holding the watermark back (it leaves split_keys); when all are idle,
    the one with the latest record stands for them."""
    from types import SimpleNamespace

    t = topic_with(kafka_broker, 3, [20, 20, 0])
    src = KafkaSource(kafka_broker.bootstrap, t, value_format="str")
    r = opened(src)

    class Marks(dict):  # what AssignTimestamps gives: each begun split's watermark
        op = SimpleNamespace(idle_timeout=5.0)  # the assigner: its idle timeout

    split_marks = Marks()
    r.watermark_per_split(split_marks)
    got = []
    deadline = time.monotonic() + 15
    while len(got) < 40 and time.monotonic() < deadline:
        batch = r.read_batch(100)
        if batch:
            split_marks[r.split_key()] = max(x.offset for x in batch)
            got += batch
    assert len(got) == 40
    k0, k1, k2 = (f"{t}/{q}" for q in range(3))
    deadline = time.monotonic() + 15  # the ends of the partitions (slow on a loaded machine:
    while time.monotonic() < deadline and not all(r._eof.get(k) for k in (k0, k1, k2)):
        r._poll(0.2)  # one 0.5 s poll saw partition 0's end only later, in a CI run)
    assert all(r._eof.get(k) for k in (k0, k1, k2))
    assert r.split_keys() == [k0, k1, k2]  # none idle yet
    now = time.monotonic()
    r._last_data.update({k0: now - 1, k1: now - 1, k2: now - 6})
    assert r.split_keys() == [k0, k1]  # the empty partition is idle
    r._last_data.update({k0: now - 7, k1: now - 5.5})
    assert r.split_keys() == [k1]  # all idle: the one with the latest record
    kafka_broker.produce(t, ["new"], partition=2)
    got, _ = read_all(r, until=1)
    assert [(x.partition, x.value) for x in got] == [(2, "new")]
    assert k2 in r.split_keys()  # a record makes it active again
    r.close()


# ---------------------------------------------------------------- gaps at the end of the log


class _Err:
    def __init__(self, code):
        self._code = code

    def code(self):
        return self._code

    def str(self):
        return "end of partition"


class _Msg:
    def __init__(self, topic, offset, value=None, err=None):
        self._t, self._o, self._v, self._e = topic, offset, value, err

    def error(self):
        return self._e

    def topic(self):
        return self._t

    def partition(self):
        return 0

    def offset(self):
        return self._o

    def key(self):
        return None

    def value(self):
        return self._v

    def timestamp(self):
        return 1, 1000

    def headers(self):
        return None


class _TansuLikeConsumer:
    """One partition of ``n`` records whose offsets in ``late`` are not readable for the
    first ``late_fetches`` fetches (a batch whose high watermark the broker advanced before
    storing it: Tansu 0.6 with two producers); a fetch answers the readable records from the
    position on, and the position moves past the last one answered, as librdkafka's does."""

    def __init__(self, topic, n, late, late_fetches, hw_offset=0, tailing=True):
        self.topic, self.n, self.late, self.late_fetches = topic, n, set(late), late_fetches
        self.hw = n + hw_offset
        self.position = 0
        self.fetches = 0
        self.tailing = tailing  # the first fetch finds the partition empty (at its end)
        self.seeks = []

    def assign(self, tps):
        self.position = tps[0].offset

    def seek(self, tp):
        self.seeks.append(tp.offset)
        self.position = tp.offset

    def get_watermark_offsets(self, tp, timeout=None, cached=False):
        return 0, self.hw

    def consume(self, num, timeout):
        from confluent_kafka import KafkaError

        self.fetches += 1
        if self.tailing and self.fetches == 1:
            return [_Msg(self.topic, 0, err=_Err(KafkaError._PARTITION_EOF))]
        hidden = self.late if self.fetches <= self.late_fetches else set()
        out = [_Msg(self.topic, o, f"v{o}".encode()) for o in range(self.position, self.n)
               if o not in hidden]
        if out:
            self.position = out[-1].offset() + 1
            return out
        time.sleep(min(timeout, 0.005))
        return [_Msg(self.topic, self.position, err=_Err(KafkaError._PARTITION_EOF))]

    def close(self):
        pass


def _fake_reader(monkeypatch, consumer, **kwargs):
    from cutline.connectors import kafka as kafka_mod

    monkeypatch.setattr(kafka_mod, "_consumer", lambda *a, **kw: consumer)
    monkeypatch.setattr(kafka_mod, "_topics", lambda *a, **kw: {consumer.topic: [0]})
    src = KafkaSource("127.0.0.1:1", consumer.topic, value_format="str",
                      starting_offsets={consumer.topic: {0: 0}},
                      stopping_offsets={consumer.topic: {0: consumer.n}}, **kwargs)
    return opened(src)


class _EndInTheBatchConsumer(_TansuLikeConsumer):
    """Every record and then the partition's end in one ``consume`` batch, the end reported
    once (librdkafka reports an end once, until new records come)."""

    def consume(self, num, timeout):
        from confluent_kafka import KafkaError

        self.fetches += 1
        if self.fetches == 1:
            return [_Msg(self.topic, o, f"v{o}".encode()) for o in range(self.n)] + [
                _Msg(self.topic, self.n, err=_Err(KafkaError._PARTITION_EOF))]
        time.sleep(min(timeout, 0.005))
        return []


def test_an_end_that_comes_in_the_batch_of_its_records_is_kept(monkeypatch):
    """The records of a partition and its end in one fetch: the partition is at its end
    (it was not: the records' arrival undid the end reported after them, which the client
    does not report again, so an idle partition held the watermark back for good; CI saw it
    as a partition whose end never came)."""
    from cutline.connectors import kafka as kafka_mod

    c = _EndInTheBatchConsumer("t", 5, late=(), late_fetches=0)
    monkeypatch.setattr(kafka_mod, "_consumer", lambda *a, **kw: c)
    monkeypatch.setattr(kafka_mod, "_topics", lambda *a, **kw: {"t": [0]})
    r = opened(KafkaSource("127.0.0.1:1", "t", value_format="str",
                           starting_offsets={"t": {0: 0}}))  # unbounded: it tails
    got = r.read_batch(100)  # (assigns, fetches: the records and the end in one batch)
    assert [x.offset for x in got] == [0, 1, 2, 3, 4]
    assert r._eof["t/0"]
    assert r.read_batch(100) == []
    assert r._eof["t/0"] and not r._active("t/0", time.monotonic() + 10, 5.0)


def test_a_gap_at_the_end_of_the_log_is_fetched_again_until_its_records_come(monkeypatch):
    """The broker answers offsets 0, 1, 4, 5 while 2 and 3 are still being stored: the
    reader fetches again from 2 and delivers every record once (without the re-fetch it
    would have ended at offset 6 with 2 and 3 lost)."""
    c = _TansuLikeConsumer("t", 6, late={2, 3}, late_fetches=3)
    r = _fake_reader(monkeypatch, c)
    got, ended = read_all(r, timeout=10)
    assert ended
    assert [x.offset for x in got] == [0, 1, 2, 3, 4, 5]
    assert [x.value for x in got] == [f"v{i}" for i in range(6)]
    assert c.seeks and set(c.seeks) == {2}
    assert (r.gaps_refetched, r.offsets_skipped) == (1, 0)


def test_a_gap_that_stays_is_taken_as_offsets_without_records(monkeypatch):
    """Offsets with no record (transaction markers, compaction) stay missing: after
    ``gap_recheck`` seconds of fetching again the reader goes on past them, counted."""
    c = _TansuLikeConsumer("t", 6, late={2, 3}, late_fetches=10**9)
    r = _fake_reader(monkeypatch, c, gap_recheck=0.1)
    t0 = time.monotonic()
    got, ended = read_all(r, timeout=10)
    assert ended and time.monotonic() - t0 >= 0.1
    assert [x.offset for x in got] == [0, 1, 4, 5]
    assert (r.gaps_refetched, r.offsets_skipped) == (0, 2)


@pytest.mark.parametrize("how", ["far from the end", "a backlog", "gap_recheck=0"])
def test_a_gap_far_from_the_end_or_with_rechecks_off_is_not_fetched_again(monkeypatch, how):
    """A gap far from the partition's end, or read by a reader that has not been at the
    end lately (a backlog: a transactional or compacted topic's gaps cost nothing), or
    with ``gap_recheck=0``, is taken at once (what happened before the re-fetch existed:
    offsets 2 and 3 are lost when they are a batch still being stored)."""
    from cutline.connectors.kafka import _GAP_NEAR_END

    c = _TansuLikeConsumer("t", 6, late={2, 3}, late_fetches=10**9,
                           hw_offset=_GAP_NEAR_END if how == "far from the end" else 0,
                           tailing=how != "a backlog")
    r = _fake_reader(monkeypatch, c, **({"gap_recheck": 0} if how == "gap_recheck=0" else {}))
    got, ended = read_all(r, timeout=10)
    assert ended and [x.offset for x in got] == [0, 1, 4, 5]
    assert c.seeks == [] and r.offsets_skipped == 2


def test_gap_recheck_must_not_be_negative():
    with pytest.raises(ValueError, match="gap_recheck"):
        KafkaSource("127.0.0.1:1", "t", gap_recheck=-1)
