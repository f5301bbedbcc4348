"""The one network layer (cutline.runtime.net): frames, the HMAC handshake with its purpose
bound into the MAC, and the accept loop that refuses strangers without reading them."""

from __future__ import annotations

import logging
import queue
import socket
import struct
import threading
import time
from typing import Self

import pytest

from cutline.runtime import net

SECRET = b"k" * 32
T = 5.0
log = logging.getLogger("test.net")


def _frame(kind: int, payload: bytes = b"") -> bytes:
    return struct.pack("!BI", kind, len(payload)) + payload


def _echo(conn: net.Connection) -> None:
    try:
        while True:
            kind, payload = conn.recv()
            conn.send(kind, bytes(payload))
    except (EOFError, OSError):
        pass


class Served:
    """A listener whose ``serve`` records what got through."""

    def __init__(self, purposes=("p",), serve=_echo, timeout=net.HANDSHAKE_TIMEOUT) -> None:
        self.served: queue.Queue = queue.Queue()

        def run(conn: net.Connection) -> None:
            self.served.put(conn.purpose)
            serve(conn)

        self.listener = net.Listener("127.0.0.1", SECRET, admit=net.only(*purposes), serve=run,
                                     name="test-net", log=log, refusal="test: refused",
                                     timeout=timeout)
        self.listener.start()
        self.address = self.listener.address

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.listener.close()


def _raw_hello(address, mac_purpose: str, sent_purpose: str, secret: bytes = SECRET) -> bytes:
    """Handshake by hand; returns the listener's reply frame kind and payload."""
    with socket.create_connection(address, timeout=T) as s:
        _, length = struct.unpack("!BI", s.recv(5))
        nonce = s.recv(length)
        s.sendall(_frame(net.HELLO, net.make_mac(secret, mac_purpose, nonce)
                         + sent_purpose.encode()))
        return s.recv(4096)


def test_authenticated_frames_round_trip_and_carry_the_purpose():
    with Served(("p",)) as srv:
        conn = net.connect(srv.address, SECRET, "p", timeout=T)
        try:
            assert srv.served.get(timeout=T) == "p"
            big = bytes(range(256)) * 1000  # above the one-sendall threshold
            for payload in (b"", b"x", big):
                conn.send(net.FIRST_KIND, payload)
                assert conn.recv() == (net.FIRST_KIND, bytearray(payload))
            assert conn.sock.gettimeout() is None
        finally:
            conn.close()


def test_wrong_secret_is_refused_and_logged(caplog):
    caplog.set_level(logging.WARNING, logger="test.net")
    with Served() as srv:
        with pytest.raises(net.Refused, match="wrong mac for p"):
            net.connect(srv.address, b"not the secret", "p", timeout=T)
        assert srv.served.empty()
    assert "test: refused from ('127.0.0.1'" in caplog.text


def test_a_token_for_one_purpose_is_useless_for_another(caplog):
    caplog.set_level(logging.WARNING, logger="test.net")
    with Served(("control",)) as srv:
        # the right secret, but a purpose this listener does not serve
        with pytest.raises(net.Refused, match="wrong purpose 'admin'"):
            net.connect(srv.address, SECRET, "admin", timeout=T)
        # an answer computed for "admin", presented as "control"
        reply = _raw_hello(srv.address, "admin", "control")
        assert reply[0] == net.REJECT and b"wrong mac for control" in reply
        # the same answer for the purpose it was made for, to the right listener: welcome
        assert _raw_hello(srv.address, "control", "control")[0] == net.WELCOME
        assert srv.served.get(timeout=T) == "control" and srv.served.empty()
    assert caplog.text.count("test: refused") == 2


def test_the_mac_binds_purpose_and_nonce():
    n = bytes(16)
    macs = {net.make_mac(SECRET, "ab", n), net.make_mac(SECRET, "a", b"b" + n[:15]),
            net.make_mac(SECRET, "ab", b"\1" + n[1:]), net.make_mac(b"x" * 32, "ab", n)}
    assert len(macs) == 4 and all(len(m) == net.MAC_BYTES for m in macs)


@pytest.mark.parametrize("junk", [
    b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * 200,  # a long stranger: only 5 bytes are read
    _frame(net.HELLO, b"short"),
    struct.pack("!BI", net.HELLO, 2**31),
    _frame(net.FIRST_KIND, b"data before HELLO"),
    _frame(net.HELLO, b"\0" * 32 + b"\xff\xfe not utf-8"),
])
def test_strangers_are_refused_without_being_read(junk, caplog):
    caplog.set_level(logging.WARNING, logger="test.net")
    with Served() as srv:
        with socket.create_connection(srv.address, timeout=T) as s:
            s.sendall(junk)
            data = b""
            try:
                while chunk := s.recv(4096):
                    data += chunk
            except ConnectionResetError:  # closed with our junk unread: a reset
                pass
        assert srv.served.empty()
    assert "test: refused" in caplog.text


def test_a_silent_stranger_times_out_and_blocks_nobody(caplog):
    caplog.set_level(logging.WARNING, logger="test.net")
    with Served(timeout=0.5) as srv:
        silent = socket.create_connection(srv.address, timeout=T)
        try:
            t0 = time.monotonic()
            conn = net.connect(srv.address, SECRET, "p", timeout=T)  # while the silent waits
            assert time.monotonic() - t0 < 0.4
            conn.close()
            silent.settimeout(T)
            while silent.recv(4096):  # the listener gives up on it and closes
                pass
        finally:
            silent.close()
    assert "bad handshake (TimeoutError" in caplog.text


def test_not_a_listener():
    server = socket.create_server(("127.0.0.1", 0))

    def answer() -> None:
        s, _ = server.accept()
        s.sendall(b"SSH-2.0-OpenSSH\r\n")
        s.close()

    t = threading.Thread(target=answer)
    t.start()
    try:
        with pytest.raises(net.NotAListener, match="not a cutline listener"):
            net.connect(server.getsockname(), SECRET, "p", timeout=T)
    finally:
        t.join(T)
        server.close()


def test_close_closes_every_connection_it_accepted():
    ended = threading.Event()

    def serve(conn: net.Connection) -> None:
        try:
            conn.recv()  # blocks until close() shuts the connection down
        except (EOFError, OSError):
            ended.set()

    srv = Served(serve=serve)
    conn = net.connect(srv.address, SECRET, "p", timeout=T)
    half = socket.create_connection(srv.address, timeout=T)  # still in its handshake
    try:
        srv.served.get(timeout=T)
        assert len(half.recv(64)) == 5 + net.NONCE_BYTES  # accepted: the listener's HELLO
        srv.listener.close()
        assert ended.wait(T)
        conn.sock.settimeout(T)
        with pytest.raises(EOFError):
            conn.recv()
        assert half.recv(64) == b""  # closed, with no REJECT: nobody refused it
        assert not [t for t in threading.enumerate() if t.name.startswith("test-net")]
        with pytest.raises(OSError):
            net.connect(srv.address, SECRET, "p", timeout=1)
    finally:
        conn.close()
        half.close()


def test_close_with_wait_lets_a_reply_finish():
    go = threading.Event()

    def serve(conn: net.Connection) -> None:
        conn.recv()
        go.wait(T)
        conn.send(net.FIRST_KIND, b"answer")

    srv = Served(serve=serve)
    conn = net.connect(srv.address, SECRET, "p", timeout=T)
    try:
        conn.send(net.FIRST_KIND, b"question")
        srv.served.get(timeout=T)
        threading.Timer(0.2, go.set).start()
        srv.listener.close(wait=T)
        conn.sock.settimeout(T)
        assert conn.recv() == (net.FIRST_KIND, bytearray(b"answer"))
    finally:
        conn.close()


def test_a_failing_serve_is_logged_and_its_connection_closed(caplog):
    def serve(conn: net.Connection) -> None:
        raise RuntimeError("bug in serve")

    with caplog.at_level(logging.ERROR, logger="test.net"), Served(serve=serve) as srv:
        conn = net.connect(srv.address, SECRET, "p", timeout=T)
        conn.sock.settimeout(T)
        with pytest.raises((EOFError, ConnectionResetError)):
            conn.recv()
        conn.close()
    assert "bug in serve" in caplog.text
