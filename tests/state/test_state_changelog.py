"""Incremental snapshots of the in-memory backend (cutline.state.changelog): a chain of a
full snapshot and deltas in shared storage, restored exactly, rescaled, continued after a
restore, materialised when the deltas outgrow the state, kept by retention."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cutline.state import create_backend
from cutline.state.backend import MISSING
from cutline.state.changelog import CHAIN_MAX, is_changelog_snapshot, manifest
from cutline.state.keygroups import key_group_range
from cutline.state.memory import MemoryStateBackend
from cutline.state.reader import keyed_entries
from cutline.state.rocksdb import RocksDBStateBackend
from cutline.storage.checkpoints import CheckpointStorage, CorruptCheckpointError

MAXP = 16
pytestmark = pytest.mark.usefixtures("local_dirs")


def mem(storage, groups=range(MAXP), **kw) -> MemoryStateBackend:
    return MemoryStateBackend(groups, MAXP, name=kw.pop("name", "op.0"), storage=storage, **kw)


def contents(backend) -> dict:
    return {(g, name, key): v for g, name, key, v in backend.entries()}


def commit(storage, n, snaps, blob_sizes=None) -> None:
    """Commit checkpoint ``n`` whose one task holds the finished snapshots ``snaps``."""
    shared = {rel: ref for s in snaps for rel, ref in s.shared.items()}
    info = storage.write_task_state(n, "t0", b"state")
    storage.commit(n, {}, states={"t0": {**info, "shared": shared}})


def test_snapshots_are_deltas_on_a_full_one_and_restore_exactly(storage):
    b = mem(storage)
    for i in range(1000):
        b.put("v", i, i)
    s1 = b.snapshot()
    blob1 = s1.finish(storage, 1)
    assert is_changelog_snapshot(blob1) and len(manifest(blob1)["files"]) == 1
    for i in range(990, 1010):  # 10 updated, 10 new, 2 deleted
        b.put("v", i, -i)
    b.delete("v", 3)
    b.delete("v", 4)
    s2 = b.snapshot()
    blob2 = s2.finish(storage, 2)
    files = manifest(blob2)["files"]
    assert len(files) == 2 and files[0] == manifest(blob1)["files"][0]
    assert s2.uploaded < s1.uploaded / 20  # the delta holds 22 entries, not 1,008
    want = contents(b)
    r = mem(storage, name="r.0")
    r.restore([blob2])
    assert contents(r) == want and r.get("v", 3) is None and r.get("v", 1005) == -1005
    old = mem(storage, name="r.1")
    old.restore([blob1])
    assert old.get("v", 1005) is None and old.get("v", 3) == 3
    # the state reader and a RocksDB backend (a job switching backends) read it too
    assert {(g, n, k): v for g, n, k, v in keyed_entries(blob2)} == want
    rocks = RocksDBStateBackend(range(MAXP), MAXP, name="x.0", storage=storage)
    rocks.restore([blob2])
    assert contents(rocks) == want
    rocks.close()


def test_a_restored_backend_continues_the_chain_and_a_rescaled_one_starts_anew(storage):
    b = mem(storage)
    for i in range(500):
        b.put("v", i, i)
    blob = b.snapshot().finish(storage, 1)
    r = mem(storage, name="op.0")
    r.restore([blob])
    r.put("v", 7, "seven")
    nxt = r.snapshot().finish(storage, 2)
    assert manifest(nxt)["files"][:1] == manifest(blob)["files"] and \
        len(manifest(nxt)["files"]) == 2
    halves = [mem(storage, key_group_range(i, 2, MAXP), name=f"op.{i}") for i in range(2)]
    got: dict = {}
    for h in halves:
        h.restore([nxt])
        got.update(contents(h))
        assert len(manifest(h.snapshot().finish(storage, 3))["files"]) == 1  # full
    r2 = mem(storage, name="z.0")
    r2.restore([nxt])
    assert got == contents(r2) and r2.get("v", 7) == "seven"


def test_a_growing_state_writes_each_entry_once(storage):
    """A state that only grows: each checkpoint writes what it added (the run's checkpoint
    cost is linear in the state, not quadratic); the chain wastes nothing to restore."""
    b = mem(storage)
    lengths, uploaded = [], []
    for n in range(1, 41):
        for i in range(n * 100, n * 100 + 100):
            b.put("v", i, "x" * 50)
        s = b.snapshot()
        lengths.append(len(manifest(s.finish(storage, n))["files"]))
        uploaded.append(s.uploaded)
    assert lengths == list(range(1, 41))
    assert max(uploaded) < 2 * min(uploaded)  # every delta: 100 entries


def test_a_state_rewritten_whole_materialises_when_the_deltas_hold_as_much_as_it(storage):
    """Deltas that rewrite the same entries: a full snapshot as soon as the deltas hold as
    many entries as the state (a restore reads at most about twice the state), or when one
    delta would hold half of it."""
    b = mem(storage)
    lengths = []
    for n in range(1, 8):
        for i in range(400 * n, 400 * n + 400):  # 40% of the 1,000 keys each time
            b.put("v", i % 1000, n)
        lengths.append(len(manifest(b.snapshot().finish(storage, n))["files"]))
    assert lengths == [1, 2, 3, 1, 2, 3, 1]
    for i in range(600):  # more than half the state changed: full
        b.put("v", i, -1)
    assert len(manifest(b.snapshot().finish(storage, 8))["files"]) == 1
    b.put("v", 1, -2)  # a small change: a delta again
    assert len(manifest(b.snapshot().finish(storage, 9))["files"]) == 2


def test_a_chain_is_at_most_chain_max_files(storage):
    b = mem(storage)
    for i in range(100_000):
        b.put("v", i, i)
    longest = 0
    for n in range(1, CHAIN_MAX + 5):
        b.put("v", n, -n)
        longest = max(longest, len(manifest(b.snapshot().finish(storage, n))["files"]))
    assert longest == CHAIN_MAX


def test_an_aborted_snapshots_changes_reach_the_next_one(storage):
    """A checkpoint dropped before its upload (aborted, declined elsewhere) leaves its delta
    to the next: no change is lost; an upload that fails is retried by the next one."""
    b = mem(storage)
    b.put("v", 1, "a")
    b.snapshot().finish(storage, 1)
    b.put("v", 2, "b")
    b.snapshot()  # checkpoint 2: never finished
    b.put("v", 3, "c")
    s3 = b.snapshot()

    class Failing:
        job_url = storage.job_url

        def upload_shared_bytes(self, *a, **k):
            raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        s3.finish(Failing(), 3)
    b.put("v", 4, "d")
    blob = b.snapshot().finish(storage, 4)
    assert len(manifest(blob)["files"]) == 4
    r = mem(storage, name="r.0")
    r.restore([blob])
    assert contents(r) == contents(b)
    assert len(manifest(s3.finish(storage, 3))["files"]) == 3  # its upload was done by 4's


def test_timers_group_values_and_ttl_cleanup_are_in_the_deltas(storage):
    b = mem(storage)
    q = b.timers("timer")
    for i in range(200):
        b.put("v", i, i)
        q.register(i, float(i))
    b.put_group_value("window-watermark", 5)
    blob1 = b.snapshot().finish(storage, 1)
    q.register(1000, 1000.0)
    q.delete(10, 10.0)
    assert [k for _, _, k in q.pop_due_ordered(4.0)] == [0, 1, 2, 3, 4]
    b.put_group_value("window-watermark", 9)
    b.clean_step("v", lambda v: v if v % 2 else MISSING, 10_000)  # drop the even values
    blob2 = b.snapshot().finish(storage, 2)
    assert len(manifest(blob2)["files"]) == 2 and manifest(blob1)["files"][0] in \
        manifest(blob2)["files"]
    r = mem(storage, name="r.0")
    r.restore([blob2])
    assert contents(r) == contents(b)
    assert r.group_values("window-watermark") == [9] * MAXP
    rq = r.timers("timer")
    assert [k for _, _, k in rq.pop_due_ordered(12.0)] == [5, 6, 7, 8, 9, 11, 12]


def test_retention_keeps_the_files_a_retained_checkpoint_needs(storage):
    b = mem(storage)
    for i in range(2000):
        b.put("v", i, i)
    blobs = {}
    for n in range(1, 8):
        b.put("v", n, -n)
        s = b.snapshot()
        blobs[n] = s.finish(storage, n)
        commit(storage, n, [s])
        storage.retain(1)
    assert storage.completed() == [7]
    live = set(storage.shared_references())
    assert live == {f[0] for f in manifest(blobs[7])["files"]}
    assert set(storage._shared_files()) == live  # the deltas of 1-6 alone: gone
    r = mem(storage, name="r.0")
    r.restore([blobs[7]])
    assert contents(r) == contents(b)


def test_restore_names_a_missing_or_corrupt_file_of_the_chain(storage, tmp_path):
    b = mem(storage)
    for i in range(100):
        b.put("v", i, i)
    b.snapshot().finish(storage, 1)
    b.put("v", 1, "x")
    s = b.snapshot()
    blob = s.finish(storage, 2)
    rel = manifest(blob)["files"][1][0]
    path = tmp_path / "chk" / "job" / rel
    data = path.read_bytes()
    path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(CorruptCheckpointError, match=f"checksum mismatch in shared file {rel}"):
        mem(storage, name="r.0").restore([blob])
    path.unlink()
    with pytest.raises(CorruptCheckpointError, match=f"missing shared file {rel}"):
        mem(storage, name="r.1").restore([blob])


def test_without_storage_a_snapshot_is_the_pickled_key_groups():
    b = create_backend("memory", range(MAXP), MAXP)
    b.put("v", "a", 1)
    snap = b.snapshot()
    assert isinstance(snap, bytes) and pickle.loads(snap)
    r = create_backend("memory", range(MAXP), MAXP)
    r.restore([snap])
    assert r.get("v", "a") == 1


OPS = st.lists(st.one_of(
    st.tuples(st.just("put"), st.integers(0, 40), st.integers()),
    st.tuples(st.just("delete"), st.integers(0, 40), st.none()),
    st.tuples(st.just("append"), st.integers(0, 40), st.integers()),
    st.tuples(st.just("timer"), st.integers(0, 40), st.integers(0, 50)),
    st.tuples(st.just("fire"), st.none(), st.integers(0, 50)),
    st.tuples(st.just("mark"), st.none(), st.integers()),
    st.tuples(st.just("spill"), st.none(), st.none()),
    st.tuples(st.just("snapshot"), st.none(), st.sampled_from(["finish", "drop", "fail"])),
), max_size=120)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS, dirty=st.integers(1, 50))
def test_every_finished_snapshot_restores_exactly_what_it_saw(tmp_path_factory, ops, dirty):
    """Random writes, deletes, in-place lists, timers, per-group values and spills, with
    snapshots finished, dropped or failing: every finished snapshot restores exactly the
    state at its moment, whole and rescaled to two subtasks."""
    storage = CheckpointStorage(str(tmp_path_factory.mktemp("chk")), "job")
    b = mem(storage, dirty_entries=dirty)
    q = b.timers("timer")
    pending, n = [], 0
    for op, key, arg in ops + [("snapshot", None, "finish")]:
        if op == "put":
            b.put("v", key, arg)
        elif op == "delete":
            b.delete("v", key)
        elif op == "append":
            b.table("l").mutable(key, list).append(arg)
        elif op == "timer":
            q.register(key, float(arg))
        elif op == "fire":
            q.pop_due_ordered(float(arg))
        elif op == "mark":
            b.put_group_value("mark", arg)
        elif op == "spill":
            b.spill()
        else:
            n += 1
            want = {k: pickle.loads(pickle.dumps(v)) for k, v in contents(b).items()}
            snap = b.snapshot()
            pending.append((n, snap, want))
            if arg == "fail":
                class Failing:
                    job_url = storage.job_url

                    def upload_shared_bytes(self, *a, **k):
                        raise OSError("unreachable")

                try:  # (nothing to upload when nothing changed: no failure)
                    snap.finish(Failing(), n)
                except OSError:
                    pass
            elif arg == "finish":
                for k, s, w in pending:
                    if s is snap:
                        blob = s.finish(storage, k)
                        r = mem(storage, name="r.0")
                        r.restore([blob])
                        assert contents(r) == w
                        halves: dict = {}
                        for i in range(2):
                            h = mem(storage, key_group_range(i, 2, MAXP), name=f"h.{i}")
                            h.restore([blob])
                            halves.update(contents(h))
                        assert halves == w
                pending = [(k, s, w) for k, s, w in pending if s is not snap]


def test_a_change_to_a_key_equal_to_another_type_reaches_the_delta(storage):
    """5 and numpy's int64(5) are one dict key but hash to different key groups here: the
    delta takes the key group the entry was written in, not the key's own hash."""
    np = pytest.importorskip("numpy")
    b = MemoryStateBackend(range(128), 128, name="op.0", storage=storage)
    for i in range(100):
        b.put("v", i, "old")
    b.snapshot().finish(storage, 1)
    assert b.get("v", 5) == "old"  # read: the table remembers where key 5 lives
    b.put("v", np.int64(5), "new")
    blob = b.snapshot().finish(storage, 2)
    assert len(manifest(blob)["files"]) == 2
    r = MemoryStateBackend(range(128), 128, name="r.0", storage=storage)
    r.restore([blob])
    assert r.get("v", 5) == "new" and contents(r) == contents(b)


def test_an_unchanged_state_adds_nothing_to_its_chain(storage):
    """Checkpoints of an idle operator reference the same files (no empty delta each time,
    no full rewrite every 64); an unchanged per-group value is no change."""
    b = mem(storage)
    for i in range(1000):
        b.put("v", i, i)
    b.put_group_value("mark", 1.0)
    first = b.snapshot()
    blob1 = first.finish(storage, 1)
    for n in range(2, CHAIN_MAX + 10):
        b.put_group_value("mark", 1.0)
        s = b.snapshot()
        assert s.finish(storage, n) == blob1 and s.uploaded == 0
    b.put_group_value("mark", 2.0)
    assert len(manifest(b.snapshot().finish(storage, 99))["files"]) == 2


def test_a_log_that_outgrows_half_the_state_is_dropped(storage):
    """Rare checkpoints and a state rewritten again and again: the log is dropped (and
    logging stops) once the next snapshot must be full anyway; that snapshot is exact."""
    b = mem(storage, dirty_entries=100)
    for i in range(1000):
        b.put("v", i, i)
    b.snapshot().finish(storage, 1)
    for i in range(5000):
        b.put("v", 5000 + i, i)
        b.delete("v", 5000 + i)
        b.after_batch()  # as an operator does: spills past dirty_entries
    assert not b._logging and not b._log_keys  # dropped: 5,000 keys logged, 1,000 held
    for i in range(5000, 5300):
        b.put("v", i, i)
        b.after_batch()
    assert not b._log_keys  # not logging until the next snapshot
    blob = b.snapshot().finish(storage, 2)
    assert len(manifest(blob)["files"]) == 1
    r = mem(storage, name="r.0")
    r.restore([blob])
    assert contents(r) == contents(b)
