"""Control messages between tasks and the driver's checkpoint coordinator.

Frames are a 4-byte big-endian length and a msgpack map (never pickle).  A connection
starts with a challenge: the server sends a random nonce, the client answers with
HMAC-SHA256(job secret, nonce); the server refuses anything else before reading a single
control message.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import socket
import struct
import logging
import threading
from typing import Any

import msgpack

from ..protocol import messages

_log = logging.getLogger("cutline.control")

__all__ = ["CLOSED", "ControlService", "FrameConnection", "HandshakeError", "connect", "accept"]

CLOSED = object()
"""Put on a :class:`ControlService`'s queue as ``(conn, CLOSED)`` when ``conn`` closes."""

_LEN = struct.Struct("!I")
MAX_FRAME = 64 * 1024 * 1024


class HandshakeError(ConnectionError):
    pass


class FrameConnection:
    """A socket carrying control messages (:mod:`cutline.protocol.messages`, one per frame);
    ``send`` is thread-safe."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._send_lock = threading.Lock()

    def send(self, msg: messages.Message) -> None:
        self._send_frame(messages.encode(msg))

    def recv(self) -> messages.Message:
        """The next message; :class:`~cutline.protocol.messages.MessageError` for a frame
        that is none (the connection stays usable: the caller logs it and reads on)."""
        return messages.decode(self._recv_frame())

    def _send_frame(self, body: bytes) -> None:
        with self._send_lock:
            self.sock.sendall(_LEN.pack(len(body)) + body)

    def _send_raw(self, msg: dict[str, Any]) -> None:  # the handshake's own frames
        self._send_frame(msgpack.packb(msg, use_bin_type=True))

    def _read_exact(self, n: int) -> bytes:
        chunks, got = [], 0
        while got < n:
            chunk = self.sock.recv(min(n - got, 1 << 20))
            if not chunk:
                raise ConnectionError("control connection closed by peer")
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def _recv_frame(self) -> bytes:
        (n,) = _LEN.unpack(self._read_exact(4))
        if n > MAX_FRAME:
            raise ConnectionError(f"control frame of {n} bytes exceeds {MAX_FRAME}")
        return self._read_exact(n)

    def _recv_raw(self) -> dict[str, Any]:
        msg = msgpack.unpackb(self._recv_frame(), raw=False, strict_map_key=False)
        if not isinstance(msg, dict):
            raise ConnectionError("malformed control frame")
        return msg

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def _mac(secret: bytes, nonce: bytes) -> bytes:
    return hmac.new(secret, b"cutline-control" + nonce, hashlib.sha256).digest()


def connect(address: tuple[str, int], secret: bytes, timeout: float = 30.0) -> FrameConnection:
    sock = socket.create_connection(address, timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conn = FrameConnection(sock)
    try:
        challenge = conn._recv_raw()
        conn._send_raw({"op": "hello", "mac": _mac(secret, challenge["nonce"])})
        reply = conn._recv_raw()
    except (OSError, KeyError, ConnectionError) as exc:
        conn.close()
        raise HandshakeError(f"coordinator at {address[0]}:{address[1]} refused us: {exc}")
    if reply.get("op") != "welcome":
        conn.close()
        raise HandshakeError(f"coordinator at {address[0]}:{address[1]} refused us: {reply}")
    sock.settimeout(None)
    return conn


def accept(sock: socket.socket, secret: bytes, timeout: float = 10.0) -> FrameConnection:
    """Server side of the handshake; raises HandshakeError for strangers."""
    sock.settimeout(timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conn = FrameConnection(sock)
    nonce = secrets.token_bytes(16)
    try:
        conn._send_raw({"op": "challenge", "nonce": nonce})
        hello = conn._recv_raw()
    except (OSError, ConnectionError, ValueError, msgpack.UnpackException) as exc:
        conn.close()
        raise HandshakeError(f"handshake failed: {exc}") from None
    mac = hello.get("mac") if isinstance(hello, dict) else None
    if not isinstance(mac, bytes) or not hmac.compare_digest(mac, _mac(secret, nonce)):
        try:
            conn._send_raw({"op": "refused"})
        finally:
            conn.close()
        raise HandshakeError("wrong job secret")
    conn._send_raw({"op": "welcome"})
    sock.settimeout(None)
    return conn


class ControlService:
    """A driver's listening socket: connections must pass the handshake with ``secret``
    (strangers are refused and logged, never read); every message then arrives on ``events``
    as ``(conn, msg)``, and a closed connection as ``(conn, CLOSED)``.  A frame that is no
    message of this codec version is logged and dropped.
    :meth:`close` closes every connection still open, of any attempt."""

    def __init__(self, host: str, secret: bytes, events: Any, name: str = "cutline") -> None:
        self.secret, self.events, self.name = secret, events, name
        self._server = socket.create_server((host, 0))
        self._server.settimeout(0.2)  # close() does not wake accept(): poll _stopping
        self.address: tuple[str, int] = self._server.getsockname()[:2]
        self._stopping = False
        self._conns: set[FrameConnection] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept_loop, name=f"{name}-accept",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stopping = True
        try:
            self._server.close()
        except OSError:
            pass
        with self._lock:
            conns, self._conns = list(self._conns), set()
        for c in conns:
            try:
                c.close()
            except OSError:
                pass
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=2)

    def _accept_loop(self) -> None:
        while not self._stopping:
            try:
                sock, peer = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            sock.settimeout(None)
            threading.Thread(target=self._serve, args=(sock, peer), daemon=True).start()

    def _serve(self, sock: socket.socket, peer: Any) -> None:
        try:
            conn = accept(sock, self.secret)
        except HandshakeError as exc:
            _log.warning("%s: refused control connection from %s: %s", self.name, peer, exc)
            return
        with self._lock:
            if self._stopping:
                conn.close()
                return
            self._conns.add(conn)
        try:
            while True:
                try:
                    msg = conn.recv()
                except messages.MessageError as exc:
                    _log.error("%s: dropped a control message from %s: %s", self.name, peer, exc)
                    continue
                self.events.put((conn, msg))
        except (ConnectionError, OSError):
            self.events.put((conn, CLOSED))
        finally:
            with self._lock:
                self._conns.discard(conn)
