"""FIFO channels with credit-based flow control (cutline.runtime.channels), over loopback.

Every test is bounded in time (a watchdog dumps stacks and exits after WATCHDOG seconds;
every wait has a timeout) and checks that it leaves no socket or channel thread behind.
"""

import collections
import enum
import faulthandler
import logging
import os
import pickle
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest

from cutline.protocol import Barrier

try:
    import numpy as np
except ImportError:  # pragma: no cover - numpy comes with pyarrow
    np = None
from cutline.runtime.channels import (
    CREDIT, HELLO, MARSHAL, RECORDS, REJECT, WELCOME, ChannelError, InputGate, OutputChannel,
    channel_mac, channel_purpose, encode_records,
)

SECRET = b"s3cret-for-tests"
WATCHDOG = 60
T = 5.0  # generous bound for anything that should happen "soon"


def _sockets() -> int:
    fds = os.listdir("/proc/self/fd")
    n = 0
    for fd in fds:
        try:
            n += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            pass
    return n


def _channel_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("cutline-")]


@pytest.fixture(autouse=True)
def bounded_and_clean():
    faulthandler.dump_traceback_later(WATCHDOG, exit=True)
    before = _sockets() if os.path.isdir("/proc/self/fd") else None
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
    deadline = time.monotonic() + T
    while time.monotonic() < deadline and (
        _channel_threads() or (before is not None and _sockets() > before)
    ):
        time.sleep(0.02)
    assert not _channel_threads(), "channel threads left running"
    if before is not None:
        assert _sockets() <= before, "sockets left open"


def wait_until(cond, timeout=T, what="condition"):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def drain(gate, blocked=frozenset(), timeout=0.2):
    items = []
    while (item := gate.poll(blocked, timeout)) is not None:
        items.append(item)
    return items


def batches(start, n, size):
    return [list(range(start + i * size, start + (i + 1) * size)) for i in range(n)]


# --------------------------------------------------------------------------- FIFO


def test_fifo_two_channels_10k_records_with_barriers_and_eof():
    plans = {}
    for ch, base in (("a", 0), ("b", 100_000)):
        plan, nxt = [], base
        for i in range(100):  # 10,000 records, batch sizes 1..199, barriers interleaved
            size = 1 + (i * 37) % 199 if i < 99 else base + 10_000 - nxt
            plan.append(("records", list(range(nxt, nxt + size))))
            nxt += size
            if i % 9 == 4:
                plan.append(("barrier", Barrier(i, unaligned=i % 2 == 0)))
        assert nxt == base + 10_000
        plans[ch] = plan + [("eof", None)]

    def send(ch, plan, address):
        with OutputChannel(ch, address, SECRET) as out:
            for kind, payload in plan:
                if kind == "records":
                    out.send_records(payload, timeout=T)
                elif kind == "barrier":
                    out.send_barrier(payload)
                else:
                    out.send_eof()

    with InputGate("t", ["a", "b"], SECRET, credits=3) as gate:
        senders = [threading.Thread(target=send, args=(c, p, gate.address))
                   for c, p in plans.items()]
        for s in senders:
            s.start()
        gate.wait_connected(T)
        got = {"a": [], "b": []}
        done = set()
        while done != {"a", "b"}:
            item = gate.poll(frozenset(), T)
            assert item is not None, "stalled"
            ch, kind, payload = item
            got[ch].append((kind, payload))
            if kind == "eof":
                done.add(ch)
            assert gate.queued(ch) <= 3
        for s in senders:
            s.join(T)
        assert got == plans
        flat = [r for kind, p in got["a"] if kind == "records" for r in p]
        assert flat == list(range(10_000))


def test_round_robin_is_fair_across_channels():
    with InputGate("t", ["a", "b", "c"], SECRET, credits=4) as gate:
        outs = {c: OutputChannel(c, gate.address, SECRET) for c in "abc"}
        try:
            for c, out in outs.items():
                for i in range(4):
                    out.send_records([f"{c}{i}"], timeout=T)
            wait_until(lambda: all(gate.queued(c) == 4 for c in "abc"), what="queues full")
            order = [gate.poll(frozenset(), T) for _ in range(12)]
            assert [ch for ch, _, _ in order] == list("abc") * 4
            assert [p for _, _, p in order] == [[f"{c}{i}"] for i in range(4) for c in "abc"]
            for out in outs.values():
                out.send_eof()
        finally:
            for out in outs.values():
                out.close()


# --------------------------------------------------------------------------- backpressure


def test_backpressure_blocks_sender_and_resumes_after_poll():
    with InputGate("t", ["a"], SECRET, credits=2) as gate:
        with OutputChannel("a", gate.address, SECRET) as out:
            assert out.credits == 2
            out.send_records([1], timeout=T)
            out.send_records([2], timeout=T)
            assert out.credits == 0
            t0 = time.monotonic()
            with pytest.raises(TimeoutError, match="no credit"):
                out.send_records([3], timeout=0.3)
            assert time.monotonic() - t0 >= 0.25
            wait_until(lambda: gate.queued("a") == 2, what="two batches queued")
            assert gate.poll(frozenset(), T) == ("a", "records", [1])
            out.send_records([3], timeout=T)  # resumes once a credit came back
            assert gate.queued("a") <= 2
            assert [p for _, _, p in drain(gate)] == [[2], [3]]
            wait_until(lambda: out.credits == 2, what="credits back")
            out.send_eof()


def test_memory_bounded_while_consumer_is_slow():
    sent = []

    def produce(out):
        for i in range(60):
            out.send_records([i] * 10, timeout=T)
            sent.append(i)
        out.send_eof()

    with InputGate("t", ["a"], SECRET, credits=2) as gate:
        with OutputChannel("a", gate.address, SECRET) as out:
            producer = threading.Thread(target=produce, args=(out,))
            producer.start()
            wait_until(lambda: len(sent) == 2, what="two batches sent")
            time.sleep(0.2)  # consumer not polling: the producer must stay stuck at 2
            assert len(sent) == 2 and gate.queued("a") == 2
            got = []
            while True:
                assert gate.queued("a") <= 2
                ch, kind, payload = gate.poll(frozenset(), T)
                if kind == "eof":
                    break
                got.append(payload[0])
            producer.join(T)
            assert got == list(range(60))


def test_blocked_channel_is_never_polled():
    with InputGate("t", ["a", "b"], SECRET, credits=8) as gate:
        with OutputChannel("a", gate.address, SECRET) as a, \
                OutputChannel("b", gate.address, SECRET) as b:
            for i in range(5):
                a.send_records([("a", i)], timeout=T)
                b.send_records([("b", i)], timeout=T)
            a.send_barrier(Barrier(1))
            wait_until(lambda: gate.queued("a") == 5 and gate.queued("b") == 5)
            items = drain(gate, blocked={"a"})
            assert [ch for ch, _, _ in items] == ["b"] * 5
            assert gate.queued("a") == 5
            assert gate.poll(frozenset({"a", "b"}), 0.05) is None
            items = drain(gate)
            assert [ch for ch, _, _ in items] == ["a"] * 6 and items[-1][1] == "barrier"
            a.send_eof()
            b.send_eof()


# --------------------------------------------------------------------------- barriers


def test_announcements_and_take_through_barrier():
    with InputGate("t", ["a", "b"], SECRET, credits=4) as gate:
        with OutputChannel("a", gate.address, SECRET) as a, \
                OutputChannel("b", gate.address, SECRET) as b:
            b.send_barrier(Barrier(1))  # nothing queued ahead of it: no announcement
            a.send_records([1, 2], timeout=T)
            a.send_records([3], timeout=T)
            a.send_barrier(Barrier(1, unaligned=True))
            a.send_records([4], timeout=T)
            a.send_barrier(Barrier(2))
            a.send_records([5], timeout=T)
            wait_until(lambda: gate.queued("a") == 4)
            wait_until(lambda: len(gate._ch["a"].queue) == 6 and gate._ch["b"].queue)
            assert gate.announcements() == [("a", Barrier(1, True)), ("a", Barrier(2))]
            assert gate.announcements() == []
            assert a.credits == 0
            # barrier 2 sits behind barrier 1: never pulled forward over it
            assert gate.take_through_barrier("a", 2) is None
            assert gate.take_through_barrier("a", 7) is None  # not present
            assert gate.take_through_barrier("a", 1) == [1, 2, 3]
            assert gate.queued("a") == 2
            wait_until(lambda: a.credits == 2, what="credits for pulled batches")
            assert gate.take_through_barrier("a", 2) == [4]
            assert gate.take_through_barrier("b", 1) == []  # barrier at the front
            assert drain(gate) == [("a", "records", [5])]
            wait_until(lambda: a.credits == 4)
            a.send_eof()
            b.send_eof()


def test_barrier_taken_before_announcements_is_not_announced():
    with InputGate("t", ["a"], SECRET) as gate:
        with OutputChannel("a", gate.address, SECRET) as a:
            a.send_records([1], timeout=T)
            a.send_barrier(Barrier(3))
            wait_until(lambda: len(gate._ch["a"].queue) == 2)
            assert drain(gate) == [("a", "records", [1]), ("a", "barrier", Barrier(3))]
            assert gate.announcements() == []
            a.send_records([2], timeout=T)
            a.send_eof()
            assert gate.take_through_barrier("a", 3) is None
            assert drain(gate) == [("a", "records", [2]), ("a", "eof", None)]


def test_inject_puts_records_first():
    with InputGate("t", ["a"], SECRET, credits=2) as gate:
        gate.inject("a", ["r0", "r1"])  # restore happens before upstream connects
        gate.inject("a", [])
        assert gate.queued("a") == 1
        with OutputChannel("a", gate.address, SECRET) as a:
            a.send_records(["x"], timeout=T)
            wait_until(lambda: gate.queued("a") == 2)
            gate.inject("a", ["y0"])
            assert drain(gate) == [("a", "records", ["y0"]), ("a", "records", ["r0", "r1"]),
                                   ("a", "records", ["x"])]
            wait_until(lambda: a.credits == 2)  # injected batches return no credit
            a.send_eof()


# --------------------------------------------------------------------------- refusal


def _frame(kind, payload):
    return struct.pack("!BI", kind, len(payload)) + payload


def _refused(sock):
    """True when the gate answers with REJECT and closes, or resets (unread junk)."""
    sock.settimeout(T)
    data = b""
    try:
        while chunk := sock.recv(4096):
            data += chunk
    except ConnectionResetError:
        return True
    kinds = []
    while len(data) >= 5:
        kind, length = struct.unpack("!BI", data[:5])
        kinds.append(kind)
        data = data[5 + length:]
    return kinds[-1:] == [REJECT]


def test_strangers_are_refused_and_good_channels_keep_working(caplog):
    caplog.set_level(logging.WARNING, logger="cutline.runtime.channels")
    with InputGate("t", ["a", "b"], SECRET) as gate:
        good_a = OutputChannel("a", gate.address, SECRET)
        # a silent stranger holds a connection open during everything below
        silent = socket.create_connection(gate.address, timeout=T)
        try:
            with pytest.raises(ChannelError, match="refused.*wrong mac"):
                OutputChannel("b", gate.address, b"not the secret")
            with pytest.raises(ChannelError, match="refused.*unknown channel 'zz'"):
                OutputChannel("zz", gate.address, SECRET)
            with pytest.raises(ChannelError, match="refused.*already connected"):
                OutputChannel("a", gate.address, SECRET)
            for junk in (
                b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * 50,
                _frame(HELLO, b"\xc1\xff junk"),  # a HELLO frame carrying garbage
                struct.pack("!BI", HELLO, 2**31),  # absurd length
                _frame(RECORDS, b"\x80\x05 not really a pickle"),  # data before HELLO
            ):
                with socket.create_connection(gate.address, timeout=T) as s:
                    s.sendall(junk)
                    assert _refused(s)
            # a replayed HELLO (mac for another nonce) is refused too
            with socket.create_connection(gate.address, timeout=T) as s:
                s.recv(5 + 16)
                mac = channel_mac(SECRET, "b", b"\0" * 16)
                s.sendall(_frame(HELLO, mac + channel_purpose("b").encode()))
                assert _refused(s)
            # the gate still serves its good channels
            good_b = OutputChannel("b", gate.address, SECRET)
            gate.wait_connected(T)
            good_a.send_records(["a1"], timeout=T)
            good_b.send_barrier(Barrier(9))
            good_b.send_records(["b1"], timeout=T)
            for out in (good_a, good_b):
                out.send_eof()
            got = []
            while len([i for i in got if i[1] == "eof"]) < 2:
                got.append(gate.poll(frozenset(), T))
            assert sorted(got, key=repr) == sorted(
                [("a", "records", ["a1"]), ("a", "eof", None), ("b", "barrier", Barrier(9)),
                 ("b", "records", ["b1"]), ("b", "eof", None)], key=repr)
            good_b.close()
            refusals = [r.getMessage() for r in caplog.records
                        if "refused connection" in r.getMessage()]
        finally:
            silent.close()
            good_a.close()
    assert len(refusals) == 8, refusals
    assert all("127.0.0.1" in m for m in refusals)
    assert any("wrong mac" in m for m in refusals)
    assert any("unknown channel" in m for m in refusals)
    assert any("already connected" in m for m in refusals)



def test_wait_connected_names_missing_channels():
    with InputGate("t", ["a", "b", "c"], SECRET) as gate:
        with OutputChannel("b", gate.address, SECRET) as b:
            with pytest.raises(TimeoutError, match=r"task t.*: a, c$"):
                gate.wait_connected(0.2)
            b.send_eof()


# --------------------------------------------------------------------------- failures


def _expect_channel_error(gate, channel, blocked=frozenset()):
    deadline = time.monotonic() + T
    with pytest.raises(ChannelError) as info:
        while time.monotonic() < deadline:
            gate.poll(blocked, 0.1)
    assert info.value.channel_id == channel
    return info.value


def test_sender_closing_without_eof_is_a_channel_error():
    with InputGate("t", ["a", "b"], SECRET) as gate:
        with OutputChannel("b", gate.address, SECRET) as b:
            a = OutputChannel("a", gate.address, SECRET)
            a.send_records([1], timeout=T)
            a.close()  # no EOF: the sender died
            err = _expect_channel_error(gate, "a", blocked={"a"})  # even while blocked
            assert "before EOF" in str(err)
            with pytest.raises(ChannelError):  # and again on every later call
                gate.poll(frozenset(), 0)
            b.send_eof()


def _raw_sender(address, channel):
    """A hand-made sender: handshake by the wire format, then the bare socket."""
    s = socket.create_connection(address, timeout=T)
    _, length = struct.unpack("!BI", s.recv(5))
    nonce = s.recv(length)
    mac = channel_mac(SECRET, channel, nonce)
    s.sendall(_frame(HELLO, mac + channel_purpose(channel).encode()))
    assert struct.unpack("!BI", s.recv(5))[0] == WELCOME
    assert struct.unpack("!BI", s.recv(5))[0] == CREDIT
    s.recv(4)
    return s


def test_connection_reset_is_a_channel_error():
    with InputGate("t", ["a"], SECRET) as gate:
        s = _raw_sender(gate.address, "a")
        s.sendall(_frame(RECORDS, pickle.dumps(list(range(10)), protocol=5)))
        s.sendall(struct.pack("!BI", RECORDS, 1000) + b"x" * 10)  # cut mid-frame
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()  # RST
        err = _expect_channel_error(gate, "a")
        assert "reset" in str(err) or "mid-frame" in str(err)


def test_sender_process_killed_midstream_is_a_channel_error():
    code = (
        "import os, sys\n"
        "from cutline.runtime.channels import OutputChannel\n"
        "out = OutputChannel('a', (sys.argv[1], int(sys.argv[2])), sys.argv[3].encode())\n"
        "out.send_records(list(range(100)))\n"
        "out.send_records(list(range(100)))\n"
        "os._exit(3)\n"
    )
    with InputGate("t", ["a"], SECRET) as gate:
        host, port = gate.address
        proc = subprocess.run([sys.executable, "-c", code, host, str(port), SECRET.decode()],
                              timeout=30, capture_output=True)
        assert proc.returncode == 3, proc.stderr
        _expect_channel_error(gate, "a")


def test_clean_eof_then_close_is_not_an_error():
    with InputGate("t", ["a"], SECRET) as gate:
        with OutputChannel("a", gate.address, SECRET) as a:
            a.send_records([1], timeout=T)
            a.send_eof()
            with pytest.raises(ChannelError, match="after EOF"):
                a.send_records([2])
        time.sleep(0.1)
        assert drain(gate) == [("a", "records", [1]), ("a", "eof", None)]
        assert gate.poll(frozenset(), 0.1) is None


def test_sender_blocked_on_credit_sees_gate_closing():
    gate = InputGate("t", ["a"], SECRET, credits=1)
    with OutputChannel("a", gate.address, SECRET) as a:
        a.send_records([1], timeout=T)
        threading.Timer(0.2, gate.close).start()
        t0 = time.monotonic()
        with pytest.raises(ChannelError, match="receiver connection lost"):
            a.send_records([2], timeout=T)
        assert time.monotonic() - t0 < T - 1
        with pytest.raises(RuntimeError, match="closed"):
            gate.poll(frozenset(), 0)


def test_unpicklable_batch_costs_no_credit():
    with InputGate("t", ["a"], SECRET, credits=1) as gate:
        with OutputChannel("a", gate.address, SECRET) as a:
            with pytest.raises(Exception):  # noqa: B017 - whichever error: the credit matters
                a.send_records([lambda: 1])
            assert a.credits == 1
            a.send_records([{"ok": (1, 2.0, "x", None, b"y")}], timeout=T)
            a.send_eof()
            assert drain(gate) == [("a", "records", [{"ok": (1, 2.0, "x", None, b"y")}]),
                                   ("a", "eof", None)]



# --------------------------------------------------------------------------- encoding


class _Point(collections.namedtuple("_Point", "x y")):
    pass


class _Level(enum.IntEnum):
    LOW = 1


class _Tagged(dict):
    pass


class _Obj:
    def __init__(self, v):
        self.v = v

    def __eq__(self, other):
        return type(other) is _Obj and other.v == self.v

    def __repr__(self):
        return f"_Obj({self.v!r})"


def _typed(x):
    """``x`` with the type of every value in it, recursively (``==`` alone says 1 == 1.0 ==
    True and (1,) != [1] only sometimes)."""
    if isinstance(x, dict):
        return (type(x).__name__, [(_typed(k), _typed(v)) for k, v in x.items()])
    if isinstance(x, (list, tuple, set, frozenset)):
        items = sorted(map(repr, x)) if isinstance(x, (set, frozenset)) else map(_typed, x)
        return (type(x).__name__, list(items))
    if isinstance(x, float) and x != x:
        return (type(x).__name__, "nan")
    return (type(x).__name__, repr(x))


PLAIN = [{"word": "w1", "n": 1}, {"word": "w1", "n": 2**70, "t": -0.0, "nan": float("nan")},
         (1, 1.0, True, None, b"\x00", "\u00e9\udc80"), [1, [2, (3,)], {4: "int key", (5, 6): 7}],
         {"set": {1, 2}, "frozen": frozenset({"a"})}, "just a string", 42, 3.5, False]
NOT_PLAIN = [[_Point(1, 2)], [_Level.LOW], [_Tagged(a=1)], [_Obj(3)], [{"a": 1}, _Obj(4)],
             [{"nested": [_Point(5, 6)]}], [np.float64(1.5)] if np is not None else [_Obj(5)]]


def test_plain_records_travel_as_marshal_and_arrive_exactly():
    kind, payload = encode_records(PLAIN)
    assert kind == MARSHAL
    with InputGate("t", ["a"], SECRET) as gate:
        with OutputChannel("a", gate.address, SECRET) as a:
            a.send_records(PLAIN, timeout=T)
            a.send_eof()
            got = drain(gate)
    assert [(c, k) for c, k, _ in got] == [("a", "records"), ("a", "eof")]
    assert _typed(got[0][2]) == _typed(PLAIN)


@pytest.mark.parametrize("batch", NOT_PLAIN, ids=lambda b: type(b[-1]).__name__)
def test_other_records_are_pickled_and_keep_their_types(batch):
    assert encode_records(batch)[0] == RECORDS
    with InputGate("t", ["a"], SECRET) as gate:
        with OutputChannel("a", gate.address, SECRET) as a:
            a.send_records(batch, timeout=T)
            a.send_eof()
            got = drain(gate)
    assert got[0][2] == batch
    assert [type(r) for r in got[0][2]] == [type(r) for r in batch]
    assert _typed(got[0][2]) == _typed(batch)


def test_retrying_a_timed_out_send_reuses_the_encoded_batch(monkeypatch):
    import cutline.runtime.channels as ch_mod

    calls = []
    real = ch_mod.encode_records
    monkeypatch.setattr(ch_mod, "encode_records", lambda b: calls.append(len(b)) or real(b))
    with InputGate("t", ["a"], SECRET, credits=1) as gate:
        out = OutputChannel("a", gate.address, SECRET)
        try:
            wait_until(lambda: out.credits == 1, what="first credit")
            out.send_records([1])
            batch = [2, 3]
            for _ in range(3):  # no credit: every retry times out
                with pytest.raises(TimeoutError):
                    out.send_records(batch, timeout=0.02)
            assert calls == [1, 2]  # encoded once for all the retries
            assert gate.poll(set(), timeout=T)[2] == [1]  # frees a credit
            out.send_records(batch, timeout=T)
            assert calls == [1, 2]
            assert gate.poll(set(), timeout=T)[2] == [2, 3]
            batch.append(4)  # a changed batch is encoded afresh
            wait_until(lambda: out.credits == 1, what="credit")
            out.send_records(batch, timeout=T)
            assert calls == [1, 2, 3]
        finally:
            out.send_eof()
            out.close()


def test_local_channel_keeps_fifo_credits_and_eof_without_a_socket():
    with InputGate("t", ["a"], SECRET, credits=2) as gate:
        out = gate.attach_local("a")
        gate.wait_connected(T)
        out.send_records([1])
        out.send_records([2])
        with pytest.raises(TimeoutError):  # credits=2: the third batch waits
            out.send_records([3], timeout=0.02)
        out.send_barrier(Barrier(1))  # behind queued records: announced
        assert gate.announcements() == [("a", Barrier(1))]
        assert gate.poll(set(), timeout=T)[2] == [1]
        out.send_records([3], timeout=T)
        out.send_eof()
        got = [gate.poll(set(), timeout=T)[1:] for _ in range(4)]
        assert got == [("records", [2]), ("barrier", Barrier(1)), ("records", [3]),
                       ("eof", None)]
        with pytest.raises(ChannelError, match="send after EOF"):
            out.send_records([4])
        out.close()


def test_local_channel_closed_without_eof_breaks_the_receiver():
    with InputGate("t", ["a"], SECRET) as gate:
        out = gate.attach_local("a")
        out.send_records([1])
        out.close()
        with pytest.raises(ChannelError, match="before EOF"):
            for _ in range(3):
                gate.poll(set(), timeout=T)


def test_a_channel_broken_while_a_slot_sets_up_is_retried_not_fatal():
    """A peer killed while the stage restarts breaks a channel's handshake: Spark retries
    (a bad configuration, in contrast, would fail the same way again)."""
    from cutline.runtime.channels import ChannelError
    from cutline.runtime.failures import repeats, setup_error

    broken = ChannelError("a.0->b.1", "handshake with ('127.0.0.1', 1) failed: reset by peer")
    assert setup_error("slot 0 could not open its tasks", broken) is broken
    assert not repeats(broken)
    assert repeats(setup_error("slot 0 could not open its tasks", ValueError("bad config")))
