"""Simulated streaming operators: replayable sources, keyed counting, a collecting sink.

Enough of a dataflow to show what each checkpoint mode promises after a failure: every
source record has a unique id ``"s<source>-<offset>"``; sources regenerate the same records
from an offset (replay); the sink's state is its committed output.
"""

from __future__ import annotations

import zlib
from collections import Counter
from collections.abc import Sequence
from typing import Any, TypedDict

from .world import SimContext, SimProcess, Simulation


def route(key: Any, outputs: Sequence[str]) -> str:
    """Hash partitioning, stable across processes and runs."""
    return outputs[zlib.crc32(repr(key).encode()) % len(outputs)]


def source_record(source: int, offset: int, keys: int) -> tuple[int, str]:
    """The record at ``offset`` of source ``source``: deterministic, so replay is exact."""
    return ((offset * 7 + source * 3) % keys, f"s{source}-{offset}")


class Source(SimProcess):
    """Emits ``count`` records, ``per_tick`` every ``interval``; position is its state."""

    def __init__(self, index: int, count: int, keys: int, interval: float, per_tick: int = 1):
        self.index, self.count, self.keys = index, count, keys
        self.interval, self.per_tick = interval, per_tick
        self.state = {"offset": 0}

    def on_start(self, ctx: SimContext) -> None:
        if self.state["offset"] >= self.count:
            ctx.finish()
        else:
            ctx.schedule(self.interval, "emit")

    def on_timer(self, ctx: SimContext, tag: Any) -> None:
        for _ in range(self.per_tick):
            off = self.state["offset"]
            if off >= self.count:
                break
            rec = source_record(self.index, off, self.keys)
            ctx.send(route(rec[0], ctx.outputs), rec)
            self.state["offset"] = off + 1
        if self.state["offset"] >= self.count:
            ctx.finish()
        else:
            ctx.schedule(self.interval, "emit")


class KeyedCount(SimProcess):
    """Running count per key; emits ``(key, count, record id)`` for every record."""

    def __init__(self) -> None:
        self.state: dict[Any, int] = {}

    def on_receive(self, ctx: SimContext, channel: str, payload: Any) -> None:
        key, rid = payload
        n = self.state.get(key, 0) + 1
        self.state[key] = n
        for out in ctx.outputs:
            ctx.send(out, (key, n, rid))


class Sink(SimProcess):
    """Collects what reaches it; its state is the committed output."""

    def __init__(self) -> None:
        self.state: list[Any] = []

    def on_receive(self, ctx: SimContext, channel: str, payload: Any) -> None:
        self.state.append(payload)


def build_pipeline(
    sim: Simulation, *, sources: int = 2, counters: int = 2, records: int = 300,
    keys: int = 10, interval: float = 0.05,
) -> None:
    """sources --hash(key)--> counters --> sink."""
    build_stages(sim, {f"src{i}": Source(i, records, keys, interval) for i in range(sources)},
                 {f"count{i}": KeyedCount() for i in range(counters)})


def build_stages(sim: Simulation, sources: dict[str, SimProcess],
                 middle: dict[str, SimProcess]) -> None:
    """``sources`` --> every one of ``middle`` --> a :class:`Sink` named ``"sink"``."""
    for name, logic in {**sources, **middle}.items():
        sim.add_process(name, logic)
    sim.add_process("sink", Sink())
    for s in sources:
        for m in middle:
            sim.connect(s, m)
    for m in middle:
        sim.connect(m, "sink")


class OutputComparison(TypedDict):
    records: int
    duplicates: int
    lost: int
    exact: bool


def compare_output(expected: list, actual: list) -> OutputComparison:
    """Exact comparison of sink outputs, and the duplicates / losses by record id."""
    exp_ids = Counter(rid for _, _, rid in expected)
    got_ids = Counter(rid for _, _, rid in actual)
    return {
        "records": len(actual),
        "duplicates": sum((got_ids - exp_ids).values()),
        "lost": sum((exp_ids - got_ids).values()),
        "exact": sorted((k, n) for k, n, _ in expected) == sorted((k, n) for k, n, _ in actual)
        and got_ids == exp_ids,
    }


class Relay(SimProcess):
    """A keyed, stateful operator for arbitrary DAGs: counts records per key and routes
    each record by key to one output; with no outputs it is a sink collecting record ids."""

    def __init__(self) -> None:
        self.state: dict[str, Any] = {"counts": {}, "out": []}

    def on_receive(self, ctx: SimContext, channel: str, payload: Any) -> None:
        key, rid = payload
        counts = self.state["counts"]
        counts[key] = counts.get(key, 0) + 1
        if ctx.outputs:
            ctx.send(route(key, ctx.outputs), payload)
        else:
            self.state["out"].append(rid)


def build_dag(sim: Simulation, edges: list[tuple[int, int]], *, records: int = 40,
              keys: int = 7, interval: float = 0.05) -> list[str]:
    """Processes ``n0..nK`` over ``edges``; nodes without inputs are sources."""
    nodes = sorted({a for a, _ in edges} | {b for _, b in edges})
    has_input = {b for _, b in edges}
    src_index = 0
    for n in nodes:
        if n in has_input:
            sim.add_process(f"n{n}", Relay())
        else:
            sim.add_process(f"n{n}", Source(src_index, records, keys, interval))
            src_index += 1
    for a, b in edges:
        sim.connect(f"n{a}", f"n{b}")
    return [f"n{n}" for n in nodes]
