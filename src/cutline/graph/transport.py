"""The logical channels between the processes of two hosts, over one TCP channel.

Every host pair with at least one process channel between them gets one
:class:`~cutline.runtime.channels.OutputChannel` -> :class:`~cutline.runtime.channels.InputGate`
(FIFO, credit-based, HMAC handshake).  A process channel ``a -> b`` (edge ``e``) lives
entirely inside the one for ``host(a) -> host(b)``, so it is FIFO too: its items travel
in order in the same record stream, ``(e, message)`` for a message and ``(~e, id)`` for a
marker.  So the number of sockets grows with the number of hosts, not with the number of
process channels.

Sends never block: items wait in an unbounded outbox per peer, handed to the TCP channel
as credit allows.  A host that blocked on credit while its peer blocked on credit from it
would deadlock on a cycle of processes; Chandy and Lamport's model assumes unbounded
channels too.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator

from ..runtime.channels import ChannelError, InputGate, OutputChannel
from ..runtime.tls import JobSecret

__all__ = ["Transport"]

BATCH = 1000  # items per record batch on the wire


class Transport:
    def __init__(self, slot: int, senders: list[int], peers: list[int],
                 secret: JobSecret | bytes, host: str) -> None:
        self.slot, self.senders, self.peers, self.secret = slot, senders, peers, secret
        self.gate = (InputGate(f"host-{slot}", [f"h{j}->h{slot}" for j in senders], secret,
                               host=host, credits=16) if senders else None)
        self.outs: dict[int, OutputChannel] = {}
        self.outbox: dict[int, list] = {k: [] for k in peers}
        self.sealed: dict[int, deque] = {k: deque() for k in peers}
        self.ended = 0  # input channels that delivered EOF

    @property
    def address(self) -> tuple[str, int] | None:
        return self.gate.address if self.gate else None

    def connect(self, addresses: dict[int, tuple[str, int]], timeout: float = 60.0) -> None:
        for k in self.peers:
            self.outs[k] = OutputChannel(f"h{self.slot}->h{k}", addresses[k], self.secret)
        if self.gate is not None:
            self.gate.wait_connected(timeout)

    def put(self, peer: int, item: tuple) -> None:
        self.outbox[peer].append(item)

    @property
    def backlog(self) -> bool:
        """Batches wait for credit."""
        return any(self.sealed.values())

    def flush(self) -> None:
        """Hand what is in the outboxes to the TCP channels, as far as credit allows."""
        for k, buf in self.outbox.items():
            if buf:
                sealed = self.sealed[k]
                for i in range(0, len(buf), BATCH):
                    sealed.append(buf[i:i + BATCH])
                self.outbox[k] = []
        for k, sealed in self.sealed.items():
            out = self.outs[k]
            while sealed:
                try:
                    out.send_records(sealed[0], timeout=0.0)
                except TimeoutError:
                    break
                sealed.popleft()

    def receive(self, timeout: float, limit: int = 64) -> Iterator[list]:
        """Record batches that arrived (waiting up to ``timeout`` for the first); raises
        :class:`ChannelError` once a peer's channel broke."""
        if self.gate is None:
            return
        item = self.gate.poll(frozenset(), timeout)
        got = 0
        while item is not None:
            _, kind, payload = item
            if kind == "records":
                yield payload
            elif kind == "eof":
                self.ended += 1  # a peer stopped first; nothing more comes from it
            got += 1
            if got >= limit:
                return
            item = self.gate.poll(frozenset(), 0.0)

    def finish(self, wait: float = 15.0) -> None:
        """End every output with EOF, then read (and drop) until every input ended, so no
        peer's last send hits a closed gate."""
        for out in self.outs.values():
            try:
                out.send_eof()
            except (ChannelError, OSError):
                pass
        deadline = time.monotonic() + wait
        while self.gate is not None and self.ended < len(self.senders) \
                and time.monotonic() < deadline:
            try:
                for _ in self.receive(0.1):
                    pass
            except ChannelError:
                return  # a peer went away without EOF: nothing more will come from it

    def close(self) -> None:
        for out in self.outs.values():
            try:
                out.close()
            except Exception:  # noqa: BLE001 - closing on the way out
                pass
        if self.gate is not None:
            self.gate.close()
