"""What a user sees when a run is refused or fails: the error's message says it all, and its
traceback ends at the user's call (``Pipeline.run``, ``RunningJob.result``), with no frame
of cutline's (issue 29: the lease's refusal printed one through launcher.py and lease.py)."""

from __future__ import annotations

import traceback

import pytest

from cutline import (
    CheckpointStorageError,
    FinishedJobError,
    IncompatibleCheckpointError,
    JobAlreadyRunningError,
    JobFailed,
)
from cutline.storage.checkpoints import CheckpointStorage
from cutline.storage.lease import JobLease

from pipelines import wordcount


def _only_mine(exc: BaseException) -> None:
    """The traceback: the user's call, then the line of cutline's that raises it again
    (``raise exc.with_traceback(None)``), nothing in between."""
    frames = traceback.extract_tb(exc.__traceback__)
    assert [f.filename for f in frames[:-1]] == [__file__], frames
    assert frames[-1].line.startswith("raise ") and "with_traceback(None)" in frames[-1].line
    assert exc.__cause__ is None and exc.__suppress_context__


def test_the_lease_refusal_ends_at_the_users_call(tmp_path):
    p, _ = wordcount(tmp_path, 50)
    lease = JobLease(CheckpointStorage(p.checkpoint.storage, p.name))
    lease.acquire()  # another run of the job holds it
    try:
        with pytest.raises(JobAlreadyRunningError, match="is already running") as e:
            p.run(engine="threads", progress=False)
        _only_mine(e.value)
        with pytest.raises(JobAlreadyRunningError) as e:  # the same in the background
            p.start(engine="threads").result(timeout=60)
        _only_mine(e.value)
    finally:
        lease.release()


def test_a_finished_job_a_misfit_checkpoint_and_a_missing_one_end_at_the_users_call(
        tmp_path):
    p, _ = wordcount(tmp_path, 50)
    final = p.run(engine="threads", progress=False).latest_checkpoint.path
    p, _ = wordcount(tmp_path, 50)
    with pytest.raises(FinishedJobError) as e:
        p.run(engine="threads", progress=False)
    _only_mine(e.value)
    assert isinstance(e.value, JobFailed)

    p, _ = wordcount(tmp_path, 50)
    p.nodes[[n.uid for n in p.nodes].index("count")].kind = "reduce"  # another kind of op
    with pytest.raises(IncompatibleCheckpointError, match="'count' was a count") as e:
        p.run(engine="threads", progress=False, restore_from=final)
    _only_mine(e.value)

    p, _ = wordcount(tmp_path, 50)
    with pytest.raises(CheckpointStorageError, match="no completed checkpoint at") as e:
        p.run(engine="threads", progress=False, restore_from=f"{final}-nothing-here")
    _only_mine(e.value)
