"""``kill -9`` of the PySpark daemon (the parent of Spark's Python workers) mid-run, with a
keyed exchange under backpressure, on embedded Spark with exactly as many task slots as the
job needs (the shared ``local[3]`` session, parallelism 3).

Spark ends a failed attempt's other tasks through the daemon; with the daemon gone they ran
on, holding the slots the stage's next attempt needed, and the job hung.  Now the driver
stops them itself, and a stage Spark still does not restart is resubmitted by the driver's
watchdog and then failed with the reason."""

from __future__ import annotations

import collections
import os
import signal

import pytest

from cutline.driver.dataflow import JobFailed
from cutline.spark.faults import KillDaemon

from cluster_jobs import per_user, per_user_expected
from pipelines import write_events


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["aligned", "at_least_once"])
def test_a_dead_daemon_then_a_lost_worker_recovers(spark, tmp_path, mode):
    events = write_events(tmp_path / "in", files=3, per_file=1500)
    p, sink = per_user(tmp_path, mode)
    fault, drivers = KillDaemon(delay=1.0, kill=2), []
    result = p.run(spark=spark, on_start=lambda d: (drivers.append(d), fault(d)),
                   timeout=240, restart_timeout=60)
    assert [what for what, _ in fault.fired] == ["daemon", "killed"], fault.fired
    # Spark restarted the stage itself: the driver's watchdog had nothing to do
    assert result.attempts >= 2 and drivers[0].controller.resubmitted == 0
    got, want = collections.Counter(sink.results()), per_user_expected(events)
    if mode == "aligned":
        assert got == want
    else:
        assert not want - got, "lost records"


@pytest.mark.slow
def test_a_task_spark_cannot_end_never_hangs_the_job(spark, tmp_path):
    """A frozen worker whose daemon is dead: Spark can neither end its task nor start the
    next attempt without its slot.  The watchdog resubmits the stage twice, then fails saying
    why.  Spark sometimes does end the frozen task after all (its kill request reaches the
    daemon Spark started for the next attempt, which kills any pid it is sent); then the job
    recovers, exactly.  Either way it never hangs."""
    events = write_events(tmp_path / "in", files=3, per_file=1500)
    p, sink = per_user(tmp_path, name="stuck")
    fault = KillDaemon(delay=1.0, freeze=0, kill=2)
    failed: JobFailed | None = None
    try:
        p.run(spark=spark, on_start=fault, timeout=120, restart_timeout=6)
    except JobFailed as e:
        failed = e
    finally:
        reaped = []
        for pid in fault.frozen:  # frees the slot its task holds
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                reaped.append(pid)
    assert [what for what, _ in fault.fired] == ["daemon", "froze", "killed"], fault.fired
    if failed is None:  # Spark ended the frozen task: the stage restarted and recovered
        assert reaped == fault.frozen
        assert collections.Counter(sink.results()) == per_user_expected(events)
    else:
        assert str(failed) == (
            "job 'stuck' failed: no attempt of the stage started within 6 s after attempt 0 "
            "lost slot 2, nor after the driver resubmitted it 2 times (the stage needs 3 free "
            "task slots at once: is capacity missing, or a task Spark cannot end holding "
            "one?)")
