"""Kafka source: a topic's partitions are the source's splits; their offsets live in checkpoints.

``KafkaSource(bootstrap, topics)`` reads with ``confluent-kafka`` (``pip install
cutline[kafka]``), imported when a reader opens, so cutline works without it.

- **Assignment.**  No consumer-group rebalancing: every subtask computes the same owner for
  a partition, ``(crc32(topic) + partition) % parallelism`` (Flink's KafkaSource does the
  same with the topic's hash), and ``assign()``\\ s its partitions.  Unbounded readers list
  the topics again every ``discovery_interval`` seconds; a partition that appears after the
  job started (a new partition, or a new topic matching ``pattern``) is read from its
  earliest offset.
- **Offsets.**  A reader's position is the next offset of each of its partitions; it is the
  only truth for recovery (restore, rescale: partitions move with their offsets).  When a
  checkpoint completes the offsets it holds are also committed to ``group_id`` (if given),
  for lag tools only (Flink does both).
- **Start / stop.**  ``starting_offsets``: ``"earliest"``, ``"latest"``, ``"committed"``
  (the group's, else ``"earliest"``), or explicit ``{topic: {partition: offset}}``;
  ``starting_timestamp``: the first record at or after that time in each partition.
  ``stopping_offsets`` (``"latest"`` or explicit) bounds the run: a partition is finished
  once its position reaches its stop, and the end of input comes when all are (Spark's
  ``endingOffsets``).  Both are resolved once, at the first start, and kept in checkpoints.
- **Records.**  :class:`KafkaRecord` (key, value, topic, partition, offset, timestamp in
  seconds, headers); ``key_format`` / ``value_format``: ``"bytes"``, ``"str"``, ``"json"`` or
  a function of the bytes.  A value that does not decode fails the job naming topic,
  partition and offset (:class:`KafkaRecordError`); read ``"bytes"`` and decode in a
  ``map(..., on_error="dead_letter")`` to send such records to the dead-letter sink instead.
- **Event time.**  A batch comes from one partition (``split_key``); with
  ``assign_timestamps`` right after the source each partition has its own watermark and the
  partitions are read aligned (the one furthest behind next).  With
  ``assign_timestamps(..., idle_timeout=t)`` a partition with nothing new for ``t`` seconds
  stops holding the watermark back until a record arrives (Flink's ``withIdleness``, per
  partition); when all of a subtask's partitions are idle its watermark is the one that
  had a record last, as if they had gone idle one after the other, and the subtask is idle.
- **Broker trouble.**  A broker that stops answering stalls the reader (``stalled()`` says
  since when); if it does not answer for ``broker_timeout`` seconds the job fails naming
  it (:class:`KafkaBrokerError`).  A topic that does not exist fails the job at the start.

- **Gaps.**  A fetch that skips offsets (``n`` expected, ``n + k`` delivered) is normal
  in Kafka (transaction markers, compacted records), but a broker may also answer a fetch
  with the batches after one it has not stored yet: Tansu 0.6 advances a partition's high
  watermark before it stores the batch, so with two producers writing one partition a
  fetch at the end of the log can return the second producer's batch without the first's,
  and the consumer's position moves past records that appear a moment later.  So a reader
  that was at a partition's end in the last :data:`_TAILING` seconds fetches a gap within
  :data:`_GAP_NEAR_END` offsets of the high watermark again (``seek`` back) until its
  records arrive or ``gap_recheck`` seconds have passed, and only then takes it as offsets
  with no record (a backlog's gaps, read far from the end, cost nothing).
  ``gaps_refetched`` and ``offsets_skipped`` count both outcomes.

``KafkaSource(...).batches(schema)``, the columnar reader, is in :mod:`.kafka_batches`.
The reader here is one piece on purpose (partitions' offsets, buffers, fetch ends and the
brokers' liveness change together on every read).

Some Kafka-compatible brokers answer ListOffsets imprecisely (Tansu 0.6: ``latest`` is the
last batch's base offset + 1, and a timestamp lookup always answers 0), so end offsets are
found by fetching to the end of the partition, and a timestamp start skips the records
before the first one at or after it.
"""

from __future__ import annotations

import json
import logging
import re
import time
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from ..protocol.watermarks import next_split
from .base import RecordError, UnavailableError

if TYPE_CHECKING:
    from .kafka_batches import ColumnarKafkaSource

log = logging.getLogger(__name__)

__all__ = ["KafkaBrokerError", "KafkaRecord", "KafkaRecordError", "KafkaSource",
           "KafkaTopicError", "owner_of"]

FORMATS = ("bytes", "str", "json")
_EARLIEST, _LATEST = -2, -1  # Kafka's logical offsets (in explicit offset dicts too)
_BUFFER = 4096  # records buffered per partition before its fetching pauses
_GAP_NEAR_END = 100_000  # a gap this close to the high watermark is fetched again
_TAILING = 10.0  # ... by a reader that was at the partition's end this recently (seconds)


class KafkaRecord(NamedTuple):
    """One Kafka record as the pipeline sees it.  ``timestamp``: the record's Kafka
    timestamp in seconds (usable as event time), None if it has none."""

    key: Any
    value: Any
    topic: str
    partition: int
    offset: int
    timestamp: float | None
    headers: tuple[tuple[str, bytes | None], ...] = ()


class KafkaRecordError(RecordError):
    """A Kafka record that does not decode: names topic, partition and offset (fatal)."""

    def __init__(self, topic: str, partition: int, offset: int, reason: str) -> None:
        super().__init__(f"{topic}/{partition}", offset, reason)
        self.topic, self.partition, self.offset = topic, partition, offset
        ValueError.__init__(self, f"undecodable record in Kafka topic {topic!r} partition "
                                  f"{partition} offset {offset}: {reason}")


class KafkaTopicError(LookupError):
    """A topic the source reads does not exist (at the start of the job)."""


class KafkaBrokerError(UnavailableError):
    """The Kafka brokers did not answer for the source's ``broker_timeout``."""


def owner_of(topic: str, partition: int, parallelism: int) -> int:
    """The subtask that reads ``topic``'s ``partition``: the same in every process."""
    return (zlib.crc32(topic.encode()) + partition) % parallelism


def _split(topic: str, partition: int) -> str:
    return f"{topic}/{partition}"


def _parse_split(key: str) -> tuple[str, int]:
    topic, _, part = key.rpartition("/")
    return topic, int(part)


def _decoder(fmt: Any, what: str) -> Callable[[bytes | None], Any]:
    if callable(fmt):
        return fmt
    if fmt == "bytes":
        return _as_bytes
    if fmt == "str":
        return _as_str
    if fmt == "json":
        return _as_json
    raise ValueError(f"{what} must be one of {', '.join(FORMATS)} or a function of the "
                     f"bytes, got {fmt!r}")


def _as_bytes(b: bytes | None) -> Any:
    return b


def _as_str(b: bytes | None) -> Any:
    return None if b is None else b.decode()


def _as_json(b: bytes | None) -> Any:
    return None if b is None else json.loads(b)


def _explicit(offsets: Mapping[Any, Any], what: str) -> dict[str, int]:
    """``{topic: {partition: offset}}`` or ``{(topic, partition): offset}`` -> split -> offset."""
    out: dict[str, int] = {}
    for k, v in offsets.items():
        if isinstance(k, tuple):
            out[_split(str(k[0]), int(k[1]))] = int(v)
        elif isinstance(v, Mapping):
            for p, off in v.items():
                out[_split(str(k), int(p))] = int(off)
        else:
            raise TypeError(f"{what}: expected {{topic: {{partition: offset}}}} or "
                            f"{{(topic, partition): offset}}, got {k!r}: {v!r}")
    return out


class KafkaSource:
    """Read Kafka topics; see the module's documentation.

    ``bootstrap``: the brokers (``"host:port,..."``).  ``topics`` (a name or a list) or
    ``pattern`` (a regular expression a topic's whole name matches).  ``config``: more
    librdkafka consumer settings (``security.protocol``, ``sasl.*`` ...).  ``gap_recheck``:
    seconds a gap in a partition's offsets near its end is fetched again before it is taken
    for offsets that hold no record (see "Gaps" in the module's documentation); 0: never.
    """

    def __init__(self, bootstrap: str, topics: str | Sequence[str] | None = None, *,
                 pattern: str | None = None, group_id: str | None = None,
                 starting_offsets: str | Mapping[Any, Any] = "earliest",
                 starting_timestamp: Any = None,
                 stopping_offsets: str | Mapping[Any, Any] | None = None,
                 key_format: Any = "bytes", value_format: Any = "bytes",
                 name: str | None = None, discovery_interval: float = 30.0,
                 broker_timeout: float = 60.0,
                 stall_after: float = 5.0, gap_recheck: float = 0.2,
                 config: Mapping[str, Any] | None = None) -> None:
        if not isinstance(bootstrap, str) or not bootstrap:
            raise ValueError(f"bootstrap must be 'host:port[,host:port...]', got {bootstrap!r}")
        if (topics is None) == (pattern is None):
            raise ValueError("KafkaSource needs topics= or pattern= (one of them)")
        if isinstance(topics, str):
            topics = [topics]
        self.topics: list[str] | None = None if topics is None else list(topics)
        if self.topics is not None and not self.topics:
            raise ValueError("KafkaSource(topics=[]): no topic to read")
        self.pattern = pattern
        if pattern is not None:
            re.compile(pattern)
        if isinstance(starting_offsets, str):
            if starting_offsets not in ("earliest", "latest", "committed"):
                raise ValueError(f"starting_offsets must be 'earliest', 'latest', 'committed' "
                                 f"or {{topic: {{partition: offset}}}}, got {starting_offsets!r}")
            if starting_offsets == "committed" and group_id is None:
                raise ValueError("starting_offsets='committed' needs group_id=")
            self.starting: str | dict[str, int] = starting_offsets
        else:
            self.starting = _explicit(starting_offsets, "starting_offsets")
        self.starting_ms: int | None = None
        if starting_timestamp is not None:
            from ..protocol.watermarks import to_timestamp

            self.starting_ms = int(to_timestamp(starting_timestamp) * 1000)
        if stopping_offsets is None or stopping_offsets == "latest":
            self.stopping: str | dict[str, int] | None = stopping_offsets
        elif isinstance(stopping_offsets, Mapping):
            self.stopping = _explicit(stopping_offsets, "stopping_offsets")
        else:
            raise ValueError(f"stopping_offsets must be None, 'latest' or "
                             f"{{topic: {{partition: offset}}}}, got {stopping_offsets!r}")
        _decoder(key_format, "key_format")
        _decoder(value_format, "value_format")
        self.key_format, self.value_format = key_format, value_format
        for label, v in (("discovery_interval", discovery_interval),
                         ("broker_timeout", broker_timeout), ("stall_after", stall_after)):
            if not isinstance(v, (int, float)) or not v > 0:
                raise ValueError(f"{label} must be > 0 seconds, got {v!r}")
        self.bootstrap, self.group_id = bootstrap, group_id
        self.discovery_interval = discovery_interval
        self.broker_timeout, self.stall_after = broker_timeout, stall_after
        if not isinstance(gap_recheck, (int, float)) or gap_recheck < 0:
            raise ValueError(f"gap_recheck must be >= 0 seconds, got {gap_recheck!r}")
        self.gap_recheck = float(gap_recheck)
        self.config = dict(config or {})
        self.name = name or "kafka:" + (",".join(self.topics) if self.topics else
                                        f"/{pattern}/")

    @property
    def bounded(self) -> bool:
        return self.stopping is not None

    def parallelism_hint(self) -> int | None:
        return None

    def create_reader(self) -> "KafkaReader":
        return KafkaReader(self)

    def batches(self, schema: Any = None, *, batch_rows: int = 8192,
                metadata: Sequence[str] = ()) -> "ColumnarKafkaSource":
        """The same records as Arrow record batches (a batch stream): the JSON values of a
        batch's messages parsed by pyarrow, with ``schema`` (a ``pyarrow.Schema``) or
        inferred.  ``metadata``: columns to add from the records, any of ``"key"``,
        ``"topic"``, ``"partition"``, ``"offset"``, ``"timestamp"`` (seconds)."""
        from .kafka_batches import ColumnarKafkaSource

        return ColumnarKafkaSource(self, schema, batch_rows, metadata)

    def check(self) -> str | None:
        """Before a run, on the driver: the brokers answer and the topics exist."""
        consumer = _consumer(self, "check")
        try:
            _topics(consumer, self, min(self.broker_timeout, 30.0))
        finally:
            consumer.close()
        return None

    def __repr__(self) -> str:
        what = f"topics={self.topics!r}" if self.topics else f"pattern={self.pattern!r}"
        return f"KafkaSource({self.bootstrap!r}, {what})"


def _kafka() -> Any:
    try:
        import confluent_kafka
    except ImportError:
        raise ImportError("KafkaSource needs confluent-kafka: pip install cutline[kafka]") \
            from None
    return confluent_kafka


def _consumer(src: KafkaSource, role: str, **extra: Any) -> Any:
    ck = _kafka()
    conf: dict[str, Any] = {
        "bootstrap.servers": src.bootstrap,
        "group.id": src.group_id or f"cutline-{role}",
        "enable.auto.commit": False, "enable.auto.offset.store": False,
        "enable.partition.eof": True, "auto.offset.reset": "earliest",
        "queued.max.messages.kbytes": 16384,
        "logger": logging.getLogger("cutline.kafka.librdkafka"),
    }
    conf.update(src.config)
    conf.update(extra)
    return ck.Consumer(conf)


def _topics(consumer: Any, src: KafkaSource, timeout: float) -> dict[str, list[int]]:
    """The topics ``src`` reads and their partitions; raises if the brokers do not answer,
    or (``topics=``) if one does not exist."""
    ck = _kafka()
    try:
        meta = consumer.list_topics(timeout=timeout)
    except ck.KafkaException as exc:
        raise KafkaBrokerError(f"Kafka broker(s) {src.bootstrap} did not answer within "
                               f"{timeout:g} s: {exc}") from None
    found = {name: sorted(t.partitions) for name, t in meta.topics.items()
             if t.error is None and t.partitions}
    if src.topics is not None:
        missing = [t for t in src.topics if t not in found]
        if missing:
            raise KafkaTopicError(f"Kafka topic(s) {', '.join(map(repr, missing))} do not "
                                  f"exist on {src.bootstrap}")
        return {t: found[t] for t in src.topics}
    pat = re.compile(src.pattern or "")
    return {t: ps for t, ps in sorted(found.items())
            if pat.fullmatch(t) and not t.startswith("__")}


class KafkaReader:
    """One source subtask: its partitions, their offsets and buffered records."""

    def __init__(self, source: KafkaSource) -> None:
        self._src = source
        self._subtask: int | None = None
        self._parallelism = 1
        self._consumer: Any = None
        self._offsets: dict[str, int] = {}  # split -> next offset to deliver (< 0: logical)
        self._stops: dict[str, int] = {}  # split -> stop offset (bounded runs)
        self._seek_ms: dict[str, int] = {}  # split -> skip records before this time (ms)
        self._restored = False  # offsets came from a checkpoint: new partitions at earliest
        self._begun = False  # partitions resolved and assigned
        self._buf: dict[str, deque] = {}
        self._fetched: dict[str, int] = {}  # split -> next offset expected from the fetcher
        self._paused: set[str] = set()
        self._eof: dict[str, bool] = {}  # fetched to the partition's end, nothing buffered
        self._eof_at: dict[str, int] = {}  # the offset that end was at
        self._hw: dict[str, int] = {}  # split -> high watermark last seen
        self._last_data: dict[str, float] = {}  # split -> when it last had a record
        self._last_split: str | None = None
        self._last_batch: tuple[str, int, int] | None = None  # split, first offset, n
        self._last_out: list[KafkaRecord] = []  # the records of the last batch
        self._split_wm: Any = None
        self._idle_timeout: float | None = None  # the assigner's, per partition
        self._rr = 0
        self._next_discovery = 0.0
        self._last_answer = time.monotonic()
        self._rx = -1
        self._committing = 0  # offset commits to the group not yet answered
        self._gaps: dict[str, tuple[int, float]] = {}  # split -> (expected offset, since)
        self._at_end: dict[str, float] = {}  # split -> when a fetch last reached its end
        self.gaps_refetched = 0  # gaps whose records came when fetched again
        self.offsets_skipped = 0  # offsets of gaps taken as holding no record
        self._brokers = source.bootstrap
        self._key = _decoder(source.key_format, "key_format")
        self._value = _decoder(source.value_format, "value_format")

    # ------------------------------------------------------------------ lifecycle
    def open(self, subtask: int, parallelism: int) -> None:
        if not 0 <= subtask < parallelism:
            raise ValueError(f"subtask {subtask} out of range for parallelism {parallelism}")
        self._subtask, self._parallelism = subtask, parallelism
        self._consumer = _consumer(self._src, "source", **{
            "statistics.interval.ms": 1000, "stats_cb": self._on_stats,
            "on_commit": self._on_commit})
        topics = _topics(self._consumer, self._src, self._src.broker_timeout)
        self._known = {_split(t, p) for t, ps in topics.items() for p in ps}
        self._next_discovery = time.monotonic() + self._src.discovery_interval

    def close(self) -> None:
        if self._consumer is not None:
            try:
                # the commit of the last completed checkpoint's offsets (the final one's,
                # at the end of input) still in flight: a second to land
                deadline = time.monotonic() + 1.0
                while self._committing > 0 and time.monotonic() < deadline:
                    self._consumer.poll(0.05)
                self._consumer.close()
            except Exception:  # noqa: BLE001 - closing on the way out
                pass
            self._consumer = None

    def _mine(self, splits: Iterable[str]) -> list[str]:
        p, s = self._parallelism, self._subtask
        return sorted((k for k in splits if owner_of(*_parse_split(k), p) == s),
                      key=_parse_split)

    # ------------------------------------------------------------------ checkpoints
    def snapshot(self) -> dict:
        return {"offsets": dict(self._offsets), "stops": dict(self._stops),
                "seek_ms": dict(self._seek_ms), "subtask": self._subtask,
                "parallelism": self._parallelism, "last": self._last_split}

    def restore(self, state: dict) -> None:
        self.rescale([state])

    def rescale(self, states: list[dict]) -> None:
        """Take the partitions this subtask owns now, with the offsets (and stops) that
        any old subtask's state holds for them."""
        offsets: dict[str, int] = {}
        stops: dict[str, int] = {}
        seek: dict[str, int] = {}
        for st in states:
            offsets.update({k: int(v) for k, v in (st.get("offsets") or {}).items()})
            stops.update({k: int(v) for k, v in (st.get("stops") or {}).items()})
            seek.update({k: int(v) for k, v in (st.get("seek_ms") or {}).items()})
        mine = set(self._mine(set(offsets) | set(stops)))
        self._offsets = {k: v for k, v in offsets.items() if k in mine}
        self._stops = {k: v for k, v in stops.items() if k in mine}
        self._seek_ms = {k: v for k, v in seek.items() if k in mine}
        self._known |= mine  # a topic deleted since: its offsets stay in the state
        self._restored = True
        self._begun = False

    def notify_checkpoint_complete(self, checkpoint_id: int, state: dict | None) -> None:
        """Checkpoint ``checkpoint_id`` completed with this reader's ``state``: commit its
        offsets to the consumer group (for lag tools; recovery never reads them)."""
        if self._src.group_id is None or self._consumer is None or not state:
            return
        ck = _kafka()
        tps = [ck.TopicPartition(*_parse_split(k), int(off))
               for k, off in (state.get("offsets") or {}).items() if int(off) >= 0]
        if tps:
            try:
                self._consumer.commit(offsets=tps, asynchronous=True)
                self._committing += 1
            except ck.KafkaException as exc:
                log.warning("committing offsets of checkpoint %d to group %r failed: %s",
                            checkpoint_id, self._src.group_id, exc)

    def _on_commit(self, err: Any, partitions: Any) -> None:
        self._committing = max(0, self._committing - 1)
        if err is not None:
            log.warning("Kafka source %r: committing offsets to group %r failed: %s",
                        self._src.name, self._src.group_id, err)

    # ------------------------------------------------------------------ splits
    def split_key(self) -> str | None:
        """The partition the last batch came from (a batch comes from one partition)."""
        return self._last_split

    def split_keys(self) -> list[str]:
        """The partitions this subtask reads and has not finished, except those idle for
        the idle timeout (they hold no watermark back until a record comes)."""
        keys = [k for k in self._offsets if not self._finished(k)]
        t = self._idle_timeout
        if t is None:
            return keys
        now = time.monotonic()
        last = self._last_data
        active = [k for k in keys if self._active(k, now, t)]
        if active or not keys:
            return active
        # all idle: the one(s) that had a record last, as if the partitions had gone idle
        # one after the other (the watermark is then that partition's, as it was when
        # only it was active; and it holds while the subtask is idle)
        latest = max(last.get(k, 0.0) for k in keys)
        return [k for k in keys if last.get(k, 0.0) == latest]

    def _active(self, k: str, now: float, t: float) -> bool:
        """Partition ``k`` is not idle: records buffered, not read to its end yet, or
        one came less than the idle timeout ``t`` ago."""
        return bool(self._buf.get(k)) or not self._eof.get(k) or \
            now - self._last_data.get(k, now) < t

    def all_idle(self) -> bool:
        """Every partition this subtask reads is idle (read to its end, nothing buffered,
        nothing new for the idle timeout): only then may the task's output go idle.  A
        partition whose first records have not come yet is not (a slow first fetch, a
        loaded machine): were the task idle meanwhile, the other subtasks' watermarks
        would pass them downstream and they would come late."""
        t = self._idle_timeout
        if t is None:
            return True
        now = time.monotonic()
        return not any(self._active(k, now, t) for k in self._offsets if not self._finished(k))

    def watermark_per_split(self, watermarks: Any = None) -> None:
        """Read the partitions aligned: each batch from the one whose watermark is lowest."""
        self._split_wm = watermarks
        op = getattr(watermarks, "op", None)  # the assigner: its idle timeout per partition
        self._idle_timeout = getattr(op, "idle_timeout", None)

    def _finished(self, k: str) -> bool:
        stop = self._stops.get(k)
        return stop is not None and self._offsets.get(k, 0) >= stop

    def locate(self, index: int | None = None) -> str | None:
        if self._last_batch is None:
            return None
        """Where record ``index`` of the last batch came from (the whole batch if None):
        topic, partition and offset, for errors and dead letters."""
        k, first, n = self._last_batch
        topic, part = _parse_split(k)
        if index is not None and 0 <= index < n:
            return f"Kafka topic {topic!r} partition {part} offset {self._last_out[index].offset}"
        return f"Kafka topic {topic!r} partition {part}, offsets from {first} ({n} records)"

    def lag(self) -> dict[str, int]:
        """Records behind the end of each partition (the high watermark last seen)."""
        return {k: max(0, self._hw[k] - off) for k, off in self._offsets.items()
                if k in self._hw and off >= 0}

    def stalled(self) -> str | None:
        """Why reading is stalled (the brokers do not answer), or None."""
        quiet = time.monotonic() - self._last_answer
        if quiet < self._src.stall_after or not self._fetching():
            return None
        return f"Kafka broker(s) {self._brokers} not answering for {quiet:.0f} s"

    # ------------------------------------------------------------------ reading
    def read_batch(self, max_records: int) -> list | None:
        if self._consumer is None:
            raise RuntimeError("KafkaReader.read_batch() before open()")
        if not self._begun:
            self._begin()
        now = time.monotonic()
        if not self._src.bounded and now >= self._next_discovery:
            self._discover()
        live = [k for k in self._offsets if not self._finished(k)]
        if not live:
            if self._src.bounded:
                return None
            self._poll(0.05)
            return []
        self._poll(0.0)
        k = self._pick(live)
        if k is None:
            self._poll(0.05)
            self._check_broker()
            k = self._pick(live)
            if k is None:
                return []
        probe = self._split_wm is not None and k not in self._split_wm
        return self._take(k, 1 if probe else max_records)

    def _pick(self, live: list[str]) -> str | None:
        """The partition to read next: aligned, the one furthest behind (if it has no
        records yet and is not at its end, wait for it); else round robin over those with
        records buffered."""
        buf = self._buf
        ready = [k for k in live if buf.get(k)]
        if self._split_wm is not None:
            keys = self.split_keys()
            k = next_split(keys, self._split_wm)
            if k is not None and not buf.get(k):
                if not self._eof.get(k):
                    return None  # furthest behind and still fetching: wait for it
                k = next_split(ready, self._split_wm)  # at its end
            return k if k is None or buf.get(k) else None
        if not ready:
            return None
        self._rr = (self._rr + 1) % len(ready)
        return ready[self._rr]

    def _take(self, k: str, n: int) -> list:
        buf = self._buf[k]
        stop = self._stops.get(k)
        topic, part = _parse_split(k)
        n = min(n, len(buf))
        if stop is None or (n and buf[n - 1].offset() < stop):
            popleft = buf.popleft
            take = [popleft() for _ in range(n)]
        else:  # the stop is within the buffer: what is at or after it is never read
            take = []
            while buf and len(take) < n:
                if buf[0].offset() >= stop:
                    buf.clear()
                    break
                take.append(buf.popleft())
        out = self._records(take, topic, part)
        first = take[0].offset() if take else self._offsets[k]
        if take:
            self._offsets[k] = take[-1].offset() + 1
            self._last_data[k] = time.monotonic()
        elif stop is not None and not buf:
            self._offsets[k] = max(self._offsets[k], stop)
        if not buf and self._eof.get(k):
            self._past_markers(k)
        if self._finished(k):
            self._drop(k)
        elif k in self._paused and len(buf) < _BUFFER // 2:
            self._consumer.resume([_kafka().TopicPartition(topic, part)])
            self._paused.discard(k)
        self._last_split, self._last_batch = k, (k, first, len(out))
        self._last_out = out
        return out

    def _records(self, msgs: list, topic: str, part: int) -> list:
        """The messages as :class:`KafkaRecord`\\ s (decoded); a message that does not
        decode raises :class:`KafkaRecordError` naming it."""
        key, value = self._key, self._value
        new, rec = tuple.__new__, KafkaRecord
        out: list[KafkaRecord] = []
        append = out.append
        msg = None
        try:
            if key is _as_bytes and value is _as_bytes:
                for msg in msgs:
                    ts_type, ts = msg.timestamp()
                    h = msg.headers()
                    append(new(rec, (msg.key(), msg.value(), topic, part, msg.offset(),
                                     ts / 1000.0 if ts_type else None,
                                     tuple(h) if h else ())))
            else:
                for msg in msgs:
                    ts_type, ts = msg.timestamp()
                    h = msg.headers()
                    append(new(rec, (key(msg.key()), value(msg.value()), topic, part,
                                     msg.offset(), ts / 1000.0 if ts_type else None,
                                     tuple(h) if h else ())))
        except Exception as exc:  # noqa: BLE001 - any decoder failure names the record
            assert msg is not None
            what = "value"
            try:
                key(msg.key())
            except Exception:  # noqa: BLE001
                what = "key"
            raise KafkaRecordError(topic, part, msg.offset(),
                                   f"{what}: {type(exc).__name__}: {exc}") from exc
        return out

    def _poll(self, timeout: float) -> None:
        """Move what the consumer fetched into the partitions' buffers."""
        msgs = self._consumer.consume(10_000, timeout)
        if not msgs:
            return
        buf, fetched = self._buf, self._fetched
        run: tuple[Any, Any] = (None, None)  # the (topic, partition) of the run of messages
        k: str | None = None
        q: Any = None
        nxt = 0
        seek: int | None = None
        touched: set[str] = set()
        # splits whose end (PARTITION_EOF) came after their records in this batch: the
        # client reports an end once, so the records before it must not undo it below
        ended: set[str] = set()
        refetch: dict[str, int] = {}  # split -> the offset to fetch again from
        for msg in msgs:
            err = msg.error()
            if err is not None:
                if k is not None:
                    fetched[k] = max(fetched.get(k, 0), nxt)
                run, k = (None, None), None
                self._on_error(msg, err)
                if err.code() == _kafka().KafkaError._PARTITION_EOF:
                    ended.add(_split(msg.topic(), msg.partition()))
                continue
            tp = (msg.topic(), msg.partition())
            if tp != run:
                if k is not None:
                    fetched[k] = max(fetched.get(k, 0), nxt)
                run, k = tp, _split(*tp)
                ended.discard(k)  # records after its end: new ones, not at the end now
                q, nxt, seek = buf.get(k), fetched.get(k, 0), self._seek_ms.get(k)
                if q is not None:
                    touched.add(k)
            if q is None or k in refetch:
                continue  # unassigned since; or fetched again from a gap
            off = msg.offset()
            if off < nxt:
                continue  # a record of a batch before the position
            if off > nxt or k in self._gaps:
                assert k is not None
                if self._gap(k, nxt, off):
                    refetch[k] = nxt
                    continue
            nxt = off + 1
            if seek is not None and k is not None:
                ts_type, ts = msg.timestamp()
                if ts_type and ts < seek:
                    self._offsets[k] = nxt  # before the starting timestamp
                    continue
                del self._seek_ms[k]
                seek = None
            q.append(msg)
        if k is not None:
            fetched[k] = max(fetched.get(k, 0), nxt)
        if refetch:
            self._refetch(refetch)
        if not touched:
            return
        self._answered()
        ck = _kafka()
        for k in touched:
            q = buf[k]
            if q:
                if k not in ended:
                    self._eof[k] = False
                self._hw[k] = max(self._hw.get(k, 0), fetched[k])
                if len(q) >= _BUFFER and k not in self._paused:
                    self._consumer.pause([ck.TopicPartition(*_parse_split(k))])
                    self._paused.add(k)

    def _gap(self, k: str, nxt: int, off: int) -> bool:
        """A record of ``k`` at ``off`` when ``nxt`` is expected (or ``k`` was being
        fetched again): whether to fetch again from ``nxt`` (else the record is taken)."""
        pending = self._gaps.get(k)
        if off == nxt:  # the records of the gap came
            if pending is not None:
                del self._gaps[k]
                self.gaps_refetched += 1
                log.info("Kafka source %r: %s offsets %d.. came when fetched again (the "
                         "broker had answered with later ones first)", self._src.name, k, nxt)
            return False
        now = time.monotonic()
        if pending is None or pending[0] != nxt:
            wait = self._src.gap_recheck
            if wait <= 0 or now - self._at_end.get(k, -_TAILING) >= _TAILING or \
                    not self._near_end(k, nxt):
                self.offsets_skipped += off - nxt
                return False
            self._gaps[k] = (nxt, now)
            return True
        if now - pending[1] < self._src.gap_recheck:
            return True
        del self._gaps[k]  # the broker answers the same: no record there
        self.offsets_skipped += off - nxt
        log.debug("Kafka source %r: %s offsets %d..%d hold no record", self._src.name, k,
                  nxt, off - 1)
        return False

    def _near_end(self, k: str, offset: int) -> bool:
        """``offset`` is within :data:`_GAP_NEAR_END` of ``k``'s high watermark as the
        last fetch answered it (unknown: near)."""
        try:
            _lo, hi = self._consumer.get_watermark_offsets(
                _kafka().TopicPartition(*_parse_split(k)), cached=True)
        except Exception:  # noqa: BLE001 - not known: assume near
            return True
        return hi is None or hi < 0 or hi - offset <= _GAP_NEAR_END

    def _refetch(self, splits: dict[str, int]) -> None:
        """Fetch ``splits`` again from the offsets given (what was fetched after is
        dropped by the client)."""
        ck = _kafka()
        for k, off in splits.items():
            tp = ck.TopicPartition(*_parse_split(k), off)
            try:
                self._consumer.seek(tp)
            except ck.KafkaException:  # not fetching it at the moment: assign it again
                self._consumer.incremental_unassign([ck.TopicPartition(*_parse_split(k))])
                self._consumer.incremental_assign([tp])
                self._paused.discard(k)

    def _on_error(self, msg: Any, err: Any) -> None:
        ck = _kafka()
        code = err.code()
        if code == ck.KafkaError._PARTITION_EOF:
            k = _split(msg.topic(), msg.partition())
            if k in self._buf:
                self._eof[k] = True
                self._eof_at[k] = msg.offset()
                self._at_end[k] = time.monotonic()
                self._hw[k] = max(self._hw.get(k, 0), msg.offset())
                if not self._buf[k]:
                    self._past_markers(k)
                self._answered()
            return
        if code in (ck.KafkaError._TRANSPORT, ck.KafkaError._ALL_BROKERS_DOWN):
            return  # the broker check decides
        raise RuntimeError(f"Kafka source {self._src.name!r}: {err.str()} "
                           f"(topic {msg.topic()!r} partition {msg.partition()})")

    def _past_markers(self, k: str) -> None:
        """``k`` is read to the end its fetch reported, nothing buffered: its position is
        that end, past offsets that hold no record (transaction markers), so that a stop
        there is reached and the lag is 0."""
        end = self._eof_at.get(k, -1)
        if end > self._offsets.get(k, 0) and end >= self._fetched.get(k, 0):
            stop = self._stops.get(k)
            self._offsets[k] = end if stop is None else min(end, max(stop, self._offsets[k]))
            self._fetched[k] = max(self._fetched.get(k, 0), end)

    # ------------------------------------------------------------------ brokers
    def _on_stats(self, text: str) -> None:
        """librdkafka's statistics (every second): any response from a broker since the
        last report means the brokers answer; partitions' high watermarks for ``lag()``."""
        try:
            stats = json.loads(text)
        except ValueError:
            return
        brokers = stats.get("brokers") or {}
        rx = sum(int(b.get("rx", 0)) for b in brokers.values())
        if rx > self._rx:
            if self._rx >= 0:
                self._answered()
            self._rx = rx
        names = [b.get("nodename") for b in brokers.values() if b.get("nodeid", -1) >= 0]
        if names:
            self._brokers = ",".join(sorted(set(filter(None, names))))
        for topic, t in (stats.get("topics") or {}).items():
            for p, info in (t.get("partitions") or {}).items():
                k = _split(topic, int(p))
                hi = int(info.get("hi_offset", -1))
                if k in self._offsets and hi >= 0:
                    self._hw[k] = max(self._hw.get(k, 0), hi)

    def _answered(self) -> None:
        self._last_answer = time.monotonic()

    def _fetching(self) -> bool:
        return any(k not in self._paused and not self._finished(k) for k in self._buf)

    def _check_broker(self) -> None:
        if not self._fetching():
            self._answered()  # nothing asked of the brokers: nothing to wait for
            return
        quiet = time.monotonic() - self._last_answer
        if quiet > self._src.broker_timeout:
            raise KafkaBrokerError(f"Kafka source {self._src.name!r}: broker(s) "
                                   f"{self._brokers} did not answer for {quiet:.0f} s "
                                   f"(broker_timeout={self._src.broker_timeout:g})")

    # ------------------------------------------------------------------ assignment
    def _begin(self) -> None:
        """Resolve the starting (and stopping) offsets of this subtask's partitions that
        the checkpoint does not hold, and assign them all to the consumer."""
        self._begun = True
        mine = self._mine(self._known)
        fresh = [k for k in mine if k not in self._offsets]
        if fresh:
            self._offsets.update(self._starts(fresh, initial=not self._restored))
        if self._src.bounded:
            need = [k for k in mine if k not in self._stops]
            if need:
                self._stops.update(self._stop_offsets(need))
        self._assign(list(self._offsets))

    def _discover(self) -> None:
        self._next_discovery = time.monotonic() + self._src.discovery_interval
        try:
            topics = _topics(self._consumer, self._src, 1.0)
        except KafkaBrokerError:
            return  # the broker check fails the job if this lasts
        except KafkaTopicError as exc:
            log.warning("Kafka source %r: %s", self._src.name, exc)
            return
        new = {_split(t, p) for t, ps in topics.items() for p in ps} - self._known
        if not new:
            return
        self._known |= new
        mine = [k for k in self._mine(new) if k not in self._offsets]
        if mine:
            log.info("Kafka source %r subtask %s: new partitions %s, read from the earliest",
                     self._src.name, self._subtask, ", ".join(mine))
            self._offsets.update(self._starts(mine, initial=False))
            self._assign(mine, incremental=True)

    def _assign(self, splits: list[str], incremental: bool = False) -> None:
        ck = _kafka()
        now = time.monotonic()
        tps = []
        for k in splits:
            self._buf[k], self._eof[k] = deque(), False
            self._last_data[k] = now
            self._gaps.pop(k, None)
            off = self._offsets[k]
            self._fetched[k] = max(off, 0)
            if not self._finished(k):
                tps.append(ck.TopicPartition(*_parse_split(k), off))
        if incremental:
            self._consumer.incremental_assign(tps)
        else:
            self._consumer.assign(tps)
            self._paused.clear()
        self._answered()

    def _drop(self, k: str) -> None:
        """``k`` reached its stop: fetch no more of it."""
        self._buf.pop(k, None)
        self._paused.discard(k)
        try:
            self._consumer.incremental_unassign([_kafka().TopicPartition(*_parse_split(k))])
        except Exception:  # noqa: BLE001 - only saves fetching; reading ignores it anyway
            pass

    def _starts(self, splits: list[str], initial: bool) -> dict[str, int]:
        """Starting offsets: the source's policy at the job's first start, the earliest for
        partitions new since (or not in the checkpoint)."""
        src = self._src
        how: Any = src.starting if initial else "earliest"
        out: dict[str, int] = {}
        if initial and src.starting_ms is not None:
            for k in splits:
                out[k] = _EARLIEST
                self._seek_ms[k] = src.starting_ms
            return self._resolve(out)
        if isinstance(how, dict):
            out = {k: how.get(k, _EARLIEST) for k in splits}
        elif how == "latest":
            out = dict.fromkeys(splits, _LATEST)
        elif how == "committed":
            ck = _kafka()
            tps = [ck.TopicPartition(*_parse_split(k)) for k in splits]
            for tp in self._consumer.committed(tps, timeout=src.broker_timeout):
                off = tp.offset
                out[_split(tp.topic, tp.partition)] = off if off >= 0 else _EARLIEST
        else:
            out = dict.fromkeys(splits, _EARLIEST)
        return self._resolve(out)

    def _stop_offsets(self, splits: list[str]) -> dict[str, int]:
        stopping = self._src.stopping
        if isinstance(stopping, dict):
            want = {k: stopping.get(k, _LATEST) for k in splits}
        else:
            want = dict.fromkeys(splits, _LATEST)
        return self._resolve(want)

    def _resolve(self, want: dict[str, int]) -> dict[str, int]:
        """Logical offsets (earliest, latest) as offsets."""
        ck = _kafka()
        out = dict(want)
        timeout = self._src.broker_timeout
        latest = []
        for k, off in want.items():
            if off >= 0:
                continue
            lo, hi = self._consumer.get_watermark_offsets(
                ck.TopicPartition(*_parse_split(k)), timeout=timeout)
            if off == _EARLIEST:
                out[k] = lo
            else:
                out[k] = hi
                if hi > lo:
                    latest.append(k)
        if latest:
            out.update(self._true_ends({k: out[k] for k in latest}))
        return out

    def _true_ends(self, ends: dict[str, int]) -> dict[str, int]:
        """The ends of partitions as a fetch sees them: from the answer of ListOffsets
        minus one, read to the end of the partition (a broker that answers ListOffsets
        with the last batch's base offset + 1 has more after it)."""
        ck = _kafka()
        probe = _consumer(self._src, "ends")
        try:
            probe.assign([ck.TopicPartition(*_parse_split(k), max(0, off - 1))
                          for k, off in ends.items()])
            out: dict[str, int] = {}
            deadline = time.monotonic() + self._src.broker_timeout
            while len(out) < len(ends):
                if time.monotonic() > deadline:
                    raise KafkaBrokerError(
                        f"Kafka broker(s) {self._src.bootstrap}: the end of partitions "
                        f"{sorted(set(ends) - set(out))} not found within "
                        f"{self._src.broker_timeout:g} s")
                for msg in probe.consume(10_000, 0.2):
                    err = msg.error()
                    if err is not None and err.code() == ck.KafkaError._PARTITION_EOF:
                        k = _split(msg.topic(), msg.partition())
                        out[k] = max(msg.offset(), ends[k])
            return out
        finally:
            probe.close()
