"""The RocksDB state backend against the in-memory one: same state, same results.

Backends are driven directly and through the keyed operators (count, reduce, process with
value / list / map state); snapshots go through a real ``CheckpointStorage`` on a temporary
directory, so restore reads what a job would read.
"""

import os
import pickle
import shutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cutline import CheckpointConfig
from cutline.logical import make_node
from cutline.state.keygroups import key_group, key_group_range
from cutline.runtime.process import KeyedContext
from cutline.runtime.registry import build_operator
from cutline.state import create_backend
from cutline.state.keys import decode_key, decode_slot, encode_key, encode_slot
from cutline.state.memory import MemoryStateBackend
from cutline.state.rocksdb import RocksDBStateBackend, is_rocksdb_snapshot
from cutline.storage.checkpoints import CorruptCheckpointError

MAXP = 16


# every test here: state backends' working directories under its tmp_path (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("local_dirs")


def rocks(groups=range(MAXP), **kw) -> RocksDBStateBackend:
    return RocksDBStateBackend(groups, MAXP, name=kw.pop("name", "op.0"), **kw)


def blob_of(backend, storage, n):
    snap = backend.snapshot()
    return snap if isinstance(snap, bytes) else snap.finish(storage, n)


def contents(backend) -> dict:
    """{(name, key): value} of a backend (normalised keys: 1.0 -> 1)."""
    return {(name, key): v for _, name, key, v in backend.entries()}


# ---------------------------------------------------------------------- keys

@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
                    | st.text() | st.binary(), lambda inner: st.tuples(inner, inner), max_leaves=6))
def test_key_encoding_round_trips_and_equal_keys_encode_equally(key):
    assert decode_key(encode_key(key)) == key
    if isinstance(key, (bool, float)) and float(key).is_integer():
        assert encode_key(key) == encode_key(int(key))
    g = key_group(key, MAXP)
    assert decode_slot(encode_slot(g, "s", key)) == (g, "s", key)
    assert encode_slot(g, "s", key)[:2] == g.to_bytes(2, "big")  # key group first


def test_state_backend_is_validated_with_a_clear_error():
    assert CheckpointConfig().state_backend == "memory"
    assert CheckpointConfig(state_backend="rocksdb").state_backend == "rocksdb"
    with pytest.raises(ValueError, match=r"CheckpointConfig.state_backend must be 'memory' or "
                                         r"'rocksdb', got 'leveldb'"):
        CheckpointConfig(state_backend="leveldb")
    with pytest.raises(ValueError, match="state backend must be one of memory, rocksdb"):
        create_backend("nope", range(4), 4)


# ---------------------------------------------------------------------- the backend

def test_value_state_get_put_delete_and_snapshot_restore(storage):
    b = rocks(cache_entries=8, dirty_entries=4)  # tiny caches: spills and evictions
    for i in range(200):
        b.put("v", i, i * 2)
    b.delete("v", 5)
    b.put("v", (1, "a"), {"x": [1]})
    assert b.get("v", 3) == 6 and b.get("v", 5, "gone") == "gone"
    assert b.get("v", 1.0) == 2 and b.get("v", True) == 2  # equal keys are one key
    blob = blob_of(b, storage, 1)
    assert is_rocksdb_snapshot(blob) and len(blob) < 4096  # a manifest, not the data
    b.put("v", 3, "later")  # after the snapshot: not in it
    r = rocks(name="op.1")
    r.restore([blob])
    assert r.get("v", 3) == 6 and r.get("v", 5) is None and r.get("v", (1, "a")) == {"x": [1]}
    assert r.keys() == 200
    for x in (b, r):
        x.close()


def test_close_removes_the_working_directory_and_stale_ones_are_reclaimed(tmp_path):
    root = str(tmp_path / "work")
    a = rocks(directory=root)
    b = rocks(directory=root, name="op.1")
    assert sorted(os.listdir(root)) == sorted(os.path.basename(x.directory) for x in (a, b))
    a.close()
    assert os.listdir(root) == [os.path.basename(b.directory)]
    # a kill -9 leaves a directory behind whose lock nobody holds
    stale = os.path.join(root, "op.2-dead")
    shutil.copytree(b.directory, stale, ignore=shutil.ignore_patterns("LOCK"))
    c = rocks(directory=root, name="op.3")
    assert not os.path.exists(stale) and os.path.exists(b.directory)  # b's lock is held
    b.close()
    c.close()
    assert os.listdir(root) == []


def test_operators_use_spark_local_dirs_and_clean_up(local_dirs):
    op = build_operator(make_node(0, "cnt", "count", key_fn=lambda r: r), 0, 1, MAXP,
                        state_backend="rocksdb")
    assert op.process(["a", "b", "a"]) == [("a", 1), ("b", 1), ("a", 2)]
    assert len(os.listdir(local_dirs)) == 1
    op.close()
    assert os.listdir(local_dirs) == []


def test_key_group_selective_restore_from_several_snapshots(storage):
    """Rescaling: 2 subtasks -> 1 -> 3, each restoring only its key groups from all."""
    keys = list(range(300)) + [f"k{i}" for i in range(300)]
    old = [rocks(key_group_range(i, 2, MAXP), name=f"op.{i}") for i in range(2)]
    mem_old = [MemoryStateBackend(key_group_range(i, 2, MAXP), MAXP) for i in range(2)]
    for k in keys:
        i = 0 if key_group(k, MAXP) in old[0].key_groups else 1
        for b in (old[i], mem_old[i]):
            b.put("v", k, repr(k))
    blobs = [blob_of(b, storage, 1) for b in old]
    one = rocks(name="one.0")
    one.restore(blobs)
    assert contents(one) == {("v", k): repr(k) for k in keys}
    # 1 -> 3 and 2 -> 3 at once, from rocksdb and from memory snapshots
    blob1 = blob_of(one, storage, 2)
    mem_blobs = [b.snapshot() for b in mem_old]
    for j in range(3):
        groups = key_group_range(j, 3, MAXP)
        want = {("v", k): repr(k) for k in keys if key_group(k, MAXP) in groups}
        for source in ([blob1], blobs, mem_blobs):
            r = rocks(groups, name=f"three.{j}")
            r.restore(source)
            assert contents(r) == want
            assert all(g in groups for g, *_ in r.entries())
            r.close()
        m = MemoryStateBackend(groups, MAXP)
        m.restore(blobs)  # the memory backend reads RocksDB snapshots too
        assert contents(m) == want
    for b in old + [one]:
        b.close()


def test_restore_names_a_missing_or_corrupt_shared_file(storage, tmp_path):
    b = rocks()
    for i in range(100):
        b.put("v", i, i)
    snap = b.snapshot()
    blob = snap.finish(storage, 1)
    [rel] = snap.shared
    path = tmp_path / "chk" / "job" / rel
    data = path.read_bytes()
    path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(CorruptCheckpointError, match=f"checksum mismatch in shared file {rel}"):
        rocks(name="r.0").restore([blob])
    path.unlink()
    with pytest.raises(CorruptCheckpointError, match=f"missing shared file {rel}"):
        rocks(name="r.1").restore([blob])
    b.close()


def test_incremental_snapshots_upload_only_new_files(storage):
    b = rocks()
    for i in range(20_000):
        b.put("v", i, "x" * 20)
    s1 = b.snapshot()
    s1.finish(storage, 1)
    for i in range(100):
        b.put("v", i, "y")
    s2 = b.snapshot()
    s2.finish(storage, 2)
    assert s1.uploaded == s1.size > 0
    assert 0 < s2.uploaded < 0.1 * s2.size  # only the new file
    assert set(s1.shared) < set(s2.shared)  # the old files are shared
    full = rocks(name="full.0", incremental=False)
    for i in range(20_000):
        full.put("v", i, "x")
    full.snapshot().finish(storage, 1)
    f2 = full.snapshot()
    f2.finish(storage, 2)
    assert f2.uploaded == f2.size  # a full checkpoint uploads everything again
    b.close()
    full.close()


def test_an_unfinished_snapshot_leaves_no_local_files():
    b = rocks()
    b.put("v", 1, 1)
    snap = b.snapshot()
    path = snap.path
    assert os.path.isdir(path)
    del snap  # an aborted checkpoint: the task drops it
    assert not os.path.exists(path)
    b.close()


# ---------------------------------------------------------------------- operators

def value_list_map(ctx, record):
    """A process function touching every kind of state; outputs what it read."""
    _, op, arg = record
    total = ctx.value_state("total", 0)
    items = ctx.list_state("items")
    seen = ctx.map_state("seen")
    if op == "add":
        total.update(total.value + arg)
        items.append(arg)
        seen[arg % 3] = seen.get(arg % 3, 0) + 1
    elif op == "clear":
        total.clear()
        items.clear()
        seen.pop(arg % 3, None)
    return [(ctx.key, total.value, list(items), dict(sorted(seen.items())))]


def _op(kind, backend, groups=range(MAXP), **cache):
    fn = {"count": None, "reduce": lambda a, b: a + b, "process": value_list_map}[kind]
    key_fn = (lambda r: r) if kind == "count" else (lambda r: r[0])
    p = len(groups) and MAXP // len(groups)
    sub = groups.start // len(groups)
    op = build_operator(make_node(0, kind, kind, fn=fn, key_fn=key_fn), sub, p, MAXP,
                        state_backend=backend)
    if backend == "rocksdb" and cache:  # tiny caches: every path (spill, evict, load) runs
        op.state.close()
        op.state = rocks(groups, name=f"{kind}.{sub}", **cache)
        if kind == "process":
            op.ctx = KeyedContext(op.state)
    return op


KEYS = st.one_of(st.integers(-3, 6), st.sampled_from(["a", "b", "ä", ""]),
                 st.sampled_from([1.0, True, (1, "a"), None]))
RECORDS = {
    "count": KEYS,
    "reduce": st.tuples(KEYS, st.integers(-5, 5)),
    "process": st.tuples(KEYS, st.sampled_from(["add", "add", "read", "clear"]),
                         st.integers(0, 9)),
}


@pytest.mark.parametrize("kind", ["count", "reduce", "process"])
@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_same_results_as_the_memory_backend(kind, data, storage):
    """Random batches, with snapshot + restore (sometimes rescaled 1 -> 2 -> 1) between:
    every output and the final state are the same on both backends."""
    n = [0]
    ops = {b: [_op(kind, b, cache_entries=3, dirty_entries=2)] for b in ("memory", "rocksdb")}
    try:
        for _ in range(data.draw(st.integers(1, 4), label="rounds")):
            batch = data.draw(st.lists(RECORDS[kind], max_size=30), label="batch")
            outs = {}
            for b, subs in ops.items():
                key_fn = subs[0].node.key_fn
                outs[b] = [o for r in batch for s in subs
                           if key_group(key_fn(r), MAXP) in s.state.key_groups
                           for o in s.process([r])]
            assert outs["rocksdb"] == outs["memory"]
            parallelism = data.draw(st.sampled_from([1, 2]), label="restore at")
            n[0] += 1
            for b, subs in ops.items():
                blobs = [blob_of(s.state, storage, n[0]) for s in subs]
                for s in subs:
                    s.close()
                fresh = [_op(kind, b, key_group_range(i, parallelism, MAXP),
                             cache_entries=3, dirty_entries=2) for i in range(parallelism)]
                for s in fresh:
                    s.restore(blobs)
                ops[b] = fresh
        got = {b: {slot: v for s in subs for slot, v in contents(s.state).items()}
               for b, subs in ops.items()}
        assert got["rocksdb"] == got["memory"]
    finally:
        for subs in ops.values():
            for s in subs:
                s.close()


def test_process_state_survives_spills_and_restores_exactly(storage):
    """Lists and maps changed in place after being handed out reach the snapshot."""
    op = _op("process", "rocksdb", cache_entries=2, dirty_entries=1)
    recs = [(k, "add", i) for i in range(30) for k in ("x", "y", "z")]
    out = op.process(recs)
    assert out[-1] == ("z", sum(range(30)), list(range(30)), {0: 10, 1: 10, 2: 10})
    blob = blob_of(op.state, storage, 1)
    op.close()
    again = _op("process", "memory")
    again.restore([blob])
    assert again.process([("x", "read", 0)]) == [
        ("x", sum(range(30)), list(range(30)), {0: 10, 1: 10, 2: 10})]


def test_memory_snapshot_format_is_unchanged():
    m = MemoryStateBackend(range(MAXP), MAXP)
    m.put("v", "a", 1)
    assert pickle.loads(m.snapshot()) == {key_group("a", MAXP): {("v", "a"): 1}}
