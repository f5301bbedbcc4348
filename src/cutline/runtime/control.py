"""Control messages between tasks and the driver's checkpoint coordinator.

The connection is :mod:`.net`'s (frames, HMAC challenge/response with the job secret for
the purpose ``"control"``, refused strangers never read); every MESSAGE frame carries one
message (:mod:`cutline.protocol.messages`, whose codec is the one place a message becomes
bytes and back: msgpack, never pickle).  A frame that is no message of this codec version
is logged and dropped; the connection stays up.

With a heartbeat monitor (:mod:`.heartbeats`) on both ends, an idle control connection
carries heartbeats both ways: the driver fails a task it hears nothing from for the
heartbeat timeout (:class:`Closed` with the monitor's reason), and a task fails when its
driver goes silent, instead of waiting for it forever.
"""

from __future__ import annotations

import logging
import socket
from dataclasses import dataclass
from typing import Any

from ..protocol import messages
from . import net
from .heartbeats import Heartbeats
from .net import HandshakeError

_log = logging.getLogger("cutline.control")

__all__ = ["CONTROL", "Closed", "ControlService", "FrameConnection", "HandshakeError",
           "ProtocolError", "Received", "connect"]

CONTROL = "control"  # the purpose of a task's (or host's) connection to its driver
MESSAGE = net.FIRST_KIND  # the frame kind of one message
MAX_FRAME = 64 * 1024 * 1024


class ProtocolError(ConnectionError):
    """An authenticated peer sent something that is not a control message."""


class FrameConnection:
    """An authenticated connection carrying messages; ``send`` is thread-safe."""

    def __init__(self, conn: net.Connection) -> None:
        self.conn = conn
        self.sock: socket.socket = conn.sock

    @property
    def silence(self) -> str | None:
        """Why the heartbeat monitor ended this connection (its peer went silent), or None."""
        return self.conn.silence

    def settimeout(self, timeout: float | None) -> None:
        self.conn.settimeout(timeout)

    def send_frame(self, frame: bytes) -> None:
        self.conn.send(MESSAGE, frame)

    def try_send(self, msg: messages.Message) -> bool:
        """Send ``msg`` only if that cannot block (:meth:`~.net.Connection.try_send`)."""
        return self.conn.try_send(MESSAGE, messages.encode(msg))

    def recv_frame(self) -> bytes:
        """The next message's bytes; ConnectionError once the peer closed or broke the
        protocol."""
        try:
            kind, payload = self.conn.recv(MAX_FRAME)
        except EOFError:
            raise ConnectionError(self.conn.silence or "control connection closed by peer") \
                from None
        except OSError:
            if self.conn.silence:  # shut down by the heartbeat monitor: say why
                raise ConnectionError(self.conn.silence) from None
            raise
        except ValueError as exc:  # too long
            raise ProtocolError(f"control {exc}") from None
        if kind != MESSAGE:
            raise ProtocolError(f"unexpected control frame of type {kind}")
        return bytes(payload)

    def send(self, msg: messages.Message) -> None:
        self.send_frame(messages.encode(msg))

    def recv(self) -> messages.Message:
        """The next message; :class:`~cutline.protocol.messages.MessageError` for a frame
        that is none (the connection stays usable: the caller logs it and reads on)."""
        return messages.decode(self.recv_frame())

    def close(self) -> None:
        self.conn.close()


@dataclass(frozen=True, slots=True, eq=False)
class Received:
    """A :class:`ControlService` event: ``msg`` came on ``conn``."""
    conn: FrameConnection
    msg: messages.Message


@dataclass(frozen=True, slots=True, eq=False)
class Closed:
    """A :class:`ControlService` event: ``conn`` closed; ``cause``: why, when this end
    closed it (the heartbeat monitor: its peer went silent), else None."""
    conn: FrameConnection
    cause: str | None = None


def connect(address: tuple[str, int], secret: net.JobSecret | bytes,
            timeout: float = 30.0) -> FrameConnection:
    """A task's (or host's) connection to its driver; HandshakeError when refused."""
    try:
        return FrameConnection(net.connect(address, secret, CONTROL, timeout))
    except HandshakeError as exc:
        raise HandshakeError(f"coordinator at {address[0]}:{address[1]} refused us: "
                             f"{exc}") from None


class ControlService:
    """A driver's listening socket: connections must pass the handshake with ``secret``
    (strangers are refused and logged, never read); every message then arrives on ``events``
    as :class:`Received`, and a closed connection as :class:`Closed`.
    :meth:`close` closes every connection still open, of any attempt."""

    def __init__(self, host: str, secret: net.JobSecret | bytes, events: Any,
                 name: str = "cutline", heartbeats: Heartbeats | None = None,
                 peer: str = "the task") -> None:
        self.secret, self.events, self.name = secret, events, name
        self.peer = peer  # what a peer is called when it goes silent
        self._heartbeats = heartbeats
        self._listener = net.Listener(host, secret, admit=net.only(CONTROL), serve=self._serve,
                                      name=f"{name}-accept", log=_log,
                                      refusal=f"{name}: refused control connection")
        self.address: tuple[str, int] = self._listener.address

    def start(self) -> None:
        self._listener.start()

    def close(self) -> None:
        self._listener.close()

    def _serve(self, raw: net.Connection) -> None:
        conn = FrameConnection(raw)
        hb = self._heartbeats
        if hb is not None:
            hb.watch(raw, self.peer)
        try:
            while True:
                try:
                    msg = conn.recv()
                except messages.MessageError as exc:
                    _log.error("%s: dropped a control message from %s: %s", self.name,
                               raw.peer, exc)
                    continue
                self.events.put(Received(conn, msg))
        except ProtocolError as exc:
            _log.warning("%s: dropped the control connection from %s: %s", self.name,
                         raw.peer, exc)
            self.events.put(Closed(conn, conn.silence))
        except (ConnectionError, OSError):
            self.events.put(Closed(conn, conn.silence))
        finally:
            if hb is not None:
                hb.forget(raw)
