"""Names of the things the protocol connects: channels between subtasks."""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["ChannelId"]


class ChannelId(NamedTuple):
    """One channel: subtask ``src_index`` of chain ``src_chain`` to subtask ``dst_index`` of
    ``dst_chain`` (chains by uid).

    Its text, ``str(ch)`` = ``"<src chain>.<i>-><dst chain>.<j>"``, is what the wire, the
    control messages and the checkpoint files carry, and what a task keys its channels by
    (a plain ``str`` hashes fastest on the record path).  The text is parsed back in one
    place only, :meth:`parse`, for ids read from a checkpoint file.
    """

    src_chain: str
    src_index: int
    dst_chain: str
    dst_index: int

    def __str__(self) -> str:
        return f"{self.src_chain}.{self.src_index}->{self.dst_chain}.{self.dst_index}"

    @property
    def src_task(self) -> str:
        return f"{self.src_chain}.{self.src_index}"

    @property
    def dst_task(self) -> str:
        return f"{self.dst_chain}.{self.dst_index}"

    @classmethod
    def parse(cls, text: str) -> ChannelId:
        """The id whose text is ``text`` (as a checkpoint file stores it)."""
        src, sep, dst = text.partition("->")
        src_chain, _, i = src.rpartition(".")
        dst_chain, _, j = dst.rpartition(".")
        if not (sep and src_chain and dst_chain and i.isdigit() and j.isdigit()):
            raise ValueError(f"not a channel id: {text!r} (expected 'a.0->b.1')")
        return cls(src_chain, int(i), dst_chain, int(j))
