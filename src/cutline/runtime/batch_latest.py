"""``key_by(cols).latest(by)`` on a batch stream: per key, the row with the largest ``by``.

Flink's deduplication keeping the last row (``ROW_NUMBER() OVER (PARTITION BY key ORDER BY
t DESC) = 1``), Spark's ``max(struct(t, ...))`` or ``max_by`` per key: each record batch
is cut to its best row per key with Arrow (one sort, no Python per row), and only those
rows meet the keyed state: the best rows so far, held as columns
(:class:`~cutline.state.columnar.ColumnarRows`: one ``dict.get`` per key mapped at C
speed, the ``by`` columns compared with numpy, a key read from the backend only when it
may be there).  At each snapshot the rows changed since the last are written into the
backend, a key's state being its best row (a tuple of the row's values, in the input's
column order), in either backend: checkpoints, restores at another parallelism and
``cutline state`` see it as any keyed state.

The output is an update stream of the input's rows: a key's row each time its best row
changes, by batch (``updates="batch"``) or, sized by time, once per key changed since
the last checkpoint (or interval) with its best row then.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..logical import LatestSpec, Node, update_interval
from ..state.columnar import ColumnarRows
from .batches import ColumnarKeyed, Described
from .operators import UserFunctionError

__all__ = ["BatchLatest", "best_per_key"]

ROCKSDB_ROWS = 250_000  # rows a subtask holds as columns on RocksDB (about 100-500 bytes each)
MEMORY_ROWS = 1_000_000  # on the memory backend (which holds every row besides)


def best_per_key(table: pa.Table, keys: list[str], by: list[str]) -> pa.Table:
    """``table``'s best row per key: sorted by the keys, then by ``by`` descending (nulls
    last: smaller than any value), the first row of each key."""
    if not table.num_rows:
        return table
    order = [(k, "ascending") for k in keys] + [(c, "descending") for c in by]
    t = table.sort_by(order)  # (nulls at the end, ascending or descending)
    first = np.zeros(t.num_rows, dtype=bool)
    first[0] = True
    for k in keys:
        c = t.column(k)
        a, b = c.slice(1), c.slice(0, t.num_rows - 1)
        differs = pc.or_(pc.fill_null(pc.not_equal(a, b), False),
                         pc.xor(pc.is_null(a), pc.is_null(b)))
        first[1:] |= differs.to_numpy(zero_copy_only=False)
    return t.take(pa.array(np.flatnonzero(first)))


class BatchLatest(ColumnarKeyed):
    """The operator of :meth:`cutline.api.batches.BatchKeyedStream.latest` (the module
    docstring)."""

    def __init__(self, node: Node, subtask: int, parallelism: int, max_parallelism: int,
                 state_backend: str = "memory", storage: Any = None) -> None:
        super().__init__(node, subtask, parallelism, max_parallelism, state_backend, storage)
        spec: LatestSpec = node.fn
        self.keys, self.by = list(spec.keys), list(spec.by)
        self.each = spec.updates == "batch"
        self.flushes = not self.each
        self.interval = update_interval(spec.updates)
        self.schema: pa.Schema | None = None  # the rows' (the first batch's)
        self.columns: ColumnarRows | None = None  # the best rows (made with the first batch)
        # rows held as columns at most (past it a snapshot keeps the half most recently
        # seen; the others are read back from the backend when seen again): on RocksDB
        # about what its own cache holds
        self.max_keys = ROCKSDB_ROWS if state_backend == "rocksdb" else MEMORY_ROWS

    def _best(self, batch: list) -> pa.Table:
        try:
            table = pa.Table.from_batches(batch)
            if self.schema is None:
                missing = [c for c in (*self.keys, *self.by) if c not in table.column_names]
                if missing:
                    raise KeyError(f"no column {missing[0]!r} in the rows (columns: "
                                   f"{', '.join(table.column_names)})")
                self.schema = table.schema
                self.columns = ColumnarRows(table.schema, self.by, self.state.table("latest"),
                                         max_keys=self.max_keys, track=not self.each,
                                         fresh=not self.restored, key_columns=self.keys,
                                         max_parallelism=self.state.max_parallelism)
            elif not table.schema.equals(self.schema):
                table = table.select(self.schema.names).cast(self.schema)
            return best_per_key(table, self.keys, self.by)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError,
                KeyError) as exc:
            raise UserFunctionError(self.uid, "latest", Described(batch[0]), exc) from exc

    def process(self, batch: list) -> list:
        if not batch:
            return batch
        best = self._best(batch)
        if not best.num_rows:
            return []
        assert self.columns is not None
        key_cols = [best.column(k).to_pylist() for k in self.keys]
        keys = key_cols[0] if len(key_cols) == 1 else list(zip(*key_cols))
        try:
            won = self.columns.offer(keys, best)
        except TypeError as exc:  # `by` values that do not compare; restored rows that
            # do not fit these
            raise UserFunctionError(self.uid, "latest", Described(batch[0]), exc) from exc
        self.state.after_batch()
        if not self.each or not len(won):
            return []
        return [b for b in best.take(pa.array(won)).to_batches() if b.num_rows]

    def flush(self) -> list:
        if self.columns is None:
            return []
        rows = self.columns.take_changed()
        return [self.columns.batch(rows)] if len(rows) else []
