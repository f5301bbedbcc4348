"""Consistent-cut checking and global / stable predicates on recorded snapshots, and the
trace types (:class:`TraceEvent`, :class:`Message`, :class:`Snapshot`) they read."""

from .cut import CutReport, check_cut
from .predicates import GlobalState, conserves, deadlock, deadlocked, terminated, total
from .trace import Message, Snapshot, TraceEvent

__all__ = ["CutReport", "GlobalState", "Message", "Snapshot", "TraceEvent", "check_cut",
           "conserves", "deadlock", "deadlocked", "terminated", "total"]
