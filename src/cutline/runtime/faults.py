"""Planned faults (tests, chaos): ``kill -9`` of a task's process at a named point.

``JobSpec.faults`` lists ``(point, slot, checkpoint)``: in the job's first attempt, the
process hosting ``slot`` kills itself at ``point`` of the first checkpoint ``>=
checkpoint``.  Points:

- ``"alignment"``: a channel is blocked while the task aligns the checkpoint's barriers;
- ``"snapshot_write"``: the task's state file is written, not yet acknowledged;
- ``"before_commit"`` / ``"after_commit"``: a sink is told the checkpoint completed, before
  / after it committed (the restart re-commits the same checkpoint).

A subtask gets a :class:`FaultPlan` only when one of its points is planned; otherwise its
hook is ``None`` and no code on its paths looks at faults.
"""

from __future__ import annotations

import logging
import os
import signal

__all__ = ["POINTS", "FaultPlan"]

log = logging.getLogger("cutline.task")

POINTS = ("alignment", "snapshot_write", "before_commit", "after_commit")
_SINK_POINTS = ("before_commit", "after_commit")


class FaultPlan:
    """The faults planned for one subtask: point -> the first checkpoint it fires at."""

    def __init__(self, points: dict[str, int]) -> None:
        self.points = points

    @classmethod
    def for_subtask(cls, faults: tuple[tuple[str, int, int], ...], slot: int, attempt: int,
                    has_sink: bool) -> FaultPlan | None:
        """The plan of a subtask in ``slot`` (None when nothing is planned for it): faults
        fire in attempt 0 only, the commit points only at a sink."""
        if attempt != 0:
            return None
        points: dict[str, int] = {}
        for point, where, n in faults:
            if point not in POINTS:
                log.warning("ignoring unknown fault point %r (one of %s)", point,
                            ", ".join(POINTS))
            elif where == slot and (has_sink or point not in _SINK_POINTS):
                points[point] = min(n, points.get(point, n))
        return cls(points) if points else None

    def _at(self, point: str, checkpoint: int) -> None:
        n = self.points.get(point)
        if n is not None and checkpoint >= n:
            log.warning("fault injection: SIGKILL at %s of checkpoint %d", point, checkpoint)
            os.kill(os.getpid(), signal.SIGKILL)

    def alignment(self, checkpoint: int) -> None:
        self._at("alignment", checkpoint)

    def snapshot_written(self, checkpoint: int) -> None:
        self._at("snapshot_write", checkpoint)

    def before_commit(self, checkpoint: int) -> None:
        self._at("before_commit", checkpoint)

    def after_commit(self, checkpoint: int) -> None:
        self._at("after_commit", checkpoint)
