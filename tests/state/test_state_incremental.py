"""Incremental checkpoints: shared files, their reference counts and retention, and jobs on
the RocksDB backend (threads engine: no Spark, fast)."""

import collections
import logging
import os
import threading
import time

import pytest

from cutline.connectors import CollectSink
from cutline.runtime.restore import read_states
from cutline.spark.launcher import JobCancelled
from cutline.state.rocksdb import RocksDBStateBackend, read_entries
from cutline.storage.checkpoints import CheckpointStorage, CheckpointStorageError
from pipelines import expected_rows, wordcount


# every test here: state backends' working directories under its tmp_path (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("local_dirs")


def shared_on_disk(st: CheckpointStorage) -> set[str]:
    return {rel for rel in st._shared_files()}


def referenced(st: CheckpointStorage) -> set[str]:
    return set(st.shared_references())


def upload(st, n, tmp_path, content: bytes, owner="op.0"):
    f = tmp_path / f"{content[:8].hex()}.sst"
    f.write_bytes(content)
    return st.upload_shared(owner, n, str(f))


def commit(st, n, refs, *, savepoint=False):
    info = st.write_task_state(n, "t.0", b"state", savepoint=savepoint)
    info["shared"] = {r["path"]: {"size": r["size"], "sha256": r["sha256"]} for r in refs}
    return st.commit(n, {}, savepoint=savepoint, states={"t.0": info})


# ---------------------------------------------------------------------- storage

def test_shared_files_are_content_addressed_listed_in_metadata_and_refcounted(tmp_path):
    st = CheckpointStorage(str(tmp_path / "c"), "job")
    a = upload(st, 1, tmp_path, b"A" * 100)
    assert a["path"].startswith("shared/op.0/1-") and a["path"].endswith(".sst")
    assert a["uploaded"] == 100 and upload(st, 1, tmp_path, b"A" * 100)["uploaded"] == 0
    b = upload(st, 2, tmp_path, b"B" * 50)
    commit(st, 1, [a])
    commit(st, 2, [a, b])
    assert st.open(2).shared == {r["path"]: {"size": r["size"], "sha256": r["sha256"]}
                                 for r in (a, b)}
    # reference counts are rebuilt from _metadata alone (a restarted driver)
    again = CheckpointStorage(str(tmp_path / "c"), "job")
    assert again.shared_references() == {a["path"]: 2, b["path"]: 1}
    with pytest.raises(CheckpointStorageError, match="missing shared file shared/op.0/9-"):
        info = st.write_task_state(3, "t.0", b"x")
        info["shared"] = {f"shared/op.0/9-{'0' * 64}.sst": {"size": 1, "sha256": "0" * 64}}
        st.commit(3, {}, states={"t.0": info})


def test_retention_deletes_exactly_the_shared_files_nothing_references(tmp_path):
    st = CheckpointStorage(str(tmp_path / "c"), "job")
    a, b, c = (upload(st, n, tmp_path, bytes([n]) * 10) for n in (1, 2, 3))
    commit(st, 1, [a])
    commit(st, 2, [a, b])
    sp = commit(st, 3, [c], savepoint=True)
    d = upload(st, 4, tmp_path, b"D" * 10)
    commit(st, 4, [b, d])
    in_flight = upload(st, 6, tmp_path, b"F" * 10)  # uploaded for a checkpoint not done yet
    orphan = upload(st, 2, tmp_path, b"O" * 10)  # uploaded for a checkpoint that failed
    assert st.retain(1) == [1, 2]
    assert shared_on_disk(st) == {b["path"], c["path"], d["path"], in_flight["path"]}
    assert orphan["path"] not in shared_on_disk(st) and a["path"] not in shared_on_disk(st)
    assert st.shared_references() == {b["path"]: 1, c["path"]: 1, d["path"]: 1}
    # cancel without retaining: checkpoints go, savepoints (and what they need) stay
    assert st.discard_all() == [4]
    assert shared_on_disk(st) == {c["path"]}
    assert st.open(sp).shared == {c["path"]: {"size": 10, "sha256": c["sha256"]}}


def test_latest_skips_a_checkpoint_whose_shared_file_is_missing_or_corrupt(tmp_path, caplog):
    st = CheckpointStorage(str(tmp_path / "c"), "job")
    a, b = upload(st, 1, tmp_path, b"a" * 10), upload(st, 2, tmp_path, b"b" * 10)
    commit(st, 1, [a])
    commit(st, 2, [a, b])
    path = tmp_path / "c" / "job" / b["path"]
    path.write_bytes(b"c" * 10)
    with caplog.at_level(logging.WARNING):
        assert st.latest().id == 1
    assert f"checksum mismatch in shared file {b['path']} referenced by chk-2" in caplog.text
    assert st.latest(deep=False).id == 2  # size-only verification cannot see it
    path.unlink()
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert st.latest(deep=False).id == 1
    assert f"missing shared file {b['path']} referenced by chk-2" in caplog.text


# ---------------------------------------------------------------------- jobs

def test_no_orphaned_shared_files_after_many_checkpoints_with_retention(tmp_path, local_dirs):
    p, sink = wordcount(tmp_path, 30_000, "aligned", rate=15_000, interval=0.05)
    p.with_checkpoint(state_backend="rocksdb", retained=2)
    result = p.run(engine="threads", timeout=60)
    assert collections.Counter(sink.results()) == expected_rows(30_000)
    assert len(result.checkpoints) >= 6  # retention (2) deleted several, with their files
    st = CheckpointStorage(p.checkpoint.storage, p.name)
    kept = st.completed()
    assert len(kept) == 2
    wanted = set().union(*(st.open(n).shared for n in kept))
    assert wanted and shared_on_disk(st) == wanted  # exactly: nothing orphaned, nothing lost
    # every retained checkpoint restores on its own: each state reads back completely
    for n in kept:
        handle = st.open(n)
        handle.verify(deep=True)
        counts = {}
        for state in read_states(handle).values():
            for blob in state.ops.values():
                for _, (_name, word), v in read_entries(blob):
                    counts[word] = v
        if n == kept[-1]:  # the final checkpoint: every word fully counted
            assert counts == collections.Counter(w for w, _ in expected_rows(30_000))
    assert os.listdir(local_dirs) == []  # tasks removed their RocksDB directories


def test_checkpoints_upload_in_the_background_while_records_flow(tmp_path, monkeypatch):
    """The ack waits for the upload; processing does not: an upload that only returns once
    more records went through the keyed operator must not deadlock the job."""
    progress = collections.Counter()
    seen_during_upload = []
    real = CheckpointStorage.upload_shared
    real_process = RocksDBStateBackend.after_batch

    def counting(self):
        progress[self.name] += 1
        return real_process(self)

    def slow_upload(self, owner, checkpoint_id, local_path):
        before = progress[owner]
        deadline = time.monotonic() + 1  # the final checkpoint's upload: no more records
        while progress[owner] <= before + 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        seen_during_upload.append(progress[owner] - before)
        return real(self, owner, checkpoint_id, local_path)

    monkeypatch.setattr(RocksDBStateBackend, "after_batch", counting)
    monkeypatch.setattr(CheckpointStorage, "upload_shared", slow_upload)
    p, sink = wordcount(tmp_path, 16_000, "aligned", rate=10_000, interval=0.3)
    p.with_checkpoint(state_backend="rocksdb")
    result = p.run(engine="threads", timeout=60)
    assert collections.Counter(sink.results()) == expected_rows(16_000)
    periodic = [c for c in result.checkpoints if not c.final]
    assert periodic, "no periodic checkpoint completed"
    assert any(n > 2 for n in seen_during_upload), seen_during_upload  # records flowed
    assert threading.active_count() < 50


@pytest.mark.parametrize("first, second", [("rocksdb", "rocksdb"), ("memory", "rocksdb"),
                                           ("rocksdb", "memory")])
def test_a_cancelled_job_resumes_exactly_on_either_backend(tmp_path, first, second):
    """Run 1 is cancelled mid-way; run 2 resumes from its latest checkpoint (switching the
    state backend is allowed: each restores the other's snapshots)."""
    p, sink = wordcount(tmp_path, 12_000, "aligned", rate=6_000, interval=0.2)
    p.with_checkpoint(state_backend=first)
    with pytest.raises(JobCancelled):
        p.run(engine="threads", timeout=1.2)
    st = CheckpointStorage(p.checkpoint.storage, p.name)
    assert st.completed(), "no checkpoint before the cancel"
    p2, sink2 = wordcount(tmp_path, 12_000, "aligned", rate=None, interval=0.2)
    p2.with_checkpoint(state_backend=second)
    p2.run(engine="threads", timeout=60)
    assert collections.Counter(sink2.results()) == expected_rows(12_000)


def test_sink_results_are_independent_of_backend(tmp_path):
    outs = {}
    for backend in ("memory", "rocksdb"):
        p, sink = wordcount(tmp_path / backend, 5_000, "unaligned", rate=20_000, interval=0.1)
        p.with_checkpoint(state_backend=backend)
        p.run(engine="threads", timeout=60)
        outs[backend] = collections.Counter(CollectSink(sink.path).results())
    assert outs["rocksdb"] == outs["memory"] == expected_rows(5_000)
