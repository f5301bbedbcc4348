"""The streaming runtime end to end on the threads engine (no Spark): fast, exact."""

import collections

import pytest

from cutline import CheckpointConfig, Pipeline
from cutline.connectors import CollectSink, GeneratorSource
from cutline.driver.dataflow import JobFailed
from cutline.plan import plan
from cutline.state.keygroups import key_group, key_group_range, subtask_for_key_group
from pipelines import expected_rows, wordcount


@pytest.mark.parametrize("mode", ["aligned", "unaligned", "at_least_once"])
def test_wordcount_is_exact_in_every_mode(tmp_path, mode):
    p, sink = wordcount(tmp_path, 12_000, mode, rate=12_000, interval=0.2)
    result = p.run(engine="threads", timeout=60)
    assert collections.Counter(sink.results()) == expected_rows(12_000)
    assert len(result.checkpoints) >= 3  # periodic ones and the final one
    assert result.checkpoints[-1].final


def test_unaligned_checkpoints_store_in_flight_data(tmp_path):
    p, _ = wordcount(tmp_path, 20_000, "unaligned", rate=20_000, interval=0.1)
    result = p.run(engine="threads", timeout=60)
    assert sum(c.in_flight for c in result.checkpoints) > 0


def test_a_new_run_resumes_from_the_latest_checkpoint(tmp_path):
    from cutline.driver.dataflow import FinishedJobError

    p, sink = wordcount(tmp_path, 5_000, "aligned")
    first = p.run(engine="threads", timeout=60)
    last = first.checkpoints[-1]
    p2, sink2 = wordcount(tmp_path, 5_000, "aligned")
    # the first run finished: a rerun is refused, naming the checkpoint to resume from
    with pytest.raises(FinishedJobError, match=f"restore_from='{last.path}'"):
        p2.run(engine="threads", timeout=60)
    second = p2.run(engine="threads", timeout=60, restore_from=last.path)
    assert second.checkpoints[0].id > last.id  # ids never repeat across runs
    # the restored run starts where the first one ended: nothing more to emit
    assert collections.Counter(sink2.results()) == expected_rows(5_000)


def test_user_function_error_names_operator_and_record(tmp_path):
    p = Pipeline("boom", parallelism=1,
                 checkpoint=CheckpointConfig(storage=f"file://{tmp_path}/c"))

    def explode(x):
        if x == 7:
            raise ValueError("seven is right out")
        return x

    (p.source(GeneratorSource(count=20), uid="numbers").map(explode, uid="explode")
       .sink(CollectSink(str(tmp_path / "o"))))
    with pytest.raises(JobFailed, match=r"map operator 'explode' failed on record 7: "
                                        r"ValueError: seven is right out"):
        p.run(engine="threads", timeout=30)


def test_chaining_and_channels():
    p = Pipeline("plan", parallelism=2)
    (p.source(GeneratorSource(count=1), uid="src").map(str, uid="m").filter(bool, uid="f")
       .key_by(len).reduce(lambda a, b: a + b, uid="r").sink(CollectSink("/tmp/x"), uid="s"))
    pp = plan(p)
    assert [[n.uid for n in c.nodes] for c in pp.chains] == [["src", "m", "f"], ["r", "s"]]
    assert [str(c) for c in pp.inputs(pp.chains[1], 0)] == ["src.0->r.0", "src.1->r.0"]
    assert pp.slots == 2


def test_key_groups_partition_every_key_exactly_once():
    for parallelism in (1, 2, 3, 7):
        ranges = [key_group_range(i, parallelism, 128) for i in range(parallelism)]
        assert sorted(g for r in ranges for g in r) == list(range(128))
        for i, r in enumerate(ranges):
            assert all(subtask_for_key_group(g, parallelism, 128) == i for g in r)
    assert key_group("word", 128) == key_group("word", 128)
    # keys equal in Python land in one group (a dict cache keyed by them stays correct)
    assert key_group(1, 128) == key_group(1.0, 128) == key_group(True, 128)


@pytest.mark.parametrize("build, message", [
    (lambda: CheckpointConfig(interval=0), "CheckpointConfig.interval must be a positive"),
    (lambda: CheckpointConfig(mode="exactly"), "CheckpointConfig.mode must be"),
    (lambda: CheckpointConfig(mode="at_least_once", unaligned=True), "applies to mode"),
    (lambda: CheckpointConfig(retained=0), "CheckpointConfig.retained must be"),
    (lambda: Pipeline("x", parallelism=0), "parallelism must be a whole number >= 1"),
    (lambda: Pipeline("bad name!"), "pipeline name must be"),
    (lambda: Pipeline("x").source(42), "source\\(\\) needs a cutline source"),
    (lambda: Pipeline("x").source(GeneratorSource(count=1)).map(3), "map\\(\\) needs a function"),
])
def test_bad_input_is_refused_up_front(build, message):
    with pytest.raises((ValueError, TypeError), match=message):
        build()


def test_pipeline_without_sink_is_refused():
    p = Pipeline("nosink")
    p.source(GeneratorSource(count=1)).map(str)
    with pytest.raises(ValueError, match="has no sink"):
        plan(p)


def test_duplicate_uid_is_refused():
    p = Pipeline("dup")
    s = p.source(GeneratorSource(count=1), uid="a")
    with pytest.raises(ValueError, match="duplicate operator uid 'a'"):
        s.map(str, uid="a")


def test_cancelled_run_resumes_exactly_in_a_new_run(tmp_path):
    from cutline.spark.launcher import JobCancelled

    p, _ = wordcount(tmp_path, 40_000, "aligned", rate=10_000, interval=0.3)
    with pytest.raises(JobCancelled, match="cancelled"):
        p.run(engine="threads", timeout=1.5)
    from cutline.storage.checkpoints import CheckpointStorage

    kept = CheckpointStorage(p.checkpoint.storage, "wordcount").completed()
    assert kept, "retain_on_cancel keeps the checkpoints"
    p2, sink2 = wordcount(tmp_path, 40_000, "aligned", rate=None, interval=0.3)
    result = p2.run(engine="threads", timeout=60)
    assert result.restored_from.endswith(f"chk-{max(kept)}")  # the latest one kept
    assert result.checkpoints[0].id > max(kept)
    assert collections.Counter(sink2.results()) == expected_rows(40_000)


def test_cancel_without_retain_deletes_checkpoints(tmp_path):
    from cutline.spark.launcher import JobCancelled
    from cutline.storage.checkpoints import CheckpointStorage

    p, _ = wordcount(tmp_path, 40_000, "aligned", rate=10_000, interval=0.3)
    p.with_checkpoint(retain_on_cancel=False)
    with pytest.raises(JobCancelled):
        p.run(engine="threads", timeout=1.5)
    assert CheckpointStorage(p.checkpoint.storage, "wordcount").completed() == []


def test_restore_from_an_explicit_checkpoint_path(tmp_path):
    p, _ = wordcount(tmp_path, 3_000, "aligned")
    first = p.run(engine="threads", timeout=60)
    path = first.checkpoints[-1].path
    p2, sink2 = wordcount(tmp_path / "other", 3_000, "aligned")
    result = p2.run(engine="threads", timeout=60, restore_from=path)
    assert result.restored_from == path
    # everything was already emitted before that checkpoint: the new sink gets nothing new
    assert list(sink2.results()) == []


def test_restore_from_a_missing_path_is_a_clear_error(tmp_path):
    p, _ = wordcount(tmp_path, 10, "aligned")
    with pytest.raises(Exception, match="nope"):
        p.run(engine="threads", timeout=30, restore_from=str(tmp_path / "nope"))


def test_restore_from_wins_over_newer_checkpoints_in_storage(tmp_path):
    p, _ = wordcount(tmp_path, 20_000, "aligned", rate=20_000, interval=0.2)
    first = p.run(engine="threads", timeout=60)
    older = first.checkpoints[-2].path  # retained: 3, so not the newest
    p2, _ = wordcount(tmp_path, 20_000, "aligned")
    second = p2.run(engine="threads", timeout=60, restore_from=older)
    assert second.restored_from == older


def test_key_hashes_do_not_change_between_versions():
    """Saved keyed state sits in key groups by these values: a change would put a restored
    key's state in a group another subtask owns (pinned from the code of 2026-12-05)."""
    from cutline.state.keygroups import stable_hash

    keys = ["word", 7, -3, 2**70, 1.5, 2.0, True, None, b"raw", (1, "a"), (123456, 789),
            ("u", (1, 2.5)), ()]
    assert [stable_hash(k) for k in keys] == [
        5609502272630911185, 18103290618691927784, 574377492800296254, 0,
        9989323613743144798, 18348614514846119501, 18397679293204093734, 0,
        9917698064949395965, 17196032970756483075, 6451501412767096586, 486110056921411294,
        17612642830714933046]
