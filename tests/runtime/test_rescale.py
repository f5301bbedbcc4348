"""Restoring a checkpoint into a changed pipeline: rescaling, and operators matched by uid.

A run is cancelled mid-way (its checkpoints kept), then a new run at another parallelism
resumes from them.  Its committed output, with the first run's, must be exactly what a
failure-free run produces: state moves by key groups, source positions and sink
transactions are handed out again, in-flight records are re-routed.
"""

from __future__ import annotations

import collections
import json

import pytest

from cutline import CheckpointConfig, Pipeline
from cutline.connectors import CollectSink, FileSource, GeneratorSource
from cutline.runtime.restore import IncompatibleCheckpointError
from cutline.spark.launcher import JobCancelled
from cutline.storage.checkpoints import CheckpointStorage

from pipelines import expected_rows, wordcount, write_events

N = 30_000


def _cancel_midway(p, timeout=1.2, checkpoints=1):
    """Run ``p`` on threads for ``timeout`` seconds and until it completed ``checkpoints``
    checkpoints (a loaded machine may take longer to start it), then cancel it."""
    import time

    job = p.start(engine="threads", timeout=120)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 60 and not (
            time.monotonic() - t0 >= timeout and job.driver is not None
            and len(job.driver.run.checkpoints) >= checkpoints):
        time.sleep(0.02)
    job.cancel("the test resumes it")
    with pytest.raises(JobCancelled):
        job.result(60)
    kept = CheckpointStorage(p.checkpoint.storage, p.name).completed()
    assert kept, "the cancelled run kept checkpoints to resume from"
    return kept


@pytest.mark.parametrize("mode", ["aligned", "unaligned"])
@pytest.mark.parametrize("scales", [(2, 1), (1, 3), (2, 3, 1)])
def test_rescaled_restore_is_exact(tmp_path, mode, scales):
    *steps, last = scales
    for p_ in steps:  # each step runs a while at its parallelism, then is cancelled
        p, _ = wordcount(tmp_path, N, mode, rate=12_000, parallelism=p_, interval=0.2)
        _cancel_midway(p, timeout=0.9)
    p, sink = wordcount(tmp_path, N, mode, parallelism=last, interval=0.2)
    result = p.run(engine="threads", timeout=120)
    assert result.restored_from is not None
    assert collections.Counter(sink.results()) == expected_rows(N)


def test_rescaled_generator_positions_cover_every_index_once(tmp_path):
    """Scale 1 -> 4: the one old split is cut so that all four readers get work."""
    p, _ = wordcount(tmp_path, N, "aligned", rate=10_000, parallelism=1, interval=0.2)
    _cancel_midway(p, timeout=0.8)
    p, sink = wordcount(tmp_path, N, "aligned", parallelism=4, interval=0.2)
    result = p.run(engine="threads", timeout=120)
    assert collections.Counter(sink.results()) == expected_rows(N)
    assert result.checkpoints and result.checkpoints[-1].final


def _files_pipeline(tmp, parallelism, rate_limited):
    def slow(e):
        if rate_limited:
            import time
            time.sleep(0.0003)
        return e

    cfg = CheckpointConfig(interval=0.2, storage=f"file://{tmp}/ck")
    p = Pipeline("files", parallelism=parallelism, checkpoint=cfg)
    sink = CollectSink(str(tmp / "out"))
    (p.source(FileSource(str(tmp / "in"), format="jsonl"), uid="events")
       .map(slow, uid="slow")
       .key_by(lambda e: e["user"])
       .count(uid="per-user")
       .sink(sink, uid="out"))
    return p, sink


@pytest.mark.parametrize("scales", [(3, 1), (1, 2)])
def test_rescaled_file_source_resumes_files_at_their_positions(tmp_path, scales):
    events = write_events(tmp_path / "in", files=5, per_file=1500)
    p, _ = _files_pipeline(tmp_path, scales[0], rate_limited=True)
    _cancel_midway(p, timeout=1.0)
    p, sink = _files_pipeline(tmp_path, scales[1], rate_limited=False)
    p.run(engine="threads", timeout=120)
    totals = collections.Counter(e["user"] for e in events)
    want = collections.Counter((u, k) for u, n in totals.items() for k in range(1, n + 1))
    assert collections.Counter(sink.results()) == want


# ---------------------------------------------------------------- operators matched by uid


def _finished_checkpoint(tmp_path):
    p, _ = wordcount(tmp_path, 2_000, "aligned", interval=0.2)
    p.run(engine="threads", timeout=60)
    return CheckpointStorage(p.checkpoint.storage, p.name).latest().path


def _variant(tmp_path, *, count_uid="count", kind="count", maxp=128, extra=False):
    cfg = CheckpointConfig(interval=0.2, storage=f"file://{tmp_path}/checkpoints")
    p = Pipeline("wordcount", parallelism=2, checkpoint=cfg, max_parallelism=maxp)
    s = p.source(GeneratorSource(count=2_000, fn=lambda i: f"w{i % 7}"), uid="sentences")
    s = s.flat_map(str.split, uid="split")
    if extra:
        s = s.map(str.upper, uid="upper")
    k = s.key_by(lambda w: w)
    s = k.count(uid=count_uid) if kind == "count" else k.reduce(lambda a, b: a, uid=count_uid)
    s.sink(CollectSink(str(tmp_path / "out2")), uid="out")
    return p


def test_a_renamed_stateful_operator_is_refused_with_its_uid(tmp_path):
    path = _finished_checkpoint(tmp_path)
    p = _variant(tmp_path, count_uid="counter")
    with pytest.raises(IncompatibleCheckpointError,
                       match=r"keyed state of operator 'count'.*allow_non_restored_state"):
        p.run(engine="threads", timeout=60, restore_from=path)


def test_dropping_unmatched_state_when_the_user_allows_it(tmp_path):
    path = _finished_checkpoint(tmp_path)
    p = _variant(tmp_path, count_uid="counter")
    result = p.run(engine="threads", timeout=60, restore_from=path,
                   allow_non_restored_state=True)
    assert result.restored_from == path


def test_an_operator_whose_kind_changed_is_refused(tmp_path):
    path = _finished_checkpoint(tmp_path)
    p = _variant(tmp_path, kind="reduce")
    with pytest.raises(IncompatibleCheckpointError, match="'count' was a count .* is a reduce"):
        p.run(engine="threads", timeout=60, restore_from=path,
              allow_non_restored_state=True)


def test_a_changed_max_parallelism_is_refused(tmp_path):
    path = _finished_checkpoint(tmp_path)
    p = _variant(tmp_path, maxp=64)
    with pytest.raises(IncompatibleCheckpointError, match="max_parallelism changed from 128 to 64"):
        p.run(engine="threads", timeout=60, restore_from=path)


def test_an_added_stateless_operator_restores(tmp_path):
    path = _finished_checkpoint(tmp_path)
    p = _variant(tmp_path, extra=True)
    result = p.run(engine="threads", timeout=60, restore_from=path)
    assert result.restored_from == path


def test_the_check_reads_the_latest_checkpoint_when_none_is_given(tmp_path):
    _finished_checkpoint(tmp_path)
    p = _variant(tmp_path, count_uid="renamed")
    with pytest.raises(IncompatibleCheckpointError, match="operator 'count'"):
        p.run(engine="threads", timeout=60)
    meta = CheckpointStorage(p.checkpoint.storage, p.name).latest().metadata
    assert json.dumps(meta["plan"]["operators"]["count"]) == json.dumps(
        {"kind": "count", "chain": "count", "parallelism": 2})


# ------------------------------------------- operators without uids: positions checked


def _reading(i):
    return (f"k{i % 5}", (i * 7919) % 1000)


def _key(r):
    return r[0]


def total(a, b):
    return (a[0], a[1] + b[1])


def longest(a, b):
    return (a[0], max(a[1], b[1]))


def _branches(tmp_path, *, swapped=False, uids=None, n=2_000, rate=None):
    """Two stateful reduces without uids on two branches of one source (positions
    reduce-1 and reduce-3; ``swapped``: declared the other way round, so at each other's
    position), each into its own sink.  ``uids``: function name -> the uid to give it."""
    uids = uids or {}
    cfg = CheckpointConfig(interval=0.2, storage=f"file://{tmp_path}/checkpoints")
    p = Pipeline("branches", parallelism=1, checkpoint=cfg)
    s = p.source(GeneratorSource(count=n, fn=_reading, rate=rate), uid="readings")
    sinks = {"total": CollectSink(str(tmp_path / "sums")),
             "longest": CollectSink(str(tmp_path / "maxes"))}
    for fn in (longest, total) if swapped else (total, longest):
        (s.key_by(_key).reduce(fn, uid=uids.get(fn.__name__))
           .sink(sinks[fn.__name__], uid=f"{fn.__name__}-out"))
    return p, sinks


def _oracle(fn, n):
    """The running reduce per key of a failure-free run, as a multiset."""
    cur, out = {}, collections.Counter()
    for i in range(n):
        r = _reading(i)
        cur[r[0]] = r if r[0] not in cur else fn(cur[r[0]], r)
        out[cur[r[0]]] += 1
    return out


def test_swapped_operators_without_uids_are_refused_naming_them(tmp_path):
    p, _ = _branches(tmp_path)
    p.run(engine="threads", timeout=60)
    meta = CheckpointStorage(p.checkpoint.storage, p.name).latest().metadata
    ops = meta["plan"]["operators"]
    assert ops["reduce-1"]["fingerprint"] == "reduce total keyed by _key <- source readings"
    assert "fingerprint" not in ops["readings"]  # an explicit uid: matched by it alone
    p, _ = _branches(tmp_path, swapped=True)
    with pytest.raises(IncompatibleCheckpointError) as err:
        p.run(engine="threads", timeout=60, allow_non_restored_state=True)
    msg = str(err.value)
    assert "'reduce-1' holds the state of [reduce total keyed by _key <- source readings] and " \
           "is [reduce longest keyed by _key <- source readings] now (its state is under " \
           "'reduce-3': uid='reduce-3' restores it)" in msg, msg
    assert "'reduce-3' holds the state of [reduce longest" in msg, msg
    assert "Give each stateful operator a uid" in msg


def test_a_lambda_fingerprint_is_its_reads_and_the_same_in_every_process():
    from cutline.runtime.restore import _const, _name

    assert _name(lambda a, b: a + b).endswith(".<locals>.<lambda>[a,b]")
    assert _name(lambda a, b: a + b) != _name(lambda a, b: max(a, b))
    assert _name(lambda r: r[0]) != _name(lambda r: r[1])
    assert _name(total) == "total" and _name(CollectSink("/tmp/x")) == "CollectSink"
    # a set constant's order is its hashes' (PYTHONHASHSEED): sorted, the same everywhere
    assert _name(lambda w: w in {"b", "a", "c"}).endswith("<lambda>[w,{'a','b','c'}]")
    assert _const(("x", frozenset({3, 1, 2}))) == "('x',{1,2,3})"


def test_an_unchanged_pipeline_without_uids_restores_exactly(tmp_path):
    n = 20_000
    p, _ = _branches(tmp_path, n=n, rate=4_000)
    _cancel_midway(p, timeout=0, checkpoints=2)
    p, sinks = _branches(tmp_path, n=n)
    result = p.run(engine="threads", timeout=120)
    assert result.restored_from is not None
    for name, fn in (("total", total), ("longest", longest)):
        assert collections.Counter(sinks[name].results()) == _oracle(fn, n), name


def test_swapped_operators_given_their_old_uids_restore_exactly(tmp_path):
    n = 20_000
    p, _ = _branches(tmp_path, n=n, rate=4_000)
    _cancel_midway(p, timeout=0, checkpoints=2)
    p, sinks = _branches(tmp_path, n=n, swapped=True,
                         uids={"total": "reduce-1", "longest": "reduce-3"})
    result = p.run(engine="threads", timeout=120)
    assert result.restored_from is not None
    for name, fn in (("total", total), ("longest", longest)):
        assert collections.Counter(sinks[name].results()) == _oracle(fn, n), name


@pytest.mark.slow
def test_rescale_2_to_1_to_2_on_spark_with_a_kill(spark, tmp_path):
    """On real Spark: parallelism 2, cancelled; resumed at 1, cancelled; resumed at 2 with a
    worker killed by ``kill -9`` on the way.  The output is exactly the failure-free one."""
    from cutline.spark.faults import Kill

    import time

    n = 40_000
    for par in (2, 1):
        p, _ = wordcount(tmp_path, n, "unaligned", rate=6_000, parallelism=par, interval=0.3)
        job = p.start(spark=spark, timeout=120)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not (
                job.driver is not None and len(job.driver.run.checkpoints) >= 2):
            time.sleep(0.05)
        job.cancel("the test moves on to the next parallelism")
        with pytest.raises(JobCancelled):
            job.result(60)
        assert CheckpointStorage(p.checkpoint.storage, p.name).completed()
    p, sink = wordcount(tmp_path, n, "unaligned", rate=15_000, parallelism=2, interval=0.3)
    kill = Kill(after_checkpoint=1, delay=0.2)
    result = p.run(spark=spark, timeout=240, on_start=kill)
    assert kill.killed, "the worker was never killed"
    assert result.attempts >= 2
    assert collections.Counter(sink.results()) == expected_rows(n)


@pytest.mark.parametrize("scales", [(2, 1), (1, 3)])
def test_rescaled_restore_is_exact_on_rocksdb(tmp_path, scales):
    """The same with keyed state in RocksDB: a subtask restores the key groups it owns
    from every old subtask's incremental snapshot."""
    for p_, rate in ((scales[0], 12_000), (scales[1], None)):
        p, sink = wordcount(tmp_path, N, "unaligned", rate=rate, parallelism=p_, interval=0.2)
        p.with_checkpoint(state_backend="rocksdb")
        if rate is not None:
            _cancel_midway(p, timeout=0.9)
    result = p.run(engine="threads", timeout=120)
    assert result.restored_from is not None
    assert collections.Counter(sink.results()) == expected_rows(N)
