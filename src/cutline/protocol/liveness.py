"""Heartbeats, sans-IO: when to send one, and which peer went silent.

One :class:`Liveness` per process watches every connection that process owns (a task's
control connection and data channels, or the driver's task connections).  It is told what
happened (``received``: bytes came from a peer, a frame or part of one, heartbeats
included; ``sent``: something went to it) and, on ``tick``, returns what to do:

- :class:`SendHeartbeat`: nothing went to ``peer`` for ``interval`` seconds: send one, then
  report it with :meth:`Liveness.sent` (until then every tick asks again);
- :class:`PeerSilent`: nothing came from ``peer`` for ``timeout`` seconds: treat it as
  failed (a frozen process, a half-open or blackholed connection).  Said once per peer.

So a live peer is never silent, however idle it is: a source with nothing to read, a sender
waiting for credit and a receiver with no credit to return all send heartbeats.  Nothing
here reads a clock or a socket; the shell (:mod:`cutline.runtime.heartbeats`) ticks it every
:attr:`Liveness.period` seconds and carries out the actions.

A tick that comes late (more than ``interval`` after the previous one) means this process
was itself stopped or starved, and its reader threads may not have caught up with what
arrived meanwhile: no peer is declared silent until ``interval`` after such a tick.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass
from typing import TypeAlias

__all__ = ["HEARTBEAT_TIMEOUT", "Liveness", "LivenessAction", "PeerSilent", "SendHeartbeat",
           "check_timeout"]

HEARTBEAT_TIMEOUT = 30.0
"""Seconds of silence after which a peer is failed.  It must outlast the longest pause of a
live peer: a Python process's heartbeat thread waits for the GIL behind a long C call
(pickling or Arrow-encoding a large batch, a RocksDB checkpoint, a user function in C) and
for the CPU on an overloaded host; that is seconds, not tens of seconds (no JVM-sized
garbage-collection pauses, for which Flink's ``heartbeat.timeout`` is 50 s).  It should also
stay well below the recovery watchdog's ``restart_timeout`` (180 s): a frozen task costs at
most this long before the normal recovery starts.  Heartbeats go out every fifth of it
(Flink's 10 s interval to 50 s timeout), so one or two lost to a busy peer never matter."""

INTERVALS_PER_TIMEOUT = 5


def check_timeout(value: object, name: str = "heartbeat_timeout") -> float:
    """``value`` as a timeout in seconds (heartbeat, start, restart); ValueError naming
    ``name`` otherwise."""
    if (not isinstance(value, (int, float)) or isinstance(value, bool)
            or not math.isfinite(value) or value <= 0):
        raise ValueError(f"{name} must be a positive, finite number of seconds, got "
                         f"{value!r}")
    return float(value)


@dataclass(frozen=True, slots=True)
class SendHeartbeat:
    peer: Hashable


@dataclass(frozen=True, slots=True)
class PeerSilent:
    """Nothing came from ``peer`` for ``silent_for`` (>= the timeout) seconds."""
    peer: Hashable
    silent_for: float


LivenessAction: TypeAlias = SendHeartbeat | PeerSilent


class _Peer:
    __slots__ = ("heard", "said")

    def __init__(self, now: float) -> None:
        self.heard = now  # when something last came from it (or when watching began)
        self.said = now  # when something last went to it


class Liveness:
    """Heartbeat decisions for any number of peers (opaque hashable handles)."""

    def __init__(self, timeout: float, interval: float | None = None) -> None:
        self.timeout = check_timeout(timeout)
        self.interval = (self.timeout / INTERVALS_PER_TIMEOUT if interval is None
                         else check_timeout(interval, "heartbeat interval"))
        if self.interval >= self.timeout:
            raise ValueError(f"heartbeat interval ({self.interval:g} s) must be shorter "
                             f"than the timeout ({self.timeout:g} s)")
        self._peers: dict[Hashable, _Peer] = {}
        self._last_tick: float | None = None
        self._judge_from = -math.inf  # no silence declared before (after a late tick)

    @property
    def period(self) -> float:
        """How often to tick: a silent peer is found at most this late."""
        return min(self.interval / 2, 1.0)

    @property
    def peers(self) -> list[Hashable]:
        return list(self._peers)

    def watch(self, peer: Hashable, now: float) -> None:
        """Start watching ``peer`` (connected now)."""
        self._peers[peer] = _Peer(now)

    def forget(self, peer: Hashable) -> None:
        """Stop watching ``peer`` (closed, or done with: after EOF, say)."""
        self._peers.pop(peer, None)

    def received(self, peer: Hashable, now: float) -> None:
        p = self._peers.get(peer)
        if p is not None and now > p.heard:
            p.heard = now

    def sent(self, peer: Hashable, now: float) -> None:
        p = self._peers.get(peer)
        if p is not None and now > p.said:
            p.said = now

    def tick(self, now: float) -> list[LivenessAction]:
        """What to do now; a silent peer is reported once and then forgotten."""
        if self._last_tick is not None and now - self._last_tick > self.interval:
            self._judge_from = now + self.interval  # we were stopped: let readers catch up
        self._last_tick = now
        actions: list[LivenessAction] = []
        for peer, p in list(self._peers.items()):
            if now - p.heard >= self.timeout and now >= self._judge_from:
                actions.append(PeerSilent(peer, now - p.heard))
                del self._peers[peer]
            elif now - p.said >= self.interval:
                actions.append(SendHeartbeat(peer))
        return actions
