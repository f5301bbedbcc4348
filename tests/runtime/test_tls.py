"""Who may connect to a job, with TLS on and off: every port (data channel, control, admin,
dashboard) refuses and logs a stranger (a plaintext client at a TLS port, a TLS client at a
plaintext one, a wrong secret, a TLS client with another certificate); the job's secret shows
in no repr, log, process listing or environment; and a job on Spark with TLS on (a storage
fault and a kill on the way) gives exact output."""

from __future__ import annotations

import collections
import logging
import os
import queue
import socket
import ssl
import struct
import subprocess
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import Future
from types import SimpleNamespace

import pytest

from cutline.driver.admin import ADMIN, AdminServer, request_savepoint
from cutline.driver.dashboard import Dashboard
from cutline.protocol import messages as m
from cutline.runtime import net
from cutline.runtime.channels import ChannelError, InputGate, OutputChannel
from cutline.runtime.control import CONTROL, ControlService, HandshakeError, connect
from cutline.runtime.tls import JobSecret
from cutline.storage.checkpoints import CheckpointStorage
from cutline.storage.faulty import fired
from pipelines import expected_rows, wordcount

T = 5.0


def _stranger_tls(secret: JobSecret) -> JobSecret:
    """The right key, another certificate (a stranger's own, self-signed)."""
    other = JobSecret.new(tls=True)
    return JobSecret(secret.key, other.cert, other.private_key)


class _Driver:
    """What AdminServer and Dashboard need of a driver."""

    def __init__(self, storage, secret) -> None:
        self.storage, self.job, self.secret = storage, storage.job, secret

    def savepoint(self, stop: bool = False) -> Future:
        done: Future = Future()
        done.set_result(f"{self.storage.dir}/savepoint-1")
        return done


def _strangers(address, secret: JobSecret, purpose: str, mutual: bool = True) -> list[str]:
    """Connect as every kind of stranger; the errors they get."""
    wrong_key = JobSecret(b"x" * 32, secret.cert, secret.private_key) if secret.tls \
        else JobSecret(b"x" * 32)
    clients = [wrong_key]
    if secret.tls:
        clients += [JobSecret(secret.key), _stranger_tls(secret)]  # plaintext; other cert
    else:
        clients += [JobSecret(secret.key, *_tls_material())]  # a TLS client, no TLS here
    errors = []
    for client in clients:
        with pytest.raises(HandshakeError) as info:
            net.connect(address, client, purpose, timeout=T)
        errors.append(str(info.value))
    if secret.tls:  # mutual TLS: refused in the TLS handshake; else by the handshake's MAC
        got = _blind_tls_client(address)
        assert ("alert unknown ca" in str(got)) if mutual else got == net.REJECT, got
    with socket.create_connection(address, timeout=T) as raw:  # junk, no handshake
        raw.sendall(b"\x16\x03\x01\x00\x05hello" * 50)
    return errors


def _blind_tls_client(address) -> int | str:
    """A TLS client that trusts any listener and shows a certificate of its own, then
    guesses a MAC: what it gets back (a frame kind, or the error)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    other = _stranger_tls(JobSecret(b"k"))
    context.load_cert_chain(*_pem_files(other))
    try:
        with socket.create_connection(address, timeout=T) as raw:
            assert net.read_frame(raw)[0] == net.STARTTLS
            with context.wrap_socket(raw) as tls:
                _, nonce = net.read_frame(tls)
                net.send_frame(tls, net.HELLO, b"m" * 32 + b"control")
                return net.read_frame(tls)[0]
    except (OSError, EOFError) as exc:
        return f"{type(exc).__name__}: {exc}"


def _pem_files(secret: JobSecret) -> tuple[str, str]:
    import tempfile

    d = tempfile.mkdtemp()
    for name, data in (("cert.pem", secret.cert), ("key.pem", secret.private_key)):
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
    return os.path.join(d, "cert.pem"), os.path.join(d, "key.pem")


_MATERIAL: list = []


def _tls_material() -> tuple[bytes, bytes]:
    if not _MATERIAL:
        s = JobSecret.new(tls=True)
        _MATERIAL.append((s.cert, s.private_key))
    return _MATERIAL[0]


def _refusals(caplog, marker: str, at_least: int) -> None:
    got = [r.getMessage() for r in caplog.records if marker in r.getMessage()]
    assert len(got) >= at_least, (marker, got, caplog.text)


@pytest.mark.parametrize("tls", [False, True], ids=["plaintext", "tls"])
def test_a_stranger_is_refused_and_logged_on_every_port(tmp_path, caplog, tls):
    secret = JobSecret(b"s" * 32, *_tls_material()) if tls else JobSecret(b"s" * 32)
    events: queue.Queue = queue.Queue()
    control = ControlService("127.0.0.1", secret, events, "test-driver")
    control.start()
    gate = InputGate("t", ["a"], secret)
    storage = CheckpointStorage(str(tmp_path), "job")
    driver = _Driver(storage, secret)
    admin = AdminServer(driver, "127.0.0.1", driver.secret)
    admin.start()
    board = Dashboard(SimpleNamespace(driver=driver, rates=SimpleNamespace(every=60.0)))
    caplog.set_level(logging.WARNING)
    try:
        errors = _strangers(control.address, secret, CONTROL)
        errors += _strangers(gate.address, secret, "channel 'a'")
        admin_key = JobSecret(admin.token, secret.cert, mutual=False) if tls else admin.token
        assert _strangers(admin.address, JobSecret.of(admin_key), ADMIN, mutual=False)
        if tls:
            assert any("requires TLS, and this job runs without" in e for e in errors)
            assert any("presented a TLS certificate that is not this job's" in e
                       for e in errors), errors
        else:
            assert any("does not offer TLS, and this job requires it" in e for e in errors)
        assert sum("wrong mac" in e for e in errors) == 2, errors
        # the job's own peers get through, on every port
        ok = connect(control.address, secret, timeout=T)
        ok.send(m.Register(0, 1, {}))
        assert events.get(timeout=T).msg == m.Register(0, 1, {})
        assert events.empty()  # nothing a stranger sent arrived
        out = OutputChannel("a", gate.address, secret)
        out.send_records([1, 2, 3])
        assert gate.poll(set(), T) == ("a", "records", [1, 2, 3])
        assert request_savepoint(storage, timeout=T).endswith("savepoint-1")
        _check_dashboard(board, secret)
        ok.close()
        out.close()
        # every stranger was logged on every port
        n = 5 if tls else 3
        _refusals(caplog, "test-driver: refused control connection from", n)
        _refusals(caplog, "task t: refused connection from", n)
        _refusals(caplog, "refused admin connection from", n)
        _refusals(caplog, "refused dashboard", 3 if tls else 2)
        for text in (caplog.text, *errors):
            assert secret.key.hex() not in text and "PRIVATE KEY" not in text
    finally:
        board.stop()
        admin.stop()
        gate.close()
        control.close()


def _check_dashboard(board: Dashboard, secret: JobSecret) -> None:
    assert board.url.startswith("https://" if secret.tls else "http://")
    context = None
    if secret.tls:  # the job's certificate, pinned (it is valid for 127.0.0.1)
        context = ssl.create_default_context(cadata=secret.cert.decode())
        with pytest.raises((urllib.error.URLError, ConnectionError)):  # HTTP at HTTPS
            urllib.request.urlopen(board.url.replace("https", "http"), timeout=T)
    for stranger in (board.url.split("?")[0], board.url.split("?")[0] + "?token=guess"):
        with pytest.raises(urllib.error.HTTPError, match="403"):
            urllib.request.urlopen(stranger, timeout=T, context=context)
    with urllib.request.urlopen(board.url, timeout=T, context=context) as page:
        assert page.status == 200


def test_the_secret_shows_in_no_repr_and_tls_follows_sparks_encryption():
    from cutline.runtime.task import JobSpec
    from cutline.spark.stage import SparkStage

    secret = JobSecret.new(tls=True)
    spec = JobSpec(plan=None, job="j", secret=secret, coordinator=("127.0.0.1", 1),
                   mode="aligned", aligned_timeout=None, storage_url="file:///x")
    for text in (repr(secret), str(secret), repr(spec), f"{secret}"):
        assert secret.key.hex() not in text and repr(secret.key) not in text
        assert "PRIVATE" not in text
    assert repr(secret) == "JobSecret(tls=on, key=<hidden>)"

    def session(conf: dict) -> SimpleNamespace:
        return SimpleNamespace(sparkContext=SimpleNamespace(
            defaultParallelism=2, master="local[2]", getConf=lambda: conf))

    assert not SparkStage(session({}), 2, "w", "g").tls
    for key in ("spark.network.crypto.enabled", "spark.ssl.enabled"):
        assert SparkStage(session({key: "true"}), 2, "w", "g").tls


RECORDS = 16_000


@pytest.mark.slow
def test_spark_job_with_tls_survives_a_failed_upload_and_a_kill_exactly(spark, tmp_path,
                                                                         caplog):
    """TLS on (``Pipeline(tls=True)``): channels and the control port speak TLS only (a
    plaintext peer is refused), checkpoint 2's uploads are cut mid-file (declined), then a
    task is killed after writing checkpoint 4's state: the restart restores checkpoint 3 —
    the last complete one — and the output is exact.  The job's secret is in no process's
    arguments or environment and in no log."""
    root = str(tmp_path / "chk")
    journal = str(tmp_path / "journal")
    options = {"root": root, "journal": journal,
               "rules": [{"match": r"/chk-2/[^/]+\.state$", "after": 64}]}
    p, sink = wordcount(tmp_path, RECORDS, "aligned", rate=8_000, interval=0.3)
    p.tls = True
    p.with_checkpoint(storage=f"faulty://{root}", storage_options=options,
                      tolerable_failures=1)
    seen: dict = {}

    def watch(driver) -> None:
        def look() -> None:
            deadline = time.monotonic() + 60
            while not driver.run.attempt.addresses and time.monotonic() < deadline:
                time.sleep(0.05)
            seen["key"] = driver.secret.key
            try:
                connect(driver.address, driver.secret.key, timeout=T)
            except HandshakeError as exc:
                seen["control"] = str(exc)
            address = next(a for a in driver.run.attempt.addresses.values() if a)
            try:
                OutputChannel("sentences.0->count.0", tuple(address), driver.secret.key,
                              connect_timeout=T)
            except ChannelError as exc:
                seen["channel"] = str(exc)
            seen["ps"] = subprocess.run(["ps", "-eww", "-o", "args"], capture_output=True,
                                        text=True).stdout
            seen["proc"] = b""
            for pid in driver.run.task_pids.values():
                for part in ("environ", "cmdline"):
                    try:
                        with open(f"/proc/{pid}/{part}", "rb") as f:
                            seen["proc"] += f.read()
                    except OSError:
                        pass
        threading.Thread(target=look, daemon=True).start()
        seen["driver"] = driver

    caplog.set_level(logging.INFO)
    result = p.run(spark=spark, timeout=240, on_start=watch,
                   faults=(("snapshot_write", 1, 4),))
    assert collections.Counter(sink.results()) == expected_rows(RECORDS)
    assert result.attempts == 2, "the kill never fired"
    assert {path.split("/wordcount/")[1] for _, path in fired(journal)} >= {
        "chk-2/sentences.0.state", "chk-2/sentences.1.state"}
    ids = [c.id for c in result.checkpoints]
    assert 2 not in ids and 3 in ids, ids
    restart = seen["driver"].controller.attempt_log[1]
    assert restart.restored_from.endswith("/chk-3"), restart
    assert not os.path.exists(f"{root}/wordcount/chk-2/_metadata")
    assert "requires TLS, and this job runs without" in seen["control"]
    assert "requires TLS, and this job runs without" in seen["channel"]
    key = seen["key"]
    assert seen["proc"], "no task process was looked at"
    assert key.hex() not in seen["ps"] and key not in seen["proc"]
    assert key.hex().encode() not in seen["proc"]
    from cutline.spark import launcher

    logs = caplog.text + _read(launcher.SPARK_LOG)
    assert key.hex() not in logs and "PRIVATE KEY" not in logs


def _read(path) -> str:
    if not path:
        return ""
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


class _Overlaps:
    """Wraps a TLS socket's calls into OpenSSL; counts how many ran at once (at most)."""

    def __init__(self, sock: ssl.SSLSocket) -> None:
        self.now = self.most = 0
        self.lock = threading.Lock()
        for name in ("recv_into", "recv", "send", "sendall"):
            setattr(sock, name, self._counted(getattr(sock, name)))

    def _counted(self, call):
        def counted(*args):
            with self.lock:
                self.now += 1
                self.most = max(self.most, self.now)
            try:
                time.sleep(0.0005)  # widen any overlap
                return call(*args)
            finally:
                with self.lock:
                    self.now -= 1
        return counted


def test_a_tls_connection_read_and_written_at_once_is_never_in_openssl_twice():
    # OpenSSL forbids two threads in one SSL object (SSL_read and SSL_write included), and
    # a channel's reader thread reads while its task writes: every call is serialized
    secret = JobSecret.new(tls=True)
    served: queue.Queue = queue.Queue()
    frames = [bytes([i % 251]) * (1 + 997 * i % 90_000) for i in range(150)]

    def duplex(conn: net.Connection) -> list[bytes]:
        got: list[bytes] = []

        def read() -> None:
            for _ in frames:
                got.append(bytes(conn.recv()[1]))

        reader = threading.Thread(target=read)
        reader.start()
        for f in frames:
            conn.send(net.FIRST_KIND, f)
        reader.join(60)
        return got

    def serve(conn: net.Connection) -> None:
        watch = _Overlaps(conn.sock)
        served.put((watch, duplex(conn)))
        try:  # then the client resets the connection
            while True:
                conn.recv()
        except EOFError:
            pass
        try:
            for _ in range(100):
                conn.send(net.FIRST_KIND, b"x" * 100_000)
        except OSError as exc:
            served.put(exc)

    listener = net.Listener("127.0.0.1", secret, admit=net.only("p"), serve=serve,
                            name="test-tls", log=logging.getLogger("test.tls"),
                            refusal="refused")
    listener.start()
    try:
        client = net.connect(listener.address, secret, "p", timeout=T)
        watch = _Overlaps(client.sock)
        assert duplex(client) == frames
        server_watch, server_got = served.get(timeout=60)
        assert server_got == frames
        assert watch.most == server_watch.most == 1
        # a reset (TCP ended without TLS's goodbye) says so, not "EOF occurred in violation
        # of protocol"
        client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        socket.socket.close(client.sock)
        error = served.get(timeout=60)
        assert (type(error), str(error)) == (ConnectionResetError,
                                             "the peer reset the connection")
    finally:
        listener.close()
