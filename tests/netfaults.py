"""A fault-injecting TCP proxy on loopback, for tests.

:class:`Proxy` listens on 127.0.0.1 and forwards each connection it accepts to
``upstream``; the first ``faulty`` connections suffer its :class:`Fault`, ``after``
seconds into the connection:

- ``delay(seconds)``: every chunk, both ways, arrives ``seconds`` late (latency, not loss);
- ``stall(after, seconds)``: forwarding stops for ``seconds`` (both ways; data waits in
  the kernel's buffers, as behind a congested link), then resumes;
- ``reset(after)``: both sides get a TCP RST;
- ``blackhole()``: the connection is accepted, never forwarded, everything read and dropped
  (a firewall that swallows packets);
- ``half_open(after, direction)``: one direction (``"down"``: upstream to client, ``"up"``:
  client to upstream) dies silently: its bytes are dropped, its FIN too, the other
  direction still works.

``fired`` records ``(connection, what)`` for each fault that happened.  :class:`Routes` is
a ``cutline.driver.dataflow.ROUTE`` hook: it puts a proxy in front of the control
connection or of chosen data channels of a job's first attempt (later attempts connect
directly, so the job can recover)."""

from __future__ import annotations

import queue
import socket
import struct
import threading
import time
from dataclasses import dataclass

__all__ = ["Fault", "Proxy", "Routes", "blackhole", "delay", "half_open", "reset", "stall"]


@dataclass(frozen=True)
class Fault:
    kind: str  # delay, stall, reset, blackhole, half_open
    after: float = 0.0
    seconds: float = 0.0
    direction: str = "both"


def delay(seconds: float) -> Fault:
    return Fault("delay", seconds=seconds)


def stall(after: float, seconds: float) -> Fault:
    return Fault("stall", after=after, seconds=seconds)


def reset(after: float) -> Fault:
    return Fault("reset", after=after)


def blackhole() -> Fault:
    return Fault("blackhole")


def half_open(after: float, direction: str = "down") -> Fault:
    assert direction in ("up", "down")
    return Fault("half_open", after=after, direction=direction)


class Proxy:
    def __init__(self, upstream: tuple[str, int], fault: Fault | None = None,
                 faulty: int = 1) -> None:
        self.upstream, self.fault, self.faulty = upstream, fault, faulty
        self.fired: list[tuple[int, str]] = []
        self.connections = 0
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False
        self._server = socket.create_server(("127.0.0.1", 0))
        self.address: tuple[str, int] = self._server.getsockname()[:2]
        threading.Thread(target=self._accept, daemon=True, name="netfaults-accept").start()

    def close(self) -> None:
        self._closed = True
        with self._lock:
            socks, self._socks = self._socks, []
        for s in [self._server, *socks]:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def __enter__(self) -> Proxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _fire(self, n: int, what: str) -> None:
        with self._lock:
            self.fired.append((n, what))

    def _keep(self, *socks: socket.socket) -> None:
        with self._lock:
            self._socks.extend(socks)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            n = self.connections
            self.connections += 1
            fault = self.fault if n < self.faulty else None
            threading.Thread(target=self._serve, args=(n, client, fault), daemon=True,
                             name=f"netfaults-{n}").start()

    def _serve(self, n: int, client: socket.socket, fault: Fault | None) -> None:
        self._keep(client)
        if fault is not None and fault.kind == "blackhole":
            self._fire(n, "blackhole")
            _drain(client)
            return
        try:
            server = socket.create_connection(self.upstream, timeout=10)
            server.settimeout(None)
        except OSError:
            client.close()
            return
        self._keep(server)
        t0 = time.monotonic()
        for src, dst, way in ((client, server, "up"), (server, client, "down")):
            threading.Thread(target=self._pump, args=(n, src, dst, way, fault, t0),
                             daemon=True, name=f"netfaults-{n}-{way}").start()
        if fault is not None and fault.kind == "reset":
            time.sleep(fault.after)
            self._fire(n, "reset")
            for s in (client, server):
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                s.close()  # with linger 0: RST

    def _pump(self, n: int, src: socket.socket, dst: socket.socket, way: str,
              fault: Fault | None, t0: float) -> None:
        late = queue.Queue()  # (due, chunk); None: EOF
        if fault is not None and fault.kind == "delay":
            threading.Thread(target=_late_writer, args=(late, dst), daemon=True).start()
            self._fire(n, f"delay {way}")
        kind = fault.kind if fault is not None and fault.direction in ("both", way) else None
        stalled = dead = False
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            now = time.monotonic()
            if fault is not None and now >= t0 + fault.after:
                if kind == "stall" and not stalled:
                    stalled = True
                    self._fire(n, f"stall {way}")
                    time.sleep(max(0.0, t0 + fault.after + fault.seconds - now))
                elif kind == "half_open" and not dead:
                    dead = True
                    self._fire(n, f"half_open {way}")
            if dead:
                if not data:
                    return  # no FIN either: the peer never learns
                continue
            if kind == "delay":
                late.put((now + fault.seconds, data) if data else None)
                if not data:
                    return
                continue
            try:
                if not data:
                    dst.shutdown(socket.SHUT_WR)
                    return
                dst.sendall(data)
            except OSError:
                return


def _late_writer(late: queue.Queue, dst: socket.socket) -> None:
    while (item := late.get()) is not None:
        due, data = item
        time.sleep(max(0.0, due - time.monotonic()))
        try:
            dst.sendall(data)
        except OSError:
            return
    try:
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def _drain(sock: socket.socket) -> None:
    try:
        while sock.recv(65536):
            pass
    except OSError:
        pass


class Routes:
    """A ``ROUTE`` hook: ``what`` ("control" or a channel id) -> its fault.  The first time
    a connection is routed for ``what`` (the control connection once per run, a channel
    once per attempt) it goes through a :class:`Proxy` whose first connection suffers the
    fault; later attempts connect directly."""

    def __init__(self, faults: dict[str, Fault]) -> None:
        self.faults = faults
        self.proxies: dict[str, Proxy] = {}

    def __call__(self, what: str, address: tuple[str, int]) -> tuple[str, int] | None:
        if what not in self.faults or what in self.proxies:
            return None
        proxy = self.proxies[what] = Proxy(address, self.faults[what])
        return proxy.address

    @property
    def fired(self) -> dict[str, list[tuple[int, str]]]:
        return {what: p.fired for what, p in self.proxies.items() if p.fired}

    def close(self) -> None:
        for p in self.proxies.values():
            p.close()
