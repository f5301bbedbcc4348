"""FIFO data channels between streaming tasks: TCP, authenticated, credit-based flow control.

One :class:`InputGate` per task holds all its input channels and listens on ``(host, 0)``;
each upstream subtask opens one :class:`OutputChannel` to it per edge.  Records travel in
batches (Python lists): plain data as ``marshal``, anything else as pickle protocol 5
(:func:`encode_records`); barriers and EOF are control frames queued in order with the
records, so every channel is FIFO end to end.

Wire format: the frames and handshake of :mod:`.net` (``struct "!BI"`` kind + length; HMAC
challenge/response with the job secret), purpose ``channel '<channel id>'``.  After WELCOME
the gate sends CREDIT(initial credits), or REJECT(reason) (unknown or already connected
channel) and closes.  Then MARSHAL or RECORDS (a batch, marshal or pickle; ARROW for a
batch stream's), BARRIER(msgpack [checkpoint_id, unaligned]) and EOF flow downstream and
CREDIT(n) upstream.  A batch costs one credit, control frames none.  Peers are
authenticated once at connect; with the job's TLS on (:mod:`.net`), everything after
STARTTLS travels in TLS 1.3.  With a heartbeat monitor (:mod:`.heartbeats`), both ends send
HEARTBEAT frames while idle (a sender without credit, a receiver with none to return) and a
peer silent for the heartbeat timeout breaks the channel, naming it; after EOF neither end
is watched.

Encoding, ``python bench/encoding.py`` (1,000-record batches, encode+decode, median of 5
rounds; Python 3.11.7, pyarrow 26.0.1, shared 2-core box), records/s, pickle-5 vs Arrow IPC:
dicts {user: str, n: int, t: float} 2.74-2.80 M vs 2.22-2.26 M (0.79-0.86x; 0.80x with the
schema given to Arrow); tuples (str, int, float) 4.66-4.87 M vs 3.42-3.43 M (0.68-0.70x).
Pickle encodes at ~215-230 MB/s and decodes at ~175-280 MB/s, Arrow ~150 / ~115-270 MB/s;
Arrow frames are 17% smaller for the dicts, 8% larger for the tuples.  Arrow loses (columns
are built from Python objects and back) and only fits flat records of primitives, so
channels use pickle protocol 5, and ``marshal`` where it fits (plain data, measured in
:func:`encode_records`: 0.69x pickle's instructions; frames 1.27x larger).  One channel
on loopback, sender in another process, credits 8: 1.6-2.3 M records/s with dict batches
of 1,000, pickled (a shared box; the receiving side, on one core, is the bottleneck).

Network layer, ``python bench/net.py`` (this code against be9b5d9's, the last before
:mod:`.net`, in one run, alternating, 2,000 dict batches of 1,000 per run, credits 8, sender
in another process; a 2-core box at load average 8-10, so single rounds vary 3x): records/s,
median of 9 / 11 rounds, old 432 k / 395 k, new 496 k / 454 k, paired new/old ratio 1.30 /
1.16: no slowdown (the data path is the same code; the gain is noise).  OutputChannel
connect (handshake + initial credits, median of 200): 698 / 728 us old, 712 / 748 us new
(ratio 1.02: one more frame, WELCOME); control connect 455 / 466 us old, 468 / 467 us new
(1.01).

It is longer than most modules on purpose: the output side, the input gate, credits and
unaligned overtaking share one invariant (a channel is FIFO and a barrier's position in it
is exact), which is easier to check with both ends in view.
"""

from __future__ import annotations

import collections
import logging
import marshal
import pickle
import socket
import struct
import threading
import time

import msgpack

from ..connectors.base import PICKLING_ERRORS, unpicklable
from ..protocol.events import Barrier
from . import net
from .heartbeats import Heartbeats
from .net import HELLO, MAX_HELLO, REJECT, WELCOME

log = logging.getLogger(__name__)

__all__ = ["BARRIER", "CREDIT", "EOF", "HELLO", "MARSHAL", "RECORDS", "REJECT", "WELCOME",
           "ChannelError", "InputGate", "LocalChannel", "OutputChannel", "channel_mac",
           "channel_purpose", "encode_records"]

RECORDS, BARRIER, EOF, CREDIT = range(net.FIRST_KIND, net.FIRST_KIND + 4)
ARROW = net.FIRST_KIND + 4  # a batch stream's record batches: one Arrow IPC stream
MARSHAL = net.FIRST_KIND + 5  # records of plain data (encode_records): marshal
_COUNT = struct.Struct("!I")
_UNBOUNDED = 2**31  # credits of a feedback channel: never runs out


class ChannelError(RuntimeError):
    """A channel broke: connection lost or refused, or the peer broke the protocol.
    ``silent``: the heartbeat monitor found the other end silent (this end saw the cause,
    not a consequence of it)."""

    def __init__(self, channel_id: str, message: str, silent: bool = False) -> None:
        super().__init__(f"channel {channel_id!r}: {message}")
        self.channel_id, self.silent = channel_id, silent


_PLAIN = frozenset((dict, list, tuple, str, int, float, bool, bytes, type(None)))


def encode_records(batch: list) -> tuple[int, bytes]:
    """``(frame kind, payload)`` of a batch of records.  Plain data (dicts, lists, tuples,
    str, int, float, bool, bytes, None, nested: what JSON and CSV sources read) goes as
    :data:`MARSHAL`: ``marshal`` writes and reads it exactly (the same types and values,
    big ints and ``-0.0`` / NaN included) with 0.69x the instructions of pickle for a round
    trip of 1,000 JSON records (callgrind: 2,731 against 3,974 per record).  Anything else
    (a class instance, a subclass of a built-in type such as a namedtuple, an IntEnum or a
    NumPy float: ``marshal`` refuses it) is pickled, :data:`RECORDS`."""
    if batch and type(batch[0]) in _PLAIN:
        try:
            return MARSHAL, marshal.dumps(batch, 4)
        except ValueError:  # an object marshal does not take, somewhere in the batch
            pass
    return RECORDS, pickle.dumps(batch, protocol=5)


decode_records = pickle.loads


def encode_frame(batch: list) -> tuple[int, bytes]:
    """``(frame kind, payload)`` of a batch: a batch stream's record batches as Arrow IPC
    (:mod:`.batches`), anything else as :func:`encode_records` says."""
    if batch and type(batch[0]).__module__ == "pyarrow.lib":
        from .batches import encode_batches, is_batch_list

        if is_batch_list(batch):
            payload = encode_batches(batch)
            if payload is not None:
                return ARROW, payload
    return encode_records(batch)


def _wait(cond: threading.Condition, deadline: float | None) -> bool:
    """Wait on ``cond`` (held) until notified; False once ``deadline`` has passed."""
    left = None if deadline is None else deadline - time.monotonic()
    if left is not None and left <= 0:
        return False
    cond.wait(left)
    return True


_shutdown = net.shutdown


class _Closing:
    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        raise NotImplementedError


def channel_purpose(channel_id: str) -> str:
    """What a channel's handshake is for: its MAC is worthless for another channel (or for
    the control and admin ports)."""
    return f"channel {channel_id!r}"


def channel_mac(secret: net.JobSecret | bytes, channel_id: str, nonce: bytes) -> bytes:
    return net.make_mac(secret, channel_purpose(channel_id), nonce)


class _Input:
    """One input channel of a gate; guarded by the gate's condition."""

    __slots__ = ("batches", "conn", "eof", "local", "owed", "queue", "unbounded")

    def __init__(self) -> None:
        self.queue: collections.deque = collections.deque()  # (kind, payload, credits)
        self.batches = 0  # record batches in the queue
        self.owed = 0  # credits earned back, not sent yet
        self.conn: net.Connection | None = None
        self.eof = False  # EOF frame received
        self.local: LocalChannel | None = None  # a sender in this process (no socket)
        self.unbounded = False  # a feedback channel: credit never runs out


class InputGate(_Closing):
    """All input channels of one task.  Upstream tasks connect to :attr:`address`."""

    def __init__(self, task_id: str, channel_ids: list[str], secret: net.JobSecret | bytes,
                 host: str = "127.0.0.1", credits: int = 8,
                 unbounded: frozenset[str] = frozenset(),
                 heartbeats: Heartbeats | None = None) -> None:
        if credits < 1 or len(set(channel_ids)) != len(channel_ids):
            raise ValueError(f"need credits >= 1 and distinct channel ids: {channel_ids}")
        self.task_id, self.credits, self._secret = task_id, credits, secret
        self._heartbeats = heartbeats
        # Feedback edges of an iteration never block their sender: a loop whose every
        # channel waits for credit would deadlock (Flink's iteration heads queue feedback
        # without bound for the same reason).
        self._unbounded = frozenset(unbounded)
        self._order = list(channel_ids)
        self._ch = {c: _Input() for c in channel_ids}
        for c in unbounded:
            self._ch[c].unbounded = True
        self._next = 0  # round-robin position in _order
        self._grant_at = max(1, credits // 4)  # coalesce credit grants
        self._cond = threading.Condition()
        self._announced: list[tuple[str, Barrier]] = []
        self._error: ChannelError | None = None
        self._closed = False
        self._by_purpose = {channel_purpose(c): c for c in channel_ids}
        self._listener = net.Listener(host, secret, admit=self._admit, serve=self._serve,
                                      name=f"cutline-gate-{task_id}", log=log,
                                      refusal=f"task {task_id}: refused connection")
        self.address: tuple[str, int] = (host, self._listener.address[1])
        self._listener.start()

    # ------------------------------------------------------------------ task side

    def wait_connected(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                self._raise_if_broken()
                missing = [c for c in self._order
                           if self._ch[c].conn is None and self._ch[c].local is None]
                if not missing:
                    return
                if not _wait(self._cond, deadline):
                    raise TimeoutError(f"task {self.task_id}: input channels not connected "
                                       f"after {timeout}s: {', '.join(missing)}")

    def poll(self, blocked: set[str] | frozenset, timeout: float | None):
        """Next ``(channel_id, kind, payload)`` from an unblocked channel, round-robin;
        ``None`` on timeout.  Raises :class:`ChannelError` once any channel broke."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while (got := self._take(blocked)) is None:
                if not _wait(self._cond, deadline):
                    return None
        cid, kind, payload, grant = got
        if grant:
            self._grant(cid, grant)
        return cid, kind, payload

    def _take(self, blocked):
        self._raise_if_broken()
        n = len(self._order)
        for i in range(n):
            idx = (self._next + i) % n
            cid = self._order[idx]
            st = self._ch[cid]
            if not st.queue or cid in blocked:
                continue
            self._next = idx + 1
            kind, payload, credits = st.queue.popleft()
            grant = 0
            if kind == "records":
                st.batches -= 1
                grant = self._earn(st, credits)
            elif kind == "barrier":
                self._forget_announcement(cid, payload)
            return cid, kind, payload, grant
        return None

    def _initial_credits(self, cid: str) -> int:
        return _UNBOUNDED if cid in self._unbounded else self.credits

    def _earn(self, st: _Input, credits: int) -> int:
        st.owed += credits
        if st.owed < self._grant_at or st.eof or st.unbounded:
            return 0
        grant, st.owed = st.owed, 0
        return grant

    def _forget_announcement(self, cid: str, barrier: Barrier) -> None:
        if (cid, barrier) in self._announced:
            self._announced.remove((cid, barrier))

    def announcements(self) -> list[tuple[str, Barrier]]:
        """Barriers that arrived behind queued records since the last call and are still
        queued (one taken meanwhile by poll or take_through_barrier is left out)."""
        with self._cond:
            out, self._announced = self._announced, []
        return out

    def copy_through_barrier(self, channel_id: str, checkpoint_id: int) -> list | None:
        """Like :meth:`take_through_barrier`, but only the barrier leaves the queue: the
        records ahead of it are returned as a copy and stay queued, to be processed in
        order (Flink copies overtaken buffers into the snapshot the same way)."""
        with self._cond:
            st = self._ch[channel_id]
            for pos, (kind, payload, _) in enumerate(st.queue):
                if kind != "records":
                    break
            else:
                return None
            if kind != "barrier" or payload.checkpoint_id != checkpoint_id:
                return None
            records = [r for i in range(pos) for r in st.queue[i][1]]
            del st.queue[pos]
            self._forget_announcement(channel_id, payload)
        return records

    def take_through_barrier(self, channel_id: str, checkpoint_id: int) -> list | None:
        with self._cond:
            st = self._ch[channel_id]
            for ahead, (kind, payload, _) in enumerate(st.queue):
                if kind != "records":
                    break
            else:
                return None
            if kind != "barrier" or payload.checkpoint_id != checkpoint_id:
                return None  # not there, or behind another barrier / EOF: no overtaking
            records, credits = [], 0
            for _ in range(ahead):
                _, batch, c = st.queue.popleft()
                records.extend(batch)
                credits += c
            st.batches -= ahead
            st.queue.popleft()
            self._forget_announcement(channel_id, payload)
            grant = self._earn(st, credits)
        if grant:
            self._grant(channel_id, grant)
        return records

    def inject(self, channel_id: str, records: list) -> None:
        """Put recovered in-flight ``records`` at the front of the queue (no credit)."""
        if records:
            with self._cond:
                self._ch[channel_id].queue.appendleft(("records", list(records), 0))
                self._ch[channel_id].batches += 1
                self._cond.notify_all()

    def queued(self, channel_id: str) -> int:
        with self._cond:
            return self._ch[channel_id].batches

    def close(self) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        self._listener.close()  # every connection too: wakes the reader threads

    def _raise_if_broken(self) -> None:
        if self._error is not None:
            raise self._error
        if self._closed:
            raise RuntimeError(f"input gate of task {self.task_id} is closed")

    def _fail(self, cid: str, message: str, silent: bool = False) -> None:
        with self._cond:
            if self._closed or self._ch[cid].eof:
                return
            # the task raises it (and reports it, unless the job is ending anyway)
            log.info("task %s: input channel %r broke: %s", self.task_id, cid, message)
            self._error = self._error or ChannelError(cid, message, silent)
            self._cond.notify_all()

    def _grant(self, cid: str, n: int) -> None:
        st = self._ch[cid]
        if st.local is not None:
            st.local._add_credits(n)
            return
        assert st.conn is not None  # earned by a batch that came through it
        try:
            st.conn.send(CREDIT, _COUNT.pack(n))
        except OSError as exc:
            self._fail(cid, f"cannot return credit to the sender: {exc}")

    # ------------------------------------------------------------------ network side

    def _admit(self, purpose: str) -> str | None:
        """Refuse (the reason) a connection for an unknown or already connected channel."""
        cid = self._by_purpose.get(purpose)
        if cid is None:
            return f"unknown {purpose}" if purpose.startswith("channel ") else \
                f"not a channel: {purpose!r}"
        st = self._ch[cid]
        if st.conn is not None or st.local is not None:
            return f"already connected: channel {cid!r}"
        return None

    def _serve(self, conn: net.Connection) -> None:
        """An authenticated connection for one of our channels: grant the initial credits,
        then read its frames (in the listener's thread for this connection)."""
        cid = self._by_purpose[conn.purpose]
        with self._cond:
            st = self._ch[cid]
            reason = self._admit(conn.purpose)  # again: a twin may have won meanwhile
            if reason is None:
                st.conn = conn
                self._cond.notify_all()
        if reason is not None:
            self._listener.refuse(conn, conn.peer, reason)
            return
        try:
            conn.send(CREDIT, _COUNT.pack(self._initial_credits(cid)))
        except OSError as exc:
            self._fail(cid, f"connection lost after handshake: {exc}")
            return
        hb = self._heartbeats
        if hb is not None:
            hb.watch(conn, "the sender")
        try:
            self._read_loop(conn, cid)
        finally:
            if hb is not None:
                hb.forget(conn)

    def _enqueue(self, st: _Input, cid: str, item: tuple) -> None:
        with self._cond:
            if item[0] == "barrier" and st.batches:
                self._announced.append((cid, item[1]))
            st.queue.append(item)
            st.batches += item[0] == "records"
            st.eof = item[0] == "eof"
            self._cond.notify_all()

    def attach_local(self, channel_id: str) -> "LocalChannel":
        """The sender of ``channel_id`` lives in this process: connect it without a socket."""
        with self._cond:
            self._raise_if_broken()
            st = self._ch.get(channel_id)
            if st is None or st.conn is not None or st.local is not None:
                raise ChannelError(channel_id, "unknown or already connected channel")
            st.local = LocalChannel(channel_id, self, st)
            self._cond.notify_all()
        st.local._add_credits(self._initial_credits(channel_id))
        return st.local

    def _read_loop(self, conn: net.Connection, cid: str) -> None:
        st = self._ch[cid]
        recv = conn.recv
        try:
            while not st.eof:
                kind, payload = recv()
                if kind == MARSHAL:
                    item = ("records", marshal.loads(payload), 1)
                elif kind == RECORDS:
                    item = ("records", decode_records(payload), 1)
                elif kind == ARROW:
                    from .batches import decode_batches

                    item = ("records", decode_batches(payload), 1)
                elif kind == BARRIER:
                    n, unaligned = msgpack.unpackb(payload)
                    item = ("barrier", Barrier(int(n), bool(unaligned)), 0)
                elif kind == EOF:
                    item = ("eof", None, 0)
                else:
                    raise ValueError(f"unexpected frame type {kind}")
                self._enqueue(st, cid, item)
            if self._heartbeats is not None:
                self._heartbeats.forget(conn)  # done: the sender may linger, unwatched
            conn.recv_some(1)  # after EOF: wait for the sender's close, then close ours
        except EOFError as exc:
            self._fail(cid, conn.silence or f"{exc} by the sender before EOF",
                       conn.silence is not None)
        except Exception as exc:
            self._fail(cid, conn.silence or f"{type(exc).__name__}: {exc}",
                       conn.silence is not None)


class OutputChannel(_Closing):
    """The sending end of one channel.  :meth:`send_records` blocks while the receiver
    granted no credit.  Thread-safe, but the order of batches sent concurrently from
    several threads is whatever order they took credit in."""

    def __init__(self, channel_id: str, address: tuple[str, int], secret: net.JobSecret | bytes,
                 connect_timeout: float = 30.0, heartbeats: Heartbeats | None = None) -> None:
        self.channel_id = channel_id
        self._heartbeats = heartbeats
        # a receiver silent for the heartbeat timeout fails the handshake too
        self._silent_after = heartbeats.timeout if heartbeats is not None else connect_timeout
        self.address: tuple[str, int] = (address[0], address[1])
        self._cond = threading.Condition()
        self._credits = 0
        self._encoded: tuple | None = None  # (batch, len, bytes) of a send that timed out
        self._error: str | None = None
        self._closed = self._eof_sent = False
        deadline = time.monotonic() + connect_timeout
        while True:  # the gate may not listen yet: retry until the deadline
            try:
                sock = socket.create_connection(
                    self.address, timeout=max(deadline - time.monotonic(), 0.01))
                break
            except OSError as exc:
                if time.monotonic() + 0.05 >= deadline:
                    raise ChannelError(channel_id,
                                       f"cannot connect to {self.address}: {exc}") from exc
                time.sleep(0.05)
        try:
            net.tune(sock)
            self._conn = self._handshake(sock, secret, deadline)
        except BaseException:
            sock.close()
            raise
        self._sock = self._conn.sock  # a TLS socket when the job has TLS on
        if heartbeats is not None:
            heartbeats.watch(self._conn, "the receiver")
        self._reader = threading.Thread(target=self._read_loop, daemon=True,
                                        name=f"cutline-out-{channel_id}")
        self._reader.start()

    @property
    def credits(self) -> int:
        return self._credits

    def _handshake(self, sock: socket.socket, secret: net.JobSecret | bytes,
                   deadline: float) -> net.Connection:
        cid, where = self.channel_id, self.address
        def left() -> float:
            return min(max(deadline - time.monotonic(), 1.0), self._silent_after)

        try:
            sock.settimeout(left())
            conn = net.client_handshake(sock, secret, channel_purpose(cid), where)
            conn.settimeout(left())
            kind, payload = conn.recv(MAX_HELLO)  # the initial credits, or REJECT
        except net.Refused as exc:
            raise ChannelError(cid, f"refused by {where}: {exc.reason}") from None
        except net.NotAListener:
            raise ChannelError(cid, f"{where} is not a cutline input gate") from None
        except net.HandshakeError as exc:  # lost on the way, or an unexpected reply
            cause = exc.__cause__
            text = f"handshake with {where} failed: {cause}" if cause else str(exc)
            raise ChannelError(cid, text) from exc
        except (OSError, EOFError, ValueError) as exc:
            raise ChannelError(cid, f"handshake with {where} failed: {exc}") from exc
        if kind == REJECT:
            reason = payload.decode(errors="replace")
            raise ChannelError(cid, f"refused by {where}: {reason}")
        if kind != CREDIT or len(payload) != _COUNT.size:
            raise ChannelError(cid, f"unexpected handshake reply (frame type {kind})")
        self._credits = _COUNT.unpack(payload)[0]
        conn.settimeout(None)
        return conn

    def _read_loop(self) -> None:
        try:
            recv = self._conn.recv
            while True:
                kind, payload = recv(MAX_HELLO)
                if kind != CREDIT or len(payload) != _COUNT.size:
                    raise ValueError(f"unexpected frame type {kind} from the receiver")
                with self._cond:
                    self._credits += _COUNT.unpack(payload)[0]
                    self._cond.notify_all()
        except (EOFError, OSError, ValueError) as exc:
            with self._cond:
                if not self._closed and self._error is None:
                    self._error = self._conn.silence or f"receiver connection lost ({exc})"
                self._cond.notify_all()

    def _check(self) -> None:  # with self._cond held
        if self._error is not None:
            raise ChannelError(self.channel_id, self._error, self._conn.silence is not None)
        if self._closed or self._eof_sent:
            raise ChannelError(self.channel_id,
                               "send after " + ("close" if self._closed else "EOF"))

    def send_records(self, batch: list, timeout: float | None = None) -> None:
        # Encode before taking credit (unpicklable data costs none).  A caller retrying the
        # same, unchanged batch after a TimeoutError reuses the bytes: no re-pickling while
        # backpressure lasts.
        retry = self._encoded
        if retry is not None and retry[0] is batch and retry[1] == len(batch):
            kind, payload = retry[2]
        else:
            try:
                kind, payload = encode_frame(batch)
            except PICKLING_ERRORS as exc:  # the same record fails every retry: fatal
                raise unpicklable(batch, exc, f"channel {self.channel_id!r}") from None
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._check()
            while self._credits == 0:
                if not _wait(self._cond, deadline):
                    self._encoded = (batch, len(batch), (kind, payload))
                    raise TimeoutError(f"channel {self.channel_id!r}: no credit from the "
                                       f"receiver for {timeout}s (backpressure)")
                self._check()  # woken by a broken connection or close()?
            self._credits -= 1
            self._encoded = None
        self._send(kind, payload)

    def send_barrier(self, barrier: Barrier) -> None:
        with self._cond:
            self._check()
        self._send(BARRIER, msgpack.packb([barrier.checkpoint_id, barrier.unaligned]))

    def send_eof(self) -> None:
        with self._cond:
            self._check()
            self._eof_sent = True
        self._unwatch()
        self._send(EOF)

    def _unwatch(self) -> None:
        if self._heartbeats is not None:
            self._heartbeats.forget(self._conn)

    def _send(self, kind: int, payload: bytes = b"") -> None:
        try:
            self._conn.send(kind, payload)
        except OSError as exc:
            with self._cond:
                self._error = self._error or self._conn.silence or f"send failed ({exc})"
            raise ChannelError(self.channel_id, self._error,
                               self._conn.silence is not None) from exc

    def close(self) -> None:
        """After :meth:`send_eof` a graceful close (FIN behind the data, then wait up to
        5 s for the receiver to close); without EOF the receiver sees a broken channel."""
        with self._cond:
            if self._closed:
                return
            graceful = self._eof_sent and self._error is None
            self._closed = True
            self._cond.notify_all()
        self._unwatch()
        _shutdown(self._sock, socket.SHUT_WR if graceful else socket.SHUT_RDWR)
        self._reader.join(5.0 if graceful else 1.0)
        self._sock.close()


class LocalChannel:
    """An output channel to a gate in the same process (subtasks of one Spark task).

    Batches are handed over by reference: no socket, no pickling.  FIFO order, credits
    (backpressure), barriers, announcements and EOF behave exactly as over TCP; closing
    without EOF breaks the channel for the receiver, as a lost connection would.
    """

    def __init__(self, channel_id: str, gate: InputGate, st: _Input) -> None:
        self.channel_id, self._gate, self._st = channel_id, gate, st
        self._cond = threading.Condition()
        self._credits = 0
        self._closed = self._eof_sent = False

    @property
    def credits(self) -> int:
        return self._credits

    def _add_credits(self, n: int) -> None:
        with self._cond:
            self._credits += n
            self._cond.notify_all()

    def _check(self) -> None:
        if self._gate._closed:
            raise ChannelError(self.channel_id, "receiver closed")
        if self._closed or self._eof_sent:
            raise ChannelError(self.channel_id,
                               "send after " + ("close" if self._closed else "EOF"))

    def send_records(self, batch: list, timeout: float | None = None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._check()
            while self._credits == 0:
                if not _wait(self._cond, deadline if deadline is not None else
                             time.monotonic() + 0.5):
                    if deadline is not None:
                        raise TimeoutError(f"channel {self.channel_id!r}: no credit from "
                                           f"the receiver for {timeout}s (backpressure)")
                self._check()  # the receiver may have gone away meanwhile
            self._credits -= 1
        self._gate._enqueue(self._st, self.channel_id, ("records", batch, 1))

    def send_barrier(self, barrier: Barrier) -> None:
        self._check()
        self._gate._enqueue(self._st, self.channel_id, ("barrier", barrier, 0))

    def send_eof(self) -> None:
        self._check()
        self._eof_sent = True
        self._gate._enqueue(self._st, self.channel_id, ("eof", None, 0))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if not self._eof_sent:
            self._gate._fail(self.channel_id, "connection closed by the sender before EOF")
        with self._cond:
            self._cond.notify_all()
