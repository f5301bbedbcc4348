"""The keyed-state interface (``cutline.state.backend``) on both backends, against a dict.

Random sequences of table operations (writes into ``fast``, reads through ``read``,
deletes, writes after deletes, list state changed in place, spills, snapshot + restore)
with tiny bounds, so every path behind ``fast`` runs: each backend must read back what a
plain dict holds.
"""

import pickle

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cutline.state import KeyedStateBackend, StateTable, ValueState, create_backend
from cutline.state.keygroups import key_group, key_group_range
from cutline.state.memory import MemoryStateBackend
from cutline.state.rocksdb import RocksDBStateBackend

MAXP = 16


# every test here: state backends' working directories under its tmp_path (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("local_dirs")


def backend(kind, groups=range(MAXP), name="op.0") -> KeyedStateBackend:
    if kind == "memory":
        return MemoryStateBackend(groups, MAXP, dirty_entries=2)
    return RocksDBStateBackend(groups, MAXP, name=name, cache_entries=3, dirty_entries=2)


def blob_of(b, storage, n):
    snap = b.snapshot()
    return snap if isinstance(snap, bytes) else snap.finish(storage, n)


KEYS = st.sampled_from([0, 1, 2, "a", "b", (1, "x"), None, 7.5])
NAMES = st.sampled_from(["v", "w", "l:items"])
OPS = st.one_of(
    st.tuples(st.just("put"), st.sampled_from(["v", "w"]), KEYS, st.integers(0, 9)),
    st.tuples(st.just("delete"), NAMES, KEYS),
    st.tuples(st.just("get"), NAMES, KEYS),
    st.tuples(st.just("append"), KEYS, st.integers(0, 9)),
    st.tuples(st.just("after_batch")),
    st.tuples(st.just("spill")),
    st.tuples(st.just("restore")),
)


@pytest.mark.parametrize("kind", ["memory", "rocksdb"])
@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(OPS, max_size=40))
def test_tables_read_back_what_a_dict_holds(kind, ops, storage):
    model: dict[tuple[str, object], object] = {}
    b = backend(kind)
    n = 0
    try:
        for op in ops:
            what = op[0]
            if what == "put":
                _, name, key, value = op
                b.table(name).fast[key] = value  # what operators do
                model[(name, key)] = value
            elif what == "delete":
                _, name, key = op
                b.table(name).delete(key)
                model.pop((name, key), None)
            elif what == "get":
                _, name, key = op
                assert b.table(name).get(key, "absent") == model.get((name, key), "absent")
            elif what == "append":  # list state: handed out, changed in place
                _, key, value = op
                b.table("l:items").mutable(key, list).append(value)
                model[("l:items", key)] = model.get(("l:items", key), []) + [value]
            elif what == "after_batch":
                b.after_batch()
                assert b.pending() <= 2
            elif what == "spill":
                b.spill()
                assert b.pending() == 0
            else:
                n += 1
                blob = blob_of(b, storage, n)
                b.close()
                b = backend(kind, name=f"op.{n}")
                b.restore([blob])
        assert {(name, key): v for _, name, key, v in b.entries()} == model
        assert b.keys() == len(model)
    finally:
        b.close()


@pytest.mark.parametrize("kind", ["memory", "rocksdb"])
def test_a_table_is_one_object_and_fast_keeps_its_identity(kind):
    """Operators hold ``table.fast`` for a batch: spills and restores empty it in place."""
    b = backend(kind)
    try:
        t = b.table("count")
        assert isinstance(t, StateTable) and b.table("count") is t
        fast = t.fast
        for k in range(10):
            fast[k] = k
        b.after_batch()
        assert t.fast is fast and not fast  # spilled past the bound
        assert t.read(3) == 3 and t.get(3) == 3 and t.read(99, "none") == "none"
        b.restore([])
        assert t.fast is fast
    finally:
        b.close()


@pytest.mark.parametrize("kind", ["memory", "rocksdb"])
def test_value_state_over_a_table(kind):
    b = backend(kind)
    try:
        t = b.table("total")
        v = ValueState(t, "k", 0)
        assert v.value == 0
        v.update(5)
        b.spill()
        assert ValueState(t, "k", 0).value == 5
        v.clear()
        assert ValueState(t, "k", 0).value == 0
        b.spill()
        assert ValueState(t, "k", -1).value == -1 and b.keys() == 0
    finally:
        b.close()


@pytest.mark.parametrize("kind", ["memory", "rocksdb"])
def test_a_key_another_subtask_owns_is_refused(kind):
    groups = key_group_range(0, 2, MAXP)
    foreign = next(k for k in range(100) if key_group(k, MAXP) not in groups)
    b = create_backend(kind, groups, MAXP, name="op.0")
    try:
        with pytest.raises(RuntimeError, match=r"key \d+ \(key group \d+\) is not owned"):
            b.table("v").read(foreign)
        b.table("v").fast[foreign] = 1  # a write without a read: refused at the spill
        with pytest.raises(RuntimeError, match="is not owned by this subtask"):
            b.spill()
    finally:
        b.close()


def test_memory_snapshot_holds_what_fast_held():
    """The snapshot format is the key-group dicts; the snapshot merges ``fast`` first."""
    m = MemoryStateBackend(range(MAXP), MAXP)
    m.table("count").fast["a"] = 3
    m.delete("count", "b")
    assert pickle.loads(m.snapshot()) == {key_group("a", MAXP): {("count", "a"): 3}}
