"""Event-time pipelines the watermark tests share (threads and Spark; shipped by value).

``TumblingCount`` is a small watermark-driven keyed operator for the tests only: it counts
records per key and tumbling window ``[w, w + size)`` in keyed state and emits
``("win", key, w, count)`` when the watermark reaches ``w + size`` (Spark's rule), and
``("late", key, w, ts)`` for a record whose window fired; with ``record_watermarks`` it
also emits ``("wm", subtask, ts)`` for every watermark it gets.  The events are out of
order by at most ``DISORDER`` seconds, so with ``max_delay=DISORDER`` no record is late and
every window's count is known in advance: a window fired early shows a smaller count (and
a second firing), a lost one is missing, a doubled one appears twice.
"""

from __future__ import annotations

import collections
import math
from typing import Any

from cutline import CheckpointConfig, Pipeline
from cutline.api import Stream
from cutline.connectors import CollectSink, GeneratorSource
from cutline.logical import HASH
from cutline.runtime.operators import Keyed

KEYS = 7
DISORDER = 40
SIZE = 100


def event(i: int) -> dict:
    """Event ``i``: its key, and a timestamp up to DISORDER seconds before ``i``."""
    return {"k": f"k{i % KEYS}", "ts": i - (i * 7919) % DISORDER, "i": i}


def event_ts(e: dict) -> int:
    return e["ts"]


def event_key(e: dict) -> str:
    return e["k"]


def expected_windows(n: int) -> collections.Counter:
    c: collections.Counter = collections.Counter()
    for i in range(n):
        e = event(i)
        c[(e["k"], e["ts"] - e["ts"] % SIZE)] += 1
    return collections.Counter(("win", k, w, cnt) for (k, w), cnt in c.items())


class TumblingCount(Keyed):
    def __init__(self, node: Any, subtask: int, parallelism: int, max_parallelism: int,
                 state_backend: str = "memory", storage: Any = None) -> None:
        super().__init__(node, subtask, parallelism, max_parallelism, state_backend, storage)
        self.subtask = subtask
        self.size, self.record = node.fn.size, node.fn.record_watermarks
        self.ts_fn = node.timestamp_fn
        self.wm = -math.inf

    def process(self, batch: list) -> list:
        table, size, out = self.state.table("w"), self.size, []
        for r in batch:
            k, ts = self.key_fn(r), self.ts_fn(r)
            w = ts - ts % size
            if w + size <= self.wm:
                out.append(("late", k, w, ts))
                continue
            d = table.mutable(k, dict)
            d[w] = d.get(w, 0) + 1
        self.state.after_batch()
        return out

    def on_watermark(self, ts: float) -> list:
        assert ts > self.wm, f"watermark went back: {self.wm} -> {ts}"
        self.wm = ts
        out: list = [("wm", self.subtask, ts)] if self.record else []
        table, size = self.state.table("w"), self.size
        for _, name, key, windows in list(self.state.entries()):
            if name != "w":
                continue
            due = sorted(w for w in windows if w + size <= ts)
            if not due:
                continue
            out += [("win", key, w, windows[w]) for w in due]
            rest = {w: n for w, n in windows.items() if w + size > ts}
            if rest:
                table.put(key, rest)
            else:
                table.delete(key)
        return out


class TumblingCountSpec:
    """``node.fn`` of a TumblingCount node: builds the operator."""

    def __init__(self, size: int, record_watermarks: bool = False) -> None:
        self.size, self.record_watermarks = size, record_watermarks

    def __call__(self, node: Any, subtask: int, parallelism: int, max_parallelism: int,
                 **kw: Any) -> TumblingCount:
        return TumblingCount(node, subtask, parallelism, max_parallelism, **kw)


def tumbling_count(stream: Stream, key_fn: Any, size: int = SIZE, *, uid: str = "windows",
                   record_watermarks: bool = False, parallelism: int | None = None) -> Stream:
    node = stream.pipeline._add("operator", TumblingCountSpec(size, record_watermarks),
                                [stream.node.id], uid=uid, parallelism=parallelism,
                                partitioning=HASH, key_fn=key_fn)
    return Stream(stream.pipeline, node)


def slow_identity(e: dict) -> dict:
    import time

    time.sleep(0.0003)
    return e


def windowed(tmp, records: int, mode: str = "aligned", *, rate=None, parallelism: int = 2,
             interval: float = 0.3, record_watermarks: bool = False, idle_timeout=None,
             source: Any = None, name: str = "windowed", slow: bool = False):
    """events -> assign_timestamps (in the source tasks: one watermark per split) ->
    [rebalance -> a slow map, when ``slow``: in-flight data and backpressure] ->
    key_by -> TumblingCount -> CollectSink."""
    cfg = CheckpointConfig(
        interval=interval, storage=f"file://{tmp}/checkpoints",
        mode="at_least_once" if mode == "at_least_once" else "exactly_once",
        unaligned=mode == "unaligned")
    p = Pipeline(name, parallelism=parallelism, checkpoint=cfg)
    sink = CollectSink(str(tmp / "out"))
    src = source or GeneratorSource(count=records, fn=event, rate=rate)
    stamped = (p.source(src, uid="events")
               .assign_timestamps(event_ts, max_delay=DISORDER, idle_timeout=idle_timeout,
                                  uid="stamps"))
    if slow:
        stamped = stamped.rebalance().map(slow_identity, uid="slow")
    tumbling_count(stamped, event_key, record_watermarks=record_watermarks).sink(sink, uid="out")
    return p, sink


def fired(rows: list) -> collections.Counter:
    return collections.Counter(r for r in rows if r[0] == "win")


def watermarks_by_subtask(rows: list) -> dict[int, list[float]]:
    out: dict[int, list[float]] = collections.defaultdict(list)
    for r in rows:
        if r[0] == "wm":
            out[r[1]].append(r[2])
    return dict(out)


class SilentSplitSource:
    """Two splits of ``event(i)``, ``i < count``: split 0 (even i) at ``rate`` records/s;
    split 1 (odd i) says nothing (no records, not ended) until the file ``release`` exists,
    then reads its records at once.  For idle-source tests."""

    def __init__(self, count: int, rate: float, release: str) -> None:
        self.count, self.rate, self.release = count, rate, release

    def create_reader(self) -> "SilentSplitReader":
        return SilentSplitReader(self)


class SilentSplitReader:
    def __init__(self, src: SilentSplitSource) -> None:
        self.src = src
        self.next = 0
        self.sub = 0

    def open(self, subtask: int, parallelism: int) -> None:
        assert parallelism == 2
        self.sub, self.next = subtask, subtask
        import time

        self.t0 = time.monotonic()

    def read_batch(self, n: int) -> list | None:
        import os
        import time

        src = self.src
        if self.next >= src.count:
            if self.sub == 0 and not os.path.exists(src.release):
                open(src.release, "w").close()
            return None
        if self.sub == 1:
            if not os.path.exists(src.release):
                time.sleep(0.005)
                return []
            due = src.count
        else:
            due = int((time.monotonic() - self.t0) * src.rate) * 2
            if due <= self.next:
                time.sleep(0.002)
                return []
        out = []
        while self.next < min(due, src.count) and len(out) < n:
            out.append(event(self.next))
            self.next += 2
        return out

    def snapshot(self) -> dict:
        return {"next": self.next}

    def restore(self, state: dict) -> None:
        self.next = state["next"]

    def close(self) -> None:
        pass


def shaky_event(i: int) -> dict:
    """``event(i)``, but every 500th has no usable timestamp (None, text, NaN in turn)."""
    e = event(i)
    if i % 500 == 499:
        e["ts"] = (None, "soon", float("nan"))[(i // 500) % 3]
    return e
