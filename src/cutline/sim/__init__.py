"""Deterministic simulator of processes and FIFO channels, driving the snapshot protocol."""

from .world import Context, Message, Process, Simulation, Snapshot, TraceEvent

__all__ = ["Context", "Message", "Process", "Simulation", "Snapshot", "TraceEvent"]
