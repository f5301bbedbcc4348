"""Deterministic simulator of processes and FIFO channels, driving the snapshot protocol.

Simulated processes subclass :class:`SimProcess` (``on_receive(ctx, channel, payload)``);
process graphs run on Spark or threads subclass :class:`cutline.graph.Process` instead.
"""

from typing import Any

from .world import Message, SimContext, SimProcess, Simulation, Snapshot, TraceEvent

__all__ = ["Message", "SimContext", "SimProcess", "Simulation", "Snapshot", "TraceEvent"]

_RENAMED = {"Process": "SimProcess", "Context": "SimContext"}


def __getattr__(name: str) -> Any:
    if name in _RENAMED:
        raise AttributeError(
            f"cutline.sim.{name} is now cutline.sim.{_RENAMED[name]} (its handler is "
            f"on_receive(ctx, channel, payload)); cutline.graph.{name} is the process-graph "
            f"class, with on_message(ctx, sender, msg)")
    raise AttributeError(f"module 'cutline.sim' has no attribute {name!r}")
