"""Checkpoint storage that fills up or fails mid-upload (``faulty://``) and S3 that answers
5xx / 503 SlowDown: checkpoints are declined, the job goes on within ``tolerable_failures``
and then fails naming the storage and the cause; nothing half-written is ever restored, and
retention never deletes the last complete checkpoint because newer ones failed.

The jobs run on the threads engine (the same driver, tasks, channels and storage as on
Spark, in seconds); ``test_tls.py`` runs a storage fault and a kill on Spark.
"""

from __future__ import annotations

import collections
import os

import pytest

from cutline.driver.dataflow import JobFailed
from cutline.storage.checkpoints import CheckpointStorage, CheckpointStorageError
from cutline.storage.faulty import fired
from pipelines import expected_rows, wordcount

RECORDS = 12_000


def _faulty(tmp_path, rules=(), **options):
    root = str(tmp_path / "chk")
    return f"faulty://{root}", {"rules": list(rules), "journal": str(tmp_path / "journal"),
                                "root": root, **options}


def test_a_full_disk_or_a_cut_upload_leaves_nothing_half_written(tmp_path):
    url, options = _faulty(tmp_path, [{"match": r"chk-3/_metadata$", "after": 10}],
                           capacity=4000)
    storage = CheckpointStorage(url, "job", options)
    for n in (1, 2):
        info = storage.write_task_state(n, "a", b"x" * 1000)
        storage.commit(n, {}, states={"a": info})
    info = storage.write_task_state(3, "a", b"y" * 1000)
    with pytest.raises(CheckpointStorageError) as cut:  # the commit point, cut after 10 bytes
        storage.commit(3, {}, states={"a": info})
    with pytest.raises(CheckpointStorageError) as full:  # 3 x 1000 bytes + metadata stored
        storage.write_task_state(4, "a", b"z" * 1500)
    assert str(full.value) == (
        f"cannot write state file {url}/job/chk-4/a.state to checkpoint storage {url!r}: "
        "OSError: [Errno 28] No space left on device")
    assert "chk-3/_metadata" in str(cut.value) and "[Errno 5] Input/output error" in str(cut.value)
    assert [e for e, _ in fired(options["journal"])] == ["EIO", "ENOSPC"]
    chk = tmp_path / "chk" / "job"
    assert sorted(os.listdir(chk / "chk-3")) == ["a.state"]  # no partial _metadata
    assert os.listdir(chk / "chk-4") == []  # no partial state file
    assert storage.completed() == [1, 2] and storage.latest().id == 2
    assert storage.retain(1) == [1]  # the newest complete one stays; 3 and 4 are newer
    assert storage.completed() == [2] and sorted(os.listdir(chk)) == ["chk-2", "chk-3", "chk-4"]
    local = tmp_path / "sst"
    local.write_bytes(b"s" * 2000)
    with pytest.raises(CheckpointStorageError, match="cannot write shared file .*No space left"):
        storage.upload_shared("a", 5, str(local))
    assert not any(files for _, _, files in os.walk(chk / "shared"))


def test_failed_uploads_are_declined_then_the_job_fails_and_a_rerun_restores_the_last_complete(
        tmp_path):
    """Run 1: checkpoint 2's state uploads are cut mid-file, checkpoint 4's ``_metadata``
    write fills the disk, every checkpoint from 5 on fails: with ``tolerable_failures=2`` the
    job goes on through 2 and 4 and fails at the third consecutive failure, naming the
    storage and the cause; retention (``retained=1``) kept checkpoint 3.  Run 2 (the storage
    healthy again) restores checkpoint 3, and the output of both runs is exact."""
    rules = [{"match": r"/chk-2/[^/]+\.state$", "after": 100},
             {"match": r"/chk-4/_metadata$", "after": 20, "error": "ENOSPC"},
             {"match": r"/chk-([5-9]|\d\d+)/[^/]+\.state$", "error": "ENOSPC"}]
    url, options = _faulty(tmp_path, rules)
    p, sink = wordcount(tmp_path, RECORDS, rate=6_000, interval=0.2)
    p.with_checkpoint(storage=url, storage_options=options, tolerable_failures=2, retained=1)
    with pytest.raises(JobFailed) as info:
        p.run(engine="threads", timeout=120, progress=False)
    msg = str(info.value)
    assert "Exceeded checkpoint tolerable failure threshold (2): 3 consecutive" in msg, msg
    assert f"to checkpoint storage {url!r}: OSError: [Errno 28] No space left on device" in msg
    hit = {path.split("/wordcount/")[1].split("/")[0] for _, path in fired(options["journal"])}
    assert hit == {"chk-2", "chk-4", "chk-5", "chk-6"}, hit
    storage = CheckpointStorage(url, "wordcount", options)
    assert storage.completed() == [3]  # 1 retired by retention, 3 kept: the rest failed
    for n in (2, 4):
        assert not os.path.exists(tmp_path / f"chk/wordcount/chk-{n}/_metadata")
    assert collections.Counter(sink.results()) != expected_rows(RECORDS)  # unfinished

    p.with_checkpoint(storage_options={**options, "rules": []})
    result = p.run(engine="threads", timeout=120, progress=False)
    assert result.restored_from.endswith("/chk-3")
    assert collections.Counter(sink.results()) == expected_rows(RECORDS)


@pytest.mark.slow
def test_s3_slow_down_is_retried_5xx_declines_and_a_failed_delete_keeps_the_job_going(
        s3, tmp_path, caplog):
    """503 SlowDown on one state upload is absorbed by the client's retry (checkpoint 2
    completes); 500 on checkpoint 3's ``_metadata`` fails its commit (declined, the job goes
    on); 500 on deleting checkpoint 1 fails one retention, which the job logs and survives
    (the next one deletes it).  Output exact, one attempt."""
    faults = s3.faults
    try:
        slow = faults.add("PUT", r"/chk-2/[^/]+\.state$", status=503, times=1)
        meta = faults.add("PUT", r"/chk-3/_metadata$", status=500)
        # retention deletes _metadata first: failing (all 3 tries of the client), it keeps
        # checkpoint 1 (and says so) until the next retention
        delete = faults.add("DELETE", r"/chk-1/_metadata$", status=500, times=3)
        p, sink = wordcount(tmp_path, RECORDS, rate=12_000, interval=0.2)
        url = s3.url("slowdown")
        p.with_checkpoint(storage=url, storage_options=s3.options,
                          tolerable_failures=1, retained=1)
        result = p.run(engine="threads", timeout=120, progress=False)
    finally:
        faults.clear()
    ids = [c.id for c in result.checkpoints]
    assert 2 in ids and 3 not in ids and max(ids) > 3, ids
    assert slow.hits == 1 and meta.hits >= 1 and delete.hits == 3
    assert "retention after checkpoint 2 failed, old checkpoints are kept" in caplog.text
    assert CheckpointStorage(url, "wordcount", s3.options).completed() == [ids[-1]]
    assert result.attempts == 1
    assert collections.Counter(sink.results()) == expected_rows(RECORDS)
