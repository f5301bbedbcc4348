"""No silent surprises: each case a new user met (issue 17) gets a clear message or a fix."""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile

import pytest

from cutline import CheckpointConfig, Pipeline
from cutline.cli import main
from cutline.connectors import CollectSink, FileSource, GeneratorSource
from cutline.driver.dataflow import FinishedJobError, JobFailed


def small(tmp_path, name: str = "twice") -> tuple[Pipeline, CollectSink]:
    p = Pipeline(name, parallelism=2, checkpoint=CheckpointConfig(
        interval=0.2, storage=f"file://{tmp_path}/chk"))
    sink = CollectSink(str(tmp_path / "out"))
    p.source(GeneratorSource(count=500), uid="numbers").key_by(lambda i: i % 5) \
     .count(uid="count").sink(sink, uid="out")
    return p, sink


def test_running_a_finished_job_again_says_so_and_how_to_start_fresh_or_resume(tmp_path,
                                                                              monkeypatch):
    p, sink = small(tmp_path)
    first = p.run(engine="threads", timeout=60)
    assert len(sink.results()) == 500
    with pytest.raises(FinishedJobError) as info:
        small(tmp_path)[0].run(engine="threads", timeout=60)
    text = str(info.value)
    final = first.latest_checkpoint.path
    assert "already finished" in text and "delete" in text
    assert f"restore_from={final!r}" in text
    # on Spark too, and at once: before an embedded session starts (10-36 s)
    import cutline.spark.launcher as launcher

    def no_spark(*args, **kwargs):
        raise AssertionError("a Spark session was started for a finished job")

    monkeypatch.setattr(launcher, "embedded_session", no_spark)
    monkeypatch.setattr(launcher, "embedded_context", no_spark)
    with pytest.raises(FinishedJobError) as info:
        small(tmp_path)[0].run(timeout=60)
    assert str(info.value) == text
    # as it says: resuming from the final state is a run that reads nothing more
    again = small(tmp_path)[0].run(engine="threads", timeout=60, restore_from=final)
    assert again.restored_from == final and len(sink.results()) == 500


def test_a_cancelled_job_still_resumes_by_itself(tmp_path):
    p, _ = small(tmp_path, "cancelled")
    p.nodes[0].fn = GeneratorSource(count=10_000_000, rate=20_000)
    with pytest.raises(JobFailed, match="cancelled"):
        p.run(engine="threads", timeout=1.5)
    p.nodes[0].fn = GeneratorSource(count=100)
    assert p.run(engine="threads", timeout=60).restored_from is not None


@pytest.mark.parametrize("argv", [
    ["checkpoints", "list", "{d}/missing", "job"],
    ["checkpoints", "list", "file://{d}/missing", "job"],
    ["savepoint", "{d}/missing", "job", "--timeout", "5"],
])
def test_read_only_commands_create_nothing_and_fail_on_a_missing_path(tmp_path, capsys, argv):
    assert main([a.format(d=tmp_path) for a in argv]) == 1
    assert "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "missing").exists()


def test_checkpoints_list_names_a_missing_job_and_the_jobs_there(tmp_path, capsys):
    small(tmp_path, "there")[0].run(engine="threads", timeout=60)
    assert main(["checkpoints", "list", f"file://{tmp_path}/chk", "nothere"]) == 1
    err = capsys.readouterr().err
    assert "no job 'nothere'" in err and "there" in err
    assert not (tmp_path / "chk" / "nothere").exists()


def test_checkpoints_list_shows_a_corrupt_checkpoint_and_fails(tmp_path, capsys):
    result = small(tmp_path, "corrupt")[0].run(engine="threads", timeout=60)
    path = result.latest_checkpoint.path.removeprefix("file://")
    state = next(f for f in os.listdir(path) if f != "_metadata")
    with open(os.path.join(path, state), "ab") as f:
        f.write(b"garbage")
    assert main(["checkpoints", "list", f"file://{tmp_path}/chk", "corrupt",
                 "--format", "json"]) == 1
    captured = capsys.readouterr()
    rows = json.loads(captured.out)
    assert [r["kind"] for r in rows if r["path"].endswith(path)] == ["corrupt"]
    assert "corrupt" in captured.err and state in captured.err


def test_checkpoints_list_of_an_unknown_scheme_or_host_is_one_line(capsys):
    assert main(["checkpoints", "list", "ftp://x", "job"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("cutline: error: ") and "ftp://x" in err and "\n" not in err


@pytest.mark.parametrize("bad", [
    {"interval": math.nan}, {"interval": math.inf}, {"interval": -math.inf},
    {"timeout": math.nan}, {"timeout": math.inf}, {"min_pause": math.nan},
    {"min_pause": math.inf}, {"aligned_timeout": math.nan}, {"aligned_timeout": math.inf},
    {"unaligned": True, "aligned_timeout": 0.5}, {"interval": True},
    {"retain_on_cancel": "yes"}, {"max_concurrent": 1.5}, {"retained": 0},
    {"tolerable_failures": -1}, {"mode": "exactly-once"}, {"state_backend": "disk"},
    {"storage": ""}, {"storage_options": ["key"]},
])
def test_checkpoint_config_refuses_what_it_cannot_honour(bad):
    field = next(iter(bad)) if len(bad) == 1 else "aligned_timeout"
    with pytest.raises(ValueError, match=field):
        CheckpointConfig(**bad)


def test_a_failing_record_of_a_file_is_named_by_file_and_line(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text('{"n": 1}\n\n{"n": 2}\n{"n": "x"}\n')

    def plus_one(e):
        return e["n"] + 1

    p = Pipeline("lines", parallelism=1, checkpoint=CheckpointConfig(
        storage=f"file://{tmp_path}/chk"))
    p.source(FileSource(str(tmp_path / "in")), uid="files").map(plus_one, uid="plus") \
     .sink(CollectSink(str(tmp_path / "out")), uid="out")
    with pytest.raises(JobFailed) as info:
        p.run(engine="threads", timeout=60)
    text = str(info.value)
    assert f"{tmp_path}/in/a.jsonl:4" in text, text
    assert "raised in plus_one at " in text and "test_surprises.py:" in text
    assert "'file': None" not in text and "{'" not in text.split("record", 2)[-1]


def test_an_empty_input_directory_says_so(tmp_path, caplog):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "_SUCCESS").write_text("")
    p = Pipeline("empty", parallelism=1, checkpoint=CheckpointConfig(
        storage=f"file://{tmp_path}/chk"))
    p.source(FileSource(str(tmp_path / "in")), uid="files") \
     .sink(CollectSink(str(tmp_path / "out")), uid="out")
    with caplog.at_level(logging.WARNING):
        p.run(engine="threads", timeout=60)
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("holds no input files" in m and "1 ignored" in m for m in said), said


def test_simulate_alignment_diagram_says_why_it_draws_none(tmp_path, capsys):
    assert main(["simulate", "alignment", "--diagram", str(tmp_path / "a.png")]) == 2
    assert "draws none" in capsys.readouterr().err
    assert not (tmp_path / "a.png").exists()


@pytest.mark.parametrize("scenario", ["lecture", "tokens", "termination", "inconsistent"])
def test_json_with_a_diagram_keeps_stdout_pure_json(tmp_path, capsys, scenario):
    deep = tmp_path / ("a-directory-name-long-enough-to-wrap-" * 3)  # a path is never wrapped
    deep.mkdir()
    out = deep / f"{scenario}.png"
    main(["simulate", scenario, "--format", "json", "--diagram", str(out)])
    captured = capsys.readouterr()
    json.loads(captured.out)
    assert out.is_file() and str(out) in captured.err


def test_process_graph_run_leaves_no_temporary_directory(tmp_path, monkeypatch):
    from graph_programs import ledger_graph

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    result = ledger_graph(3, 10).run(engine="threads", tasks=2, snapshot_interval=0.01,
                                     timeout=60)
    assert result.snapshots, "the run took snapshots"
    assert not [p for p in os.listdir(tmp_path) if p.startswith("cutline-")]
