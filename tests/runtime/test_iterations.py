"""Iterations (a feedback edge in a Pipeline): exactly once through checkpoints and kills,
the loop's end detected on a consistent checkpoint, and bad loops refused up front."""

from __future__ import annotations

import collections

import pytest

from cutline import CheckpointConfig, Pipeline
from cutline.connectors import CollectSink, GeneratorSource
from cutline.spark.launcher import JobCancelled

from pipelines import collatz_expected, collatz_pipeline


@pytest.mark.parametrize("mode", ["aligned", "unaligned"])
@pytest.mark.parametrize("parallelism", [1, 2])
def test_loop_output_is_exact_and_the_job_ends(tmp_path, mode, parallelism):
    p, sink = collatz_pipeline(tmp_path, 3_000, mode, parallelism=parallelism)
    result = p.run(engine="threads", timeout=120)
    assert collections.Counter(sink.results()) == collatz_expected(3_000)
    assert result.checkpoints[-1].final


def test_a_cancelled_loop_resumes_exactly_with_its_logged_feedback(tmp_path):
    """Cancelled mid-loop: the checkpoint holds the feedback records logged after the
    head's snapshot; the new run replays them and nothing is lost or doubled."""
    p, _ = collatz_pipeline(tmp_path, 20_000, "aligned", rate=8_000)
    with pytest.raises(JobCancelled):
        p.run(engine="threads", timeout=1.5)
    p, sink = collatz_pipeline(tmp_path, 20_000, "aligned")
    result = p.run(engine="threads", timeout=180)
    assert result.restored_from is not None
    # aligned: in-flight records in a checkpoint can only be logged feedback (ABS)
    assert any(c.in_flight for c in result.checkpoints), "no feedback was ever logged"
    assert collections.Counter(sink.results()) == collatz_expected(20_000)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["aligned", "unaligned"])
def test_kill_9_inside_a_loop_on_spark_is_exact(spark, tmp_path, mode):
    from cutline.spark.faults import Kill

    p, sink = collatz_pipeline(tmp_path, 20_000, mode, rate=5_000)
    kill = Kill(after_checkpoint=2, delay=0.2)
    result = p.run(spark=spark, timeout=240, on_start=kill)
    assert kill.killed, "the worker was never killed"
    assert result.attempts >= 2
    assert collections.Counter(sink.results()) == collatz_expected(20_000)


def _loop(tmp_path, mode="exactly_once"):
    cfg = CheckpointConfig(interval=0.5, storage=f"file://{tmp_path}/ck", mode=mode)
    p = Pipeline("loop", checkpoint=cfg)
    return p, p.source(GeneratorSource(count=10), uid="src")


def test_an_unclosed_iteration_is_refused(tmp_path):
    p, src = _loop(tmp_path)
    src.iterate(uid="loop").map(str, uid="m").sink(CollectSink(str(tmp_path / "o")), uid="o")
    with pytest.raises(ValueError, match="iteration 'loop' is never closed"):
        p.run(engine="threads", timeout=10)


def test_an_iteration_needs_exactly_once(tmp_path):
    p, src = _loop(tmp_path, mode="at_least_once")
    loop = src.iterate(uid="loop")
    body = loop.map(lambda x: x - 1, uid="dec")
    loop.close_with(body.filter(lambda x: x > 0, uid="again"))
    body.sink(CollectSink(str(tmp_path / "o")), uid="o")
    with pytest.raises(ValueError, match="needs mode 'exactly_once'.*consistent cuts"):
        p.run(engine="threads", timeout=10)


def test_close_with_takes_a_stream_of_the_loop(tmp_path):
    p, src = _loop(tmp_path)
    loop = src.iterate(uid="loop")
    other = src.map(str, uid="other")
    with pytest.raises(ValueError, match="needs a stream computed from iteration 'loop'"):
        loop.close_with(other)
    body = loop.map(lambda x: x, uid="id")
    loop.close_with(body.filter(lambda x: False, uid="never"))
    with pytest.raises(ValueError, match="already closed"):
        loop.close_with(body)
