"""Operators, executed a batch at a time inside a chain.

Each operator turns an input batch (a list) into an output batch.  User functions that
raise are reported with the operator's uid and the record that failed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..logical import Node
from ..state import DeferredSnapshot, KeyedStateBackend, StateTable, ValueState, create_backend
from ..state.keygroups import key_group_range

__all__ = ["UserFunctionError", "build_operator", "Operator"]


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

    def __init__(self, node: Node) -> None:
        self.node = node
        self.uid = node.uid
        # Set by the task when this operator's bad records go to the dead-letter sink:
        # ``on_bad_record(operator, record, error, index, batch_size)``.
        self.on_bad_record: Callable[..., None] | None = None

    def process(self, batch: list) -> list:
        raise NotImplementedError

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
        self.key_fn: Callable[[Any], Any] = node.key_fn
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
    """``KeyedStream.count()``: a running count per key, one dict lookup per record."""

    def process(self, batch: list) -> list:
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


class KeyedContext:
    """What a ``process`` function sees: the current key and its state."""

    __slots__ = ("key", "_state", "_values", "_lists", "_maps")

    def __init__(self, state: KeyedStateBackend) -> None:
        self._state = state
        self.key: Any = None
        self._values: dict[str, StateTable] = {}  # user's state name -> its table
        self._lists: dict[str, StateTable] = {}
        self._maps: dict[str, StateTable] = {}

    def value_state(self, name: str, default: Any = None) -> ValueState:
        t = self._values.get(name)
        if t is None:
            t = self._values[name] = self._state.table(name)
        return ValueState(t, self.key, default)

    def list_state(self, name: str) -> list:
        t = self._lists.get(name)
        if t is None:
            t = self._lists[name] = self._state.table("l:" + name)
        return t.mutable(self.key, list)

    def map_state(self, name: str) -> dict:
        t = self._maps.get(name)
        if t is None:
            t = self._maps[name] = self._state.table("m:" + name)
        return t.mutable(self.key, dict)


class Process(Keyed):
    def __init__(self, node: Node, subtask: int, parallelism: int, max_parallelism: int,
                 state_backend: str = "memory", storage: Any = None):
        super().__init__(node, subtask, parallelism, max_parallelism, state_backend, storage)
        self.ctx = KeyedContext(self.state)

    def process(self, batch: list) -> list:
        fn, key_fn, ctx = self.node.fn, self.key_fn, self.ctx
        out: list = []
        record = None
        try:
            for record in batch:
                ctx.key = key_fn(record)
                result = fn(ctx, record)
                if result is not None:
                    out.extend(result)
        except Exception as exc:
            raise UserFunctionError(self.uid, "process", record, exc) from exc
        self.state.after_batch()
        return out


def build_operator(node: Node, subtask: int, parallelism: int, max_parallelism: int, *,
                   state_backend: str = "memory", storage: Any = None) -> Operator:
    """The operator of ``node`` for one subtask.  Keyed operators keep their state in
    ``state_backend`` ("memory" or "rocksdb"); ``storage`` (the job's checkpoint storage)
    is where a RocksDB backend fetches the shared files of a snapshot it restores."""
    if node.kind == "map":
        return Map(node)
    if node.kind == "flat_map":
        return FlatMap(node)
    if node.kind == "filter":
        return Filter(node)
    if node.kind in ("union", "iterate"):
        return Passthrough(node)
    if node.kind == "reduce":
        return Reduce(node, subtask, parallelism, max_parallelism, state_backend, storage)
    if node.kind == "process":
        return Process(node, subtask, parallelism, max_parallelism, state_backend, storage)
    if node.kind == "count":
        return Count(node, subtask, parallelism, max_parallelism, state_backend, storage)
    raise ValueError(f"no operator for node kind {node.kind!r}")
