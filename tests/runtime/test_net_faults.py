"""Network faults on the threads engine, through the fault-injecting proxy (tests/netfaults.py):
a delay and a stall shorter than the heartbeat timeout, and a peer that is idle or has no
credit for longer, are survived; a reset, a blackhole and a half-open data channel or
control connection (either direction) fail the run with a short error naming what went
silent or broke (a stall past the timeout: tests/runtime/test_net_faults_spark.py).  The failed
runs resume one after another on one storage, and the last one's output is exactly a
failure-free run's."""

from __future__ import annotations

import collections
import re
import socket
import threading
import time

import pytest

from cutline import CheckpointConfig, Pipeline
from cutline.connectors import CollectSink, GeneratorSource
from cutline.driver import dataflow
from cutline.driver.dataflow import JobFailed

from netfaults import Proxy, Routes, blackhole, delay, half_open, reset, stall
from pipelines import expected_rows, sentence, wordcount

HB = 2.0  # heartbeat_timeout of these runs
CROSS = "sentences.0->count.1"  # a channel between two slots: TCP, not in-process


def _echo_server():
    srv = socket.create_server(("127.0.0.1", 0))

    def serve():
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return

            def echo(c=c):
                while data := c.recv(4096):
                    c.sendall(data)
                c.close()
            threading.Thread(target=echo, daemon=True).start()
    threading.Thread(target=serve, daemon=True).start()
    return srv


def test_the_proxy_delays_stalls_resets_blackholes_and_half_opens():
    srv = _echo_server()
    up = srv.getsockname()[:2]

    def roundtrip(proxy, timeout=1.0):
        # the clock starts before the connection: a fault's time runs from the proxy's accept,
        # which may come before create_connection returns here
        t = time.monotonic()
        with socket.create_connection(proxy.address, timeout=timeout) as c:
            c.sendall(b"ping")
            return c.recv(16), time.monotonic() - t

    with Proxy(up, delay(0.2)) as p:
        data, took = roundtrip(p)
        assert data == b"ping" and took >= 0.4  # 0.2 s each way
        assert roundtrip(p)[1] < 0.2  # only the first connection is faulty
    with Proxy(up, stall(0.0, 0.5)) as p:
        data, took = roundtrip(p)
        assert data == b"ping" and took >= 0.5 and p.fired[0] in [(0, "stall up"),
                                                                   (0, "stall down")]
    with Proxy(up, reset(0.1)) as p, socket.create_connection(p.address) as c:
        with pytest.raises(ConnectionResetError):
            time.sleep(0.3)
            c.sendall(b"x")
            c.recv(1)
        assert p.fired == [(0, "reset")]
    with Proxy(up, blackhole()) as p:
        with pytest.raises(TimeoutError):
            roundtrip(p, timeout=0.3)
        assert p.fired == [(0, "blackhole")]
    with Proxy(up, half_open(0.0, "down")) as p:
        with pytest.raises(TimeoutError):
            roundtrip(p, timeout=0.3)
        assert p.fired == [(0, "half_open down")]
    srv.close()


def _run(p, monkeypatch, faults):
    routes = Routes(faults)
    monkeypatch.setattr(dataflow, "ROUTE", routes)
    drivers = []
    try:
        p.run(engine="threads", heartbeat_timeout=HB, progress=False, timeout=60,
              on_start=drivers.append)
        error = None
    except JobFailed as exc:
        error = str(exc)
    finally:
        routes.close()
    return error, routes.fired, drivers[0]


PAUSED = threading.Event()


def count_pausing(ctx, w):
    """A count whose subtask 1 stops for 1.5 heartbeat timeouts at its first record: its
    senders wait for credit all that time and its control connection has nothing to say."""
    if not PAUSED.is_set() and threading.current_thread().name == "count.1":
        PAUSED.set()
        time.sleep(HB * 1.5)
    n = ctx.value_state("n", 0)
    n.update(n.value + 1)
    return ((w, n.value),)


def test_short_faults_and_idle_peers_are_survived(tmp_path, monkeypatch):
    records = 3000
    p = Pipeline("wordcount", parallelism=2, checkpoint=CheckpointConfig(
        interval=0.3, storage=f"file://{tmp_path}/checkpoints"), tls=True)  # inside TLS too
    sink = CollectSink(str(tmp_path / "out"))
    (p.source(GeneratorSource(count=records, fn=sentence, rate=3000), uid="sentences")
       .flat_map(str.split, uid="split")
       .key_by(lambda w: w)
       .process(count_pausing, uid="count")
       .sink(sink, uid="out"))
    PAUSED.clear()
    error, fired, driver = _run(p, monkeypatch, {
        "control": delay(0.05), CROSS: stall(0.3, HB * 0.4)})
    assert error is None and PAUSED.is_set()
    assert sorted(fired["control"]) == [(0, "delay down"), (0, "delay up")]
    assert sorted(fired[CROSS]) == [(0, "stall down"), (0, "stall up")]
    assert collections.Counter(sink.results()) == expected_rows(records)
    assert driver.heartbeats.silent == [] and driver.secret.tls


FAULTS = [  # what is faulty, the fault, the error it must end the run with
    (CROSS, reset(0.5), rf"channel '{CROSS}': .*reset by peer"),
    (CROSS, blackhole(), rf"channel '{CROSS}': handshake with .* failed: timed out"),
    (CROSS, half_open(0.5, "down"), rf"channel '{CROSS}': the receiver went silent: "
                                    r"nothing heard for 2\.\d s \(heartbeat_timeout=2\)"),
    ("control", half_open(0.3, "down"), r"slot \d: the driver went silent: nothing heard"),
    ("control", half_open(0.3, "up"), r"slot \d: the task went silent: nothing heard"),
]


@pytest.mark.slow
def test_faults_past_the_heartbeat_timeout_fail_the_run_and_the_next_resumes_exactly(
        tmp_path, monkeypatch):
    records = 40_000
    p, sink = wordcount(tmp_path, records, rate=8000, interval=0.2)
    for what, fault, expected in FAULTS:
        t0 = time.monotonic()
        error, fired, driver = _run(p, monkeypatch, {what: fault})
        took = time.monotonic() - t0
        assert fired[what][0][1].startswith(fault.kind), (fault, fired)
        assert error is not None and re.search(expected, error), (fault, error)
        assert len(error) < 400 and "Traceback" not in error, error
        # found within the timeout (or the handshake's, for a blackhole) plus slack
        assert took < fault.after + HB + 6, (fault, took)
        if what != "control" and fault.kind != "blackhole":  # mid-run
            assert driver.run.checkpoints, f"{fault}: no progress before the fault"
    error, fired, _ = _run(p, monkeypatch, {})
    assert error is None
    assert collections.Counter(sink.results()) == expected_rows(records)


def test_the_monitor_heartbeats_idle_connections_and_wakes_a_blocked_writer():
    """Over a socket pair: two monitors keep an idle connection alive; once one end stops
    (its monitor stopped, nothing read: a frozen process), the other declares it silent and
    a writer blocked on the full socket buffer wakes with the reason."""
    from cutline.runtime import net
    from cutline.runtime.heartbeats import Heartbeats

    a_sock, b_sock = socket.socketpair()
    a, b = net.Connection(a_sock, "b", "test"), net.Connection(b_sock, "a", "test")
    hb_a, hb_b = Heartbeats(0.5), Heartbeats(0.5)
    frozen, got = threading.Event(), []

    def read(conn):  # every watched connection has its reader
        try:
            while not (conn is b and frozen.is_set()):
                got.append(conn.recv())
        except (EOFError, OSError):
            pass
    for conn, hb, who in ((a, hb_a, "b"), (b, hb_b, "a")):
        hb.watch(conn, who)
        hb.start()
        threading.Thread(target=read, args=(conn,), daemon=True).start()
    time.sleep(1.2)  # more than twice the timeout, idle but for heartbeats
    assert hb_a.silent == hb_b.silent == [] and got == [] and a.received and b.received
    frozen.set()  # b freezes: no more heartbeats, nothing more read
    hb_b.stop()
    errors = []

    def write():
        try:
            while True:
                a.send(20, b"x" * 65536)  # fills the buffers, then blocks
        except OSError as exc:
            errors.append(exc)
    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    writer.join(3.0)
    assert not writer.is_alive() and errors
    assert a.silence == hb_a.silent[0] and re.fullmatch(
        r"b went silent: nothing heard for 0\.\d+ s \(heartbeat_timeout=0\.5\)", a.silence)
    hb_a.stop()
    a.close()
    b.close()
