"""The heartbeat monitor of one process: a thin shell around
:class:`~cutline.protocol.liveness.Liveness`.

A task slot watches its control connection and its data channels with one; the driver
watches its tasks' control connections with another.  Every :attr:`Liveness.period`
seconds its thread reads how far each watched :class:`~.net.Connection`'s counters moved,
ticks the state machine, and carries out what it says: a HEARTBEAT frame on an idle
connection (:meth:`~.net.Connection.try_send`: never blocks, so a peer that stopped
reading cannot stall the monitor), or, for a peer silent for ``timeout`` seconds,
:meth:`~.net.Connection.go_silent`: the connection is shut down and whoever reads or writes
it fails with the reason (a channel error naming the channel, a lost task, a lost driver).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from ..protocol.job import remember
from ..protocol.liveness import Liveness, PeerSilent, SendHeartbeat
from . import net

log = logging.getLogger("cutline.heartbeats")

__all__ = ["Heartbeats"]


class _Watched:
    __slots__ = ("before_silent", "conn", "received", "sent", "who")

    def __init__(self, conn: net.Connection, who: str,
                 before_silent: Callable[[str], None] | None) -> None:
        self.conn, self.who, self.before_silent = conn, who, before_silent
        self.received, self.sent = conn.received, conn.sent


class Heartbeats:
    """Sends heartbeats on the connections it watches and ends the silent ones."""

    def __init__(self, timeout: float, name: str = "cutline-heartbeats") -> None:
        self.liveness = Liveness(timeout)
        self.timeout = self.liveness.timeout
        self.silent: list[str] = []  # why it ended connections, in order (the newest)
        self._watched: dict[net.Connection, _Watched] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(2.0)

    def watch(self, conn: net.Connection, who: str,
              before_silent: Callable[[str], None] | None = None) -> None:
        """Watch ``conn``, whose peer is ``who`` in messages ("the sender", "the driver");
        ``before_silent(reason)`` runs before a silent connection is shut down."""
        with self._lock:
            self._watched[conn] = _Watched(conn, who, before_silent)
            self.liveness.watch(conn, time.monotonic())

    def forget(self, conn: net.Connection) -> None:
        with self._lock:
            self._watched.pop(conn, None)
            self.liveness.forget(conn)

    def _run(self) -> None:
        period = self.liveness.period
        while not self._stop.wait(period):
            try:
                self.tick(time.monotonic())
            except Exception:  # noqa: BLE001 - the monitor must outlive a bug in one tick
                log.exception("heartbeat monitor: tick failed")

    def tick(self, now: float) -> None:
        with self._lock:
            lv = self.liveness
            for conn, w in self._watched.items():
                if conn.received != w.received:
                    w.received = conn.received
                    lv.received(conn, now)
                if conn.sent != w.sent:
                    w.sent = conn.sent
                    lv.sent(conn, now)
            actions = lv.tick(now)
            silent = [(a, self._watched.pop(a.peer)) for a in actions
                      if type(a) is PeerSilent and a.peer in self._watched]
        for a in actions:
            if type(a) is SendHeartbeat:
                peer = a.peer
                assert isinstance(peer, net.Connection)
                if peer.try_send(net.HEARTBEAT):
                    with self._lock:
                        lv.sent(peer, now)
        for a, w in silent:
            assert isinstance(a, PeerSilent)
            reason = (f"{w.who} went silent: nothing heard for {a.silent_for:.1f} s "
                      f"(heartbeat_timeout={self.timeout:g})")
            log.warning("%s: %s", w.conn.purpose, reason)
            remember(self.silent, reason, 100)
            if w.before_silent is not None:
                try:
                    w.before_silent(reason)
                except Exception:  # noqa: BLE001 - the connection is ended regardless
                    log.exception("heartbeat monitor: %s", w.conn.purpose)
            w.conn.go_silent(reason)
