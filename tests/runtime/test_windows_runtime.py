"""Windows end to end on the threads engine: the API, results and late output against the
exact expected multisets, restores (rescaled too), and refused restores."""

import collections

import pytest

from cutline import CheckpointConfig, Pipeline, WindowResult, session, sliding, tumbling
from cutline.connectors import CollectSink, GeneratorSource
from cutline.plan import plan
from cutline.runtime.restore import IncompatibleCheckpointError
from cutline.spark.launcher import JobCancelled
from cutline.storage.checkpoints import CheckpointStorage

from windows_pipelines import event, expected, key_of, late_rows, ts_of, windowed

N = 30_000


# ---------------------------------------------------------------------- the API


def _stamped(tmp_path, **kw):
    p = Pipeline("api", parallelism=2,
                 checkpoint=CheckpointConfig(storage=f"file://{tmp_path}/chk"))
    return p, p.source(GeneratorSource(count=10, fn=event), uid="events")


def test_a_window_needs_event_time_upstream(tmp_path):
    p, s = _stamped(tmp_path)
    with pytest.raises(ValueError, match=r"window\(\) needs event time: call "
                                         r"\.assign_timestamps"):
        s.key_by(key_of).window(tumbling(10))
    with pytest.raises(ValueError, match="needs event time"):
        s.key_by(key_of).window(tumbling(10), timestamp=ts_of)  # nothing makes watermarks


def test_a_window_after_a_union_of_assigners_needs_timestamp(tmp_path):
    p, s = _stamped(tmp_path)
    a = s.assign_timestamps(ts_of, max_delay=5)
    b = p.source(GeneratorSource(count=10, fn=event)).assign_timestamps(lambda e: e["i"])
    u = a.union(b).key_by(key_of)
    with pytest.raises(ValueError, match=r"different assign_timestamps .* timestamp=ts_fn"):
        u.window(tumbling(10))
    u.window(tumbling(10), timestamp=ts_of).count()


def test_window_arguments_are_checked_up_front(tmp_path):
    p, s = _stamped(tmp_path)
    k = s.assign_timestamps(ts_of).key_by(key_of)
    with pytest.raises(TypeError, match=r"tumbling\(size\), sliding\(size, slide\) or session"):
        k.window(10)
    with pytest.raises(ValueError, match=r"window\(allowed_lateness=...\) must be >= 0"):
        k.window(tumbling(10), allowed_lateness=-1)
    with pytest.raises(ValueError, match="NaN"):
        k.window(tumbling(10), allowed_lateness=float("nan"))
    with pytest.raises(TypeError, match="window"):
        k.window(tumbling(10), timestamp="ts")
    with pytest.raises(ValueError, match=r"aggregate\(\) needs merge="):
        k.window(session(5)).aggregate(list, lambda a, r: a + [r])
    k.window(session(5)).aggregate(list, lambda a, r: a + [r], lambda a, b: a + b)
    with pytest.raises(TypeError, match="field name"):
        k.window(tumbling(10)).sum(3)
    with pytest.raises(TypeError, match="apply"):
        k.window(tumbling(10)).apply(None)
    with pytest.raises(ValueError, match=r"sliding\(slide=...\)"):
        sliding(10, 20)


def test_plan_chains_the_results_and_splits_late_output(tmp_path):
    p, _, _ = windowed(tmp_path, 10)
    text = plan(p).describe()
    assert "window[counts] -> " not in text  # two consumers: results and late records
    assert "window_results" in text and "window_late[late]" in text
    q = Pipeline("q", parallelism=2, checkpoint=CheckpointConfig(storage=f"file://{tmp_path}/c"))
    (q.source(GeneratorSource(count=10, fn=event)).assign_timestamps(ts_of).key_by(key_of)
      .window(tumbling(10)).count(uid="w").sink(CollectSink(str(tmp_path / "o"))))
    assert "window[w] -> window_results" in plan(q).describe()  # chained: one task


# ---------------------------------------------------------------------- jobs


@pytest.mark.parametrize("kind", ["tumbling", "sliding", "session"])
def test_windows_on_threads_equal_the_expected_output(tmp_path, kind):
    p, out, late = windowed(tmp_path, N, kind)
    result = p.run(engine="threads", timeout=120)
    assert result.attempts == 1
    want, want_late = expected(N, kind)
    got = collections.Counter(out.results())
    assert got == want
    assert late_rows(late) == want_late
    if kind != "session":
        windows = {(r.key, r.start) for r in want}
        assert len(want_late) > 50 and sum(want.values()) > len(windows) + 500  # re-emits
    assert all(type(r) is WindowResult for r in got)


def test_windows_on_rocksdb_and_parallel_splits(tmp_path):
    """Two source splits (the watermark is their minimum) and RocksDB state: on-time records
    only (a split's lead would make the lateness of late ones depend on timing)."""
    p, out, late = windowed(tmp_path, N, "sliding", source_parallelism=2, late=False,
                            state_backend="rocksdb")
    p.run(engine="threads", timeout=120)
    want, _ = expected(N, "sliding", late=False)
    assert collections.Counter(out.results()) == want
    assert not late.results()


def test_a_result_after_a_window_has_its_window_time(tmp_path):
    """Windows of windows: per-key counts per 100 s, then the number of keys per 200 s."""
    cfg = CheckpointConfig(storage=f"file://{tmp_path}/chk")
    p = Pipeline("nested", parallelism=2, checkpoint=cfg)
    out = CollectSink(str(tmp_path / "out"))
    (p.source(GeneratorSource(count=2000, fn=event), parallelism=1)
      .assign_timestamps(ts_of, max_delay=40, parallelism=1)
      .key_by(key_of).window(tumbling(100)).count()
      .key_by(lambda r: "all").window(tumbling(200)).count()
      .sink(out))
    p.run(engine="threads", timeout=60)
    got = sorted(out.results())
    # (early events are up to 39 s out of order: 5 keys have a window [-100, 0))
    assert [(r.start, r.value) for r in got] == [(-200, 5)] + [
        (s, 10) for s in range(0, 2000, 200)]


@pytest.mark.parametrize("mode", ["aligned", "unaligned"])
@pytest.mark.parametrize("scales", [(2, 1), (1, 3), (2, 1, 2)])
def test_restores_and_rescales_are_exact(tmp_path, mode, scales):
    """Cancelled midway at one parallelism, resumed at another: the committed output equals
    the failure-free run's (every window once, every re-emit once, every late record once)."""
    *steps, last = scales
    for first in steps:
        p, _, _ = windowed(tmp_path, N, "tumbling", mode, rate=15_000, parallelism=first,
                           interval=0.2)
        with pytest.raises(JobCancelled):
            p.run(engine="threads", timeout=1.0)
        assert CheckpointStorage(p.checkpoint.storage, p.name).completed()
    p, out, late = windowed(tmp_path, N, "tumbling", mode, parallelism=last, interval=0.2)
    result = p.run(engine="threads", timeout=120)
    assert result.restored_from is not None
    want, want_late = expected(N, "tumbling")
    assert collections.Counter(out.results()) == want
    assert late_rows(late) == want_late


def test_a_restore_into_changed_windows_is_refused(tmp_path):
    p, _, _ = windowed(tmp_path, 2_000, "tumbling")
    p.run(engine="threads", timeout=60)
    path = CheckpointStorage(p.checkpoint.storage, p.name).latest().path
    q, _, _ = windowed(tmp_path, 2_000, "sliding")
    with pytest.raises(IncompatibleCheckpointError,
                       match=r"operator 'counts' keeps state for tumbling\(size=100, offset=0\)"
                             r"\.count in the checkpoint and is sliding\(size=100, slide=50, "
                             r"offset=0\)\.count now"):
        q.run(engine="threads", timeout=60, restore_from=path)
    # the same windows with another lateness restore
    r, _, _ = windowed(tmp_path, 2_000, "tumbling", late=False)
    assert r.run(engine="threads", timeout=60, restore_from=path).restored_from == path


def test_window_state_reads_as_rows(tmp_path):
    """``cutline.state.read``'s rows (decoded without Spark here): a key's windows, and the
    per key group watermark under its own state name."""
    from cutline.spark.state_reader import _column_type, _encode
    from cutline.state.reader import keyed_rows
    from cutline.storage.checkpoints import open_checkpoint

    p, _, _ = windowed(tmp_path, 2_000, "tumbling", late=False, interval=0.05)
    p.run(engine="threads", timeout=60)
    # the last checkpoint is taken at the end: every window fired and gone, each key
    # group's mark at the last real watermark (a continued job goes on from there), not inf
    handle = open_checkpoint(CheckpointStorage(p.checkpoint.storage, p.name).latest().path)
    rows = list(keyed_rows(handle, "counts"))
    marks = [r["window-watermark"] for r in rows if "window-watermark" in r]
    assert len(marks) == 128 and len(set(marks)) == 1
    assert 0 < marks[0] < float("inf")
    # `cutline checkpoints show` counts keys, not the 128 per-key-group marks: the keys
    # whose windows cutline.state.read returns (window_rows: none, every window fired and
    # gone), and apart the windows the end of input fired, only remembered (issue 29: they
    # were counted as keys)
    from cutline.state.reader import summary, window_rows

    counts = next(o for o in summary(handle)["operators"] if o["uid"] == "counts")
    held = list(window_rows(handle, "counts"))
    assert counts["keys"] == len({r["key"] for r in held}) == 0
    assert counts["windows"] == len(held) == 0
    fired = [r["window-fired"] for r in rows if r.get("window-fired")]
    assert counts["fired_at_end"] == sum(map(len, fired)) > 0
    value = {(0, 100): 3, (100, 200): 1}
    assert _encode(value, _column_type([value])) == '{"(0, 100)": 3, "(100, 200)": 1}'
