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
import threading
from typing import Any

import msgpack

__all__ = ["FrameConnection", "HandshakeError", "connect", "accept"]

_LEN = struct.Struct("!I")
MAX_FRAME = 64 * 1024 * 1024


class HandshakeError(ConnectionError):
    pass


class FrameConnection:
    """A socket carrying msgpack frames; ``send`` is thread-safe."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._send_lock = threading.Lock()

    def send(self, msg: dict[str, Any]) -> None:
        body = msgpack.packb(msg, use_bin_type=True)
        with self._send_lock:
            self.sock.sendall(_LEN.pack(len(body)) + body)

    def _read_exact(self, n: int) -> bytes:
        chunks, got = [], 0
        while got < n:
            chunk = self.sock.recv(min(n - got, 1 << 20))
            if not chunk:
                raise ConnectionError("control connection closed by peer")
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def recv(self) -> dict[str, Any]:
        (n,) = _LEN.unpack(self._read_exact(4))
        if n > MAX_FRAME:
            raise ConnectionError(f"control frame of {n} bytes exceeds {MAX_FRAME}")
        msg = msgpack.unpackb(self._read_exact(n), raw=False, strict_map_key=False)
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
        challenge = conn.recv()
        conn.send({"op": "hello", "mac": _mac(secret, challenge["nonce"])})
        reply = conn.recv()
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
        conn.send({"op": "challenge", "nonce": nonce})
        hello = conn.recv()
    except (OSError, ConnectionError, ValueError, msgpack.UnpackException) as exc:
        conn.close()
        raise HandshakeError(f"handshake failed: {exc}") from None
    mac = hello.get("mac") if isinstance(hello, dict) else None
    if not isinstance(mac, bytes) or not hmac.compare_digest(mac, _mac(secret, nonce)):
        try:
            conn.send({"op": "refused"})
        finally:
            conn.close()
        raise HandshakeError("wrong job secret")
    conn.send({"op": "welcome"})
    sock.settimeout(None)
    return conn
