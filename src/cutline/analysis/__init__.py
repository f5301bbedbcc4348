"""Consistent-cut checking and global / stable predicates on recorded snapshots."""

from .cut import CutReport, check_cut
from .predicates import GlobalState, conserves, deadlock, deadlocked, terminated, total

__all__ = ["CutReport", "GlobalState", "check_cut", "conserves", "deadlock", "deadlocked",
           "terminated", "total"]
