"""Savepoints on a running job: ``RunningJob.savepoint()``, stop-with-savepoint, resuming
from one, retention never deleting them, and ``cutline savepoint`` from outside."""

from __future__ import annotations

import collections
import time

import pytest

from cutline.cli import main
from cutline.driver.dataflow import SavepointError
from cutline.storage.checkpoints import CheckpointStorage, open_checkpoint

from pipelines import expected_rows, wordcount

N = 30_000


def _wait_checkpoints(job, n=1, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        d = job.driver
        if d is not None and len([c for c in d.run.checkpoints if not c.final]) >= n:
            return
        time.sleep(0.02)
    raise AssertionError("no checkpoint completed")


def test_stop_with_savepoint_then_resume_is_exact(tmp_path):
    p, sink = wordcount(tmp_path, N, "aligned", rate=10_000, interval=0.2)
    p.with_checkpoint(retained=1)
    job = p.start(engine="threads")
    _wait_checkpoints(job, 1)
    first = job.savepoint(timeout=30)
    assert "/savepoint-" in first
    _wait_checkpoints(job, 4)  # retention (1) runs past the savepoint
    stopped = job.stop_with_savepoint(timeout=30)
    result = job.result(5)
    assert result.savepoint == stopped and stopped != first
    assert open_checkpoint(first).is_savepoint, "retention never deletes savepoints"
    storage = CheckpointStorage(p.checkpoint.storage, p.name)
    assert len(storage.completed()) <= 1
    done_before = collections.Counter(sink.results())
    assert 0 < sum(done_before.values()) < sum(expected_rows(N).values())
    p2, sink2 = wordcount(tmp_path, N, "aligned", interval=0.2)
    again = p2.run(engine="threads", timeout=120, restore_from=stopped)
    assert again.restored_from == stopped
    assert collections.Counter(sink2.results()) == expected_rows(N)


def test_savepoint_of_a_finished_job_is_refused(tmp_path):
    p, _ = wordcount(tmp_path, 500, "aligned", interval=0.2)
    job = p.start(engine="threads")
    job.result(60)
    with pytest.raises(RuntimeError, match="not running"):
        job.savepoint(timeout=5)


def test_cli_savepoint_and_stop(tmp_path, capsys):
    p, sink = wordcount(tmp_path, N, "unaligned", rate=8_000, interval=0.2)
    job = p.start(engine="threads")
    _wait_checkpoints(job, 1)
    storage = p.checkpoint.storage
    assert main(["savepoint", storage, p.name]) == 0
    path = capsys.readouterr().out.strip()
    assert open_checkpoint(path).is_savepoint
    assert main(["savepoint", storage, p.name, "--stop"]) == 0
    stopped = capsys.readouterr().out.strip()
    assert job.result(30).savepoint == stopped
    assert main(["savepoint", storage, p.name]) == 1
    assert "is not running" in capsys.readouterr().err
    p2, sink2 = wordcount(tmp_path, N, "unaligned", interval=0.2)
    p2.run(engine="threads", timeout=120, restore_from=stopped)
    assert collections.Counter(sink2.results()) == expected_rows(N)


def test_cli_savepoint_refuses_a_wrong_token(tmp_path, capsys):
    import json

    p, _ = wordcount(tmp_path, N, "aligned", rate=5_000, interval=0.2)
    job = p.start(engine="threads")
    _wait_checkpoints(job, 1)
    storage = CheckpointStorage(p.checkpoint.storage, p.name)
    info_path = f"{storage.dir}/_job.json"
    info = json.loads(storage.fs.cat_file(info_path))
    storage.fs.pipe_file(info_path, json.dumps({**info, "token": "00" * 32}).encode())
    assert main(["savepoint", p.checkpoint.storage, p.name]) == 1
    assert "does not answer" in capsys.readouterr().err
    job.cancel()
    with pytest.raises(Exception, match="cancelled"):
        job.result(30)


@pytest.mark.slow
def test_stop_with_savepoint_on_spark_then_resume_exact(spark, tmp_path):
    p, sink = wordcount(tmp_path, N, "unaligned", rate=8_000, interval=0.3)
    job = p.start(spark=spark, timeout=120)
    _wait_checkpoints(job, 1, timeout=60)
    stopped = job.stop_with_savepoint(timeout=60)
    assert job.result(60).savepoint == stopped
    p2, sink2 = wordcount(tmp_path, N, "unaligned", interval=0.3)
    p2.run(spark=spark, timeout=120, restore_from=stopped)
    assert collections.Counter(sink2.results()) == expected_rows(N)


def test_savepoint_error_type_is_public():
    assert issubclass(SavepointError, RuntimeError)


def test_stop_with_savepoint_logs_no_task_failure(tmp_path, caplog):
    """A graceful stop is no failure: no task logs "failed: connection closed" (peers stop
    in no particular order, and a channel closing under a stopping task is expected)."""
    import logging

    for i in range(3):
        p, _ = wordcount(tmp_path / str(i), N, "aligned", rate=10_000, interval=0.2)
        job = p.start(engine="threads")
        _wait_checkpoints(job, 1)
        with caplog.at_level(logging.INFO):
            job.stop_with_savepoint(timeout=30)
            job.result(10)
            time.sleep(1)  # the other tasks' ends
        noise = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert not noise, noise
