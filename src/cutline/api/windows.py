"""``WindowedStream`` and ``WindowedResults``: a keyed record stream's windows."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from ..logical import (
    FORWARD,
    Node,
)
from ..protocol.windows import (
    Aggregate,
    TimeWindow,
    WindowAssigner,
    WindowSpec,
    aggregating,
    applying,
    counting,
    reducing,
    summarizing,
    window_time,
)
from .config import _check_callable, _keep_late
from .streams import KeyedStream, Stream

if TYPE_CHECKING:
    from .pipeline import Pipeline


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
