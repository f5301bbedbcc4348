"""The operator chain of a subtask: batches pass through its operators by function call.

``OperatorChain.process(batch)`` runs the chain's operators (maps, filters, keyed
operators ...; the source and the sink are the task's ends, not in the chain) and names the
batch's origin in a user-code error: the input channel it came from, or the source position
it was read up to.
"""

from __future__ import annotations

from typing import Any

from .operators import UserFunctionError

__all__ = ["OperatorChain", "describe_position"]


def describe_position(pos: Any) -> str:
    """A source position, short: file and line for files, else the position itself."""
    if isinstance(pos, dict) and pos.get("file") is not None:
        where = f"file {pos['file']!r}"
        if pos.get("line") is not None:
            where += f" line {pos['line']}"
        if pos.get("offset") is not None:
            where += f" (offset {pos['offset']})"
        return where
    text = repr(pos)
    return text if len(text) <= 200 else text[:200] + "..."


class OperatorChain:
    """The operators between a subtask's input (a source or channels) and its output."""

    def __init__(self, ops: list, task_id: str, source_uid: str | None, index: int,
                 reader: Any) -> None:
        self.ops = ops
        self.task_id, self.source_uid, self.index, self.reader = task_id, source_uid, index, reader
        self.origin: str | None = None  # input channel of the batch in the chain

    def process(self, batch: list) -> list:
        op = None
        try:
            for op in self.ops:
                if not batch:
                    return batch
                batch = op.process(batch)
        except UserFunctionError as exc:
            # the first operator got the source's batch as read: its index is the reader's
            exc.locate(self.where(exc.index if op is self.ops[0] else None))
            raise
        return batch

    def where(self, index: int | None = None) -> str:
        """Where the batch in the chain came from (record ``index`` of what the source
        read, if known): for errors and dead letters."""
        if self.origin is not None:
            return f"input channel {self.origin!r} of task {self.task_id}"
        if self.reader is not None:
            locate = getattr(self.reader, "locate", None)
            at = locate(index) if locate is not None else None
            if at:
                return f"source {self.source_uid!r} subtask {self.index}, {at}"
            return (f"source {self.source_uid!r} subtask {self.index}, in the batch read "
                    f"up to {describe_position(self.reader.snapshot())}")
        return f"task {self.task_id}"

    def keyed(self) -> list:
        """The operators with keyed state (snapshotted and restored by uid)."""
        return [op for op in self.ops if op.keyed]

    def close(self) -> None:
        for op in self.ops:  # state backends: RocksDB removes its local files
            try:
                getattr(op, "close", lambda: None)()
            except Exception:  # noqa: BLE001, S110 - closing on the way out
                pass
