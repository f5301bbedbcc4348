"""Dead letters: records a user function raised on, written exactly once to a sink.

``Pipeline(..., dead_letter=sink)`` gives every subtask whose chain has a ``map`` /
``flat_map`` / ``filter`` with ``on_error="dead_letter"`` its own writer of that sink.  A bad
record becomes one dead letter (a dict, see :func:`dead_letter`) written to the writer right
away; the writer goes through the same two-phase commit as the job's sinks: pre-committed at
the subtask's snapshot, its handles stored in the subtask's state (``"dead_letter"``),
committed when the checkpoint completes, recovered (re-committed idempotently, the rest
discarded) on restore.  After a failure the records after the checkpoint are replayed and
their bad records reported again, so each bad record is stored exactly once.

Writers are numbered ``chain position * max_parallelism + subtask`` (``chain position``:
among the chains that have dead-letter operators), so they never share a staging directory
or a part file name, whatever the parallelism of each chain.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

__all__ = ["DeadLetters", "dead_letter"]


def _summary(exc: BaseException, frames: int = 5, limit: int = 4000) -> str:
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__,
                                              limit=-frames))
    return text if len(text) <= limit else "..." + text[-limit:]


def dead_letter(op: Any, record: Any, exc: BaseException, task: str, position: str) -> dict:
    """What the dead-letter sink receives for one bad record."""
    return {"operator": op.uid, "kind": str(op.node.kind), "task": task, "position": position,
            "error_type": type(exc).__name__, "error": str(exc),
            "traceback": _summary(exc), "record": record}


class DeadLetters:
    """The dead-letter writer of one subtask, and its uncommitted transactions."""

    def __init__(self, sink: Any, index: int, writers: int, job: str, task: str,
                 where: Callable[..., str], first: Any = None) -> None:
        self.sink, self.index, self.writers, self.job, self.task = sink, index, writers, job, task
        self.where = where  # where(index=None): where the batch (or its record) came from
        self.first = first  # the chain's first operator: it gets the source's batch as read
        self.writer = sink.create_writer()
        self.uncommitted: dict[int, dict] = {}
        self.reported = 0

    @classmethod
    def for_subtask(cls, plan: Any, chain: Any, subtask: int, ops: list, job: str,
                    task: str, where: Callable[..., str]) -> "DeadLetters | None":
        """The subtask's dead letters, wired to its operators; None if none of them has
        ``on_error="dead_letter"``."""
        mine = [op for op in ops if getattr(op.node, "on_error", "fail") == "dead_letter"]
        if not mine:
            return None
        chains = [c.id for c in plan.chains
                  if any(getattr(n, "on_error", "fail") == "dead_letter" for n in c.nodes)]
        maxp = plan.max_parallelism
        dl = cls(mine[0].node.dead_letter, chains.index(chain.id) * maxp + subtask,
                 len(chains) * maxp, job, task, where, ops[0])
        for op in mine:
            op.on_bad_record = dl.report
        return dl

    # ------------------------------------------------------------------ lifecycle

    def open(self, handles: list[dict] | None) -> None:
        """Open the writer; re-commit restored ``handles`` and discard other staged data."""
        self.writer.open(self.index, self.writers, self.job)
        self.writer.recover(list(handles or []))

    def report(self, op: Any, record: Any, exc: BaseException, index: int, size: int) -> None:
        # the first operator's batch is the source's as read: its reader may name the record
        # (a Kafka reader: topic, partition and offset)
        at = self.where(index) if op is self.first else self.where()
        where = f"record {index} of {size} in its batch, {at}"
        self.writer.write([dead_letter(op, record, exc, self.task, where)])
        self.reported += 1

    def pre_commit(self, checkpoint_id: int) -> list[dict]:
        """Stage this checkpoint's dead letters; the handles to store in the snapshot."""
        self.uncommitted[checkpoint_id] = self.writer.pre_commit(checkpoint_id)
        return [self.uncommitted[k] for k in sorted(self.uncommitted)]

    def commit_upto(self, checkpoint_id: int) -> None:
        done = sorted(k for k in self.uncommitted if k <= checkpoint_id)
        if done:
            self.writer.commit([self.uncommitted[k] for k in done])
        for k in done:
            del self.uncommitted[k]

    def close(self) -> None:
        self.writer.close()
