"""Routing: a subtask's output records partitioned into per-channel buffers.

Per outgoing edge: **hash** sends each record to the subtask owning its key's key group
(the key -> channel choice cached per edge, bounded), **broadcast** to every subtask,
**forward** / **rebalance** the whole batch to one channel, round robin per batch.  A task
that ends in a sink writes to its writer instead.  The buffers are sent by the task
(:mod:`cutline.runtime.task`), which decides when (batch size, flush interval, barriers).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..plan import HASH
from ..state.keygroups import key_group, subtask_for_key_group
from .operators import UserFunctionError

__all__ = ["Router"]

_CACHE_LIMIT = 100_000  # distinct keys cached per edge; beyond, recompute


class Router:
    """Where a subtask's output goes: ``emit(batch)`` fills :attr:`buffers` (or the sink).

    ``outputs``: per outgoing edge ``(edge, channel ids by downstream subtask, downstream
    parallelism, downstream chain uid)``; ``where`` names the batch in a key error."""

    def __init__(self, task_id: str, outputs: list[tuple[Any, list[str], int, str]],
                 max_parallelism: int, writer: Any, where: Callable[[], str]) -> None:
        self.task_id, self.max_parallelism, self.writer, self.where = (
            task_id, max_parallelism, writer, where)
        self.edges = [(edge, chans, dst_p, dst_uid, {}) for edge, chans, dst_p, dst_uid
                      in outputs]
        self.buffers: dict[str, list] = {ch: [] for _, chans, _, _ in outputs for ch in chans}
        self.rr = 0
        self.closed = False  # the task's outputs ended (EOF sent)

    def emit(self, batch: list) -> None:
        if not batch:
            return
        if self.closed and self.writer is None:
            raise RuntimeError(f"task {self.task_id} produced {len(batch)} records after its "
                               "outputs ended (an iteration found empty got more input)")
        if self.writer is not None:
            self.writer.write(batch)
            return
        buffers = self.buffers
        for edge, chans, dst_p, dst_uid, cache in self.edges:
            if edge.partitioning == HASH:
                key_fn, maxp = edge.key_fn, self.max_parallelism
                if len(cache) > _CACHE_LIMIT:
                    cache.clear()  # bounded: many distinct keys just recompute
                for r in batch:
                    try:
                        k = key_fn(r)
                    except Exception as exc:  # a bad record: fails the job, named
                        err = UserFunctionError(dst_uid, "key_by", r, exc,
                                                index=batch.index(r), batch_size=len(batch))
                        err.locate(self.where())
                        raise err from exc
                    try:
                        ch = cache[k]
                    except (KeyError, TypeError):
                        ch = chans[subtask_for_key_group(key_group(k, maxp), dst_p, maxp)]
                        try:
                            cache[k] = ch
                        except TypeError:  # unhashable key: no caching
                            pass
                    buffers[ch].append(r)
            elif edge.partitioning == "broadcast":
                for ch in chans:
                    buffers[ch].extend(batch)
            else:  # forward (one channel) or rebalance (round robin per batch)
                ch = chans[self.rr % len(chans)]
                self.rr += 1
                buffers[ch].extend(batch)

    def pending(self) -> int:
        """Records buffered, not yet sent."""
        return sum(len(b) for b in self.buffers.values())
