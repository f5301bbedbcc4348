"""``Pipeline``: a job's sources, operators and sinks; ``run()`` starts it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ..logical import (
    FORWARD,
    FallibleNode,
    IterateNode,
    Kind,
    Node,
    kind_of,
    make_node,
    timestamp_fn_of,
)
from .batches import BatchStream
from .config import _UID, CheckpointConfig, _check_parallelism
from .streams import Stream


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
             key_fn: Callable | None = None, **fields: Any) -> Node:
        """A node of ``kind`` (:func:`cutline.logical.make_node`: its class, its payload
        checked) reading ``inputs``; ``fields``: its kind's own (``on_error=``, ...)."""
        kind = kind_of(kind, uid)
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
        node = make_node(node_id, uid, kind, fn, parallelism, inputs, partitioning, key_fn,
                         auto_uid=auto_uid, **fields)
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
               parallelism: int | None = None) -> "Stream | BatchStream":
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
        from ..spark.launcher import USER_ERRORS, run_pipeline

        try:
            return run_pipeline(self, spark=spark, **kwargs)
        except USER_ERRORS as exc:
            # cutline's message says what failed (the long story is in the log file it
            # names): the traceback stops here, at the user's call
            raise exc.with_traceback(None) from None

    def start(self, spark: Any = None, **kwargs: Any) -> Any:
        """Start the job in the background; returns a ``RunningJob`` with ``savepoint()``,
        ``stop_with_savepoint()``, ``cancel()`` and ``result()``."""
        from ..spark.launcher import RunningJob

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
            if isinstance(n, FallibleNode) and n.on_error == "dead_letter":
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
            if not isinstance(n, IterateNode):
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
