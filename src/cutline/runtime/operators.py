"""Operators, executed a batch at a time inside a chain.

Each operator turns an input batch (a list) into an output batch.  User functions that
raise are reported with the operator's uid and the record that failed.  The base classes
(:class:`Operator`, :class:`Keyed`) and the record stream's operators live here; which
operator runs a node is :mod:`.registry`'s business.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from typing import Any

import msgpack

from ..logical import CountSpec, Node, Partial, update_interval
from ..protocol.watermarks import (
    NO_WATERMARK,
    BoundedOutOfOrderness,
    encode_ts,
    restored_ts,
    split_watermark,
    to_timestamp,
)
from ..state import DeferredSnapshot, KeyedStateBackend, create_backend
from ..state.keygroups import key_group_range
from .keys import fast_key

__all__ = ["AssignTimestamps", "UserFunctionError", "Operator"]


def _raised_at(error: BaseException) -> str:
    """`` (raised in fn at file:line)``: the innermost frame of the user's code that ``error``
    passed through (not cutline's, not the standard library's or an installed package's)."""
    import sysconfig
    import traceback

    skip = tuple(sysconfig.get_paths()[k] for k in ("stdlib", "purelib", "platlib"))
    here = __file__.rsplit("/", 2)[0]  # the cutline package
    frames = traceback.extract_tb(error.__traceback__)
    for f in reversed(frames):
        if not f.filename.startswith((here, *skip)) and not f.filename.startswith("<"):
            return f" (raised in {f.name} at {f.filename}:{f.lineno})"
    return ""


class UserFunctionError(RuntimeError):
    """A user function raised on a record.

    ``index`` / ``batch_size``: where the record was in the batch the operator got (when
    known); :meth:`locate` adds where the batch came from (the task fills that in: input
    channel, or source subtask and read position), kept in ``position``.
    """

    def __init__(self, uid: str, kind: str, record: Any, error: BaseException, *,
                 index: int | None = None, batch_size: int | None = None) -> None:
        text = repr(record)
        if len(text) > 200:
            text = text[:200] + "..."
        self._text = (f"{kind} operator {uid!r} failed on record {text}: "
                      f"{type(error).__name__}: {error}")
        self._raised_at = _raised_at(error)
        super().__init__(self._text + self._raised_at)
        self.uid, self.kind, self.record, self.error = uid, kind, record, error
        self.index, self.batch_size = index, batch_size
        self.position: str | None = None

    def locate(self, where: str) -> None:
        """Name where the failing record came from (once: the innermost caller knows best)."""
        if self.position is not None:
            return
        self.position = where
        at = f"record {self.index} of {self.batch_size} in its batch, " \
            if self.index is not None else ""
        self.args = (f"{self._text} (at {at}{where}){self._raised_at}",)


class Operator:
    keyed = False
    emits_watermarks = False  # an event-time assigner (AssignTimestamps)
    # it holds output back until :meth:`flush` (a combine, a time-sized update stream): the
    # task flushes it before every snapshot, at the end of input, and every ``interval``
    flushes = False
    interval: float | None = None

    def __init__(self, node: Node) -> None:
        self.node = node
        self.uid = node.uid
        # Set by the task when this operator's bad records go to the dead-letter sink:
        # ``on_bad_record(operator, record, error, index, batch_size)``.
        self.on_bad_record: Callable[..., None] | None = None

    def process(self, batch: list) -> list:
        raise NotImplementedError

    def on_watermark(self, ts: float) -> list:
        """Event time reached ``ts`` (the task's combined input watermark advanced): the
        records to emit because of it (window results, timer output).  Called in chain
        order, after the output of the operators before it went through this one."""
        return []

    def flush(self) -> list:
        """What this operator held back (:attr:`flushes`), to emit now: called by the task
        before each snapshot is taken (so it leaves before the barrier, and the snapshot
        holds nothing of it), at the end of input, and every :attr:`interval` seconds."""
        return []

    def snapshot(self) -> bytes | DeferredSnapshot | None:
        return None

    def restore(self, blobs: list[bytes]) -> None:
        pass

    def _one_by_one(self, batch: list, call: Callable[[Any], Any],
                    error: BaseException) -> list:
        """The fast path raised on ``batch``: run it again record by record (``call`` returns
        a record's outputs).  Without a dead-letter sink the first bad record fails the job,
        named with its index; with one, each bad record goes there and the good records'
        outputs are returned.  (User functions should be pure: a record before the bad one
        is processed twice.)"""
        out: list = []
        report, n = self.on_bad_record, len(batch)
        for i, record in enumerate(batch):
            try:
                out.extend(call(record))
            except Exception as exc:  # noqa: BLE001 - reported with the record
                if report is None:
                    raise UserFunctionError(self.uid, self.node.kind, record, exc,
                                            index=i, batch_size=n) from exc
                report(self, record, exc, i, n)
        if report is None:  # the batch passed on the second run: fn is not deterministic
            raise UserFunctionError(self.uid, self.node.kind, batch[0] if batch else None,
                                    error) from error
        return out


class Map(Operator):
    def process(self, batch: list) -> list:
        fn = self.node.fn
        try:
            return [fn(r) for r in batch]
        except Exception as exc:
            return self._one_by_one(batch, lambda r: (fn(r),), exc)


class FlatMap(Operator):
    def process(self, batch: list) -> list:
        fn, out = self.node.fn, []
        try:
            for r in batch:
                out.extend(fn(r))
        except Exception as exc:
            return self._one_by_one(batch, lambda r: list(fn(r)), exc)
        return out


class Filter(Operator):
    def process(self, batch: list) -> list:
        fn = self.node.fn
        try:
            return [r for r in batch if fn(r)]
        except Exception as exc:
            return self._one_by_one(batch, lambda r: (r,) if fn(r) else (), exc)


class AssignTimestamps(Operator):
    """``Stream.assign_timestamps``: reads each record's timestamp with the user's ``ts_fn``
    and feeds the watermark generator; records pass unchanged.  After a batch,
    :meth:`take_watermark` is the new watermark when it rose (the chain emits it after the
    batch's records).  Upstream watermarks stop here: this operator's are the ones
    downstream sees.

    **Per split**: right after a source whose reader names its splits (``split_key()``: the
    split the last batch came from, ``split_keys()``: the splits it still reads), it keeps
    one generator per split and its watermark is the lowest over the reader's splits (a
    split with no record yet holds it back).  A split's generator state moves with the
    split on a rescaled restore.

    ``idle``: no input for ``idle_timeout`` seconds (:meth:`check_idle`, called by the task
    when it has nothing to read); a record ends it.
    """

    emits_watermarks = True

    def __init__(self, node: Node) -> None:
        super().__init__(node)
        spec = node.fn
        self.ts_fn: Callable[[Any], Any] = spec.ts_fn
        self.prototype: Any = spec.generator
        self.generator: Any = copy.deepcopy(spec.generator)  # one per subtask (or split)
        self.splits: dict[str, Any] | None = None  # split key -> its generator (per split)
        self.reader: Any = None
        self.idle_timeout: float | None = spec.idle_timeout
        # aligned with the source's other subtasks (the task pauses reading beyond it)
        self.max_drift: float | None = getattr(spec, "max_drift", None)
        self.emitted: float = NO_WATERMARK  # the last watermark emitted (never goes back)
        self.real: float = math.inf  # at the end of input: the last emitted before it
        self.last_input = time.monotonic()
        self.idle = False

    def read_splits_of(self, reader: Any) -> None:
        """The chain starts at ``reader``'s source: one generator per split, if it names
        them; a reader that can (``watermark_per_split(watermarks)``) then reads its splits
        aligned: next from the split whose watermark is lowest (:func:`next_split`)."""
        if callable(getattr(reader, "split_key", None)) and callable(
                getattr(reader, "split_keys", None)):
            self.reader, self.splits = reader, {}
            per_split = getattr(reader, "watermark_per_split", None)
            if callable(per_split):  # (a reader whose batches may span splits)
                per_split(_SplitWatermarks(self))

    def _generator(self) -> Any:
        if self.splits is None:
            return self.generator
        key = self.reader.split_key()
        g = self.splits.get(key)
        if g is None:
            g = self.splits[key] = copy.deepcopy(self.prototype)
        return g

    def _stamp(self, record: Any) -> tuple:
        self._generator().on_event(to_timestamp(self.ts_fn(record)))
        return (record,)

    def process(self, batch: list) -> list:
        ts_fn, on_event = self.ts_fn, self._generator().on_event
        if self.idle_timeout is not None:
            self.last_input = time.monotonic()
            self.idle = False
        try:
            for r in batch:
                on_event(to_timestamp(ts_fn(r)))
        except Exception as exc:
            # record by record: the bad one fails the job named, or is a dead letter
            return self._one_by_one(batch, self._stamp, exc)
        return batch

    def current(self) -> float:
        """The generator's watermark; per split, the lowest over the reader's unfinished
        splits, those not begun included (:func:`split_watermark`)."""
        splits = self.splits
        if splits is None:
            return self.generator.current()
        keys = self.reader.split_keys()
        if not keys:  # every split read to its end: what the last one read reached (inf
            # follows at the end of input).  The others finished before it and hold nothing
            # back: kept, a followed directory's first file would hold the watermark for good
            last = self.reader.split_key()
            for gone in set(splits) - {last}:
                del splits[gone]
            return min((g.current() for g in splits.values()), default=NO_WATERMARK)
        live = set(keys)
        for gone in [k for k in splits if k not in live]:  # finished: hold nothing back
            del splits[gone]
        return split_watermark(keys, _SplitWatermarks(self))

    def take_watermark(self) -> float | None:
        """The watermark, when it rose above the last one emitted."""
        wm = self.current()
        if wm > self.emitted:
            self.emitted = wm
            return wm
        return None

    def end_of_input(self) -> None:
        """The input ended: the watermark goes to ``inf``; the last real one stays beside
        it, for a job continued from the final checkpoint (:meth:`time_restore`)."""
        if self.emitted < math.inf:
            self.real = self.emitted
        self.emitted = math.inf

    def check_idle(self, now: float) -> bool:
        """True once when input has been quiet for ``idle_timeout`` (then :attr:`idle`) and,
        reading per split from a reader that tells (``all_idle()``: a Kafka source), every
        split is idle too: a partition still to be read is not quiet, only slow."""
        t = self.idle_timeout
        if t is None or self.idle or now - self.last_input < t:
            return False
        if self.splits is not None:
            all_idle = getattr(self.reader, "all_idle", None)
            if callable(all_idle) and not all_idle():
                return False
        self.idle = True
        return True

    def _snap(self, g: Any) -> Any:
        snap = getattr(g, "snapshot", None)
        if snap is None:
            return None
        state = snap()
        if type(g) is not BoundedOutOfOrderness:  # a user's generator: checked by name
            try:
                msgpack.packb(state)
            except (TypeError, ValueError, OverflowError) as exc:
                raise TypeError(
                    f"assign_timestamps operator {self.uid!r}: its watermark generator's "
                    f"{type(g).__name__}.snapshot() returned {type(state).__name__} "
                    f"{state!r:.80}, which a checkpoint cannot hold ({exc}): return None, a "
                    f"bool, number, str, bytes, or lists and dicts of them") from None
        return state

    def time_snapshot(self) -> dict:
        out: dict[str, Any] = {"emitted": encode_ts(self.emitted),
                               "generator": self._snap(self.generator)}
        if self.emitted == math.inf:  # the end of input: and the last real watermark
            out["real"] = encode_ts(self.real)
        if self.splits is not None:
            out["splits"] = {k: self._snap(g) for k, g in self.splits.items()}
        return out

    def _restored(self, state: Any) -> Any:
        g = copy.deepcopy(self.prototype)
        restore = getattr(g, "restore", None)
        if restore is not None and state is not None:
            restore(state)
        return g

    def time_restore(self, states: list[dict], exact: bool) -> None:
        """``states``: this subtask's own (``exact``), or every old subtask's (rescaled):
        then the lowest ``emitted``, a fresh generator, and per split the state of the
        splits this reader reads now (a split cut in two starts fresh).  An ``emitted`` at
        the end of input (``"inf"``) restores as the last real one: a job continued from
        its final checkpoint with new input goes on from there."""
        if not states:
            return
        self.emitted = min(restored_ts(st.get("emitted"), st, "real") for st in states)
        self.real = math.inf
        if exact and states[0].get("generator") is not None:
            self.generator = self._restored(states[0]["generator"])
        if self.splits is not None:
            keys = set(self.reader.split_keys())
            self.splits = {k: self._restored(g) for st in states
                           for k, g in (st.get("splits") or {}).items() if k in keys}


class _SplitWatermarks:
    """Each split's watermark, read live from an :class:`AssignTimestamps`' per-split
    generators (a split without one yet: :data:`NO_WATERMARK`): the mapping the reader
    picks its next split by and the assigner takes its minimum over."""

    __slots__ = ("op",)

    def __init__(self, op: AssignTimestamps) -> None:
        self.op = op

    def get(self, key: Any, default: float = NO_WATERMARK) -> float:
        g = (self.op.splits or {}).get(key)
        return default if g is None else g.current()

    def __getitem__(self, key: Any) -> float:
        return self.get(key)

    def __contains__(self, key: Any) -> bool:
        """The split has begun (a record of it reached the assigner)."""
        return key in (self.op.splits or {})


class Passthrough(Operator):
    def process(self, batch: list) -> list:
        return batch


class Keyed(Operator):
    """A keyed operator: state per key in a state backend (``CheckpointConfig.state_backend``),
    through one table per state name (:mod:`cutline.state.backend`): a record reads its
    key's entry from the table's ``fast`` dict, or on a miss with ``table.read``, and writes
    it into ``fast``; ``after_batch()`` lets the backend bound what ``fast`` holds.
    """

    keyed = True

    def __init__(self, node: Node, subtask: int, parallelism: int, max_parallelism: int,
                 state_backend: str = "memory", storage: Any = None):
        super().__init__(node)
        if node.key_fn is None:
            raise ValueError(f"{node.kind} operator {node.uid!r} has no key function")
        self.key_fn: Callable[[Any], Any] = fast_key(node.key_fn)  # a column: itemgetter
        self.state: KeyedStateBackend = create_backend(
            state_backend, key_group_range(subtask, parallelism, max_parallelism),
            max_parallelism, name=f"{node.uid}.{subtask}", storage=storage)

    def snapshot(self) -> bytes | DeferredSnapshot:
        """Bytes, or (RocksDB) a snapshot whose ``finish(storage, checkpoint_id)`` uploads
        its files and returns the bytes: the task runs that on its upload thread."""
        return self.state.snapshot()

    def restore(self, blobs: list[bytes]) -> None:
        self.state.restore(blobs)

    def close(self) -> None:
        self.state.close()


class Reduce(Keyed):
    _NONE = object()

    def process(self, batch: list) -> list:
        fn, key_fn, none = self.node.fn, self.key_fn, self._NONE
        out: list = []
        table = self.state.table("reduce")
        fast, read, emit = table.fast, table.read, out.append
        cached = fast.get
        record = None
        try:
            for record in batch:
                k = key_fn(record)
                cur = cached(k, none)
                if cur is none:
                    cur = read(k, none)
                new = record if cur is none else fn(cur, record)
                fast[k] = new
                emit(new)
        except Exception as exc:
            raise UserFunctionError(self.uid, "reduce", record, exc) from exc
        self.state.after_batch()
        return out


class Count(Keyed):
    """``KeyedStream.count()``: a running count per key, one dict lookup per record.

    ``updates="record"`` (the default): ``(key, count)`` for every record.  Else (time-sized,
    ``CountSpec.updates``): the counts change silently and :meth:`flush` emits ``(key,
    count)`` once per key changed since the last flush (at each checkpoint, the end of
    input, and every ``updates`` seconds); the input then holds :class:`Partial` counts of
    the ``combine`` before the exchange (and records, from an older checkpoint's channels).
    """

    def __init__(self, node: Node, subtask: int, parallelism: int, max_parallelism: int,
                 state_backend: str = "memory", storage: Any = None) -> None:
        super().__init__(node, subtask, parallelism, max_parallelism, state_backend, storage)
        spec = node.fn if isinstance(node.fn, CountSpec) else CountSpec()
        self.each = spec.updates == "record"
        self.flushes = not self.each
        self.interval = update_interval(spec.updates)
        self.changed: dict[Any, None] = {}  # keys counted since the last flush (in order)

    def process(self, batch: list) -> list:
        if not self.each:
            return self._merge(batch)
        key_fn = self.key_fn
        out: list = []
        table = self.state.table("count")
        fast, read, emit = table.fast, table.read, out.append
        cached = fast.get
        record = None
        try:
            for record in batch:
                k = key_fn(record)
                n = cached(k)
                n = (read(k, 0) if n is None else n) + 1
                fast[k] = n
                emit((k, n))
        except Exception as exc:
            raise UserFunctionError(self.uid, "count", record, exc) from exc
        self.state.after_batch()
        return out

    def _merge(self, batch: list) -> list:
        key_fn, changed = self.key_fn, self.changed
        table = self.state.table("count")
        fast, read = table.fast, table.read
        cached = fast.get
        record = None
        try:
            for record in batch:
                if type(record) is Partial:
                    k, d = record.key, record.value
                else:
                    k, d = key_fn(record), 1
                n = cached(k)
                fast[k] = (read(k, 0) if n is None else n) + d
                changed[k] = None
        except Exception as exc:
            raise UserFunctionError(self.uid, "count", record, exc) from exc
        self.state.after_batch()
        return []

    def flush(self) -> list:
        if not self.changed:
            return []
        get = self.state.table("count").get
        out = [(k, get(k, 0)) for k in self.changed]
        self.changed = {}
        return out


class CountCombine(Operator):
    """The local half of a time-sized ``count()`` (two-phase aggregation, planned by
    :func:`cutline.plan.plan`): counts its records per key and sends one :class:`Partial`
    count per key at each :meth:`flush` (before every barrier, at the end of input, every
    ``updates`` seconds) or when it holds ``MAX_KEYS`` keys.  No state: a snapshot never
    finds anything held."""

    flushes = True
    MAX_KEYS = 100_000

    def __init__(self, node: Node) -> None:
        super().__init__(node)
        if node.key_fn is None:
            raise ValueError(f"count operator {node.uid!r} has no key function")
        self.key_fn: Callable[[Any], Any] = fast_key(node.key_fn)
        self.interval = update_interval(node.fn.updates)
        self.counts: dict[Any, int] = {}
        self.agg_uid = node.uid.rsplit(".", 1)[0]  # errors name the count operator

    def process(self, batch: list) -> list:
        key_fn, counts = self.key_fn, self.counts
        get = counts.get
        record = None
        try:
            for record in batch:
                k = key_fn(record)
                counts[k] = get(k, 0) + 1
        except Exception as exc:
            raise UserFunctionError(self.agg_uid, "count", record, exc) from exc
        return self.flush() if len(counts) >= self.MAX_KEYS else []

    def flush(self) -> list:
        if not self.counts:
            return []
        out = [Partial(k, n) for k, n in self.counts.items()]
        self.counts = {}
        return out
