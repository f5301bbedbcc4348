"""The timer service (:mod:`cutline.state.timers`) on both state backends, against a model.

Random sequences of register / delete / advance, with snapshot + restore between (same
parallelism, rescaled, and into the other backend): every advance pops exactly the model's
due timers, in (time, key) order per subtask, and a restore preserves exactly the pending
timers (none lost, none doubled).
"""

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cutline.state import timers as timers_mod
from cutline.state.keygroups import key_group_range
from cutline.state.keys import encode_key
from cutline.state.memory import MemoryStateBackend
from cutline.state.rocksdb import RocksDBStateBackend
from cutline.state.timers import EVENT_TIMERS, PROCESSING_TIMERS, time_key

MAXP = 16


# every test here: state backends' working directories under its tmp_path (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("local_dirs")


def backend(kind, subtask=0, parallelism=1, name="op"):
    groups = key_group_range(subtask, parallelism, MAXP)
    if kind == "memory":
        return MemoryStateBackend(groups, MAXP)
    return RocksDBStateBackend(groups, MAXP, name=f"{name}.{subtask}")


def blob_of(b, storage, n):
    snap = b.snapshot()
    return snap if isinstance(snap, bytes) else snap.finish(storage, n)


# ---------------------------------------------------------------------- encoding

NUMBERS = st.one_of(st.integers(-2**53, 2**53), st.floats(allow_nan=False))


@given(NUMBERS, NUMBERS)
def test_time_keys_sort_as_the_times_do(a, b):
    ka, kb = time_key(a), time_key(b)
    assert (ka < kb) == (a < b)
    assert (ka == kb) == (a == b)


def test_equal_times_are_one_timer():
    assert time_key(1) == time_key(1.0) and time_key(-0.0) == time_key(0)
    assert time_key(-math.inf) < time_key(-1e308) < time_key(0) < time_key(math.inf)


# ---------------------------------------------------------------------- against a model

KEYS = st.one_of(st.integers(-3, 8), st.sampled_from(["a", "b", "ä", "", (1, "x")]))
WHENS = st.one_of(st.integers(-5, 30), st.sampled_from([2.5, 7.0, 1e9, math.inf]))
OPS = st.lists(st.one_of(
    st.tuples(st.just("register"), KEYS, WHENS),
    st.tuples(st.just("register"), KEYS, WHENS),
    st.tuples(st.just("delete"), KEYS, WHENS),
    st.tuples(st.just("advance"), WHENS),
    st.tuples(st.just("restore"), st.sampled_from([1, 2, 3]),
              st.sampled_from(["memory", "rocksdb"]))), max_size=60)


def order(when, key):
    return time_key(when) + encode_key(key)


class Subtasks:
    """Timer queues of one operator at some parallelism; each key goes to its owner."""

    def __init__(self, kinds, parallelism, storage):
        self.storage, self.n = storage, 0
        self.subtasks = [backend(kinds, i, parallelism, name=f"op{id(self)}")
                         for i in range(parallelism)]

    def owner(self, key):
        for b in self.subtasks:
            try:
                b.owned_group(key)
                return b
            except RuntimeError:
                continue
        raise AssertionError(key)

    def register(self, key, when, name=EVENT_TIMERS):
        self.owner(key).timers(name).register(key, when)

    def delete(self, key, when, name=EVENT_TIMERS):
        self.owner(key).timers(name).delete(key, when)

    def advance(self, t, name=EVENT_TIMERS):
        fired = []
        for b in self.subtasks:
            q, mine = b.timers(name), []
            while batch := q.pop_due(t):
                mine.extend(batch)
            keys = [order(w, k) for w, k in mine]
            assert keys == sorted(keys), "a subtask fired out of order"
            fired.extend(mine)
        return fired

    def pending(self, name=EVENT_TIMERS):
        return sum(b.timers(name).count() for b in self.subtasks)

    def restore(self, parallelism, kind):
        self.n += 1
        blobs = [blob_of(b, self.storage, self.n) for b in self.subtasks]
        new = []
        for i in range(parallelism):
            b = backend(kind, i, parallelism, name=f"op{id(self)}-{self.n}")
            b.timers(EVENT_TIMERS)  # a queue made before the restore is rebuilt by it
            b.restore(blobs)
            new.append(b)
        self.close()
        self.subtasks = new

    def close(self):
        for b in self.subtasks:
            b.close()


@pytest.mark.parametrize("kind, batch", [("memory", 1000), ("rocksdb", 1000), ("rocksdb", 2)])
@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS)
def test_timers_match_a_model_through_restores_and_rescaling(kind, batch, ops, storage,
                                                             monkeypatch):
    """``batch=2``: RocksDB pops at most 2 timers per key group per scan, so the order is
    kept across several scans of several groups."""
    monkeypatch.setattr(timers_mod, "_BATCH", batch)
    model: dict = {}
    s = Subtasks(kind, 1, storage)
    try:
        for op in ops:
            if op[0] == "register":
                _, k, w = op
                s.register(k, w)
                model[order(w, k)] = (w, k)
            elif op[0] == "delete":
                _, k, w = op
                s.delete(k, w)
                model.pop(order(w, k), None)
            elif op[0] == "advance":
                t = op[1]
                due = sorted(o for o, (w, _) in model.items() if w <= t)
                fired = s.advance(t)
                assert sorted(order(w, k) for w, k in fired) == due
                for o in due:
                    del model[o]
            else:
                s.restore(op[1], op[2])
            assert s.pending() == len(model)
        assert sorted(order(w, k) for w, k in s.advance(math.inf)) == sorted(model)
        assert s.pending() == 0
    finally:
        s.close()


@pytest.mark.parametrize("kind", ["memory", "rocksdb"])
def test_time_domains_are_separate_and_the_next_time_is_known(kind, storage):
    s = Subtasks(kind, 1, storage)
    try:
        q = s.subtasks[0].timers(PROCESSING_TIMERS)
        assert q.next_time() == math.inf
        s.register("a", 5, PROCESSING_TIMERS)
        s.register("a", 3)
        assert q.next_time() <= 5
        assert s.advance(10) == [(3, "a")]
        assert s.advance(4, PROCESSING_TIMERS) == []
        s.restore(2, kind)
        q = s.owner("a").timers(PROCESSING_TIMERS)
        assert q.next_time() == 5
        assert s.advance(5, PROCESSING_TIMERS) == [(5, "a")]
        assert q.next_time() == math.inf
    finally:
        s.close()


@pytest.mark.parametrize("kind", ["memory", "rocksdb"])
def test_many_timers_fire_in_order_and_registering_twice_is_once(kind, storage):
    s = Subtasks(kind, 2, storage)
    try:
        for i in range(3000):
            s.register(f"k{i % 97}", i % 501)
            s.register(f"k{i % 97}", i % 501)
        n = len({(f"k{i % 97}", i % 501) for i in range(3000)})
        assert s.pending() == n
        fired = s.advance(250)
        assert all(w <= 250 for w, _ in fired)
        s.restore(3, "rocksdb" if kind == "memory" else "memory")
        fired += s.advance(math.inf)
        assert len(fired) == n and len(set(fired)) == n
    finally:
        s.close()


def test_deleted_timers_do_not_pile_up_in_memory():
    b = backend("memory")
    q = b.timers(EVENT_TIMERS)
    for i in range(10_000):
        q.register("k", i)
        q.delete("k", i)
    assert q.count() == 0 and len(q._heap) < 2_100
    assert q.pop_due(math.inf) == []


@pytest.mark.parametrize("batch", [1, 2, 3, 1000])
def test_rocksdb_pops_in_order_across_groups_when_a_scan_is_bounded(batch, storage,
                                                                    monkeypatch):
    monkeypatch.setattr(timers_mod, "_BATCH", batch)
    s = Subtasks("rocksdb", 1, storage)
    try:
        keys = [f"k{i}" for i in range(6)]  # several key groups, interleaved times
        for j, k in enumerate(keys):
            for w in range(j, 40, 3):
                s.register(k, w)
        s.delete("k0", 3)
        fired = s.advance(30)
        want = sorted((order(w, k), (w, k)) for j, k in enumerate(keys)
                      for w in range(j, 31, 3) if (k, w) != ("k0", 3))
        assert fired == [v for _, v in want]
    finally:
        s.close()
