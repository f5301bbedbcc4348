"""Planned faults (``cutline.runtime.faults``): which subtask gets a plan, and when it fires.

The kills themselves are exercised end to end by test_spark.py, test_sinks_delta.py,
test_dead_letter.py and test_driver_death.py; here ``os.kill`` is replaced."""

from __future__ import annotations

import signal

import pytest

from cutline.runtime import faults
from cutline.runtime.faults import FaultPlan

PLAN = (("alignment", 1, 2), ("before_commit", 1, 3), ("snapshot_write", 0, 4),
        ("alignment", 1, 5))


def test_only_the_first_attempt_and_the_planned_slot_get_a_plan():
    assert FaultPlan.for_subtask(PLAN, 1, 1, has_sink=True) is None  # a restart: no faults
    assert FaultPlan.for_subtask(PLAN, 2, 0, has_sink=True) is None  # nothing planned there
    assert FaultPlan.for_subtask((), 1, 0, has_sink=True) is None
    assert FaultPlan.for_subtask(PLAN, 1, 0, has_sink=True).points == {
        "alignment": 2, "before_commit": 3}
    # the commit points are a sink's: a subtask without one does not get them
    assert FaultPlan.for_subtask(PLAN, 1, 0, has_sink=False).points == {"alignment": 2}
    assert FaultPlan.for_subtask((("after_commit", 1, 1),), 1, 0, has_sink=False) is None
    assert FaultPlan.for_subtask((("nowhere", 1, 1),), 1, 0, has_sink=True) is None


@pytest.mark.parametrize("hook, point", [
    ("alignment", "alignment"), ("snapshot_written", "snapshot_write"),
    ("before_commit", "before_commit"), ("after_commit", "after_commit")])
def test_a_point_fires_from_its_checkpoint_on(monkeypatch, hook, point):
    kills = []
    monkeypatch.setattr(faults.os, "kill", lambda pid, sig: kills.append(sig))
    plan = FaultPlan({point: 3})
    getattr(plan, hook)(2)
    assert kills == []
    getattr(plan, hook)(3)
    getattr(plan, hook)(7)
    assert kills == [signal.SIGKILL, signal.SIGKILL]
    other = next(h for h in ("alignment", "snapshot_written", "before_commit", "after_commit")
                 if h != hook)
    getattr(plan, other)(9)  # another point is not planned
    assert len(kills) == 2
