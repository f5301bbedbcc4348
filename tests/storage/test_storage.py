"""Checkpoint storage on a temporary directory: layout, commit point, verification, retention."""

import logging
import os
import uuid

import msgpack
import pytest

from cutline.storage.checkpoints import (
    CheckpointNotFoundError, CheckpointStorage, CheckpointStorageError, CorruptCheckpointError,
)


def checkpoint(st, n, states=None, *, savepoint=False, meta=None):
    states = states or {"src-0": b"offset=%d" % n, "map-0": b"sum=%d" % (n * 10)}
    acks = {t: st.write_task_state(n, t, data, savepoint=savepoint) for t, data in states.items()}
    return st.commit(n, meta or {"sources": {"src-0": n}}, savepoint=savepoint, states=acks)


def test_write_commit_latest_open(tmp_path):
    st = CheckpointStorage(str(tmp_path), "job")
    info = st.write_task_state(1, "map-0", b"abc")
    assert info["size"] == 3 and info["path"].endswith("/job/chk-1/map-0.state")
    assert len(info["sha256"]) == 64
    assert st.completed() == [] and st.latest() is None  # written, not committed
    ack_stats = {**info, "bytes": 3, "chain": "map"}  # what a task acknowledges: extra keys ok
    path = st.commit(1, {"k": [1, 2], "b": b"\x00"}, states={"map-0": ack_stats})
    assert path == f"file://{tmp_path}/job/chk-1"
    assert sorted(os.listdir(tmp_path / "job" / "chk-1")) == ["_metadata", "map-0.state"]
    assert st.completed() == [1]
    h = st.latest()
    assert (h.id, h.is_savepoint, h.tasks, h.path) == (1, False, ["map-0"], path)
    assert h.metadata == {"k": [1, 2], "b": b"\x00"}
    assert h.read_task_state("map-0") == b"abc"
    with pytest.raises(KeyError, match="task 'nope' has no state in chk-1"):
        h.read_task_state("nope")
    for ref in (1, "chk-1", path, str(tmp_path / "job" / "chk-1")):
        assert st.open(ref).read_task_state("map-0") == b"abc"
    assert st.next_id() == 2


def test_file_url_and_metadata_is_msgpack_not_pickle(tmp_path):
    st = CheckpointStorage(f"file://{tmp_path}/nested/root", "j")
    checkpoint(st, 3)
    raw = (tmp_path / "nested/root/j/chk-3/_metadata").read_bytes()
    env = msgpack.unpackb(raw)
    assert env["format"] == "cutline-checkpoint" and env["version"] == 1
    body = msgpack.unpackb(env["body"])
    assert body["states"]["src-0"] == {"file": "src-0.state", "size": 8,
                                       "sha256": body["states"]["src-0"]["sha256"]}
    assert not [p for p in os.listdir(tmp_path / "nested/root/j/chk-3") if p.endswith(".tmp")]


def test_commit_without_states_hashes_the_directory(tmp_path):
    st = CheckpointStorage(str(tmp_path), "job")
    st.write_task_state(1, "a", b"1")
    st.write_task_state(1, "b", b"22")
    st.commit(1, {})
    h = st.open(1)
    assert h.tasks == ["a", "b"] and h.read_task_state("b") == b"22"


def test_commit_checks_acknowledged_files_and_refuses_to_recommit(tmp_path):
    st = CheckpointStorage(str(tmp_path), "job")
    info = st.write_task_state(1, "a", b"123")
    with pytest.raises(CheckpointStorageError, match="missing state file b.state"):
        st.commit(1, {}, states={"a": info, "b": info})
    with pytest.raises(CheckpointStorageError, match="a.state has 3 bytes, acknowledged 9"):
        st.commit(1, {}, states={"a": {**info, "size": 9}})
    st.commit(1, {}, states={"a": info})
    with pytest.raises(CheckpointStorageError, match="chk-1 of job 'job' is already committed"):
        st.commit(1, {}, states={"a": info})
    with pytest.raises(CheckpointStorageError, match="is committed; refusing to change it"):
        st.write_task_state(1, "a", b"other")
    st.write_task_state(2, "a", b"")
    with pytest.raises(TypeError, match="checkpoint metadata must be msgpack-serialisable"):
        st.commit(2, {"x": object()})
    assert st.completed() == [1]


def test_partial_checkpoint_is_ignored(tmp_path):
    st = CheckpointStorage(str(tmp_path), "job")
    checkpoint(st, 1)
    st.write_task_state(2, "src-0", b"half")  # crashed before _metadata
    assert st.completed() == [1] and st.latest().id == 1
    with pytest.raises(CheckpointNotFoundError, match=r"chk-2 \(partial: no _metadata\)"):
        st.open(2)
    with pytest.raises(CheckpointNotFoundError, match=r"chk-9 \(no such directory\)"):
        st.open(9)
    assert st.next_id() == 3


def test_corrupt_state_file_falls_back_with_a_warning(tmp_path, caplog):
    st = CheckpointStorage(str(tmp_path), "job")
    checkpoint(st, 6)
    checkpoint(st, 7)
    (tmp_path / "job/chk-7/map-0.state").write_bytes(b"sum=71")  # same size, other bytes
    with caplog.at_level(logging.WARNING, logger="cutline.storage.checkpoints"):
        h = st.latest()
    assert h.id == 6
    assert "checksum mismatch in chk-7/map-0.state" in caplog.text
    assert st.completed() == [6, 7]  # _metadata is fine; the state is not
    assert st.latest(deep=False).id == 7  # size-only verification cannot see it
    with pytest.raises(CorruptCheckpointError, match="checksum mismatch in chk-7/map-0.state"):
        st.open(7).read_task_state("map-0")
    (tmp_path / "job/chk-7/map-0.state").write_bytes(b"short")
    with pytest.raises(CorruptCheckpointError, match="size mismatch in chk-7/map-0.state"):
        st.open(7).read_task_state("map-0")
    (tmp_path / "job/chk-7/map-0.state").unlink()
    with pytest.raises(CorruptCheckpointError, match="missing state file chk-7/map-0.state"):
        st.open(7).read_task_state("map-0")
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert st.latest(deep=False).id == 6
    assert "missing state file chk-7/map-0.state" in caplog.text


@pytest.mark.parametrize("damage, message", [
    (lambda raw: raw[:-5] + b"xxxxx", "checksum mismatch in chk-2/_metadata"),
    (lambda raw: b"\xc1garbage", "unreadable chk-2/_metadata"),
    (lambda raw: msgpack.packb({"format": "other"}), "not a cutline checkpoint"),
    (lambda raw: b"", "unreadable chk-2/_metadata"),
])
def test_corrupt_metadata_detected_and_latest_falls_back(tmp_path, caplog, damage, message):
    st = CheckpointStorage(str(tmp_path), "job")
    checkpoint(st, 1)
    checkpoint(st, 2)
    meta = tmp_path / "job/chk-2/_metadata"
    meta.write_bytes(damage(meta.read_bytes()))
    with pytest.raises(CorruptCheckpointError, match=message):
        st.open(2)
    with caplog.at_level(logging.WARNING):
        assert st.latest().id == 1
    assert message in caplog.text and "chk-2" in caplog.text
    assert st.completed() == [1]


def test_retention_keeps_exactly_n_and_never_savepoints(tmp_path):
    st = CheckpointStorage(str(tmp_path), "job")
    for n in range(1, 6):
        checkpoint(st, n)
    sp = checkpoint(st, 6, savepoint=True)
    st.write_task_state(7, "src-0", b"in progress")  # partial newer than the newest: kept
    os.makedirs(tmp_path / "job/chk-0")  # partial older than the newest completed: dropped
    assert st.retain(2) == [0, 1, 2, 3]
    assert st.completed() == [4, 5]
    assert sorted(os.listdir(tmp_path / "job")) == sorted(
        ["chk-4", "chk-5", "chk-7", os.path.basename(sp)])
    assert st.retain(2) == []
    assert st.retain(1) == [4] and st.completed() == [5]
    h = st.open(sp)
    assert h.is_savepoint and h.id == 6 and h.read_task_state("src-0") == b"offset=6"
    assert st.open(os.path.basename(sp)).id == 6
    assert st.next_id() == 8
    with pytest.raises(ValueError, match="keeps at least one"):
        st.retain(0)


def test_savepoint_layout_and_reuse(tmp_path):
    st = CheckpointStorage(str(tmp_path), "job")
    path = checkpoint(st, 4, savepoint=True)
    name = os.path.basename(path)
    assert name.startswith("savepoint-4-") and len(name) == len("savepoint-4-") + 8
    assert st.completed() == [] and st.latest() is None  # savepoints are not checkpoints
    # another process (a task) computes the same directory without being told
    assert CheckpointStorage(str(tmp_path), "job").write_task_state(
        5, "a", b"", savepoint=True)["path"].startswith(f"file://{tmp_path}/job/savepoint-5-")
    # a new job may start from it
    other = CheckpointStorage(str(tmp_path), "other-job")
    assert other.open(path).job == "job"


def test_a_savepoint_commit_promotes_the_states_tasks_wrote_under_chk(tmp_path):
    """Tasks write a savepoint's states under chk-<id> (a barrier does not say it is a
    savepoint's): committing it as a savepoint moves them into its own directory."""
    st = CheckpointStorage(str(tmp_path), "job")
    acks = {t: st.write_task_state(3, t, b"state of " + t.encode()) for t in ("a.0", "b.0")}
    with open(tmp_path / "job" / "chk-3" / ".a.0.state.x.tmp", "wb"):
        pass  # a leftover temporary file goes with the directory
    path = st.commit(3, {"m": 1}, savepoint=True, states=acks)
    assert os.path.basename(path).startswith("savepoint-3-")
    assert sorted(os.listdir(tmp_path / "job")) == [os.path.basename(path)]  # chk-3 gone
    h = st.open(path)
    assert h.is_savepoint and h.read_task_state("b.0") == b"state of b.0"
    h.verify(deep=True)
    assert st.completed() == [] and st.next_id() == 4
    st.retain(1)
    assert st.open(path).is_savepoint, "retention never deletes savepoints"
    # a committed checkpoint is never turned into a savepoint
    checkpoint(st, 5)
    with pytest.raises(CheckpointStorageError, match="chk-5 is a committed checkpoint"):
        st.commit(5, {}, savepoint=True)
    assert st.open(5).read_task_state("src-0") == b"offset=5"


def test_bad_url_scheme_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"'nosuch://bucket/x'.*scheme 'nosuch'"):
        CheckpointStorage("nosuch://bucket/x", "job")


def test_root_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "afile").write_text("hi")
    with pytest.raises(CheckpointStorageError, match=r"root .*afile.* is a file, not a directory"):
        CheckpointStorage(str(tmp_path / "afile"), "job")
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "job").write_text("hi")
    with pytest.raises(CheckpointStorageError, match="job directory .* is a file"):
        CheckpointStorage(str(tmp_path / "root"), "job")


def test_unwritable_root_is_refused(tmp_path, monkeypatch):
    from fsspec.implementations.local import LocalFileSystem

    def refuse(self, path, value, **kwargs):
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(LocalFileSystem, "pipe_file", refuse)
    with pytest.raises(CheckpointStorageError, match=r"URL '.*' is not writable \(PermissionError"):
        CheckpointStorage(str(tmp_path), "job")


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores permissions")
def test_read_only_directory_is_refused(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(CheckpointStorageError, match=r"'.*ro' is not writable"):
            CheckpointStorage(str(ro), "job")
    finally:
        ro.chmod(0o700)


@pytest.mark.parametrize("job", ["", "a/b", "..", "x\\y"])
def test_bad_job_names(tmp_path, job):
    with pytest.raises(ValueError, match="job must be a non-empty name"):
        CheckpointStorage(str(tmp_path), job)


def test_scheme_without_its_package_or_backend_is_named():
    import importlib.util

    if importlib.util.find_spec("s3fs") is None:
        with pytest.raises(ImportError, match="'s3://bucket/x' needs an extra package"):
            CheckpointStorage("s3://bucket/x", "job")


def test_memory_filesystem_goes_through_fsspec():
    st = CheckpointStorage(f"memory://cutline-{uuid.uuid4().hex}", "job")
    checkpoint(st, 1)
    checkpoint(st, 2)
    assert st.latest().id == 2 and st.latest().path.startswith("memory://")
    assert st.retain(1) == [1] and st.completed() == [2]


def test_coordinator_complete_feeds_commit(tmp_path):
    """The runtime contract: tasks ack with their write_task_state result as stats, and the
    driver commits Complete.stats_by_task as ``states`` (no state file is read back)."""
    from cutline.protocol.coordinator import CheckpointCoordinator, CheckpointPolicy, Complete

    st = CheckpointStorage(str(tmp_path), "job")
    coord = CheckpointCoordinator(CheckpointPolicy(1.0), ["a", "b"],
                                  first_id=st.next_id(), started_at=0.0)
    [trigger] = coord.tick(1.0)
    cmds = []
    for task in ("a", "b"):
        info = st.write_task_state(trigger.checkpoint_id, task, task.encode() * 3)
        cmds += coord.on_ack(task, trigger.checkpoint_id, 1.5, {**info, "bytes": 3})
    [done] = [c for c in cmds if isinstance(c, Complete)]
    st.commit(done.checkpoint_id, {"attempt": 0}, states=done.stats_by_task)
    assert st.latest().read_task_state("b") == b"bbb" and st.next_id() == 2
