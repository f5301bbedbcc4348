"""Who may connect to a driver: only holders of the job's secret; a stranger is refused and
logged before anything it sends is read."""

from __future__ import annotations

import logging
import queue
import socket

import pytest

from cutline.protocol import messages as m
from cutline.runtime.control import CLOSED, ControlService, HandshakeError, connect


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
            ok._send_frame(b"\x92\x01\xa4nope")  # [1, "nope"]: no such message
            ok.send(m.Register(0, 1, {}))
            conn, msg = events.get(timeout=5)
        assert msg == m.Register(0, 1, {})  # the only message that got through
        assert "unknown control message 'nope'" in caplog.text
        assert "refused control connection" in caplog.text
        ok.close()
        assert events.get(timeout=5)[1] is CLOSED
        assert events.empty()
    finally:
        service.close()
    assert service.address[0] == "127.0.0.1"  # listens on the address it was given only
