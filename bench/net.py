"""The network layer, measured: which transport, and old vs new channels side by side.

Run ``python bench/net.py`` (``--quick`` for a short run; ``--base be9b5d9`` picks the old
code).  Every case runs in the same process, in alternating order over the rounds, and the
median is reported (with the median of the per-round new/old ratios).

Part 1, transports: 1,000-record dict batches (pickle 5, as the channels send them) from a
sender in a child process to a receiving thread that decodes them and hands them to the
main thread, which returns a credit every 2 batches (credits 8), over

* ``sockets``: blocking sockets, one reader thread, ``recv_into`` a preallocated buffer
  (:mod:`cutline.runtime.net`);
* ``mp.connection``: ``multiprocessing.connection`` (``send_bytes`` / ``recv_bytes``);
* ``asyncio``: an event-loop thread reading with ``StreamReader.readexactly``, credits
  written back through ``call_soon_threadsafe``;

and the handshake latency of each (connect + authenticate, client side).

Part 2, A/B: ``cutline.runtime.channels`` of ``--base`` (``git show``, written to a temp
directory) against the working tree's: records/s through one loopback channel (sender in
a child process, 1,000-record dict batches, credits 8, as ``bench/encoding.py`` part 2),
``OutputChannel`` connect latency, and the control connection's (``control.connect``
against a ``ControlService``).  Exit code is always 0.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import importlib.util
import logging
import multiprocessing
import multiprocessing.connection as mpc
import pickle
import platform
import queue
import secrets
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
try:
    import cutline  # noqa: F401
except ImportError:  # running from a checkout without an installed package
    sys.path.insert(0, str(ROOT / "src"))

from cutline.runtime import channels as new_channels
from cutline.runtime import control as new_control
from cutline.runtime import net

from _common import drain_channel

CREDITS, GRANT = 8, 2
_COUNT = struct.Struct("!I")
DATA, CREDIT = net.FIRST_KIND, net.FIRST_KIND + 1


def make_dicts(bs: int, k: int) -> list[dict]:
    return [{"user": f"user-{(k * bs + i) % 997}", "n": k * bs + i, "t": (k * bs + i) * 0.25}
            for i in range(bs)]


def _pool(bs: int) -> list[bytes]:
    return [pickle.dumps(make_dicts(bs, k), protocol=5) for k in range(16)]


# --------------------------------------------------------------------------- part 1


def _send_sockets(address, secret, bs, n) -> None:
    pool = _pool(bs)
    conn = net.connect(address, secret, "bench", 30)
    credits = CREDITS
    for i in range(n):
        while credits == 0:
            _, payload = conn.recv()
            credits += _COUNT.unpack(payload)[0]
        conn.send(DATA, pool[i % 16])
        credits -= 1
    conn.send(DATA, b"")
    try:
        while True:  # credits still on the way, then the receiver's close
            conn.recv()
    except (EOFError, OSError):
        pass
    conn.close()


def _send_mp(address, authkey, bs, n) -> None:
    pool = _pool(bs)
    conn = mpc.Client(address, authkey=authkey)
    credits = CREDITS
    for i in range(n):
        while credits == 0:
            credits += _COUNT.unpack(conn.recv_bytes())[0]
        conn.send_bytes(pool[i % 16])
        credits -= 1
    conn.send_bytes(b"")
    try:
        while True:
            conn.recv_bytes()
    except (EOFError, OSError):
        pass
    conn.close()


class _Handoff:
    """The receiving side's queue: reader thread -> main thread, like an input gate's."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.items: collections.deque = collections.deque()

    def put(self, item) -> None:
        with self.cond:
            self.items.append(item)
            self.cond.notify()

    def consume(self, grant, bs: int) -> float:
        """Records/s from the first batch to the end marker (None)."""
        records, t0, owed = 0, None, 0
        while True:
            with self.cond:
                while not self.items:
                    if not self.cond.wait(60):
                        raise TimeoutError("stalled")
                item = self.items.popleft()
            if item is None:
                break
            if t0 is None:
                t0 = time.perf_counter()
            records += len(item)
            owed += 1
            if owed >= GRANT:
                grant(owed)
                owed = 0
        return (records - bs) / (time.perf_counter() - t0)


def _spawn(target, *args) -> multiprocessing.Process:
    p = multiprocessing.get_context("spawn").Process(target=target, args=args)
    p.start()
    return p


def transport_sockets(bs: int, n: int) -> float:
    secret, got = secrets.token_bytes(32), queue.Queue()
    hand = _Handoff()

    def serve(conn: net.Connection) -> None:
        got.put(conn)
        while True:
            _, payload = conn.recv()
            if not payload:
                hand.put(None)
                return
            hand.put(pickle.loads(payload))

    lst = net.Listener("127.0.0.1", secret, admit=net.only("bench"), serve=serve,
                       name="bench-sockets", log=logging.getLogger("bench"))
    lst.start()
    proc = _spawn(_send_sockets, lst.address, secret, bs, n)
    conn = got.get(timeout=60)
    def grant(k: int) -> None:
        try:
            conn.send(CREDIT, _COUNT.pack(k))
        except OSError:  # the reader saw the end and closed: late credits go nowhere
            pass

    rate = hand.consume(grant, bs)
    lst.close()
    proc.join(30)
    return rate


def transport_mp(bs: int, n: int) -> float:
    authkey = secrets.token_bytes(32)
    hand = _Handoff()
    with mpc.Listener(("127.0.0.1", 0), authkey=authkey) as lst:
        proc = _spawn(_send_mp, lst.address, authkey, bs, n)
        conn = lst.accept()

        def read() -> None:
            while payload := conn.recv_bytes():
                hand.put(pickle.loads(payload))
            hand.put(None)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        rate = hand.consume(lambda k: conn.send_bytes(_COUNT.pack(k)), bs)
        reader.join(30)
        conn.close()
    proc.join(30)
    return rate


def transport_asyncio(bs: int, n: int) -> float:
    secret = secrets.token_bytes(32)
    hand = _Handoff()
    loop = asyncio.new_event_loop()
    ready: queue.Queue = queue.Queue()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonce = secrets.token_bytes(net.NONCE_BYTES)
        writer.write(net.HEADER.pack(net.HELLO, len(nonce)) + nonce)
        _, length = net.HEADER.unpack(await reader.readexactly(net.HEADER.size))
        hello = await reader.readexactly(length)
        if hello[:net.MAC_BYTES] != net.make_mac(secret, hello[net.MAC_BYTES:].decode(), nonce):
            writer.close()
            return
        writer.write(net.HEADER.pack(net.WELCOME, 0))
        ready.put(writer)
        while True:
            _, length = net.HEADER.unpack(await reader.readexactly(net.HEADER.size))
            if not length:
                hand.put(None)
                break
            hand.put(pickle.loads(await reader.readexactly(length)))
        writer.close()

    async def start():
        return await asyncio.start_server(handle, "127.0.0.1", 0)

    server = loop.run_until_complete(start())
    address = server.sockets[0].getsockname()[:2]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    proc = _spawn(_send_sockets, address, secret, bs, n)
    writer = ready.get(timeout=60)

    def grant(k: int) -> None:
        loop.call_soon_threadsafe(writer.write, net.HEADER.pack(CREDIT, 4) + _COUNT.pack(k))

    rate = hand.consume(grant, bs)
    proc.join(30)
    server.close()
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()
    return rate


def handshake_sockets(k: int) -> float:
    secret = secrets.token_bytes(32)
    def serve(conn: net.Connection) -> None:
        try:
            conn.recv()
        except EOFError:
            pass

    lst = net.Listener("127.0.0.1", secret, admit=net.only("bench"), serve=serve,
                       name="bench-hs", log=logging.getLogger("bench"))
    lst.start()
    times = []
    for _ in range(k):
        t0 = time.perf_counter()
        conn = net.connect(lst.address, secret, "bench", 10)
        times.append(time.perf_counter() - t0)
        conn.close()
    lst.close()
    return statistics.median(times)


def handshake_mp(k: int) -> float:
    authkey = secrets.token_bytes(32)
    times = []
    with mpc.Listener(("127.0.0.1", 0), authkey=authkey) as lst:
        def accept() -> None:
            for _ in range(k):
                lst.accept().close()
        t = threading.Thread(target=accept, daemon=True)
        t.start()
        for _ in range(k):
            t0 = time.perf_counter()
            conn = mpc.Client(lst.address, authkey=authkey)
            times.append(time.perf_counter() - t0)
            conn.close()
        t.join(10)
    return statistics.median(times)


# --------------------------------------------------------------------------- part 2


def load_old(base: str, tmp: Path):
    """``channels`` and ``control`` of ``base`` as modules ``old_channels``/``old_control``."""
    mods = {}
    for name in ("channels", "control"):
        src = subprocess.run(["git", "show", f"{base}:src/cutline/runtime/{name}.py"], cwd=ROOT,
                             check=True, capture_output=True, text=True).stdout
        for rel, mod in (("..protocol.events", "cutline.protocol.events"),
                         ("..connectors.base", "cutline.connectors.base"),
                         ("..protocol", "cutline.protocol"),
                         (".net", "cutline.runtime.net"), (".", "cutline.runtime")):
            src = src.replace(f"from {rel} import", f"from {mod} import")
        (tmp / f"old_{name}.py").write_text(src)
        spec = importlib.util.spec_from_file_location(f"old_{name}", tmp / f"old_{name}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[f"old_{name}"] = mod
        spec.loader.exec_module(mod)
        mods[name] = mod
    return mods["channels"], mods["control"]


def _channels_module(which: str, tmp: str):
    if which == "new":
        return new_channels
    sys.path.insert(0, tmp)
    import old_channels
    return old_channels


def _send_channel(which, tmp, address, secret, bs, n) -> None:
    mod = _channels_module(which, tmp)
    pool = [make_dicts(bs, k) for k in range(16)]
    with mod.OutputChannel("bench", address, secret) as ch:
        for i in range(n):
            ch.send_records(pool[i % 16])
        ch.send_eof()


def channel_rate(mod, which: str, tmp: str, bs: int, n: int) -> float:
    secret = secrets.token_bytes(32)
    with mod.InputGate("bench-task", ["bench"], secret, credits=CREDITS) as gate:
        proc = _spawn(_send_channel, which, tmp, gate.address, secret, bs, n)
        gate.wait_connected(60)
        records, dt = drain_channel(gate)
        proc.join(30)
    return records / dt


def channel_connect(mod, k: int) -> float:
    secret = secrets.token_bytes(32)
    ids = [f"c{i}" for i in range(k)]
    times = []
    with mod.InputGate("bench-hs", ids, secret) as gate:
        outs = []
        for cid in ids:
            t0 = time.perf_counter()
            outs.append(mod.OutputChannel(cid, gate.address, secret))
            times.append(time.perf_counter() - t0)
        for out in outs:
            out.send_eof()
            out.close()
    return statistics.median(times)


def control_connect(mod, k: int) -> float:
    secret, events = secrets.token_bytes(32), queue.Queue()
    service = mod.ControlService("127.0.0.1", secret, events, "bench")
    service.start()
    times = []
    for _ in range(k):
        t0 = time.perf_counter()
        conn = mod.connect(service.address, secret, timeout=10)
        times.append(time.perf_counter() - t0)
        conn.close()
    service.close()
    return statistics.median(times)


# --------------------------------------------------------------------------- main


def _alternate(cases: dict, rounds: int) -> dict[str, list[float]]:
    runs: dict[str, list[float]] = {k: [] for k in cases}
    names = list(cases)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            runs[name].append(cases[name]())
    return runs


def _report(title: str, runs: dict[str, list[float]], unit: str, scale: float = 1.0,
            base: str | None = None) -> None:
    print(f"\n{title}")
    for name, v in runs.items():
        line = (f"  {name:<16}{statistics.median(v) * scale:>14,.1f} {unit}   "
                f"(rounds: {', '.join(f'{x * scale:,.1f}' for x in v)})")
        if base is not None and name != base:
            ratio = statistics.median(x / b for x, b in zip(v, runs[base]))
            line += f"   paired ratio vs {base}: {ratio:.3f}"
        print(line)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="short run (smoke test)")
    p.add_argument("--base", default="be9b5d9", help="the old code's commit (default be9b5d9)")
    p.add_argument("--rounds", type=int, default=None, help="rounds (default 9, quick 3)")
    p.add_argument("--skip-transports", action="store_true", help="only part 2")
    args = p.parse_args(argv)
    bs, rounds = 1000, args.rounds or (3 if args.quick else 9)
    nb = 200 if args.quick else 2000
    hs = 20 if args.quick else 200
    print(f"cutline network benchmark: {bs:,}-record dict batches, {nb:,} per run, credits "
          f"{CREDITS}, {rounds} rounds alternating, median; Python {platform.python_version()}")

    if not args.skip_transports:
        runs = _alternate({"sockets": lambda: transport_sockets(bs, nb),
                           "mp.connection": lambda: transport_mp(bs, nb),
                           "asyncio": lambda: transport_asyncio(bs, nb)}, rounds)
        _report("part 1: transports, records/s", runs, "records/s", base="sockets")
        runs = _alternate({"sockets": lambda: handshake_sockets(hs),
                           "mp.connection": lambda: handshake_mp(hs)}, rounds)
        _report(f"part 1: handshake latency (median of {hs} connects per round)", runs, "us",
                1e6, base="sockets")

    with tempfile.TemporaryDirectory() as tmp:
        old_ch, old_ctl = load_old(args.base, Path(tmp))
        runs = _alternate({f"old {args.base}": lambda: channel_rate(old_ch, "old", tmp, bs, nb),
                           "new": lambda: channel_rate(new_channels, "new", tmp, bs, nb)},
                          rounds)
        _report("part 2: one channel, records/s", runs, "records/s", base=f"old {args.base}")
        runs = _alternate({f"old {args.base}": lambda: channel_connect(old_ch, hs),
                           "new": lambda: channel_connect(new_channels, hs)}, rounds)
        _report(f"part 2: OutputChannel connect (median of {hs} per round)", runs, "us", 1e6,
                base=f"old {args.base}")
        runs = _alternate({f"old {args.base}": lambda: control_connect(old_ctl, hs),
                           "new": lambda: control_connect(new_control, hs)}, rounds)
        _report(f"part 2: control connect (median of {hs} per round)", runs, "us", 1e6,
                base=f"old {args.base}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
