"""Operators, executed a batch at a time inside a chain.

Each operator turns an input batch (a list) into an output batch.  User functions that
raise are reported with the operator's uid and the record that failed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..api import Node
from ..plan import key_group_range
from ..state.memory import MemoryStateBackend, ValueState

__all__ = ["UserFunctionError", "build_operator", "Operator"]


class UserFunctionError(RuntimeError):
    """A user function raised on a record."""

    def __init__(self, uid: str, kind: str, record: Any, error: BaseException) -> None:
        text = repr(record)
        if len(text) > 200:
            text = text[:200] + "..."
        super().__init__(f"{kind} operator {uid!r} failed on record {text}: "
                         f"{type(error).__name__}: {error}")
        self.uid, self.record, self.error = uid, record, error


class Operator:
    keyed = False

    def __init__(self, node: Node) -> None:
        self.node = node
        self.uid = node.uid

    def process(self, batch: list) -> list:
        raise NotImplementedError

    def snapshot(self) -> bytes | None:
        return None

    def restore(self, blobs: list[bytes]) -> None:
        pass

    def _fail(self, batch: list, call: Callable[[Any], Any], error: BaseException) -> None:
        """Find the record that made ``call`` raise, and report it."""
        for record in batch:
            try:
                call(record)
            except Exception as exc:  # noqa: BLE001 - reported with the record
                raise UserFunctionError(self.uid, self.node.kind, record, exc) from exc
        raise UserFunctionError(self.uid, self.node.kind, batch[0] if batch else None, error)


class Map(Operator):
    def process(self, batch: list) -> list:
        fn = self.node.fn
        try:
            return [fn(r) for r in batch]
        except Exception as exc:
            self._fail(batch, fn, exc)


class FlatMap(Operator):
    def process(self, batch: list) -> list:
        fn, out = self.node.fn, []
        try:
            for r in batch:
                out.extend(fn(r))
        except Exception as exc:
            self._fail(batch, lambda r: list(fn(r)), exc)
        return out


class Filter(Operator):
    def process(self, batch: list) -> list:
        fn = self.node.fn
        try:
            return [r for r in batch if fn(r)]
        except Exception as exc:
            self._fail(batch, fn, exc)


class Passthrough(Operator):
    def process(self, batch: list) -> list:
        return batch


class Keyed(Operator):
    keyed = True

    def __init__(self, node: Node, subtask: int, parallelism: int, max_parallelism: int):
        super().__init__(node)
        self.state = MemoryStateBackend(
            key_group_range(subtask, parallelism, max_parallelism), max_parallelism)

    def snapshot(self) -> bytes:
        return self.state.snapshot()

    def restore(self, blobs: list[bytes]) -> None:
        self.state.restore(blobs)


class Reduce(Keyed):
    _NONE = object()

    def process(self, batch: list) -> list:
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


class Count(Keyed):
    """``KeyedStream.count()``: a running count per key, one table lookup per record."""

    def process(self, batch: list) -> list:
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


class Process(Keyed):
    def __init__(self, node: Node, subtask: int, parallelism: int, max_parallelism: int):
        super().__init__(node, subtask, parallelism, max_parallelism)
        self.ctx = KeyedContext(self.state)

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
        return out


def build_operator(node: Node, subtask: int, parallelism: int, max_parallelism: int) -> Operator:
    if node.kind == "map":
        return Map(node)
    if node.kind == "flat_map":
        return FlatMap(node)
    if node.kind == "filter":
        return Filter(node)
    if node.kind == "union":
        return Passthrough(node)
    if node.kind == "reduce":
        return Reduce(node, subtask, parallelism, max_parallelism)
    if node.kind == "process":
        return Process(node, subtask, parallelism, max_parallelism)
    if node.kind == "count":
        return Count(node, subtask, parallelism, max_parallelism)
    raise ValueError(f"no operator for node kind {node.kind!r}")
