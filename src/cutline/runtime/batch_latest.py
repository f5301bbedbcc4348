"""``key_by(cols).latest(by)`` on a batch stream: per key, the row with the largest ``by``.

Flink's deduplication keeping the last row (``ROW_NUMBER() OVER (PARTITION BY key ORDER BY
t DESC) = 1``), Spark's ``max(struct(t, ...))`` or ``max_by`` per key: each record batch
is cut to its best row per key with Arrow (one sort, no Python per row), and only those
rows meet the keyed state, one dictionary lookup and one tuple comparison per key.  A
key's state is its best row so far (a tuple of the row's values, in the input's column
order), in either backend: checkpoints, restores at another parallelism and ``cutline
state`` see it as any keyed state.

The output is an update stream of the input's rows: a key's row each time its best row
changes, by batch (``updates="batch"``) or, sized by time, once per key changed since
the last checkpoint (or interval) with its best row then.
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..logical import LatestSpec, Node, update_interval
from .batches import Described
from .operators import Keyed, UserFunctionError

__all__ = ["BatchLatest", "best_per_key"]


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


def _order(values: Any) -> tuple:
    """``by``'s values (a tuple, or one value) as they compare with nulls smallest."""
    if not isinstance(values, tuple):
        values = (values,)
    return tuple((v is not None, v) for v in values)


class BatchLatest(Keyed):
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
        self.changed: dict[Any, None] = {}  # time-sized: keys changed since the last flush

    def _best(self, batch: list) -> pa.Table:
        try:
            table = pa.Table.from_batches(batch)
            if self.schema is None:
                self.schema = table.schema
                missing = [c for c in (*self.keys, *self.by) if c not in table.column_names]
                if missing:
                    raise KeyError(f"no column {missing[0]!r} in the rows (columns: "
                                   f"{', '.join(table.column_names)})")
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
        names = best.column_names
        cols = [c.to_pylist() for c in best.columns]
        rows = list(zip(*cols))
        key_cols = [cols[names.index(k)] for k in self.keys]
        batch_keys = key_cols[0] if len(key_cols) == 1 else list(zip(*key_cols))
        by_of = itemgetter(*(names.index(c) for c in self.by))  # a value, or a tuple
        table = self.state.table("latest")
        fast, read = table.fast, table.read
        won: list[int] = []
        keys: list[Any] = []
        for i, (k, row) in enumerate(zip(batch_keys, rows)):
            cur = fast.get(k)
            if cur is None:
                cur = read(k, None)
            if cur is not None:
                mine, theirs = by_of(row), by_of(cur)
                try:
                    newer = mine > theirs
                except TypeError:  # a null among them
                    newer = _order(mine) > _order(theirs)
                if not newer:
                    continue
            fast[k] = row
            won.append(i)
            keys.append(k)
        self.state.after_batch()
        if not won:
            return []
        if self.each:
            return [b for b in best.take(pa.array(won)).to_batches() if b.num_rows]
        self.changed.update(dict.fromkeys(keys))
        return []

    def flush(self) -> list:
        if not self.changed or self.schema is None:
            return []
        keys, self.changed = list(self.changed), {}
        get = self.state.table("latest").get
        rows = [get(k) for k in keys]
        arrays = [pa.array([r[j] for r in rows], type=f.type)
                  for j, f in enumerate(self.schema)]
        return [pa.RecordBatch.from_arrays(arrays, schema=self.schema)]
