"""State TTL (:mod:`cutline.state.ttl`) for value, list and map state on both backends:
expired entries are never returned, reads delete them, the incremental cleanup deletes the
ones nobody reads, and a restore keeps every entry's expiry."""

import datetime

import pytest

from cutline.logical import make_node
from cutline.runtime.operators import UserFunctionError
from cutline.runtime.registry import build_operator
from cutline.state.ttl import Expiring, StateTtl

MAXP = 8
BACKENDS = ["memory", "rocksdb"]


# every test here: state backends' working directories under its tmp_path (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("local_dirs")


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def op(fn, backend, clock, subtask=0, parallelism=1):
    node = make_node(0, "p", "process", fn=fn, key_fn=lambda r: r[0])
    o = build_operator(node, subtask, parallelism, MAXP, state_backend=backend)
    o.clock = clock
    return o


def stored(o, name):
    return {k: v for _, n, k, v in o.state.entries() if n == name}


def value_fn(ttl):
    def fn(ctx, r):
        s = ctx.value_state("v", "none", ttl=ttl)
        if r[1] == "read":
            return [(ctx.key, s.value)]
        s.update(r[1])
        return ()
    return fn


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_value_expires_after_its_last_write(backend):
    clock = Clock()
    o = op(value_fn(10), backend, clock)
    o.process([("a", 1), ("b", 2)])
    clock.now += 6
    assert o.process([("a", "read")]) == [("a", 1)]  # a read does not extend it
    o.process([("b", 3)])  # a write does
    clock.now += 4
    assert o.process([("a", "read"), ("b", "read")]) == [("a", "none"), ("b", 3)]
    o.state.spill()
    assert "a" not in stored(o, "v")  # the read deleted it
    clock.now += 6
    assert o.process([("b", "read")]) == [("b", "none")]
    o.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_on_read_and_write_extends_on_read(backend):
    clock = Clock()
    o = op(value_fn(StateTtl(datetime.timedelta(seconds=10), update="on_read_and_write")),
           backend, clock)
    o.process([("a", 1)])
    for _ in range(5):
        clock.now += 9
        assert o.process([("a", "read")]) == [("a", 1)]
    clock.now += 10
    assert o.process([("a", "read")]) == [("a", "none")]
    o.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_list_elements_and_map_entries_expire_one_by_one(backend):
    clock = Clock()

    def fn(ctx, r):
        items = ctx.list_state("items", ttl=10)
        seen = ctx.map_state("seen", ttl=10)
        if r[1] is not None:
            items.append(r[1])
            seen[r[1]] = clock.now
        return [(ctx.key, list(items), dict(seen), len(items), len(seen), "x" in seen)]

    o = op(fn, backend, clock)
    o.process([("a", "x"), ("a", "y")])
    clock.now += 5
    o.process([("a", "z")])
    clock.now += 5  # x and y expire now
    assert o.process([("a", None)]) == [("a", ["z"], {"z": 1005.0}, 1, 1, False)]
    clock.now += 5
    assert o.process([("a", None)]) == [("a", [], {}, 0, 0, False)]
    o.close()


def test_list_and_map_views_behave_like_list_and_dict():
    clock = Clock()
    got = []

    def fn(ctx, r):
        items = ctx.list_state("items", ttl=10)
        items.extend([3, 1, 2])
        items[0] = 4
        items.insert(1, 9)
        del items[2]
        got.append((items[:2], items == [4, 9, 2], items.pop(), len(items)))
        m = ctx.map_state("m", ttl=10)
        m.update({"a": 1, "b": 2})
        m.setdefault("c", 3)
        del m["a"]
        got.append((sorted(m.items()), m.get("a", 0), m.pop("b"), dict(m)))
        return ()

    op(fn, "memory", clock).process([("k", 0)])
    assert got == [([4, 9], True, 2, 2), ([("b", 2), ("c", 3)], 0, 2, {"c": 3})]


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_incremental_cleanup_deletes_what_nobody_reads(backend):
    clock = Clock()

    def fn(ctx, r):
        if r[1] == "write":
            ctx.value_state("v", ttl=StateTtl(10, cleanup_per_batch=50)).update(1)
            ctx.list_state("l", ttl=StateTtl(10, cleanup_per_batch=50)).append(1)
            ctx.map_state("m", ttl=StateTtl(10, cleanup_per_batch=50))["x"] = 1
        else:  # touches other keys' states only through the cleanup
            ctx.value_state("v", ttl=StateTtl(10, cleanup_per_batch=50))
            ctx.list_state("l", ttl=StateTtl(10, cleanup_per_batch=50))
            ctx.map_state("m", ttl=StateTtl(10, cleanup_per_batch=50))
        return ()

    o = op(fn, backend, clock)
    o.process([(i, "write") for i in range(300)])
    o.state.spill()
    assert len(stored(o, "v")) == len(stored(o, "l:l")) == len(stored(o, "m:m")) == 300
    clock.now += 5
    o.process([("other", "touch")] * 10)  # a pass over everything: nothing expired yet
    o.state.spill()
    assert len(stored(o, "v")) == 300
    clock.now += 10
    for _ in range(30):
        o.process([("other", "touch")])
    o.state.spill()
    assert stored(o, "v") == {}
    assert set(stored(o, "l:l")) <= {"other"} and set(stored(o, "m:m")) <= {"other"}
    o.close()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("into", BACKENDS)
def test_a_restore_keeps_each_entrys_expiry(backend, into, storage):
    clock = Clock()
    o = op(value_fn(10), backend, clock)
    o.process([(i, i) for i in range(20)])
    clock.now += 5
    o.process([(i, -i) for i in range(10)])  # rewritten: expire 5 s later
    snap = o.snapshot()
    blob = snap if isinstance(snap, bytes) else snap.finish(storage, 1)
    o.close()
    new = [op(value_fn(10), into, clock, j, 2) for j in range(2)]
    for n in new:
        n.restore([blob])
    clock.now += 7
    out = sorted(r for n in new
                 for r in n.process([(i, "read") for i in range(20)
                                     if _owns(n, i)]))
    assert out == sorted([(i, -i) for i in range(10)] + [(i, "none") for i in range(10, 20)])
    for n in new:
        n.close()


def _owns(o, key):
    try:
        o.state.owned_group(key)
        return True
    except RuntimeError:
        return False


def test_settings_are_checked():
    with pytest.raises(ValueError, match="state ttl must be a positive"):
        StateTtl(0)
    with pytest.raises(ValueError, match="state ttl must be a positive"):
        StateTtl("1h")
    with pytest.raises(ValueError, match="StateTtl.update must be one of"):
        StateTtl(1, update="on_read")
    with pytest.raises(ValueError, match="cleanup_per_batch"):
        StateTtl(1, cleanup_per_batch=-1)
    assert StateTtl(datetime.timedelta(minutes=1)).ttl == 60.0

    def fn(ctx, r):
        ctx.value_state("v", ttl=10)
        ctx.value_state("v", ttl=20)

    with pytest.raises(UserFunctionError, match=r"value state 'v' is used with ttl="):
        op(fn, "memory", Clock()).process([("a", 1)])


def test_stored_values_carry_their_expiry():
    clock = Clock()
    o = op(value_fn(10), "memory", clock)
    o.process([("a", 1)])
    assert stored(o, "v") == {"a": Expiring(1, 1010.0)}


def remember(ctx, r):
    last = ctx.value_state("last", ttl=3600)
    seen = ctx.list_state("seen", ttl=3600)
    before = last.value
    last.update(r)
    seen.append(r)
    return [(r, before, len(seen))]


def test_ttl_state_in_a_job_and_in_its_checkpoint(tmp_path):
    import collections

    from cutline import CheckpointConfig, Pipeline
    from cutline.connectors import CollectSink, GeneratorSource
    from cutline.state.reader import keyed_rows
    from cutline.storage.checkpoints import CheckpointStorage, open_checkpoint

    cfg = CheckpointConfig(interval=0.2, storage=f"file://{tmp_path}/checkpoints",
                           state_backend="rocksdb")
    p = Pipeline("ttl", parallelism=2, checkpoint=cfg)
    sink = CollectSink(str(tmp_path / "out"))
    (p.source(GeneratorSource(count=2000), uid="n").key_by(lambda i: i % 10)
       .process(remember, uid="remember").sink(sink, uid="out"))
    p.run(engine="threads", timeout=60)
    want = collections.Counter((i, i - 10 if i >= 10 else None, i // 10 + 1)
                               for i in range(2000))
    assert collections.Counter(sink.results()) == want
    latest = CheckpointStorage(p.checkpoint.storage, p.name).latest()
    rows = sorted(keyed_rows(open_checkpoint(latest.path), "remember"), key=lambda r: r["key"])
    assert [(r["key"], r["last"], r["seen"][-2:]) for r in rows] == [
        (k, 1990 + k, [1980 + k, 1990 + k]) for k in range(10)]
