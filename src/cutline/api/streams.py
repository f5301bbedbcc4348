"""``Stream``, ``KeyedStream``, ``IterativeStream``: a record stream's operators."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from ..logical import (
    FORWARD,
    HASH,
    ON_ERROR,
    REBALANCE,
    CountSpec,
    FallibleNode,
    IterateNode,
    Node,
    TimestampSpec,
    check_updates,
    node_class,
)
from ..protocol.watermarks import BoundedOutOfOrderness, to_duration
from ..protocol.windows import WindowAssigner, duration
from .config import _check_callable, _check_schema, _column_key, _on_late

if TYPE_CHECKING:  # (each built by a method here, imported there)
    from .batches import BatchStream
    from .pipeline import Pipeline
    from .windows import WindowedStream


class _Operators:
    """What every stream of a pipeline has, of records (:class:`Stream`) or of Arrow record
    batches (:class:`~cutline.api.batches.BatchStream`): its pipeline and operator, a
    new operator after it, ``union`` and ``sink``.  Each kind of stream adds its own
    operators; neither has the other's."""

    carries = "records"
    """What flows on it: ``records``, or ``record batches`` (Arrow)."""
    _partitioning: str | None = None  # rebalance(): how the next operator is reached

    def __init__(self, pipeline: Pipeline, node: Node):
        self.pipeline = pipeline
        self.node = node

    def _add(self, kind: str, fn: Any, *, uid: str | None, parallelism: int | None,
             partitioning: str | None = None, key_fn: Callable | None = None,
             on_error: str | None = None, **fields: Any) -> Node:
        """A new operator reading this stream (forward at the same parallelism, else
        round-robin, unless ``partitioning`` says); ``fields``: its kind's own."""
        part = partitioning or self._partitioning or (
            FORWARD if parallelism in (None, self._parallelism()) else REBALANCE)
        if issubclass(node_class(kind), FallibleNode):  # map, flat_map, filter, assigner
            fields["on_error"] = self._on_error(kind, on_error)
        elif on_error is not None:
            raise ValueError(f"{kind}() takes no on_error: only a function run per record "
                             "does (map, flat_map, filter, assign_timestamps)")
        return self.pipeline._add(kind, fn, [self.node.id], uid=uid, parallelism=parallelism,
                                  partitioning=part, key_fn=key_fn, **fields)

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

    def _union(self, others: tuple[Any, ...], uid: str | None,
               parallelism: int | None) -> Node:
        """The union operator of this stream and ``others`` (of its own kind)."""
        for o in others:
            if not isinstance(o, _Operators) or o.pipeline is not self.pipeline:
                raise ValueError("union() takes streams of the same pipeline")
            if o.carries != self.carries:
                fix = ".rows() on it, or .batches(schema) on this one" if \
                    self.carries == "records" else ".batches(schema) on it, or .rows() on " \
                    "this one"
                raise TypeError(f"union() of a stream of {self.carries} takes streams of "
                                f"{self.carries}; {o.node.uid!r} carries {o.carries}: use "
                                f"{fix}")
        return self.pipeline._add("union", None, [self.node.id] + [o.node.id for o in others],
                                  uid=uid, parallelism=parallelism, partitioning=REBALANCE)

    def _timestamps(self, ts_fn: Any, max_delay: Any, watermark: Any, idle_timeout: Any,
                    max_drift: Any, parallelism: int | None
                    ) -> tuple[TimestampSpec, int | None]:
        """``assign_timestamps``'s checks: its spec, and the parallelism it runs at (right
        after a source: the source's, so one watermark per split)."""
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
        return TimestampSpec(ts_fn, generator, idle, drift), parallelism

    def sink(self, sink: Any, *, uid: str | None = None,
             parallelism: int | None = None) -> "Stream":
        """Write this stream's records (or record batches) to ``sink``."""
        if not hasattr(sink, "create_writer"):
            raise TypeError(f"sink() needs a cutline sink (e.g. ParquetSink, CollectSink, "
                            f"PrintSink), got {sink!r}")
        return Stream(self.pipeline, self._add("sink", sink, uid=uid, parallelism=parallelism))


class Stream(_Operators):
    """A stream of records produced by one operator."""

    def _then(self, kind: str, fn: Any, *, uid: str | None, parallelism: int | None,
              partitioning: str | None = None, key_fn: Callable | None = None,
              on_error: str | None = None, **fields: Any) -> "Stream":
        return Stream(self.pipeline, self._add(kind, fn, uid=uid, parallelism=parallelism,
                                               partitioning=partitioning, key_fn=key_fn,
                                               on_error=on_error, **fields))

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
        spec, parallelism = self._timestamps(ts_fn, max_delay, watermark, idle_timeout,
                                             max_drift, parallelism)
        return self._then("assign_timestamps", spec, uid=uid, parallelism=parallelism,
                          on_error=on_error)

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
        from .batches import BatchStream  # (it imports this module)

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
        """The records of this stream and ``others`` (record streams too) as one stream."""
        return Stream(self.pipeline, self._union(others, uid, parallelism))


class _Repartitioned(Stream):
    def __init__(self, stream: Stream, partitioning: str):
        super().__init__(stream.pipeline, stream.node)
        self._partitioning = partitioning


class IterativeStream(Stream):
    """The head of an iteration (:meth:`Stream.iterate`)."""

    def close_with(self, feedback: "Stream | KeyedStream") -> None:
        """Feed ``feedback`` back to the head of this iteration.  A ``KeyedStream`` is
        partitioned by its key on the way back, a ``Stream`` round-robin."""
        head = self.node
        assert isinstance(head, IterateNode)
        if head.feedback:
            raise ValueError(f"iteration {head.uid!r} is already closed")
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
        head.inputs.append(stream.node.id)
        head.feedback[stream.node.id] = (part, key_fn)

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

    def _keyed(self, kind: str, fn: Any, uid: str | None, parallelism: int | None,
               **fields: Any) -> Stream:
        return self.stream._then(kind, fn, uid=uid, parallelism=parallelism,
                                 partitioning=HASH, key_fn=self.key_fn, **fields)

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
        return self._keyed("process", fn, uid, parallelism, on_timer=on_timer)

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
        from .windows import WindowedStream  # (its results are a stream: it imports this)

        windowed = WindowedStream(self, assigner, lateness, ts_fn)
        windowed.on_late = _on_late(on_late)
        return windowed
