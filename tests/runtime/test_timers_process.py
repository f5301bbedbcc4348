"""Timers in the keyed ``process`` operator, driven directly (no tasks): ``ctx.timers``,
``on_timer``, ``ctx.timestamp`` / ``ctx.watermark``, and a snapshot + restore (also
rescaled, also into the other backend) in the middle gives the output of a run without one.
"""

import math

import pytest

from cutline.logical import make_node
from cutline.runtime.operators import UserFunctionError
from cutline.runtime.registry import build_operator

MAXP = 8


# every test here: state backends' working directories under its tmp_path (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("local_dirs")


def ts(r):
    return r[1]


def silence(ctx, r):
    """An alert when a key has seen nothing for 10 s of event time (one pending timer per
    key: the previous one is deleted)."""
    last = ctx.value_state("last")
    if last.value is not None:
        ctx.timers.delete_event_time(last.value + 10)
    t = max(ctx.timestamp, last.value if last.value is not None else -math.inf)
    last.update(t)
    ctx.timers.register_event_time(t + 10)
    n = ctx.value_state("n", 0)
    n.update(n.value + 1)
    return ()


def alert(ctx, key, when):
    assert ctx.time_domain == "event_time" and ctx.timestamp == when
    return [("silent", key, when, ctx.value_state("n").value, ctx.watermark)]


def op(fn=silence, on_timer=alert, backend="memory", subtask=0, parallelism=1, timed=True):
    node = make_node(0, "p", "process", fn=fn, key_fn=lambda r: r[0], on_timer=on_timer)
    if timed:
        node.timestamp_fn, node.timestamps_from = ts, "ts"
    return build_operator(node, subtask, parallelism, MAXP, state_backend=backend)


def snapshot(o, storage, n):
    s = o.snapshot()
    return s if isinstance(s, bytes) else s.finish(storage, n)


STEPS = [
    ("batch", [("a", 1), ("b", 2), ("c", 3)]),
    ("wm", 5),
    ("batch", [("a", 8), ("b", 4)]),
    ("wm", 13),  # b's timer (14)? no: b last 4 -> 14; c: 13 fires
    ("batch", [("d", 20), ("b", 21)]),
    ("wm", 18),  # a: 18 fires
    ("batch", [("a", 30), ("e", 29)]),
    ("wm", 35),  # b: 31, d: 30 fire
    ("wm", math.inf),
]


def run(steps, ops_at, restore_at=None, storage=None, into=("memory", 1)):
    """Run ``steps`` on the operators ``ops_at`` (one per subtask); at ``restore_at``
    snapshot them all and continue on new ones (``into``: backend, parallelism)."""
    ops, out = ops_at, []
    for i, (kind, arg) in enumerate(steps):
        if i == restore_at:
            blobs = [snapshot(o, storage, i) for o in ops]
            backend, p = into
            new = [op(backend=backend, subtask=j, parallelism=p) for j in range(p)]
            for o in new:
                o.restore(blobs)
            for o in ops:
                o.close()
            ops = new
        if kind == "batch":
            for o in ops:
                mine = []
                for r in arg:
                    try:
                        o.state.owned_group(r[0])
                        mine.append(r)
                    except RuntimeError:
                        pass
                out += o.process(mine) if mine else []
        else:
            for o in ops:
                out += o.on_watermark(arg)
    for o in ops:
        o.close()
    return sorted(out, key=repr)


def test_event_time_timers_fire_when_the_watermark_passes():
    out = run(STEPS, [op()])
    assert out == sorted([("silent", "c", 13, 1, 13), ("silent", "a", 18, 2, 18),
                          ("silent", "b", 31, 3, 35), ("silent", "d", 30, 1, 35),
                          ("silent", "a", 40, 3, math.inf), ("silent", "e", 39, 1, math.inf)],
                         key=repr)


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
@pytest.mark.parametrize("at", range(1, len(STEPS)))
@pytest.mark.parametrize("into", [("memory", 1), ("rocksdb", 2), ("memory", 3)])
def test_a_restore_anywhere_gives_the_same_output(backend, at, into, storage):
    want = run(STEPS, [op()])
    got = run(STEPS, [op(backend=backend)], restore_at=at, storage=storage, into=into)
    assert got == want


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
def test_the_watermark_is_restored_with_the_state(backend, storage):
    o = op(backend=backend)
    o.process([("a", 1)])
    o.on_watermark(7)
    blob = snapshot(o, storage, 1)
    o.close()
    for p in (1, 2):
        new = [op(backend=backend, subtask=j, parallelism=p) for j in range(p)]
        for n in new:
            n.restore([blob])
            assert n.watermark == 7 and n.ctx.watermark == 7
            assert n.on_watermark(6) == []  # never back
            n.close()


def test_timers_registered_in_on_timer_at_or_before_the_watermark_fire_in_the_same_advance():
    def chain(ctx, key, when):
        if when < 5:
            ctx.timers.register_event_time(when + 1)
            ctx.timers.register_event_time(when + 1)  # once
        return [(key, when)]

    o = op(fn=lambda ctx, r: ctx.timers.register_event_time(r[1]), on_timer=chain)
    o.process([("a", 1), ("b", 3)])
    assert o.on_watermark(4) == [("a", 1), ("a", 2), ("a", 3), ("b", 3), ("a", 4), ("b", 4)]
    assert o.on_watermark(10) == [("a", 5), ("b", 5)]
    assert o.timer_count() == 0


def test_processing_time_timers_fire_from_the_clock():
    now = [100.0]

    def fn(ctx, r):
        assert ctx.timers.current_processing_time() == now[0]
        ctx.timers.register_processing_time(now[0] + r[1])
        return ()

    def on_timer(ctx, key, when):
        assert ctx.time_domain == "processing_time"
        return [(key, when)]

    o = op(fn=fn, on_timer=on_timer)
    o.clock = lambda: now[0]
    o.process([("a", 5), ("b", 2), ("a", 5)])
    assert o.next_processing_time() == 102
    assert o.on_processing_time(101) == []
    assert o.on_processing_time(103) == [("b", 102)]
    o.ctx.key = "a"
    o.ctx.timers.delete_processing_time(105)
    assert o.next_processing_time() == math.inf
    assert o.on_watermark(1000) == []  # event time does not fire processing-time timers


def test_mistakes_are_named():
    o = op(on_timer=None)
    with pytest.raises(UserFunctionError, match="need a callback.*on_timer="):
        o.process([("a", 1)])
    o = op(timed=False)
    with pytest.raises(UserFunctionError, match="ctx.timestamp .*assign_timestamps"):
        o.process([("a", 1)])
    o = op(fn=lambda ctx, r: ctx.timers.register_event_time(1), timed=False)
    with pytest.raises(UserFunctionError, match="event-time timers .*assign_timestamps"):
        o.process([("a", 1)])
    o = op(fn=lambda ctx, r: ctx.timers.register_event_time("soon"))
    with pytest.raises(UserFunctionError, match="timer's time: a timestamp must be a number"):
        o.process([("a", 1)])
    o = op(fn=lambda ctx, r: ctx.timers.register_event_time(1),
           on_timer=lambda ctx, key, when: 1 / 0)
    o.process([("a", 1)])
    with pytest.raises(UserFunctionError, match=r"<event-time timer at 1 of key 'a'>.*"
                                                r"ZeroDivisionError"):
        o.on_watermark(2)
    o = op(fn=lambda ctx, r: ctx.value_state("__timers.event").value)
    with pytest.raises(UserFunctionError, match="reserved"):
        o.process([("a", 1)])


def test_on_timer_must_be_a_function():
    from cutline import Pipeline
    from cutline.connectors import GeneratorSource

    s = Pipeline("p").source(GeneratorSource(count=1)).key_by(lambda r: r)
    with pytest.raises(TypeError, match=r"process\(on_timer=...\) needs a function"):
        s.process(lambda ctx, r: (), on_timer=3)


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
def test_on_timer_deleting_a_timer_due_in_the_same_advance_stops_it(backend):
    def on_timer(ctx, key, when):
        if when == 1:
            ctx.timers.delete_event_time(2)
        return [(key, when)]

    def fn(ctx, r):
        for w in (1, 2, 3):
            ctx.timers.register_event_time(w)

    o = op(fn=fn, on_timer=on_timer, backend=backend)
    o.process([("a", 0)])
    assert o.on_watermark(5) == [("a", 1), ("a", 3)]
    o.close()
