"""``KafkaSink``: records to a Kafka topic, at least once or exactly once.

Three delivery modes:

- ``"at_least_once"``: records are produced as they come; ``pre_commit`` waits until the
  broker acknowledged every one (a checkpoint never completes over an unacknowledged
  record), so nothing is lost; a restore replays what came after the checkpoint, so a
  consumer may see some records twice.
- ``"exactly_once"`` (the default): a write-ahead log and an idempotent commit, like
  Flink's ``GenericWriteAheadSink`` with a ``CheckpointCommitter``.  The records written
  between two checkpoints are serialised, given their partition, and kept in the
  pre-commit *handle*, which the checkpoint stores (so they are as durable as the
  checkpoint).  When the checkpoint completes, ``commit`` produces them, each with a
  header ``cutline-id: <job>/<subtask>/<checkpoint>/<seq>``, and waits for the broker.
  On restore, ``recover`` reads every target partition back from the offset the handle
  noted at pre-commit (a lower bound of where its records can be) to its end, skips the
  records whose ``cutline-id`` is there, and produces the rest: a crash anywhere (also
  between a checkpoint's completion and its commit, or halfway through a commit) ends
  with each record in the topic once, as a plain ``read_uncommitted`` consumer sees it.
  It needs no broker transactions, so it holds on brokers without isolation (Tansu).
- ``"kafka_transactions"``: every checkpoint's records go in a Kafka transaction
  (``transactional.id`` = ``<prefix>-<job>-<subtask>-<n>``, ``n`` from a small pool);
  ``pre_commit`` flushes it open, ``commit`` commits it.  librdkafka cannot resume another
  producer's open transaction, so ``recover`` re-initialises the handle's
  ``transactional.id`` (which aborts a transaction left open), reads the partitions back
  ``read_committed`` and produces what is missing in a new transaction.  Only a broker
  with isolation (Apache Kafka, Redpanda) hides aborted records from ``read_committed``
  consumers; Tansu does not (docs/kafka.md says what was verified where).

``confluent_kafka`` is imported when a writer opens, not with this module.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .base import CommitError, UnsupportedRecordError, check_open, sink_label
from .kafka_messages import (
    ACCEPTS,
    KafkaBrokerError,
    KafkaTopicError,
    UndeliverableRecordError,
    header_list,
    id_header,
    identity,
    murmur2_partition,
    serialiser,
)

__all__ = ["DELIVERY_MODES", "KafkaBrokerError", "KafkaSink", "KafkaSinkWriter",
           "KafkaTopicError", "UndeliverableRecordError"]

log = logging.getLogger("cutline.kafka")

DELIVERY_MODES = ("at_least_once", "exactly_once", "kafka_transactions")
_POOL = 4  # transactional ids per subtask that recover() fences (aborts left-open ones)
_WARN_AFTER = 5.0  # seconds without acknowledgements before a stall is logged


# ------------------------------------------------------------------ the sink

class KafkaSink:
    """Write records to the Kafka topic ``topic`` at ``bootstrap_servers``.

    A record becomes a Kafka message through ``key`` / ``value`` (functions of the record;
    default: no key, the record itself as the value), then ``key_serializer`` /
    ``value_serializer``: ``"bytes"``, ``"str"`` (UTF-8), ``"json"``, or a function
    returning bytes.  ``partition``: a fixed partition or a function of the record; by
    default keyed records go to Kafka's murmur2 partition of their key bytes (the Java
    client's and librdkafka's ``murmur2`` choice), records without a key round-robin over
    the partitions.  ``headers``: a dict or list of ``(name, bytes or str)``, or a function
    of the record returning one.  ``timestamp``: a function of the record returning its
    time in seconds (default: the time it is produced).

    ``delivery``: ``"exactly_once"`` (default), ``"at_least_once"`` or
    ``"kafka_transactions"`` (module docstring).  ``timeout`` (seconds): how long the sink
    waits for a broker that does not answer (at open, and for each record's
    acknowledgement: librdkafka's ``message.timeout.ms``) before the job fails with
    :class:`KafkaBrokerError` naming the broker; while it waits, a commit stalls and
    resumes without loss when the broker answers again.  ``config``: more librdkafka
    settings for every client the sink opens (security, ...); ``producer_config``: for the
    producer only.  ``transactional_id_prefix``: ``kafka_transactions`` only.
    ``partition_check`` (seconds, default 30): how often (at a checkpoint's pre-commit) the
    sink reads the topic's partition count again; partitions added to the topic are written
    to from then on, keyed records going to murmur2 over the new count as Kafka's own
    producers do (a key's later records may then be in another partition than its earlier
    ones), and a ``partition`` function may name them at once.

    A topic that does not exist fails the job at start (:class:`KafkaTopicError`); a record
    the broker refuses fails it naming the record (:class:`UndeliverableRecordError`).
    """

    def __init__(self, topic: str, bootstrap_servers: str, *,
                 delivery: str = "exactly_once",
                 key: Callable[[Any], Any] | None = None,
                 value: Callable[[Any], Any] | None = None,
                 key_serializer: Any = "str", value_serializer: Any = "json",
                 partition: int | Callable[[Any], int] | None = None,
                 headers: Any = None, timestamp: Callable[[Any], float] | None = None,
                 timeout: float = 60.0, config: dict | None = None,
                 producer_config: dict | None = None,
                 transactional_id_prefix: str = "cutline", name: str | None = None,
                 partition_check: float = 30.0) -> None:
        if not topic or not isinstance(topic, str):
            raise ValueError(f"KafkaSink needs a topic name, got {topic!r}")
        if not bootstrap_servers or not isinstance(bootstrap_servers, str):
            raise ValueError(f"KafkaSink needs bootstrap_servers ('host:port,...'), "
                             f"got {bootstrap_servers!r}")
        if delivery not in DELIVERY_MODES:
            raise ValueError(f"KafkaSink delivery must be one of {', '.join(DELIVERY_MODES)}, "
                             f"got {delivery!r}")
        for fn, what in ((key, "key"), (value, "value"), (timestamp, "timestamp")):
            if fn is not None and not callable(fn):
                raise TypeError(f"KafkaSink {what}= must be a function of the record, "
                                f"got {fn!r}")
        if partition is not None and not callable(partition) and (
                type(partition) is not int or partition < 0):
            raise ValueError(f"KafkaSink partition= must be a partition number >= 0 or a "
                             f"function of the record, got {partition!r}")
        if not timeout or timeout <= 0:
            raise ValueError(f"KafkaSink timeout must be > 0 seconds, got {timeout!r}")
        if not isinstance(partition_check, (int, float)) or partition_check < 0:
            raise ValueError(f"KafkaSink partition_check must be >= 0 seconds, got "
                             f"{partition_check!r}")
        self.partition_check = float(partition_check)
        serialiser(key_serializer, "key")
        serialiser(value_serializer, "value")
        self.topic, self.bootstrap_servers, self.delivery = topic, bootstrap_servers, delivery
        self.key, self.value, self.partition = key, value, partition
        self.key_serializer, self.value_serializer = key_serializer, value_serializer
        self.headers, self.timestamp, self.timeout = headers, timestamp, float(timeout)
        self.config = dict(config or {})
        self.producer_config = dict(producer_config or {})
        self.transactional_id_prefix = transactional_id_prefix
        self.name = name or f"kafka:{topic}"

    def create_writer(self) -> KafkaSinkWriter:
        return KafkaSinkWriter(self)

    def client_config(self, **extra: Any) -> dict[str, Any]:
        return {"bootstrap.servers": self.bootstrap_servers, **self.config, **extra}

    def __repr__(self) -> str:
        return f"KafkaSink({self.topic!r}, {self.bootstrap_servers!r}, delivery={self.delivery!r})"



@dataclass
class _Txn:
    """A Kafka transaction (``kafka_transactions``): its producer and ``transactional.id``,
    the ``cutline-id`` batch of its records, and each partition's end when it began."""

    producer: Any
    tid: str
    batch: str = ""
    since: dict[int, int] = field(default_factory=dict)


class KafkaSinkWriter:
    """One sink subtask: its producer and the records written since the last pre-commit."""

    def __init__(self, sink: KafkaSink) -> None:
        self._sink = sink
        self._producer: Any = None
        self._waiting: tuple[float, int, str] | None = None  # a wait for acks: since, n, why
        # called (by the task) about every second while the writer waits for the broker,
        # so that its stall is reported while the task is blocked in the wait
        self.on_wait: Callable[[], None] | None = None
        self._key = serialiser(sink.key_serializer, "key")
        self._value = serialiser(sink.value_serializer, "value")

    # ------------------------------------------------------------------ opening

    def open(self, subtask: int, parallelism: int, job: str) -> None:
        check_open(subtask, parallelism, job)
        import confluent_kafka  # noqa: F401 - fails here, named, when it is not installed

        self._subtask, self._parallelism, self._job = subtask, parallelism, job
        self._staged: list[list[Any]] = []  # [partition, key, value, headers, ts_ms]
        self._errors: list[tuple[Any, Any]] = []  # (KafkaError, message) from callbacks
        self._rr = subtask  # round-robin partition of records without a key
        self._ends: dict[int, int] = {}  # partition -> a lower bound of its end offset
        self._committed: set[int] = set()  # checkpoints this writer committed
        self._pending: dict[int, _Txn] = {}  # kafka_transactions: pre-committed
        self._free: list[_Txn] = []  # kafka_transactions: producers with no transaction
        self._txn: _Txn | None = None  # kafka_transactions: the open transaction
        self._tids = _POOL  # the next transactional id beyond the fenced pool
        conf = {**self._sink.config, **self._sink.producer_config}
        self._max_bytes = int(conf.get("message.max.bytes", 1_000_000))
        self._partitions = self._describe_topic()
        self._checked = time.monotonic()  # when the partition count was last read
        self._asked = -1e9  # ... because a record named a partition beyond it
        if self._sink.delivery != "kafka_transactions":
            self._producer = self._new_producer()
        if self._sink.delivery != "at_least_once":
            self._ends = self._end_offsets()

    @property
    def _broker(self) -> str:
        return self._sink.bootstrap_servers

    def _unanswered(self, what: str, e: Any) -> KafkaBrokerError:
        return KafkaBrokerError(
            f"sink {sink_label(self)}: Kafka broker {self._broker} did not {what} within "
            f"{self._sink.timeout:g} s (KafkaSink timeout){f': {e}' if e else ''}")

    def _describe_topic(self) -> int:
        """The topic's partition count; fails naming it when it does not exist.  Asks for
        every topic, never for the one: a broker that creates topics on a metadata request
        for them (Tansu) would create it."""
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        topic = self._sink.topic
        try:
            meta = AdminClient(self._sink.client_config()).list_topics(
                timeout=self._sink.timeout)
        except KafkaException as e:
            raise self._unanswered("answer a metadata request", e) from None
        found = meta.topics.get(topic)
        if found is None:
            known = sorted(t for t in meta.topics if not t.startswith("__"))
            raise KafkaTopicError(
                f"sink {sink_label(self)}: topic {topic!r} does not exist on Kafka broker "
                f"{self._broker} (create it first; its topics: "
                f"{', '.join(known[:20]) or 'none'})")
        if found.error is not None:
            raise KafkaTopicError(f"sink {sink_label(self)}: topic {topic!r} on Kafka broker "
                                  f"{self._broker}: {found.error}")
        return len(found.partitions)

    def _check_partitions(self, now: bool = False) -> None:
        """Read the topic's partition count again (at a pre-commit, every
        ``partition_check`` seconds; ``now``: a record names a partition beyond it):
        partitions added since are written to from then on."""
        t = time.monotonic()
        if not now and t - self._checked < self._sink.partition_check:
            return
        if now:
            if t - self._asked < 1.0:
                return  # (a function that names no partition of the topic: not per record)
            self._asked = t
        self._checked = t
        n = self._describe_topic()
        if n > self._partitions:
            log.info("KafkaSink %s: topic %r has %d partitions now (had %d): records go to "
                     "all of them from here on", sink_label(self), self._sink.topic, n,
                     self._partitions)
            self._partitions = n

    def _end_offsets(self) -> dict[int, int]:
        """Each partition's end offset as ListOffsets says: a lower bound of where later
        records land (Tansu 0.6 answers the last batch's base offset + 1, lower still)."""
        from confluent_kafka import KafkaException, TopicPartition
        from confluent_kafka.admin import AdminClient, OffsetSpec

        admin = AdminClient(self._sink.client_config())
        want = {TopicPartition(self._sink.topic, p): OffsetSpec.latest()
                for p in range(self._partitions)}
        try:
            futures = admin.list_offsets(want, request_timeout=self._sink.timeout)
            return {tp.partition: max(0, f.result().offset) for tp, f in futures.items()}
        except KafkaException as e:
            raise self._unanswered(f"list the offsets of {self._sink.topic!r}", e) from None

    def _new_producer(self, transactional_id: str | None = None) -> Any:
        from confluent_kafka import Producer

        ms = int(self._sink.timeout * 1000)
        # request.timeout.ms = message.timeout.ms: no second copy of a request a paused
        # broker may still answer; the message timeout bounds the wait instead
        conf = self._sink.client_config(**{
            "enable.idempotence": True, "acks": "all", "linger.ms": 5,
            "message.timeout.ms": ms, "request.timeout.ms": ms,
            "error_cb": self._on_client_error})
        conf.update(self._sink.producer_config)
        if transactional_id is not None:
            conf["transactional.id"] = transactional_id
            conf.setdefault("transaction.timeout.ms", max(2 * ms, 60_000))
        return Producer(conf)

    def _on_client_error(self, err: Any) -> None:
        # transport errors while the broker is away: librdkafka retries them itself
        log.debug("KafkaSink %s: %s", self._sink.topic, err)

    # ------------------------------------------------------------------ writing

    def _message(self, record: Any) -> list[Any]:
        """``record`` as ``[partition, key, value, headers, timestamp_ms]``."""
        s = self._sink
        try:
            key = self._key(s.key(record)) if s.key is not None else None
            value = self._value(s.value(record) if s.value is not None else record)
            headers = header_list(s.headers(record) if callable(s.headers) else s.headers)
            ts = int(s.timestamp(record) * 1000) if s.timestamp is not None else None
        except (TypeError, ValueError, OverflowError, UnicodeError) as e:
            raise UnsupportedRecordError(
                sink_label(self), record, "records its key, value, headers and timestamp "
                "functions and serializers turn into bytes", f"{type(e).__name__}: {e}",
            ) from None
        for name, part in (("key", key), ("value", value)):
            if part is not None and type(part) is not bytes:
                raise UnsupportedRecordError(
                    sink_label(self), record, "serializers that return bytes",
                    f"its {name} serializer returned {type(part).__name__}", value=part)
        size = len(key or b"") + len(value or b"") + sum(
            len(k) + len(v or b"") for k, v in headers or ())
        if size > self._max_bytes:
            raise UndeliverableRecordError(
                sink_label(self), record, ACCEPTS,
                f"its message is {size} bytes, over message.max.bytes {self._max_bytes}")
        if s.partition is None:
            if key is not None:
                p = murmur2_partition(key, self._partitions)
            else:
                p = self._rr % self._partitions
                self._rr += 1
        else:
            p = s.partition(record) if callable(s.partition) else s.partition
            if type(p) is int and p >= self._partitions:
                self._check_partitions(now=True)  # added since the last look?
            if type(p) is not int or not 0 <= p < self._partitions:
                raise UnsupportedRecordError(
                    sink_label(self), record, f"partitions 0 to {self._partitions - 1}",
                    f"its partition {p!r} is not one of topic {s.topic!r}'s")
        return [p, key, value, headers, ts]

    def write(self, batch: list) -> None:
        if batch and type(batch[0]).__module__ == "pyarrow.lib":  # a batch stream's rows
            batch = [row for rb in batch for row in rb.to_pylist()]
        msgs = [self._message(r) for r in batch]
        mode = self._sink.delivery
        if mode == "at_least_once":
            self._produce(self._producer, msgs, None)
            return
        start = len(self._staged)
        self._staged.extend(msgs)
        if mode == "kafka_transactions" and msgs:
            if self._txn is None:
                self._txn = self._begin()
            self._produce(self._txn.producer, msgs,
                          (self._job, self._subtask, self._txn.batch, start))

    def _produce(self, producer: Any, msgs: list[list[Any]], ident: tuple | None,
                 skip: set[int] | None = None) -> None:
        """Hand ``msgs`` to ``producer`` (waiting while its queue is full).  ``ident``:
        ``(job, subtask, batch, first seq)`` of their ``cutline-id`` headers."""
        topic, on_delivery = self._sink.topic, self._delivered
        for i, (p, key, value, headers, ts) in enumerate(msgs):
            if skip is not None and i in skip:
                continue
            hdrs = [(k, v) for k, v in headers] if headers else []
            if ident is not None:
                job, sub, batch, first = ident
                hdrs.append(id_header(job, sub, batch, first + i))
            kw: dict[str, Any] = {"partition": p, "on_delivery": on_delivery}
            if hdrs:
                kw["headers"] = hdrs
            if ts is not None:
                kw["timestamp"] = ts
            waited = time.monotonic()
            while True:
                try:
                    producer.produce(topic, value=value, key=key, **kw)
                    break
                except BufferError:  # the queue is full: the broker is slow or away
                    producer.poll(0.1)
                    self._waiting = (waited, len(producer), "the producer's queue full")
                    if self.on_wait is not None:
                        self.on_wait()
                    self._check(waited, "take records to")
                except Exception as e:  # noqa: BLE001 - librdkafka refuses the record
                    raise self._undeliverable(e, p, key, value) from None
        self._waiting = None
        producer.poll(0)
        self._raise_errors()

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is not None:
            self._errors.append((err, msg))
            return
        p, off = msg.partition(), msg.offset()
        if off is not None and off + 1 > self._ends.get(p, 0):
            self._ends[p] = off + 1

    def _undeliverable(self, reason: Any, partition: int, key: Any,
                       value: Any) -> UndeliverableRecordError:
        return UndeliverableRecordError(
            sink_label(self), {"key": key, "value": value}, ACCEPTS,
            f"topic {self._sink.topic!r} partition {partition} on Kafka broker "
            f"{self._broker} refused it: {reason}")

    def _raise_errors(self) -> None:
        """Fail with the first delivery error: the broker unreachable (retried from the
        latest checkpoint), or the record refused (fatal, naming the record)."""
        if not self._errors:
            return
        err, msg = self._errors[0]
        self._errors.clear()
        from confluent_kafka import KafkaError

        if err.retriable() or err.code() in (KafkaError._MSG_TIMED_OUT, KafkaError._TIMED_OUT,
                                             KafkaError._TRANSPORT,
                                             KafkaError._ALL_BROKERS_DOWN):
            raise self._unanswered(
                f"acknowledge a record to {self._sink.topic!r} partition {msg.partition()}",
                err.str())
        raise self._undeliverable(err.str(), msg.partition(), msg.key(), msg.value())

    def _check(self, since: float, what: str) -> None:
        """Fail when the broker has not answered for longer than the timeout (librdkafka's
        own message timeout normally fires first)."""
        self._raise_errors()
        if time.monotonic() - since > self._sink.timeout + 10:
            raise self._unanswered(f"{what} {self._sink.topic!r}", None)

    def stalled(self) -> str | None:
        """Why the sink cannot go on now (its broker has not acknowledged its records for
        a few seconds), or None: the live line, the dashboard and ``/metrics`` show it."""
        w = self._waiting
        if w is None:
            return None
        quiet = time.monotonic() - w[0]
        if quiet < _WARN_AFTER:
            return None
        return (f"Kafka broker(s) {self._broker} not acknowledging {w[1]} records to "
                f"{self._sink.topic!r} for {quiet:.0f} s ({w[2]})")

    def _flush(self, producer: Any, doing: str) -> None:
        """Wait until the broker acknowledged everything ``producer`` sent: a stall is
        logged and reported (:meth:`stalled`, :attr:`on_wait`) after a few seconds, the
        sink's timeout fails it naming the broker."""
        start, warned = time.monotonic(), False
        try:
            while True:
                left = producer.flush(1.0)
                self._raise_errors()
                if left == 0:
                    if warned:
                        log.warning("KafkaSink %s: Kafka broker %s answers again after "
                                    "%.1f s", self._sink.topic, self._broker,
                                    time.monotonic() - start)
                    return
                self._waiting = (start, left, doing)
                if self.on_wait is not None:
                    self.on_wait()
                waited = time.monotonic() - start
                if waited > _WARN_AFTER and not warned:
                    warned = True
                    log.warning("KafkaSink %s: Kafka broker %s has not acknowledged %d "
                                "records for %.0f s (%s); waiting up to %g s",
                                self._sink.topic, self._broker, left, waited, doing,
                                self._sink.timeout)
                self._check(start, f"acknowledge {left} records ({doing}) to")
        finally:
            self._waiting = None
            if warned and self.on_wait is not None:
                self.on_wait()  # (rate-limited: the next report says it is over)

    # ------------------------------------------------------------------ two-phase commit

    def pre_commit(self, checkpoint_id: int) -> dict:
        cid, mode = int(checkpoint_id), self._sink.delivery
        self._raise_errors()  # a delivery report of an earlier commit
        self._check_partitions()  # for the records after this checkpoint
        if mode == "at_least_once":
            self._flush(self._producer, f"checkpoint {cid}")
            return {"delivery": mode, "checkpoint_id": cid, "subtask": self._subtask}
        records, self._staged = self._staged, []
        targets = sorted({r[0] for r in records})
        handle = {"delivery": mode, "job": self._job, "subtask": self._subtask,
                  "checkpoint_id": cid, "batch": str(cid), "topic": self._sink.topic,
                  "records": records}
        since = self._ends
        txn, self._txn = self._txn, None
        if txn is not None:  # kafka_transactions: flushed, left open until the commit
            self._flush(txn.producer, f"pre-commit of checkpoint {cid}")
            handle["tid"], handle["batch"], since = txn.tid, txn.batch, txn.since
            self._pending[cid] = txn
        handle["since"] = [[p, since.get(p, 0)] for p in targets]
        return handle

    def commit(self, handles: list[dict]) -> None:
        mode = self._sink.delivery
        if mode == "at_least_once":
            return
        for h in handles:
            cid = h["checkpoint_id"]
            if h["subtask"] != self._subtask or cid in self._committed or not h["records"]:
                continue  # (another subtask's handle is only ever recovered)
            if mode == "kafka_transactions":
                txn = self._pending.pop(cid, None)
                if txn is None:  # not this writer's transaction: re-commit it
                    self._recommit([h])
                else:
                    self._end(txn, commit=True, what=f"checkpoint {cid}")
            else:
                self._produce(self._producer, h["records"],
                              (h["job"], h["subtask"], h["batch"], 0))
                self._flush(self._producer, f"commit of checkpoint {cid}")
            self._committed.add(cid)

    def abort(self, handles: list[dict]) -> None:
        for h in handles:
            txn = self._pending.pop(h.get("checkpoint_id", -1), None)
            if txn is not None:
                self._end(txn, commit=False, what=f"checkpoint {h['checkpoint_id']}")

    def recover(self, handles: list[dict]) -> None:
        """Re-commit ``handles`` (this subtask's, or after a rescale old subtasks'): produce
        each staged record its partition does not hold yet (by ``cutline-id``)."""
        mode = self._sink.delivery
        self._staged, self._committed = [], set()
        for txn in [*self._pending.values(), *([self._txn] if self._txn else [])]:
            self._end(txn, commit=False, what="recovery")
        self._pending, self._txn = {}, None
        if mode == "at_least_once":
            return
        handles = [h for h in handles if h.get("records")]
        if mode == "kafka_transactions":
            # abort what an earlier run left open under this subtask's ids and the handles'
            fenced = {self._tid(n) for n in range(_POOL)}
            self._free = [self._fence(tid) for tid in sorted(fenced)]
            for tid in sorted({h["tid"] for h in handles if h.get("tid")} - fenced):
                self._fence(tid).producer.flush(0)
        self._recommit(handles)

    def _recommit(self, handles: list[dict]) -> None:
        """Produce the records of ``handles`` that the topic does not hold yet."""
        mode = self._sink.delivery
        if not handles:
            return
        present = self._read_back(handles)
        for h in handles:
            ident = (h["job"], h["subtask"], h["batch"])
            skip = present.get(ident, set())
            if len(skip) >= len(h["records"]):
                continue
            log.info("KafkaSink %s: re-committing checkpoint %d of subtask %d (%d of %d "
                     "records)", self._sink.topic, h["checkpoint_id"], h["subtask"],
                     len(h["records"]) - len(skip), len(h["records"]))
            what = f"recovered checkpoint {h['checkpoint_id']}"
            if mode == "kafka_transactions":
                txn = self._begin()
                self._produce(txn.producer, h["records"], (*ident, 0), skip)
                self._end(txn, commit=True, what=what)
            else:
                self._produce(self._producer, h["records"], (*ident, 0), skip)
                self._flush(self._producer, what)

    def _read_back(self, handles: list[dict]) -> dict[tuple, set[int]]:
        """``(job, subtask, batch) -> seqs`` of the handles' records already in the topic:
        every partition they target, read from the lowest offset their handles noted to
        its end (``read_committed`` for Kafka transactions)."""
        from confluent_kafka import Consumer, KafkaError, TopicPartition

        start: dict[int, int] = {}
        for h in handles:
            for p, off in h["since"]:
                start[p] = min(off, start.get(p, off))
        wanted = {(h["job"], h["subtask"], h["batch"]) for h in handles}
        iso = ("read_committed" if self._sink.delivery == "kafka_transactions"
               else "read_uncommitted")
        consumer = Consumer(self._sink.client_config(**{
            "group.id": f"cutline-sink-{self._job}", "enable.auto.commit": False,
            "enable.partition.eof": True, "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 20,  # the end of a partition is known from a fetch answer
            "isolation.level": iso}))
        present: dict[tuple, set[int]] = {}
        try:
            consumer.assign([TopicPartition(self._sink.topic, p, off)
                             for p, off in sorted(start.items())])
            todo, since = set(start), time.monotonic()
            while todo:
                msgs = consumer.consume(1000, 0.5)
                if not msgs:
                    self._check(since, "answer the read-back of")
                for msg in msgs:
                    err = msg.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            todo.discard(msg.partition())
                        elif not err.retriable():
                            raise self._unanswered(f"let {self._sink.topic!r} be read back",
                                                   err.str())
                        continue
                    since = time.monotonic()
                    ident = identity(msg.headers())
                    if ident is not None and ident[:3] in wanted:
                        present.setdefault(ident[:3], set()).add(ident[3])
        finally:
            consumer.close()
        return present

    # ------------------------------------------------------------------ Kafka transactions

    def _tid(self, n: int) -> str:
        return f"{self._sink.transactional_id_prefix}-{self._job}-{self._subtask}-{n}"

    def _fence(self, tid: str) -> _Txn:
        """A new producer under ``tid``, initialised: the broker aborts a transaction an
        earlier producer left open under the same id."""
        from confluent_kafka import KafkaException

        producer = self._new_producer(tid)
        try:
            producer.init_transactions(self._sink.timeout)
        except KafkaException as e:
            raise self._unanswered(f"initialise transactional id {tid!r}", e) from None
        return _Txn(producer, tid)

    def _begin(self) -> _Txn:
        """A producer with a new open transaction: a free one, else one more id."""
        if self._free:
            txn = self._free.pop()
        else:
            txn = self._fence(self._tid(self._tids))
            self._tids += 1
        txn.producer.begin_transaction()
        txn.batch = f"t{uuid.uuid4().hex[:12]}"
        txn.since = dict(self._ends)
        return txn

    def _end(self, txn: _Txn, *, commit: bool, what: str) -> None:
        from confluent_kafka import KafkaException

        try:
            if commit:
                self._flush(txn.producer, what)
                txn.producer.commit_transaction(self._sink.timeout)
            else:
                txn.producer.abort_transaction(self._sink.timeout)
        except KafkaException as e:
            if not commit:
                log.warning("KafkaSink %s: aborting the transaction of %s: %s",
                            self._sink.topic, what, e)
                return
            raise CommitError(
                f"sink {sink_label(self)}: committing the Kafka transaction of {what} "
                f"({txn.tid}) on broker {self._broker} failed: {e}") from None
        self._free.append(txn)

    def close(self) -> None:
        # Records not pre-committed are dropped on purpose: a restore replays them
        # (at_least_once: those already produced may still go out; duplicates are allowed).
        if self._producer is not None:
            self._producer.flush(0)
        self._producer, self._free, self._pending, self._txn = None, [], {}, None
        self._staged = []

    def __repr__(self) -> str:
        return f"KafkaSinkWriter({self._sink!r})"
