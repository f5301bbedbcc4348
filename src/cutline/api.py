"""The user's vocabulary: ``Pipeline``, ``Stream``, ``KeyedStream``, ``CheckpointConfig``.

A pipeline is built by chaining operators on streams; nothing runs until
:meth:`Pipeline.run`.  Everything a user passes is validated here, up front, with an error
that names the argument.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from .logical import (
    AGGREGATES,
    FORWARD,
    HASH,
    REBALANCE,
    AggSpec,
    BatchFunction,
    BatchWindowSpec,
    ColumnKey,
    ColumnTime,
    CountSpec,
    Kind,
    Node,
    TimestampSpec,
    check_updates,
    timestamp_fn_of,
)
from .protocol import Mode
from .protocol.watermarks import BoundedOutOfOrderness, to_duration
from .protocol.windows import (
    Aggregate,
    TimeWindow,
    WindowAssigner,
    WindowSpec,
    aggregating,
    applying,
    columns,
    counting,
    duration,
    reducing,
    summarizing,
    window_time,
)

__all__ = ["BatchKeyedStream", "BatchStream", "BatchWindowedResults", "CheckpointConfig",
           "IterativeStream", "Pipeline", "Stream", "KeyedStream", "Node", "WindowedResults",
           "WindowedStream"]

_UID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


@dataclass(frozen=True)
class CheckpointConfig:
    """How a job checkpoints; the fields of Flink's ``CheckpointConfig`` that users set."""

    interval: float = 1.0
    mode: str = "exactly_once"  # or "at_least_once"
    unaligned: bool = False
    aligned_timeout: float | None = None
    timeout: float = 600.0
    min_pause: float = 0.0
    max_concurrent: int = 1
    tolerable_failures: int = 0
    retained: int = 3
    retain_on_cancel: bool = True
    storage: str = "file:///tmp/cutline-checkpoints"
    # fsspec options for ``storage`` (s3fs: endpoint_url, key, secret, client_kwargs, ...).
    # Not shown in repr: they may hold credentials.
    storage_options: Mapping[str, Any] | None = field(default=None, repr=False, hash=False)
    # Where keyed state lives: "memory" (dicts, the fastest) or "rocksdb" (embedded RocksDB
    # on local disk: state larger than memory, incremental checkpoints uploaded in the
    # background).
    state_backend: str = "memory"

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> None:
            raise ValueError(f"CheckpointConfig.{name} {why}, got {getattr(self, name)!r}")

        def seconds(v: Any) -> bool:  # a finite number (NaN and infinities are not)
            return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

        if not seconds(self.interval) or self.interval <= 0:
            bad("interval", "must be a positive, finite number of seconds")
        if self.mode not in ("exactly_once", "at_least_once"):
            bad("mode", "must be 'exactly_once' or 'at_least_once'")
        if not isinstance(self.unaligned, bool):
            bad("unaligned", "must be True or False")
        if self.unaligned and self.mode != "exactly_once":
            bad("unaligned", "applies to mode 'exactly_once' only")
        if self.aligned_timeout is not None:
            if self.mode != "exactly_once":
                bad("aligned_timeout", "applies to mode 'exactly_once' only")
            if not seconds(self.aligned_timeout) or self.aligned_timeout < 0:
                bad("aligned_timeout", "must be None or a finite number of seconds >= 0")
            if self.unaligned:
                bad("aligned_timeout", "applies to aligned checkpoints only (it switches "
                    "them to unaligned after the timeout): with unaligned=True leave it None")
        if not isinstance(self.retain_on_cancel, bool):
            bad("retain_on_cancel", "must be True or False")
        if not seconds(self.timeout) or self.timeout <= 0:
            bad("timeout", "must be a positive, finite number of seconds")
        if not seconds(self.min_pause) or self.min_pause < 0:
            bad("min_pause", "must be a finite number of seconds >= 0")
        for name in ("max_concurrent", "retained"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                bad(name, "must be a whole number >= 1")
        v = self.tolerable_failures
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            bad("tolerable_failures", "must be a whole number >= 0")
        if not isinstance(self.storage, str) or not self.storage:
            bad("storage", "must be a storage URL such as file:///path or s3://bucket/path")
        if self.state_backend not in ("memory", "rocksdb"):
            bad("state_backend", "must be 'memory' or 'rocksdb'")
        if self.state_backend == "rocksdb":
            import importlib.util

            if importlib.util.find_spec("rocksdict") is None:
                bad("state_backend", "needs the rocksdict package for 'rocksdb' "
                    "(pip install rocksdict)")
        if self.storage_options is not None:
            opts = self.storage_options
            if not isinstance(opts, Mapping) or not all(isinstance(k, str) for k in opts):
                raise ValueError("CheckpointConfig.storage_options must be a dict of fsspec "
                                 "options with string keys (e.g. {'endpoint_url': ..., 'key': "
                                 "..., 'secret': ...} for s3://), got "
                                 f"{type(opts).__name__}")
            object.__setattr__(self, "storage_options", dict(opts))

    @property
    def protocol_mode(self) -> Mode:
        if self.mode == "at_least_once":
            return Mode.AT_LEAST_ONCE
        if self.unaligned:
            return Mode.UNALIGNED
        return Mode.ALIGNED


def _check_callable(name: str, fn: Any) -> None:
    if not callable(fn):
        raise TypeError(f"{name}() needs a function, got {type(fn).__name__}: {fn!r}")


ON_ERROR = ("fail", "dead_letter")


def _check_parallelism(p: Any, what: str = "parallelism") -> None:
    if p is not None and (not isinstance(p, int) or isinstance(p, bool) or p < 1):
        raise ValueError(f"{what} must be a whole number >= 1, got {p!r}")


class Pipeline:
    """A streaming job: sources, operators and sinks, checkpointed as configured.

    >>> p = Pipeline("wordcount", parallelism=2, checkpoint=CheckpointConfig(interval=1.0))
    >>> (p.source(GeneratorSource(count=1000))             # doctest: +SKIP
    ...   .map(str).key_by(len).reduce(lambda a, b: a + b).sink(CollectSink()))
    >>> p.run()                                             # doctest: +SKIP

    ``dead_letter``: a sink for bad records.  When a ``map`` / ``flat_map`` / ``filter``
    function raises on a record, the job fails naming the operator, the record and where it
    came from; with a dead-letter sink the record goes there instead (with the operator uid,
    error type, message and traceback) and the job keeps running.  Dead letters are written
    exactly once, through the sink's two-phase commit like any output.  Operators opt out
    with ``on_error="fail"``.

    ``tls``: the job's data channels, control and admin ports (and dashboard) speak TLS 1.3
    with a certificate made for the run.  None (default): when the Spark session encrypts
    its own traffic (``spark.network.crypto.enabled`` or ``spark.ssl.enabled``).
    """

    def __init__(self, name: str, parallelism: int = 2,
                 checkpoint: CheckpointConfig | None = None, max_parallelism: int = 128,
                 dead_letter: Any = None, tls: bool | None = None):
        if not isinstance(name, str) or not _UID.match(name):
            raise ValueError(f"pipeline name must be 1-64 letters, digits, '.', '_' or '-', "
                             f"got {name!r}")
        _check_parallelism(parallelism)
        _check_parallelism(max_parallelism, "max_parallelism")
        if max_parallelism < parallelism:
            raise ValueError(f"max_parallelism ({max_parallelism}) must be >= parallelism "
                             f"({parallelism}): state is split into max_parallelism key groups")
        if checkpoint is not None and not isinstance(checkpoint, CheckpointConfig):
            raise TypeError(f"checkpoint must be a CheckpointConfig, got {checkpoint!r}")
        if dead_letter is not None and not hasattr(dead_letter, "create_writer"):
            raise TypeError(f"dead_letter must be a cutline sink (e.g. CollectSink, "
                            f"ParquetSink), got {dead_letter!r}")
        if tls not in (None, True, False):
            raise ValueError(f"tls must be True, False or None (on when Spark encrypts its "
                             f"own traffic), got {tls!r}")
        self.dead_letter = dead_letter
        self.tls = tls
        self.name = name
        self.parallelism = parallelism
        self.max_parallelism = max_parallelism
        self.checkpoint = checkpoint or CheckpointConfig()
        self.nodes: list[Node] = []

    # -------------------------------------------------------------- building

    def _add(self, kind: Kind | str, fn: Any, inputs: list[int], *, uid: str | None,
             parallelism: int | None, partitioning: str = FORWARD,
             key_fn: Callable | None = None) -> Node:
        kind = Kind(kind)
        _check_parallelism(parallelism)
        if parallelism is not None and parallelism > self.max_parallelism:
            raise ValueError(f"parallelism {parallelism} exceeds max_parallelism "
                             f"{self.max_parallelism}")
        node_id = len(self.nodes)
        auto_uid = uid is None
        if uid is None:
            uid = f"{kind}-{node_id}"
        elif not isinstance(uid, str) or not _UID.match(uid):
            raise ValueError(f"uid must be 1-64 letters, digits, '.', '_' or '-', got {uid!r}")
        if any(n.uid == uid for n in self.nodes):
            raise ValueError(f"duplicate operator uid {uid!r}: uids identify state in "
                             "checkpoints and must be unique")
        node = Node(node_id, uid, kind, fn, parallelism, inputs, partitioning, key_fn,
                    auto_uid=auto_uid)
        if kind == "assign_timestamps":
            node.timestamp_fn, node.timestamps_from = fn.ts_fn, uid
        elif inputs:
            node.timestamp_fn, node.timestamps_from = timestamp_fn_of(
                [self.nodes[i] for i in inputs])
        self.nodes.append(node)
        return node

    @property
    def timed(self) -> bool:
        """The pipeline uses event time (it has an ``assign_timestamps``): its tasks carry
        watermarks."""
        return any(n.kind == "assign_timestamps" for n in self.nodes)

    def source(self, source: Any, *, uid: str | None = None,
               parallelism: int | None = None) -> "Stream":
        if not hasattr(source, "create_reader"):
            raise TypeError(f"source() needs a cutline source (e.g. GeneratorSource, "
                            f"FileSource), got {source!r}")
        node = self._add("source", source, [], uid=uid, parallelism=parallelism)
        if getattr(source, "columnar", False):  # FileSource(...).batches(), batch_fn=
            node.columnar = True
            return BatchStream(self, node)
        return Stream(self, node)

    def run(self, spark: Any = None, **kwargs: Any) -> Any:
        """Run on Spark (an embedded ``local[N,F]`` session unless ``spark`` is given)."""
        from .spark.launcher import USER_ERRORS, run_pipeline

        try:
            return run_pipeline(self, spark=spark, **kwargs)
        except USER_ERRORS as exc:
            # cutline's message says what failed (the long story is in the log file it
            # names): the traceback stops here, at the user's call
            raise exc.with_traceback(None) from None

    def start(self, spark: Any = None, **kwargs: Any) -> Any:
        """Start the job in the background; returns a ``RunningJob`` with ``savepoint()``,
        ``stop_with_savepoint()``, ``cancel()`` and ``result()``."""
        from .spark.launcher import RunningJob

        return RunningJob(self, spark, **kwargs)

    def with_checkpoint(self, **changes: Any) -> "Pipeline":
        """Change checkpoint settings (validated) and return the pipeline."""
        self.checkpoint = replace(self.checkpoint, **changes)
        return self

    def validate(self) -> None:
        sinks = [n for n in self.nodes if n.kind == "sink"]
        if not sinks:
            raise ValueError(f"pipeline {self.name!r} has no sink: add .sink(...)")
        consumed = {i for n in self.nodes for i in n.inputs}
        dangling = [n.uid for n in self.nodes if n.kind != "sink" and n.id not in consumed]
        if dangling:
            raise ValueError(f"operators {dangling} lead nowhere: end every branch in a sink")
        dl = self.dead_letter
        for n in self.nodes:
            if n.on_error == "dead_letter":
                if dl is None:
                    raise ValueError(f"operator {n.uid!r} sends bad records to the dead-letter "
                                     "sink, but the pipeline has none: "
                                     "Pipeline(..., dead_letter=sink)")
                n.dead_letter = dl
        path = getattr(dl, "path", None)
        same = [n.uid for n in sinks if dl is not None and (
            n.fn is dl or (path is not None and getattr(n.fn, "path", None) == path))]
        if same:
            raise ValueError(f"the dead-letter sink writes where sink {same[0]!r} writes "
                             f"({path or dl!r}): give dead letters their own sink and path")
        for n in self.nodes:
            if n.kind != "iterate":
                continue
            if self.timed:
                raise ValueError(
                    f"iteration {n.uid!r} in a pipeline with event time (assign_timestamps): "
                    "watermarks do not go round loops yet; use event time outside iterations")
            if not n.feedback:
                raise ValueError(f"iteration {n.uid!r} is never closed: call "
                                 f"close_with(stream) with the records that go round again")
            if self.checkpoint.mode != "exactly_once":
                raise ValueError(
                    f"iteration {n.uid!r} needs mode 'exactly_once': the end of a loop is "
                    "detected on a consistent snapshot (no records in flight anywhere in "
                    "it), and at-least-once snapshots are not consistent cuts")


class Stream:
    """A stream of records produced by one operator."""

    def __init__(self, pipeline: Pipeline, node: Node):
        self.pipeline = pipeline
        self.node = node

    def _then(self, kind: str, fn: Any, *, uid: str | None, parallelism: int | None,
              partitioning: str | None = None, key_fn: Callable | None = None,
              on_error: str | None = None) -> "Stream":
        part = partitioning or (FORWARD if parallelism in (None, self._parallelism())
                                else REBALANCE)
        if kind in ("map", "flat_map", "filter", "assign_timestamps"):
            on_error = self._on_error(kind, on_error)
        node = self.pipeline._add(kind, fn, [self.node.id], uid=uid, parallelism=parallelism,
                                  partitioning=part, key_fn=key_fn)
        if on_error is not None:
            node.on_error = on_error
        return Stream(self.pipeline, node)

    def _on_error(self, kind: str, on_error: str | None) -> str:
        """``None``: the pipeline's default (dead letters if it has a dead-letter sink)."""
        if on_error is None:
            return "dead_letter" if self.pipeline.dead_letter is not None else "fail"
        if on_error not in ON_ERROR:
            raise ValueError(f"{kind}(on_error=...) must be 'fail' or 'dead_letter', "
                             f"got {on_error!r}")
        if on_error == "dead_letter" and self.pipeline.dead_letter is None:
            raise ValueError(f"{kind}(on_error='dead_letter') needs a dead-letter sink: "
                             "Pipeline(..., dead_letter=sink)")
        return on_error

    def _parallelism(self) -> int:
        return self.node.parallelism or self.pipeline.parallelism

    def map(self, fn: Callable[[Any], Any], *, uid: str | None = None,
            parallelism: int | None = None, on_error: str | None = None) -> "Stream":
        """``fn(record)`` for every record.  ``on_error``: what a record ``fn`` raises on
        does: ``"fail"`` the job (naming operator, record and position) or go to the
        pipeline's ``"dead_letter"`` sink; by default the latter if the pipeline has one."""
        _check_callable("map", fn)
        return self._then("map", fn, uid=uid, parallelism=parallelism, on_error=on_error)

    def flat_map(self, fn: Callable[[Any], Iterable[Any]], *, uid: str | None = None,
                 parallelism: int | None = None, on_error: str | None = None) -> "Stream":
        """Every item of ``fn(record)``; a record ``fn`` raises on yields nothing (see
        ``map`` for ``on_error``)."""
        _check_callable("flat_map", fn)
        return self._then("flat_map", fn, uid=uid, parallelism=parallelism,
                          on_error=on_error)

    def filter(self, fn: Callable[[Any], bool], *, uid: str | None = None,
               parallelism: int | None = None, on_error: str | None = None) -> "Stream":
        """Records for which ``fn(record)`` is true (see ``map`` for ``on_error``)."""
        _check_callable("filter", fn)
        return self._then("filter", fn, uid=uid, parallelism=parallelism, on_error=on_error)

    def assign_timestamps(self, ts_fn: Callable[[Any], Any], *, max_delay: Any = 0,
                          watermark: Any = None, idle_timeout: Any = None,
                          max_drift: Any = None,
                          uid: str | None = None, parallelism: int | None = None,
                          on_error: str | None = None) -> "Stream":
        """Event time: ``ts_fn(record)`` is the record's timestamp (seconds as int/float, or a
        ``datetime``); watermarks follow the records downstream.

        Records are unchanged: every timed operator downstream (windows, event-time timers)
        reads a record's time with this ``ts_fn`` again, so a ``map`` in between must keep
        what ``ts_fn`` reads.  Right after a source it runs in the source's tasks (its
        parallelism is the source's unless given): one watermark per source split, the
        splits read aligned (the split furthest behind next), so no record is late
        because another split ran ahead.

        ``max_delay`` (seconds or ``timedelta``): how far out of order records may be; the
        watermark is the largest timestamp seen minus ``max_delay`` (Spark's
        ``withWatermark``).  ``watermark``: a custom generator instead (``on_event(ts)``,
        ``current()``, optionally ``snapshot()`` / ``restore(state)``, the state None, numbers,
        str, bytes, or lists and dicts of them).  ``idle_timeout``
        (seconds): a subtask with no input for that long says so downstream, where it stops
        holding the watermark back until it has records again.  ``max_drift`` (seconds,
        right after a source): align the source's subtasks with each other too (Flink's
        watermark alignment, FLIP-182): a subtask pauses reading while its watermark is
        more than ``max_drift`` ahead of the slowest subtask's, so what operators downstream
        hold open spans ``max_drift``, not how far one subtask ran ahead (on an unbounded
        source give ``idle_timeout`` too: an idle subtask then holds no one back).
        ``on_error``: a record whose
        ``ts_fn`` raises or returns a non-timestamp fails the job naming the operator and
        record, or with ``"dead_letter"`` goes to the pipeline's dead-letter sink (as for
        ``map``).
        """
        _check_callable("assign_timestamps", ts_fn)
        delay = to_duration(max_delay, "assign_timestamps(max_delay=...)")
        idle = to_duration(idle_timeout, "assign_timestamps(idle_timeout=...)", positive=True,
                           allow_none=True)
        drift = to_duration(max_drift, "assign_timestamps(max_drift=...)", allow_none=True)
        if drift is not None and (self.node.kind != "source" or parallelism not in (
                None, self._parallelism())):
            raise ValueError("assign_timestamps(max_drift=...) aligns a source's subtasks: "
                             "call it right after the source, at its parallelism")
        if watermark is None:
            generator: Any = BoundedOutOfOrderness(delay)
        else:
            if delay:
                raise ValueError("assign_timestamps() takes max_delay or watermark=, not "
                                 "both (a custom generator decides the delay itself)")
            for meth in ("on_event", "current"):
                if not callable(getattr(watermark, meth, None)):
                    raise TypeError(
                        "assign_timestamps(watermark=...) needs a watermark generator with "
                        f"on_event(ts) and current() (e.g. BoundedOutOfOrderness), got "
                        f"{watermark!r}: it has no {meth}()")
            generator = watermark
        if parallelism is None and self.node.kind == "source":
            parallelism = self.node.parallelism  # in the source's tasks: per split
        return self._then("assign_timestamps", TimestampSpec(ts_fn, generator, idle, drift),
                          uid=uid, parallelism=parallelism, on_error=on_error)

    def rebalance(self) -> "Stream":
        """Spread records round-robin over the next operator's subtasks."""
        return _Repartitioned(self, REBALANCE)

    def key_by(self, key_fn: Callable[[Any], Any] | str | list[str]) -> "KeyedStream":
        """Partition by key: ``key_fn(record)``, or column names (``"user"`` keys a dict
        record by ``record["user"]``, ``["a", "b"]`` by the tuple of both)."""
        if isinstance(key_fn, (str, list, tuple)):
            key_fn = _column_key("key_by", key_fn)
        _check_callable("key_by", key_fn)
        return KeyedStream(self, key_fn)

    def batches(self, schema: Any = None, *, uid: str | None = None) -> "BatchStream":
        """This stream's dict records as Arrow record batches (one per task batch, with
        ``schema``, a ``pyarrow.Schema``, or inferred): the columnar operators follow.
        Costs about what ``RecordBatch.from_pylist`` does (see docs/columnar.md)."""
        if schema is not None:
            _check_schema("batches", schema)
        node = self._then("to_batches", schema, uid=uid, parallelism=None).node
        node.columnar = True
        return BatchStream(self.pipeline, node)

    def iterate(self, *, uid: str | None = None,
                parallelism: int | None = None) -> "IterativeStream":
        """Start an iteration: the returned stream carries this stream's records and, once
        :meth:`IterativeStream.close_with` is called, the records fed back into the loop.

        Checkpoints stay exactly once: the loop's head logs the records that arrive on the
        feedback edge between its snapshot and the feedback's barrier (the ABS paper's
        scheme), and a restore replays them.  A bounded job ends when a checkpoint shows
        the loop empty: every input of the head ended and no record in flight in the loop.
        """
        node = self.pipeline._add("iterate", None, [self.node.id], uid=uid,
                                  parallelism=parallelism,
                                  partitioning=FORWARD if parallelism in (
                                      None, self._parallelism()) else REBALANCE)
        return IterativeStream(self.pipeline, node)

    def union(self, *others: "Stream", uid: str | None = None,
              parallelism: int | None = None) -> "Stream":
        for o in others:
            if not isinstance(o, Stream) or o.pipeline is not self.pipeline:
                raise ValueError("union() takes streams of the same pipeline")
        node = self.pipeline._add("union", None, [self.node.id] + [o.node.id for o in others],
                                  uid=uid, parallelism=parallelism, partitioning=REBALANCE)
        return Stream(self.pipeline, node)

    def sink(self, sink: Any, *, uid: str | None = None,
             parallelism: int | None = None) -> "Stream":
        if not hasattr(sink, "create_writer"):
            raise TypeError(f"sink() needs a cutline sink (e.g. ParquetSink, CollectSink, "
                            f"PrintSink), got {sink!r}")
        return self._then("sink", sink, uid=uid, parallelism=parallelism)


class _Repartitioned(Stream):
    def __init__(self, stream: Stream, partitioning: str):
        super().__init__(stream.pipeline, stream.node)
        self._partitioning = partitioning

    def _then(self, kind, fn, *, uid, parallelism, partitioning=None, key_fn=None,
              on_error=None):
        return super()._then(kind, fn, uid=uid, parallelism=parallelism,
                             partitioning=partitioning or self._partitioning, key_fn=key_fn,
                             on_error=on_error)


class IterativeStream(Stream):
    """The head of an iteration (:meth:`Stream.iterate`)."""

    def close_with(self, feedback: "Stream | KeyedStream") -> None:
        """Feed ``feedback`` back to the head of this iteration.  A ``KeyedStream`` is
        partitioned by its key on the way back, a ``Stream`` round-robin."""
        if self.node.feedback:
            raise ValueError(f"iteration {self.node.uid!r} is already closed")
        if isinstance(feedback, KeyedStream):
            stream, part, key_fn = feedback.stream, HASH, feedback.key_fn
        elif isinstance(feedback, Stream):
            stream, part, key_fn = feedback, REBALANCE, None
        else:
            raise TypeError(f"close_with() takes a stream of this iteration, got {feedback!r}")
        if stream.pipeline is not self.pipeline:
            raise ValueError("close_with() takes a stream of the same pipeline")
        if not self._downstream(stream.node.id):
            raise ValueError(f"close_with() needs a stream computed from iteration "
                             f"{self.node.uid!r} (operator {stream.node.uid!r} is not)")
        self.node.inputs.append(stream.node.id)
        self.node.feedback[stream.node.id] = (part, key_fn)

    def _downstream(self, node_id: int) -> bool:
        by_id = {n.id: n for n in self.pipeline.nodes}
        todo, seen = [node_id], set()
        while todo:
            i = todo.pop()
            if i == self.node.id:
                return True
            if i in seen:
                continue
            seen.add(i)
            todo.extend(by_id[i].inputs)
        return False


class KeyedStream:
    """Records partitioned by key: the next operator sees all records of a key, with state."""

    def __init__(self, stream: Stream, key_fn: Callable[[Any], Any]):
        self.stream = stream
        self.key_fn = key_fn

    def _keyed(self, kind: str, fn: Any, uid: str | None, parallelism: int | None) -> Stream:
        return self.stream._then(kind, fn, uid=uid, parallelism=parallelism,
                                 partitioning=HASH, key_fn=self.key_fn)

    def reduce(self, fn: Callable[[Any, Any], Any], *, uid: str | None = None,
               parallelism: int | None = None) -> Stream:
        """Running reduce per key; emits the new aggregate for every record."""
        _check_callable("reduce", fn)
        return self._keyed("reduce", fn, uid, parallelism)

    def process(self, fn: Callable[[Any, Any], Iterable[Any] | None], *, uid: str | None = None,
                parallelism: int | None = None,
                on_timer: Callable[[Any, Any, Any], Iterable[Any] | None] | None = None
                ) -> Stream:
        """``fn(ctx, record)`` with keyed state on ``ctx``; returns/yields outputs (or None).

        ``ctx.key``; ``ctx.value_state(name, default)`` -> ``.value`` / ``.update(v)`` /
        ``.clear()``; ``ctx.list_state(name)`` -> list-like; ``ctx.map_state(name)`` ->
        dict-like.  State is per key, checkpointed, restored after failures.  Each takes
        ``ttl=`` (seconds, a ``timedelta`` or a ``cutline.state.ttl.StateTtl``): entries
        expire that long after their last write, in processing time.

        Event time: ``ctx.timestamp`` (the record's time, read with the ``ts_fn`` of the
        nearest upstream ``assign_timestamps``; a ``map`` in between must keep what it reads)
        and ``ctx.watermark``.  Timers of the current key: ``ctx.timers.register_event_time(
        when)`` / ``register_processing_time(when)`` / ``delete_event_time(when)`` /
        ``delete_processing_time(when)`` (seconds; one timer per key and time).  When one
        fires (the watermark, or the wall clock in epoch seconds, reaches ``when``),
        ``on_timer(ctx, key, when)`` is called with the key's state and ``ctx.time_domain``
        (``"event_time"`` / ``"processing_time"``); what it returns is emitted downstream.
        Timers are keyed state: checkpointed, moved with their key on rescale, and fired
        exactly once across restores.  At the end of a bounded input every event-time timer
        fires; processing-time timers still pending do not.
        """
        _check_callable("process", fn)
        if on_timer is not None and not callable(on_timer):
            raise TypeError(f"process(on_timer=...) needs a function, got "
                            f"{type(on_timer).__name__}: {on_timer!r}")
        stream = self._keyed("process", fn, uid, parallelism)
        stream.node.on_timer = on_timer
        return stream

    def count(self, *, uid: str | None = None, parallelism: int | None = None,
              updates: Any = "record") -> Stream:
        """Running count per key: ``(key, count)`` records, an update stream.

        ``updates``: when it emits.  ``"record"`` (the default): for every record, with the
        key's count so far.  ``"checkpoint"``: once per key counted since the last
        checkpoint, at each checkpoint (and the end of input), with its count then; a
        number of seconds: every that often too (Flink's mini-batch, Spark's update mode
        per micro-batch).  Sized by time, the count runs in two phases: each upstream
        subtask counts its records per key and sends one partial count per key before
        each checkpoint's barrier, so the exchange carries one record per key, not one
        per input record (docs/pipelines.md, "Update streams")."""
        spec = CountSpec(check_updates("count", updates, "record"))
        return self._keyed("count", spec, uid, parallelism)

    # ------------------------------------------------------------------ windows (issue 14)

    def window(self, assigner: WindowAssigner, *, allowed_lateness: Any = 0,
               timestamp: Callable[[Any], Any] | None = None,
               on_late: str = "drop") -> "WindowedStream":
        """Event-time windows per key: ``tumbling(size)``, ``sliding(size, slide)`` or
        ``session(gap)`` (from ``cutline``); then an aggregate (``count()``, ``sum(field)``,
        ``min``, ``max``, ``mean``, ``reduce(fn)``, ``aggregate(...)``, ``apply(fn)``).

        A window ``[start, end)`` fires when the watermark reaches ``end`` (Spark's rule),
        emitting ``WindowResult(key, start, end, value)`` per key.  A record's time is read
        with the ``ts_fn`` of the nearest upstream ``assign_timestamps`` (or ``timestamp=``):
        a window needs an ``assign_timestamps`` upstream, whose watermarks drive it.

        ``allowed_lateness`` (seconds or ``timedelta``): a record up to that late for a fired
        window updates it and its result is emitted again (as Flink does); a record later
        than that for all its windows is dropped, or goes to ``.late()`` of the result.

        ``on_late``: what happens to a dropped late record.  ``"drop"`` (the default):
        it is counted per operator and subtask (``JobResult.late_records``, the live line,
        the dashboard, ``/metrics``, ``cutline checkpoints show``; the first drop prints a
        warning).  ``"fail"``: the job fails at once, naming the operator, the record, its
        time and the watermark (no retry: a replay would fail the same way).
        """
        if not isinstance(assigner, WindowAssigner):
            raise TypeError("window() takes tumbling(size), sliding(size, slide) or "
                            f"session(gap) (from cutline), got {assigner!r}")
        lateness = duration(allowed_lateness, "window(allowed_lateness=...)", positive=False)
        node = self.stream.node
        if timestamp is not None:
            _check_callable("window(timestamp=...)", timestamp)
        if node.timestamps_from is None:
            raise ValueError(
                "window() needs event time: call .assign_timestamps(ts_fn, max_delay=...) "
                "upstream (its watermarks fire the windows)")
        ts_fn = timestamp if timestamp is not None else node.timestamp_fn
        if ts_fn is None:
            raise ValueError(
                "window() cannot tell which timestamp function to use: its input comes from "
                "different assign_timestamps (e.g. after a union); pass "
                "window(..., timestamp=ts_fn)")
        windowed = WindowedStream(self, assigner, lateness, ts_fn)
        windowed.on_late = _on_late(on_late)
        return windowed


def _on_late(on_late: Any) -> str:
    if on_late not in ("drop", "fail"):
        raise ValueError('window(on_late=...) is "drop" (count late records, the default) '
                         f'or "fail" (fail the job on one), got {on_late!r}')
    return on_late


def _keep_late(spec: Any) -> None:
    """``.late()`` keeps the late records: refused after ``window(on_late="fail")``."""
    if spec.on_late == "fail":
        raise ValueError('.late() keeps late records, window(..., on_late="fail") fails the '
                         "job on one: choose one of them")


class WindowedStream:
    """A keyed stream cut into event-time windows (:meth:`KeyedStream.window`): choose what
    each window computes.  Every method takes ``uid`` (names the window state in
    checkpoints) and ``parallelism``, and returns a :class:`WindowedResults` stream."""

    def __init__(self, keyed: KeyedStream, assigner: WindowAssigner, lateness: float,
                 ts_fn: Callable[[Any], Any]) -> None:
        self.keyed, self.assigner, self.lateness, self.ts_fn = keyed, assigner, lateness, ts_fn
        self.on_late = "drop"

    def _build(self, agg: Aggregate, uid: str | None,
               parallelism: int | None) -> "WindowedResults":
        if self.assigner.merging and agg.merge is None:
            raise ValueError(f"{self.assigner!r} windows merge, and so do their "
                             "accumulators: aggregate() needs merge=fn(a, b)")
        spec = WindowSpec(self.assigner, self.lateness, self.ts_fn, agg, on_late=self.on_late)
        win = self.keyed._keyed("window", spec, uid, parallelism)
        results = win._then("window_results", spec, uid=None, parallelism=parallelism)
        if agg.full is None:  # a WindowResult's event time is its window's last instant
            results.node.timestamp_fn, results.node.timestamps_from = window_time, win.node.uid
        return WindowedResults(results.pipeline, results.node, win.node, spec)

    def count(self, *, uid: str | None = None,
              parallelism: int | None = None) -> "WindowedResults":
        """The number of records per key and window."""
        return self._build(counting(), uid, parallelism)

    def sum(self, of: str | Callable[[Any], Any], *, uid: str | None = None,
            parallelism: int | None = None) -> "WindowedResults":
        """The sum of ``of``: a field name (``record[of]`` or ``record.of``) or a function of
        the record."""
        return self._build(summarizing("sum", of), uid, parallelism)

    def min(self, of: str | Callable[[Any], Any], *, uid: str | None = None,
            parallelism: int | None = None) -> "WindowedResults":
        """The smallest ``of`` (see :meth:`sum`)."""
        return self._build(summarizing("min", of), uid, parallelism)

    def max(self, of: str | Callable[[Any], Any], *, uid: str | None = None,
            parallelism: int | None = None) -> "WindowedResults":
        """The largest ``of`` (see :meth:`sum`)."""
        return self._build(summarizing("max", of), uid, parallelism)

    def mean(self, of: str | Callable[[Any], Any], *, uid: str | None = None,
             parallelism: int | None = None) -> "WindowedResults":
        """The mean of ``of`` (see :meth:`sum`), a float."""
        return self._build(summarizing("mean", of), uid, parallelism)

    def reduce(self, fn: Callable[[Any, Any], Any], *, uid: str | None = None,
               parallelism: int | None = None) -> "WindowedResults":
        """``fn(a, b)`` over the window's records; the value is the last result."""
        _check_callable("reduce", fn)
        return self._build(reducing(fn), uid, parallelism)

    def aggregate(self, create: Callable[[], Any], add: Callable[[Any, Any], Any],
                  merge: Callable[[Any, Any], Any] | None = None,
                  result: Callable[[Any], Any] | None = None, *, uid: str | None = None,
                  parallelism: int | None = None) -> "WindowedResults":
        """An accumulator: ``create()`` a new one, ``add(acc, record) -> acc``,
        ``merge(a, b) -> acc`` (needed by session windows, which merge), and
        ``result(acc)`` the window's value (default: the accumulator)."""
        given: dict[str, Any] = {"create": create, "add": add, "merge": merge,
                                 "result": result}
        for name, fn in given.items():
            if fn is not None or name in ("create", "add"):
                _check_callable(f"aggregate({name}=...)", fn)
        return self._build(aggregating(create, add, merge, result), uid, parallelism)

    def apply(self, fn: Callable[[Any, TimeWindow, list], Iterable[Any] | None], *,
              uid: str | None = None, parallelism: int | None = None) -> "WindowedResults":
        """``fn(key, window, records)`` when a window fires: the records it returns or yields
        are emitted (not a ``WindowResult``).  ``window`` has ``.start`` / ``.end``.  The
        window's records are kept in state until then: prefer an aggregate when one will do.
        """
        _check_callable("apply", fn)
        return self._build(applying(fn), uid, parallelism)


class WindowedResults(Stream):
    """The results of a window aggregate: one ``WindowResult(key, start, end, value)`` per key
    and window (``apply``: what its function emits).  :meth:`late` is a second output."""

    def __init__(self, pipeline: Pipeline, node: Node, window_node: Node,
                 spec: WindowSpec) -> None:
        super().__init__(pipeline, node)
        self.window_node, self.spec = window_node, spec

    def late(self, *, uid: str | None = None) -> Stream:
        """The records that came later than ``allowed_lateness`` for all their windows, as a
        stream to route to any sink.  They are output of the window operator like its
        results: written exactly once, through the same channels and checkpoints."""
        _keep_late(self.spec)
        self.spec.emit_late = True
        w = self.window_node
        node = self.pipeline._add("window_late", self.spec, [w.id], uid=uid,
                                  parallelism=w.parallelism, partitioning=FORWARD)
        return Stream(self.pipeline, node)


# --------------------------------------------------------------------------- batch streams

def _column_key(what: str, columns: Any) -> ColumnKey:
    cols = (columns,) if isinstance(columns, str) else tuple(columns)
    if not cols or not all(isinstance(c, str) and c for c in cols):
        raise TypeError(f"{what}() takes a column name or a list of column names, got "
                        f"{columns!r}")
    return ColumnKey(cols)


def _check_schema(what: str, schema: Any) -> None:
    import pyarrow as pa

    if not isinstance(schema, pa.Schema):
        raise TypeError(f"{what}(schema=...) takes a pyarrow.Schema, got "
                        f"{type(schema).__name__}: {schema!r}")


_BATCH_FORMATS = ("arrow", "pandas", "polars")


def _check_batch_format(what: str, batch_format: Any) -> None:
    if batch_format not in _BATCH_FORMATS:
        raise ValueError(f"{what}(batch_format=...) must be 'arrow', 'pandas' or 'polars', "
                         f"got {batch_format!r}")
    if batch_format != "arrow":
        import importlib.util

        if importlib.util.find_spec(batch_format) is None:
            raise ValueError(f"{what}(batch_format={batch_format!r}) needs the "
                             f"{batch_format} package (pip install {batch_format})")


class BatchStream(Stream):
    """A stream of Arrow record batches (``FileSource(...).batches()``,
    ``GeneratorSource(batch_fn=...)``, ``stream.batches(schema)``): operators run a record
    batch at a time, vectorised, like Spark's ``mapInArrow`` / ``mapInPandas`` and
    DataFrame column expressions.  ``rows()`` turns it back into dict records.
    """

    _partitioning: str | None = None  # rebalance(): how the next operator is reached

    def _then(self, kind: str, fn: Any, *, uid: str | None, parallelism: int | None,
              partitioning: str | None = None, key_fn: Callable | None = None,
              on_error: str | None = None) -> "Stream":
        stream = super()._then(kind, fn, uid=uid, parallelism=parallelism,
                               partitioning=partitioning or self._partitioning, key_fn=key_fn,
                               on_error=on_error)
        if kind in ("sink", "to_rows"):
            return stream
        stream.node.columnar = True
        return BatchStream(self.pipeline, stream.node)

    def rebalance(self) -> "BatchStream":
        """Spread record batches round-robin over the next operator's subtasks."""
        out = BatchStream(self.pipeline, self.node)
        out._partitioning = REBALANCE
        return out

    def union(self, *others: Stream, uid: str | None = None,
              parallelism: int | None = None) -> "BatchStream":
        """The record batches of this and ``others`` (batch streams too) as one stream;
        each keeps its schema (a sink after it takes one schema)."""
        for o in others:
            if not isinstance(o, BatchStream):
                raise TypeError("union() of a batch stream takes batch streams; "
                                f"{o.node.uid!r} carries records: use .batches(schema) on it, "
                                "or .rows() on this one")
        node = super().union(*others, uid=uid, parallelism=parallelism).node
        node.columnar = True
        return BatchStream(self.pipeline, node)

    def assign_timestamps(self, column: Any, *, max_delay: Any = 0,  # type: ignore[override]
                          watermark: Any = None, idle_timeout: Any = None,
                          max_drift: Any = None, uid: str | None = None,
                          parallelism: int | None = None) -> "BatchStream":
        """Event time from ``column`` (seconds as int/float, or an Arrow timestamp), with
        watermarks as for records (``max_delay``, ``watermark=``, ``idle_timeout``,
        ``max_drift``; see
        :meth:`Stream.assign_timestamps`).  The generator sees each record batch's largest
        timestamp.  Windows follow: ``key_by(cols).window(tumbling(60)).agg(...)``."""
        if not isinstance(column, str) or not column:
            raise TypeError("assign_timestamps() on a batch stream takes the name of the "
                            f"event-time column, got {column!r}")
        stream = super().assign_timestamps(ColumnTime(column), max_delay=max_delay,
                                           watermark=watermark, idle_timeout=idle_timeout,
                                           max_drift=max_drift, uid=uid,
                                           parallelism=parallelism)
        return stream  # type: ignore[return-value]

    def _per_record(self, name: str, instead: str) -> Any:
        raise TypeError(f"{name}() works on records; this is a batch stream (Arrow record "
                        f"batches): use {instead}, or .rows().{name}(...) for dict records")

    # the per-record operators do not apply to record batches
    def map(self, fn: Any, **kw: Any) -> "Stream":
        return self._per_record("map", "map_batches(fn)")

    def flat_map(self, fn: Any, **kw: Any) -> "Stream":
        return self._per_record("flat_map", "map_batches(fn)")

    def iterate(self, **kw: Any) -> "IterativeStream":
        return self._per_record("iterate", "rows() first")

    def batches(self, schema: Any = None, *, uid: str | None = None) -> "BatchStream":
        raise TypeError("batches(): this stream is a batch stream already")

    def map_batches(self, fn: Callable[[Any], Any], *, batch_format: str = "arrow",
                    uid: str | None = None, parallelism: int | None = None) -> "BatchStream":
        """``fn(batch)`` per record batch: a ``pyarrow.RecordBatch`` (``batch_format=
        "arrow"``), ``pandas.DataFrame`` or ``polars.DataFrame``; it returns the same kind
        (or an Arrow ``Table``) with any number of rows and any schema."""
        _check_callable("map_batches", fn)
        _check_batch_format("map_batches", batch_format)
        return self._then("map_batches", BatchFunction(fn, batch_format), uid=uid,
                          parallelism=parallelism)  # type: ignore[return-value]

    def filter_batches(self, fn: Callable[[Any], Any], *, batch_format: str = "arrow",
                       uid: str | None = None,
                       parallelism: int | None = None) -> "BatchStream":
        """The rows where ``fn(batch)`` is true: it returns one boolean per row (a pyarrow
        boolean array, or a numpy / pandas / polars boolean vector)."""
        _check_callable("filter_batches", fn)
        _check_batch_format("filter_batches", batch_format)
        return self._then("filter_batches", BatchFunction(fn, batch_format), uid=uid,
                          parallelism=parallelism)  # type: ignore[return-value]

    def select(self, *columns: str, uid: str | None = None) -> "BatchStream":
        """Only these columns, in this order (``df.select``)."""
        if not columns or not all(isinstance(c, str) for c in columns):
            raise TypeError(f"select() takes column names, got {columns!r}")
        return self._then("select", list(columns), uid=uid,
                          parallelism=None)  # type: ignore[return-value]

    def filter(self, expr: Any, *, uid: str | None = None,  # type: ignore[override]
               **kw: Any) -> "BatchStream":
        """The rows where the boolean column expression holds (``df.filter``), e.g.
        ``pc.field("value") >= 10`` (``import pyarrow.compute as pc``)."""
        return self.where(expr, uid=uid)

    def where(self, expr: Any, *, uid: str | None = None) -> "BatchStream":
        """Alias of :meth:`filter` (``df.where``)."""
        import pyarrow.compute as pc

        if not isinstance(expr, pc.Expression):
            raise TypeError(f"filter()/where() on a batch stream takes a column expression "
                            f"(pyarrow.compute, e.g. pc.field('x') > 3), got "
                            f"{type(expr).__name__}; for a function of the batch use "
                            "filter_batches(fn)")
        return self._then("where", expr, uid=uid,
                          parallelism=None)  # type: ignore[return-value]

    def with_column(self, name: str, expr: Any, *, uid: str | None = None) -> "BatchStream":
        """Add (or replace) column ``name``: a ``pyarrow.compute`` expression (e.g.
        ``pc.field("value") * 1.5``) or a function of the record batch returning an Arrow
        array (e.g. ``lambda b: pc.utf8_upper(b["page"])``) (``df.withColumn``)."""
        import pyarrow.compute as pc

        if not isinstance(name, str) or not name:
            raise TypeError(f"with_column() needs a column name, got {name!r}")
        if not isinstance(expr, pc.Expression) and not callable(expr):
            raise TypeError(f"with_column() takes a pyarrow.compute expression or a function "
                            f"of the batch, got {type(expr).__name__}: {expr!r}")
        return self._then("with_column", (name, expr), uid=uid,
                          parallelism=None)  # type: ignore[return-value]

    def rows(self, *, uid: str | None = None) -> Stream:
        """Every row as a dict record (``RecordBatch.to_pylist``): the per-record
        operators follow.  Costs a Python dict per row (see docs/columnar.md)."""
        return self._then("to_rows", None, uid=uid, parallelism=None)

    def key_by(self, columns: Any) -> "BatchKeyedStream":  # type: ignore[override]
        """Partition rows by column(s) (``df.groupBy``): ``"user"`` or ``["a", "b"]``.  A
        row goes to the key group the per-record ``key_by`` gives the same key (the value,
        or the tuple of values), so state can be rescaled and the two paths mixed."""
        if callable(columns) and not isinstance(columns, ColumnKey):
            raise TypeError("key_by() on a batch stream takes column names (e.g. "
                            "key_by('user')), not a function: rows are keyed vectorised")
        return BatchKeyedStream(self, _column_key("key_by", columns))


def _agg_specs(named: dict[str, Any], keys: tuple[str, ...]
               ) -> tuple[tuple[str, str | None, str], ...]:
    """``agg(...)``'s named aggregates as ``(name, column, function)``; bad ones raise."""
    if not named:
        raise ValueError("agg() needs at least one aggregate, e.g. agg(n='count')")
    aggs: list[tuple[str, str | None, str]] = []
    for out, spec in named.items():
        if spec == "count":
            aggs.append((out, None, "count"))
            continue
        if not (isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[0], str)
                and spec[1] in AGGREGATES and spec[1] != "count"):
            raise ValueError(f"agg({out}=...) takes 'count' or (column, function) with "
                             f"function one of sum, min, max, mean; got {spec!r}")
        aggs.append((out, spec[0], spec[1]))
    clash = set(keys) & set(named)
    if clash:
        raise ValueError(f"agg(): output names {sorted(clash)} are key columns")
    return tuple(aggs)


class _Aggregations:
    """``count()``, ``sum(col)``, ``min``, ``max``, ``mean``: shorthands of ``agg``."""

    def agg(self, *, uid: str | None = None, parallelism: int | None = None,
            updates: Any = None, **named: Any) -> BatchStream:
        raise NotImplementedError

    def count(self, *, uid: str | None = None, parallelism: int | None = None,
              updates: Any = None) -> BatchStream:
        """Rows per key, as column ``count``."""
        return self.agg(uid=uid, parallelism=parallelism, updates=updates, count="count")

    def sum(self, column: str, *, uid: str | None = None,
            parallelism: int | None = None, updates: Any = None) -> BatchStream:
        """The sum of ``column`` per key, as column ``<column>_sum``."""
        return self.agg(uid=uid, parallelism=parallelism, updates=updates,
                        **{f"{column}_sum": (column, "sum")})

    def min(self, column: str, *, uid: str | None = None,
            parallelism: int | None = None, updates: Any = None) -> BatchStream:
        """The smallest ``column`` per key, as ``<column>_min``."""
        return self.agg(uid=uid, parallelism=parallelism, updates=updates,
                        **{f"{column}_min": (column, "min")})

    def max(self, column: str, *, uid: str | None = None,
            parallelism: int | None = None, updates: Any = None) -> BatchStream:
        """The largest ``column`` per key, as ``<column>_max``."""
        return self.agg(uid=uid, parallelism=parallelism, updates=updates,
                        **{f"{column}_max": (column, "max")})

    def mean(self, column: str, *, uid: str | None = None,
             parallelism: int | None = None, updates: Any = None) -> BatchStream:
        """The mean of ``column`` per key (a float), as ``<column>_mean``."""
        return self.agg(uid=uid, parallelism=parallelism, updates=updates,
                        **{f"{column}_mean": (column, "mean")})


class BatchWindowedStream(_Aggregations):
    """A batch stream's keyed windows (:meth:`BatchKeyedStream.window`): choose the
    aggregates; the result is a batch stream of one row per key and window."""

    def __init__(self, keyed: "BatchKeyedStream", assigner: WindowAssigner, lateness: float,
                 time: ColumnTime) -> None:
        self.keyed, self.assigner, self.lateness, self.time = keyed, assigner, lateness, time
        self.on_late = "drop"

    def agg(self, *, uid: str | None = None, parallelism: int | None = None,
            updates: Any = None, **named: Any) -> BatchStream:
        """Named aggregates per key and window, as :meth:`BatchKeyedStream.agg`; the
        output names ``start`` and ``end`` are the window's."""
        if updates is not None:
            raise ValueError("window agg(updates=...): a window emits its row when the "
                             "watermark reaches its end; updates= sizes the update stream "
                             "of a keyed aggregation without windows")
        keys = self.keyed.key_fn.columns
        aggs = _agg_specs(named, keys)
        clash = {"start", "end"} & (set(named) | set(keys))
        if clash:
            raise ValueError(f"window agg(): {sorted(clash)} name the window's bounds; "
                             "name the aggregates (or keys) otherwise")
        spec = BatchWindowSpec(keys, aggs, self.assigner, self.lateness, self.time.column,
                               columns(aggs), ts_shift=self.time.shift, on_late=self.on_late)
        win = self.keyed.stream._then("window_agg", spec, uid=uid, parallelism=parallelism,
                                      partitioning=HASH, key_fn=self.keyed.key_fn)
        results = win._then("window_results", spec, uid=None, parallelism=parallelism)
        # a row's event time is its window's last instant, ``end`` less 1 µs (as a record
        # window's result): windows of windows follow, on batches or after rows()
        results.node.timestamp_fn = ColumnTime("end", shift=-1e-6)
        results.node.timestamps_from = win.node.uid
        return BatchWindowedResults(results.pipeline, results.node, win.node, spec)


class BatchWindowedResults(BatchStream):
    """The rows of a batch stream's windows, one per key and window (and again per row
    within ``allowed_lateness`` of a fired window); :meth:`late` is a second output."""

    def __init__(self, pipeline: Pipeline, node: Node, window_node: Node,
                 spec: BatchWindowSpec) -> None:
        super().__init__(pipeline, node)
        self.window_node, self.spec = window_node, spec

    def late(self, *, uid: str | None = None) -> BatchStream:
        """The rows that came later than ``allowed_lateness`` for all their windows, as
        they came (the input's columns): a batch stream to route to any sink, written
        exactly once like the windows' rows."""
        _keep_late(self.spec)
        self.spec.emit_late = True
        w = self.window_node
        node = self.pipeline._add("window_late", self.spec, [w.id], uid=uid,
                                  parallelism=w.parallelism, partitioning=FORWARD)
        node.columnar = True
        return BatchStream(self.pipeline, node)


class BatchKeyedStream(_Aggregations):
    """A batch stream partitioned by key columns: keyed aggregations follow (``count``,
    ``sum``, ``min``, ``max``, ``mean``, ``agg``), computed per record batch with
    ``Table.group_by`` and merged into keyed state.  Each emits an update stream, as
    Spark's update output mode: rows ``(key columns..., aggregates...)``, a key's latest
    row holding its aggregates so far; by default one row per key changed since the last
    checkpoint, at each checkpoint (``updates=``, see :meth:`agg`)."""

    def __init__(self, stream: BatchStream, key: ColumnKey) -> None:
        self.stream, self.key_fn = stream, key

    def agg(self, *, uid: str | None = None, parallelism: int | None = None,
            updates: Any = None, **named: Any) -> BatchStream:
        """Named aggregates: ``agg(n="count", total=("value", "sum"), avg=("value",
        "mean"))``; functions ``count`` (rows), ``sum``, ``min``, ``max``, ``mean``.

        ``updates``: when the update stream emits.  ``"checkpoint"`` (the default): one row
        per key changed since the last checkpoint, at each checkpoint (and the end of
        input); a number of seconds: every that often too; ``"batch"``: one row per key
        per input record batch, as it comes.  Sized by time, the aggregation runs in two
        phases: each upstream subtask merges its batches per key and sends one partial per
        key before each barrier (Spark's partial aggregation), so the exchange carries one
        row per key and checkpoint, not the input (docs/columnar.md)."""
        updates = check_updates("agg", "checkpoint" if updates is None else updates,
                                "batch")
        aggs = _agg_specs(named, self.key_fn.columns)
        stream = self.stream._then("aggregate", AggSpec(self.key_fn.columns, aggs, updates),
                                   uid=uid, parallelism=parallelism, partitioning=HASH,
                                   key_fn=self.key_fn)
        return stream  # type: ignore[return-value]

    def window(self, assigner: WindowAssigner, *, allowed_lateness: Any = 0,
               on_late: str = "drop") -> "BatchWindowedStream":
        """Event-time windows per key, ``tumbling(size)``, ``sliding(size, slide)`` or
        ``session(gap)`` (sessions merge), fired by the watermark of the
        ``assign_timestamps(column)`` upstream; then ``agg(...)`` (or ``count()``,
        ``sum(col)``, ...).  Each window emits one row per key once, when the watermark
        reaches its end: ``(keys..., start, end, aggregates...)``, ``start`` / ``end`` in
        seconds.  ``allowed_lateness`` as for records: each row within it of a fired
        window updates it and emits its row again; later rows are dropped, or go to
        ``.late()`` of the result.  The output is the per-record window's, row for row.
        ``on_late="fail"`` fails the job on a late row instead of dropping (and counting)
        it, as for records."""
        if not isinstance(assigner, WindowAssigner):
            raise TypeError("window() takes tumbling(size), sliding(size, slide) or "
                            f"session(gap) (from cutline), got {assigner!r}")
        lateness = duration(allowed_lateness, "window(allowed_lateness=...)", positive=False)
        ts = self.stream.node.timestamp_fn
        if self.stream.node.timestamps_from is None or not isinstance(ts, ColumnTime):
            raise ValueError("window() needs event time: call .assign_timestamps(column, "
                             "max_delay=...) upstream (its watermarks fire the windows)")
        windowed = BatchWindowedStream(self, assigner, lateness, ts)
        windowed.on_late = _on_late(on_late)
        return windowed

