"""Operators, executed a batch at a time inside a chain.

Each operator turns an input batch (a list) into an output batch.  User functions that
raise are reported with the operator's uid and the record that failed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..api import Node
from ..plan import key_group_range
from ..state import create_backend
from ..state.memory import MemoryStateBackend, ValueState

__all__ = ["UserFunctionError", "build_operator", "Operator"]


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
        super().__init__(self._text)
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
        self.args = (f"{self._text} (at {at}{where})",)


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

    def snapshot(self) -> bytes | None:
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
    """A keyed operator: state per key in a state backend (``CheckpointConfig.state_backend``).

    The in-memory backend's ``table(key)`` is the key's whole key-group dict.  A backend
    over a store (RocksDB) has ``complete_tables = False``: writes go to its ``dirty`` dict,
    reads that miss it go to ``load()``, and ``after_batch()`` bounds what it holds.
    """

    keyed = True

    def __init__(self, node: Node, subtask: int, parallelism: int, max_parallelism: int,
                 state_backend: str = "memory", storage: Any = None):
        super().__init__(node)
        self.state = create_backend(
            state_backend, key_group_range(subtask, parallelism, max_parallelism),
            max_parallelism, name=f"{node.uid}.{subtask}", storage=storage)
        self._cached = not self.state.complete_tables

    def snapshot(self) -> Any:
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
        if self._cached:
            return self._process_cached(batch)
        fn, key_fn, st, out = self.node.fn, self.node.key_fn, self.state, []
        record = None
        try:
            for record in batch:
                k = key_fn(record)
                table, slot = st.table(k), ("reduce", k)
                cur = table.get(slot, self._NONE)
                new = record if cur is self._NONE else fn(cur, record)
                table[slot] = new
                out.append(new)
        except Exception as exc:
            raise UserFunctionError(self.uid, "reduce", record, exc) from exc
        return out

    def _process_cached(self, batch: list) -> list:
        fn, key_fn, st, out, none = self.node.fn, self.node.key_fn, self.state, [], self._NONE
        dirty, load = st.dirty, st.load
        record = None
        try:
            for record in batch:
                k = key_fn(record)
                slot = ("reduce", k)
                cur = dirty.get(slot, none)
                if cur is none:
                    cur = load(slot, none)
                new = record if cur is none else fn(cur, record)
                dirty[slot] = new
                out.append(new)
        except Exception as exc:
            raise UserFunctionError(self.uid, "reduce", record, exc) from exc
        st.after_batch()
        return out


class Count(Keyed):
    """``KeyedStream.count()``: a running count per key, one table lookup per record."""

    def process(self, batch: list) -> list:
        if self._cached:
            return self._process_cached(batch)
        key_fn, st, out = self.node.key_fn, self.state, []
        record = None
        try:
            for record in batch:
                k = key_fn(record)
                table, slot = st.table(k), ("count", k)
                n = table.get(slot, 0) + 1
                table[slot] = n
                out.append((k, n))
        except Exception as exc:
            raise UserFunctionError(self.uid, "count", record, exc) from exc
        return out

    def _process_cached(self, batch: list) -> list:
        key_fn, st, out = self.node.key_fn, self.state, []
        dirty, load = st.dirty, st.load
        record = None
        try:
            for record in batch:
                k = key_fn(record)
                slot = ("count", k)
                n = dirty.get(slot)
                n = (load(slot, 0) if n is None else n) + 1
                dirty[slot] = n
                out.append((k, n))
        except Exception as exc:
            raise UserFunctionError(self.uid, "count", record, exc) from exc
        st.after_batch()
        return out


class KeyedContext:
    """What a ``process`` function sees: the current key and its state."""

    __slots__ = ("key", "_backend", "_table")

    def __init__(self, backend: MemoryStateBackend) -> None:
        self._backend = backend
        self.key: Any = None
        self._table: dict = {}

    def _set_key(self, key: Any) -> None:
        self.key = key
        self._table = self._backend.table(key)  # one key-group lookup per record

    def value_state(self, name: str, default: Any = None) -> ValueState:
        return ValueState(self._table, name, self.key, default)

    def list_state(self, name: str) -> list:
        return self._table.setdefault(("l:" + name, self.key), [])

    def map_state(self, name: str) -> dict:
        return self._table.setdefault(("m:" + name, self.key), {})


class StoreContext(KeyedContext):
    """:class:`KeyedContext` over a backend with a store behind its cache (RocksDB): state
    objects read through to the store; list and map state handed out are written back at the
    next spill (the function may change them in place)."""

    __slots__ = ()

    def _set_key(self, key: Any) -> None:
        self.key = key

    def value_state(self, name: str, default: Any = None) -> Any:
        return self._backend.value_state(name, self.key, default)

    def list_state(self, name: str) -> list:
        return self._backend.mutable(("l:" + name, self.key), list)

    def map_state(self, name: str) -> dict:
        return self._backend.mutable(("m:" + name, self.key), dict)


class Process(Keyed):
    def __init__(self, node: Node, subtask: int, parallelism: int, max_parallelism: int,
                 state_backend: str = "memory", storage: Any = None):
        super().__init__(node, subtask, parallelism, max_parallelism, state_backend, storage)
        self.ctx = (StoreContext if self._cached else KeyedContext)(self.state)

    def process(self, batch: list) -> list:
        fn, key_fn, ctx, out = self.node.fn, self.node.key_fn, self.ctx, []
        record = None
        try:
            for record in batch:
                ctx._set_key(key_fn(record))
                result = fn(ctx, record)
                if result is not None:
                    out.extend(result)
        except Exception as exc:
            raise UserFunctionError(self.uid, "process", record, exc) from exc
        if self._cached:
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
