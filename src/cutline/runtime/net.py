"""One network layer for every cutline connection: framing, handshake, accept loop.

Data channels (:mod:`.channels`), the driver's control service (:mod:`.control`) and the
admin port (``cutline.spark.admin``) all speak this, and only this, on TCP:

* **Frames**: ``struct "!BI"`` (kind, payload length) and the payload.  Kinds 1-4 belong to
  the handshake, 5 is a heartbeat; a protocol on top picks its own from :data:`FIRST_KIND` up.
* **Handshake** (per-job secret, challenge/response, purpose bound into the MAC): the
  listener sends HELLO(16-byte random nonce); the client answers HELLO(mac + purpose) with
  ``mac = HMAC-SHA256(secret, b"cutline-net-1" + len(purpose) + purpose + nonce)``; the
  listener answers WELCOME, or REJECT(reason) and closes.  The purpose names what the
  connection is for (``"control"``, ``"admin"``, ``"channel 'a->b'"``), so an answer made
  for one purpose is refused for any other, and a nonce is never reused, so no answer can
  be replayed.  Peers are authenticated once at connect.
* **TLS** (when the job's :class:`~.tls.JobSecret` carries a certificate): the listener
  first sends STARTTLS (one empty frame, in the clear), then both sides run a TLS 1.3
  handshake in which each presents the job's certificate and pins the other's (the admin
  port: the listener only); the HELLO exchange above and every frame after it travel inside
  TLS.  A client whose job has TLS off refuses a STARTTLS, and a client whose job has TLS on
  refuses a listener that offers none (no downgrade): both say so.
* **Accept loop** (:class:`Listener`): one thread accepts; each connection gets a thread
  that runs the handshake under a timeout (a silent stranger blocks nobody), logs and
  refuses a stranger after reading nothing but its HELLO (at most :data:`MAX_HELLO` bytes),
  and hands an authenticated connection to the ``serve`` callback.
  :meth:`Listener.close` closes every connection it accepted.
* **Heartbeats**: a HEARTBEAT frame (empty) may come at any time after the handshake;
  :meth:`Connection.recv` skips it.  :class:`Connection` counts what it receives (every
  chunk of a frame, heartbeats too) and sends, which is all the heartbeat monitor
  (:mod:`.heartbeats`) looks at; it sends heartbeats with :meth:`Connection.try_send`,
  which never blocks, and ends a silent connection with :meth:`Connection.go_silent`.

Why blocking sockets with a reader thread per connection, not ``multiprocessing.connection``
or asyncio: ``python bench/net.py`` part 1 (1,000-dict pickled batches from a child process,
decoded by the receiving thread and handed to the main thread, which returns credits;
credits 8; shared 2-core box at load 8-10, two runs of 9 and 11 rounds, medians): sockets
844 k / 549 k records/s; ``multiprocessing.connection`` 784 k / 470 k (paired ratio 0.91 /
0.91); asyncio 749 k / 546 k (0.92 / 0.96).  ``multiprocessing.connection`` receives into a
``BytesIO`` (one more copy than ``recv_into`` a preallocated buffer) and asyncio adds a hop
between the event-loop thread and the task's thread for every batch and credit.  Its
handshake is faster (273 us against 441 us per connect, once per channel per attempt)
because ``Listener.accept`` authenticates in the accepting thread, with no timeout: one
silent stranger stops every accept; it also uses HMAC-MD5 on Python 3.11 and binds no
purpose.  Here a connection costs a thread start, and a stranger costs only its own.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import select
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

from .tls import JobSecret

__all__ = [
    "FIRST_KIND", "HEARTBEAT", "HELLO", "MAX_HELLO", "REJECT", "STARTTLS", "WELCOME",
    "Connection", "HandshakeError", "JobSecret", "Listener", "NotAListener", "Refused",
    "client_handshake", "connect", "make_mac",
]

HELLO, WELCOME, REJECT, STARTTLS = 1, 2, 3, 4
HEARTBEAT = 5  # "still here": empty, skipped by Connection.recv
FIRST_KIND = 8  # the first frame kind free for a protocol on top
HEADER = struct.Struct("!BI")
NONCE_BYTES = 16
MAC_BYTES = 32
MAX_HELLO = 4096  # longest frame accepted from a peer that has not authenticated (yet)
HANDSHAKE_TIMEOUT = 10.0
_DOMAIN = b"cutline-net-1"
_COPY_BELOW = 65536  # smaller payloads are sent in one sendall with their header


class HandshakeError(ConnectionError):
    """The peer did not complete the handshake: refused us, or is not a cutline listener."""


class Refused(HandshakeError):
    """The listener refused us; :attr:`reason` is what it said."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class NotAListener(HandshakeError):
    """What answered does not speak this protocol."""


def make_mac(secret: JobSecret | bytes, purpose: str, nonce: bytes) -> bytes:
    """The answer to ``nonce`` for ``purpose``; worthless for any other purpose or nonce."""
    p = purpose.encode()
    msg = _DOMAIN + len(p).to_bytes(4, "big") + p + nonce
    key = secret.key if isinstance(secret, JobSecret) else secret
    return hmac.new(key, msg, hashlib.sha256).digest()


def shutdown(sock: socket.socket, how: int = socket.SHUT_RDWR) -> None:
    """Shut the connection down (a TLS socket's too, whose own ``shutdown`` would drop its
    TLS state under a thread still reading it); an error (already closed) is ignored."""
    try:
        socket.socket.shutdown(sock, how)
    except OSError:
        pass


def recv_exact(sock: socket.socket, n: int) -> bytearray:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise EOFError("connection closed" + (" mid-frame" if got else ""))
        got += k
    return buf


def read_frame(sock: socket.socket, max_len: int = 2**32) -> tuple[int, bytearray]:
    kind, length = HEADER.unpack(recv_exact(sock, HEADER.size))
    if length > max_len:
        raise ValueError(f"frame of type {kind} too long ({length} bytes)")
    return kind, recv_exact(sock, length)


def send_frame(sock: socket.socket, kind: int, payload: bytes | bytearray = b"") -> None:
    header = HEADER.pack(kind, len(payload))
    if len(payload) < _COPY_BELOW:
        sock.sendall(header + payload)
    else:  # don't copy a big payload to prepend five bytes
        sock.sendall(header)
        sock.sendall(payload)


def tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, name):  # a peer host that vanishes is noticed in ~25 s
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


class Connection:
    """An authenticated connection carrying frames.  :meth:`send` is thread-safe (one
    sender at a time); :meth:`recv` belongs to one reader thread.

    ``received`` / ``sent`` count chunks read and frames sent (the heartbeat monitor only
    looks whether they moved); ``silence`` says why the monitor ended a silent connection
    (readers and writers then fail with it instead of a bare connection error).

    A TLS connection is read by one thread while others write to it, and OpenSSL forbids
    two threads in one ``SSL`` object at once (SSL_read and SSL_write included; CPython's
    ``ssl`` adds no lock and releases the GIL inside them).  So its socket is non-blocking,
    every TLS call holds :attr:`_tls_lock` (never while waiting), and a call that would
    block waits for the socket outside it (``poll``), then tries again.  Set its timeout
    with :meth:`settimeout`, not on :attr:`sock`."""

    __slots__ = ("_send_lock", "_timeout", "_tls_lock", "peer", "purpose", "received", "sent",
                 "silence", "sock")

    def __init__(self, sock: socket.socket, peer: Any, purpose: str) -> None:
        self.sock, self.peer, self.purpose = sock, peer, purpose
        self._send_lock = threading.Lock()
        self.received = self.sent = 0
        self.silence: str | None = None
        self._timeout = sock.gettimeout()
        self._tls_lock: threading.Lock | None = None
        if isinstance(sock, ssl.SSLSocket):
            self._tls_lock = threading.Lock()
            sock.setblocking(False)

    def settimeout(self, timeout: float | None) -> None:
        """Reads and writes fail with TimeoutError after ``timeout`` s (None: never)."""
        if self._tls_lock is None:
            self.sock.settimeout(timeout)
        self._timeout = timeout

    def _tls(self, call: Callable[[Any], int | bytes], arg: Any) -> Any:
        """``call(arg)`` on the TLS socket, alone in its ``SSL`` object, waiting outside
        the lock for the socket when it would block."""
        lock = self._tls_lock
        assert lock is not None
        deadline = None
        while True:
            with lock:
                try:
                    return call(arg)
                except ssl.SSLWantReadError:
                    event = select.POLLIN
                except ssl.SSLWantWriteError:
                    event = select.POLLOUT
                except ssl.SSLEOFError:  # TCP ended without TLS's goodbye: a reset
                    raise ConnectionResetError("the peer reset the connection") from None
            if deadline is None and self._timeout is not None:
                deadline = time.monotonic() + self._timeout
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            poller = select.poll()
            try:
                poller.register(self.sock, event)
            except ValueError:  # closed by another thread
                raise OSError("connection closed") from None
            if not poller.poll(None if wait is None else wait * 1000) and wait is not None:
                raise TimeoutError("timed out")

    def _sendall(self, data: bytes | bytearray | memoryview) -> None:
        if self._tls_lock is None:
            self.sock.sendall(data)
            return
        view = memoryview(data)
        while view:  # a write that would block has taken nothing: the same bytes again
            view = view[self._tls(self.sock.send, view):]

    def recv_some(self, n: int) -> bytes:
        """Up to ``n`` bytes as they come, no framing (b"": the peer closed)."""
        return self._tls(self.sock.recv, n) if self._tls_lock else self.sock.recv(n)

    def send(self, kind: int, payload: bytes | bytearray = b"") -> None:
        header = HEADER.pack(kind, len(payload))
        with self._send_lock:
            if len(payload) < _COPY_BELOW:
                self._sendall(header + payload)
            else:
                self._sendall(header)
                self._sendall(payload)
            self.sent += 1

    def try_send(self, kind: int, payload: bytes = b"") -> bool:
        """Send a small frame only if that cannot block: no other sender busy and room in
        the socket's buffer.  False: not sent (try again later)."""
        if not self._send_lock.acquire(blocking=False):
            return False
        try:
            poller = select.poll()
            poller.register(self.sock, select.POLLOUT)
            if not any(ev & select.POLLOUT for _, ev in poller.poll(0)):
                return False  # Linux says POLLOUT only with plenty of room: no blocking
            self._sendall(HEADER.pack(kind, len(payload)) + payload)
            self.sent += 1
            return True
        except (OSError, ValueError):  # closed meanwhile: its reader reports that
            return False
        finally:
            self._send_lock.release()

    def recv(self, max_len: int = 2**32) -> tuple[int, bytearray]:
        """The next ``(kind, payload)``, heartbeats skipped; EOFError once the peer
        closed."""
        while True:
            kind, length = HEADER.unpack(self._recv_exact(HEADER.size))
            if length > max_len:
                raise ValueError(f"frame of type {kind} too long ({length} bytes)")
            payload = self._recv_exact(length)
            if kind != HEARTBEAT:
                return kind, payload

    def _recv_exact(self, n: int) -> bytearray:
        buf = bytearray(n)
        view, got, recv_into = memoryview(buf), 0, self.sock.recv_into
        tls = self._tls if self._tls_lock is not None else None
        while got < n:
            k = tls(recv_into, view[got:]) if tls is not None else recv_into(view[got:])
            if k == 0:
                raise EOFError("connection closed" + (" mid-frame" if got else ""))
            got += k
            self.received += 1  # progress, even inside one long frame
        return buf

    def go_silent(self, reason: str) -> None:
        """The peer went silent: remember why, and shut the socket down, which wakes the
        reader (and a writer blocked on a full buffer) with an error."""
        self.silence = reason
        self.shutdown()

    def shutdown(self, how: int = socket.SHUT_RDWR) -> None:
        shutdown(self.sock, how)

    def close(self) -> None:
        self.shutdown()
        self.sock.close()


def client_handshake(sock: socket.socket, secret: JobSecret | bytes, purpose: str,
                     address: tuple[str, int]) -> Connection:
    """Authenticate an open ``sock`` for ``purpose`` (in TLS when ``secret`` has a
    certificate: the connection's socket is then a new, wrapped one); raises
    :class:`Refused`, :class:`NotAListener`, or HandshakeError for a connection lost on the
    way or a TLS mismatch.  The caller sets the socket's timeout; it is left blocking (no
    timeout) on success."""
    wrapped = [sock]
    try:
        return _client_handshake(wrapped, JobSecret.of(secret), purpose, address)
    except BaseException:
        if wrapped[0] is not sock:  # the TLS socket owns the connection now
            wrapped[0].close()
        raise


def _client_handshake(wrapped: list[socket.socket], secret: JobSecret, purpose: str,
                      address: tuple[str, int]) -> Connection:
    where = f"{address[0]}:{address[1]}"
    sock = wrapped[0]
    try:
        kind, nonce = _first_frame(sock)
        if kind == STARTTLS and not nonce:
            if not secret.tls:
                raise HandshakeError(f"{where} requires TLS, and this job runs without")
            try:
                sock = wrapped[0] = secret.client_context().wrap_socket(sock)
            except ssl.SSLCertVerificationError as exc:
                raise HandshakeError(f"{where} presented a TLS certificate that is not this "
                                     f"job's ({exc.verify_message})") from None
            kind, nonce = _first_frame(sock)
        elif kind == HELLO and secret.tls:
            raise HandshakeError(f"{where} does not offer TLS, and this job requires it")
        if kind != HELLO or len(nonce) != NONCE_BYTES:
            raise NotAListener(f"{where} is not a cutline listener")
        send_frame(sock, HELLO, make_mac(secret, purpose, bytes(nonce)) + purpose.encode())
        kind, payload = read_frame(sock, MAX_HELLO)
    except HandshakeError:
        raise
    except (OSError, EOFError, ValueError) as exc:
        raise HandshakeError(f"handshake with {where} failed: {exc}") from exc
    if kind == REJECT:
        raise Refused(payload.decode(errors="replace"))
    if kind != WELCOME:
        raise HandshakeError(f"unexpected handshake reply (frame type {kind})")
    sock.settimeout(None)
    return Connection(sock, address, purpose)


def _first_frame(sock: socket.socket) -> tuple[int, bytearray]:
    """The listener's first frame; ``(-1, b"")`` for one too long to be a HELLO."""
    try:
        return read_frame(sock, MAX_HELLO)
    except ssl.SSLError:  # (a certificate error is a ValueError too)
        raise
    except ValueError:
        return -1, bytearray()


def connect(address: tuple[str, int], secret: JobSecret | bytes, purpose: str,
            timeout: float = 30.0) -> Connection:
    """Open an authenticated connection to a :class:`Listener` for ``purpose``.  Raises
    OSError when nothing listens and :class:`HandshakeError` (an OSError too) when the
    handshake fails; ``timeout`` bounds the connect and the handshake."""
    sock = socket.create_connection(address, timeout=timeout)
    try:
        tune(sock)
        return client_handshake(sock, secret, purpose, address)
    except BaseException:
        sock.close()
        raise


def only(*purposes: str) -> Callable[[str], str | None]:
    """An ``admit`` callback for a listener that serves exactly these purposes."""
    allowed = frozenset(purposes)

    def admit(purpose: str) -> str | None:
        return None if purpose in allowed else f"wrong purpose {purpose!r}"
    return admit


class Listener:
    """Listens on ``(host, 0)``; every connection must pass the handshake with ``secret``
    for a purpose ``admit`` accepts (it returns None, or the reason for refusing), then
    ``serve(conn)`` runs in the connection's own thread, which closes the connection when
    ``serve`` returns.  Refusals are logged on ``log`` as ``"<refusal> from <peer>:
    <reason>"``.  Threads are named ``name`` (accept) and ``name-<peer>``."""

    def __init__(self, host: str, secret: JobSecret | bytes, *,
                 admit: Callable[[str], str | None],
                 serve: Callable[[Connection], None], name: str, log: logging.Logger,
                 refusal: str = "refused connection", timeout: float = HANDSHAKE_TIMEOUT,
                 backlog: int = 128) -> None:
        self._secret, self._admit, self._serve = JobSecret.of(secret), admit, serve
        self.name, self._log, self._refusal, self._timeout = name, log, refusal, timeout
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.create_server((host, 0), family=family, backlog=backlog)
        self._sock.settimeout(0.5)  # shutdown() wakes accept() at once on Linux; else poll
        self.address: tuple[str, int] = self._sock.getsockname()[:2]
        self._lock = threading.Lock()
        self._closed = False
        self._open: set[socket.socket] = set()  # every accepted socket not closed yet
        self._threads: list[threading.Thread] = []
        self._acceptor = threading.Thread(target=self._accept_loop, name=name, daemon=True)

    @property
    def closed(self) -> bool:
        return self._closed

    def start(self) -> None:
        self._acceptor.start()

    def close(self, wait: float = 0.0) -> None:
        """Stop accepting; give connections up to ``wait`` seconds to finish by themselves,
        then shut every one down and join their threads (2 s each at most)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        me = threading.current_thread()
        if self._acceptor.is_alive() and self._acceptor is not me:
            self._acceptor.join(2.0)
        self._sock.close()
        deadline = time.monotonic() + wait
        for t in list(self._threads):
            if t is not me and (left := deadline - time.monotonic()) > 0:
                t.join(left)
        with self._lock:
            socks = list(self._open)
        for s in socks:  # wakes the connection threads; each closes its own socket
            shutdown(s)
        for t in list(self._threads):
            if t is not me:
                t.join(2.0)

    def refuse(self, conn: Connection | socket.socket, peer: Any, reason: str) -> None:
        """Log the refusal and tell the peer why (it is closed by the connection thread)."""
        sock = conn.sock if isinstance(conn, Connection) else conn
        if self._closed:
            return
        self._log.warning("%s from %s: %s", self._refusal, peer, reason)
        try:
            sock.settimeout(1.0)
            send_frame(sock, REJECT, reason.encode()[:MAX_HELLO])
        except OSError:
            pass

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                sock, peer = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._closed:
                    return
                time.sleep(0.05)  # e.g. out of file descriptors: don't spin
                continue
            with self._lock:
                if self._closed:
                    sock.close()
                    return
                self._open.add(sock)
                self._threads = [t for t in self._threads if t.is_alive()]
                t = threading.Thread(target=self._run, args=(sock, peer), daemon=True,
                                     name=f"{self.name}-{peer}")
                self._threads.append(t)
            t.start()

    def _run(self, sock: socket.socket, peer: Any) -> None:
        held = [sock]  # the connection's socket: a TLS one once wrapped
        try:
            conn = self._handshake(held, peer)
            if conn is not None and not self._closed:
                self._serve(conn)
        except Exception:  # noqa: BLE001 - a serve bug must not pass silently
            self._log.exception("%s: connection from %s failed", self.name, peer)
        finally:
            with self._lock:
                self._open.discard(sock)
                self._open.discard(held[0])
            shutdown(held[0])
            held[0].close()
            sock.close()

    def _start_tls(self, held: list[socket.socket], peer: Any) -> bool:
        """STARTTLS, then the server side of the TLS handshake; False: refused (logged)."""
        sock = held[0]
        try:
            send_frame(sock, STARTTLS)
            wrapped = self._secret.server_context().wrap_socket(sock, server_side=True)
        except (OSError, EOFError) as exc:
            if not self._closed:
                self._log.warning("%s from %s: TLS handshake failed (%s)", self._refusal,
                                  peer, exc)
            return False
        with self._lock:
            self._open.discard(sock)
            self._open.add(wrapped)
        held[0] = wrapped
        return True

    def _handshake(self, held: list[socket.socket], peer: Any) -> Connection | None:
        nonce = secrets.token_bytes(NONCE_BYTES)
        sock = held[0]
        try:
            sock.settimeout(self._timeout)
            tune(sock)
            if self._secret.tls:
                if not self._start_tls(held, peer):
                    return None
                sock = held[0]
            send_frame(sock, HELLO, nonce)
            kind, payload = read_frame(sock, MAX_HELLO)
            if kind != HELLO:
                self.refuse(sock, peer, f"expected HELLO, got frame type {kind}")
                return None
            if len(payload) < MAC_BYTES:
                raise ValueError(f"HELLO of {len(payload)} bytes")
            mac, purpose = bytes(payload[:MAC_BYTES]), payload[MAC_BYTES:].decode()
        except Exception as exc:  # noqa: BLE001 - untrusted input: whatever goes wrong, refuse
            self.refuse(sock, peer, f"bad handshake ({type(exc).__name__}: {exc})")
            return None
        if not hmac.compare_digest(mac, make_mac(self._secret, purpose, nonce)):
            shown = purpose if purpose.isprintable() and len(purpose) <= 200 else \
                repr(purpose[:200])  # a stranger's text: no control characters in the log
            self.refuse(sock, peer, f"wrong mac for {shown}")
            return None
        if (reason := self._admit(purpose)) is not None:
            self.refuse(sock, peer, reason)
            return None
        try:
            send_frame(sock, WELCOME)
        except OSError:
            return None
        sock.settimeout(None)
        return Connection(sock, peer, purpose)
