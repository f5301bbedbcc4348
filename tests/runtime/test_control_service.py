"""Who may connect to a driver (control and admin ports): only holders of the job's secret
(the admin token), for the right purpose; a stranger is refused and logged before anything it
sends is read."""

from __future__ import annotations

import logging
import queue
import socket
import struct
import threading
import time
from concurrent.futures import Future

import pytest

from cutline.protocol import messages as m
from cutline.runtime import net
from cutline.runtime.channels import InputGate, channel_purpose
from cutline.runtime.control import (
    CONTROL,
    Closed,
    ControlService,
    HandshakeError,
    Received,
    connect,
)
from cutline.driver.admin import ADMIN, AdminServer, request_savepoint
from cutline.storage.checkpoints import CheckpointStorage


def test_a_stranger_is_refused_and_logged_the_job_is_heard(caplog):
    events: queue.Queue = queue.Queue()
    service = ControlService("127.0.0.1", b"s" * 32, events, "test-driver")
    service.start()
    try:
        with caplog.at_level(logging.WARNING, logger="cutline.control"):
            with pytest.raises(HandshakeError):
                conn = connect(service.address, b"x" * 32, timeout=5)
                conn.send(m.Drained("evil"))
                conn.recv()
            raw = socket.create_connection(service.address, timeout=5)  # no handshake at all
            raw.sendall(b"\x00\x00\x00\x05hello")
            raw.close()
            ok = connect(service.address, b"s" * 32, timeout=5)
            ok.send(m.Register(0, 1, {}))
            got = events.get(timeout=5)
        assert type(got) is Received
        assert got.msg == m.Register(0, 1, {})  # the only message that got through
        assert "refused control connection" in caplog.text
        ok.close()
        closed = events.get(timeout=5)
        assert type(closed) is Closed and closed.conn is got.conn and closed.cause is None
        assert events.empty()
    finally:
        service.close()
    assert service.address[0] == "127.0.0.1"  # listens on the address it was given only


def _hello(address, secret, purpose):
    """The handshake by hand (cutline.runtime.net's wire format): the reply frame's kind."""
    with socket.create_connection(address, timeout=5) as s:
        _, length = struct.unpack("!BI", s.recv(5))
        nonce = s.recv(length)
        s.sendall(struct.pack("!BI", net.HELLO, 32 + len(purpose))
                  + net.make_mac(secret, purpose, nonce) + purpose.encode())
        return struct.unpack("!BI", s.recv(5))[0]


def test_tokens_do_not_cross_purposes_between_control_and_channels(caplog):
    events: queue.Queue = queue.Queue()
    secret = b"s" * 32
    service = ControlService("127.0.0.1", secret, events, "test-driver")
    service.start()
    gate = InputGate("t", ["a"], secret)
    try:
        with caplog.at_level(logging.WARNING):
            # the job's secret, but a channel's purpose, on the control port
            assert _hello(service.address, secret, channel_purpose("a")) == net.REJECT
            # ... and the control purpose at a data channel's gate
            assert _hello(gate.address, secret, CONTROL) == net.REJECT
            assert _hello(service.address, secret, CONTROL) == net.WELCOME
        assert "test-driver: refused control connection" in caplog.text
        assert "wrong purpose" in caplog.text and "not a channel" in caplog.text
        assert type(events.get(timeout=5)) is Closed and events.empty()  # nothing else got in
    finally:
        gate.close()
        service.close()


def test_an_authenticated_peer_sending_garbage_is_dropped_and_logged(caplog):
    events: queue.Queue = queue.Queue()
    service = ControlService("127.0.0.1", b"s" * 32, events, "test-driver")
    service.start()
    try:
        with caplog.at_level(logging.WARNING, logger="cutline.control"):
            conn = connect(service.address, b"s" * 32, timeout=5)
            conn.send_frame(b"\xc1 not msgpack")
            conn.send_frame(b"\x93\x07\xa7drained\xa1a")  # [7, "drained", "a"]: version 7
            conn.send_frame(b"\x92\x01\xa4nope")  # [1, "nope"]: no such message
            conn.send(m.Drained("a.0"))  # the connection stays up: the next one is heard
            assert events.get(timeout=5).msg == m.Drained("a.0")
            conn.close()
            assert type(events.get(timeout=5)) is Closed
        assert "not a msgpack frame" in caplog.text
        assert "codec version 7" in caplog.text
        assert "unknown control message 'nope'" in caplog.text
    finally:
        service.close()


class _Driver:
    """What AdminServer needs of a driver: storage, job and savepoint()."""

    def __init__(self, storage, future=None) -> None:
        self.storage, self.job, self.future, self.asked = storage, storage.job, future, []

    def savepoint(self, stop: bool = False) -> Future:
        self.asked.append(stop)
        if self.future is not None:
            return self.future
        done: Future = Future()
        done.set_result(f"{self.storage.dir}/savepoint-1")
        return done


def test_the_admin_port_refuses_strangers_and_other_purposes(tmp_path, caplog):
    storage = CheckpointStorage(str(tmp_path), "job")
    driver = _Driver(storage)
    admin = AdminServer(driver, "127.0.0.1")
    admin.start()
    try:
        with caplog.at_level(logging.WARNING, logger="cutline.admin"):
            # the admin token, but the control purpose (as a task's connection would use)
            assert _hello(admin.address, admin.token, CONTROL) == net.REJECT
            with pytest.raises(HandshakeError):  # a control connection with the admin token
                connect(admin.address, admin.token, timeout=5)
            assert _hello(admin.address, b"x" * 32, ADMIN) == net.REJECT  # wrong token
            with socket.create_connection(admin.address, timeout=5) as raw:  # no handshake
                raw.sendall(b"\x00\x00\x00\x05hello" * 100)
            assert driver.asked == []  # nothing got as far as the driver
            assert request_savepoint(storage, stop=True, timeout=5).endswith("savepoint-1")
            assert driver.asked == [True]

            def refusals() -> list[str]:
                return [r.getMessage() for r in caplog.records
                        if r.getMessage().startswith("refused admin connection from")]

            # the server's thread logs a refusal after the client has gone: wait for it
            deadline = time.monotonic() + 10
            while len(refusals()) < 4 and time.monotonic() < deadline:
                time.sleep(0.05)
        assert len(refusals()) >= 4, refusals()
    finally:
        admin.stop()


def test_admin_stop_still_answers_a_request_in_progress(tmp_path):
    storage = CheckpointStorage(str(tmp_path), "job")
    pending: Future = Future()
    driver = _Driver(storage, pending)
    admin = AdminServer(driver, "127.0.0.1")
    admin.start()
    answer: queue.Queue = queue.Queue()

    def ask() -> None:
        try:
            answer.put(request_savepoint(storage, timeout=5))
        except Exception as exc:  # noqa: BLE001 - the test looks at it
            answer.put(exc)

    t = threading.Thread(target=ask)
    t.start()
    deadline = time.monotonic() + 5
    while not driver.asked and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)  # the request is waiting on the savepoint
    admin.stop()  # as the driver does before failing its pending savepoints
    pending.set_exception(RuntimeError("savepoint 3 of job 'job' failed: the job stopped"))
    t.join(10)
    got = answer.get(timeout=1)
    assert isinstance(got, RuntimeError) and "the job stopped" in str(got)
