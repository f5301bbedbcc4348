"""``cutline chaos``: many ``kill -9`` of Spark Python workers during one job, some while the
job restores, in every mode; the committed output is compared with the failure-free one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cutline.cli import main
from cutline.spark.chaos import run_chaos

EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "wordcount.py")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["aligned", "unaligned", "aligned_timeout", "at_least_once"])
def test_chaos_kills_lose_and_duplicate_nothing(spark, tmp_path, mode):
    report = run_chaos(EXAMPLE, kills=3, seed=11, mode=mode, records=36_000, spark=spark,
                       workdir=str(tmp_path), mean_delay=0.7, early=0.4)
    assert report.kills == 3, report
    assert report.attempts >= 4
    assert report.lost == 0, report
    if mode != "at_least_once":
        assert report.duplicated == 0, report
        assert report.committed == report.expected
    # no storage leaks: the retained checkpoints (3) and nothing else; no sink staging left
    assert report.orphans == [], report.orphans
    assert 1 <= len(report.retained) <= 3, report.retained


@pytest.mark.slow
def test_chaos_kills_during_recovery(spark, tmp_path):
    report = run_chaos(EXAMPLE, kills=3, seed=3, mode="aligned", records=36_000, spark=spark,
                       workdir=str(tmp_path), mean_delay=0.7, early=1.0)
    assert report.kills == 3 and report.during_recovery == 3, report
    assert report.exact, report


@pytest.mark.slow
def test_chaos_cli_json(spark, capsys):
    assert main(["chaos", EXAMPLE, "--kills", "1", "--records", "20000",
                 "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is True and out["kills"] == 1 and out["lost"] == 0
    assert out["duplicated"] == 0


def test_chaos_needs_an_example_with_chaos_job(tmp_path, capsys):
    prog = tmp_path / "plain.py"
    prog.write_text("x = 1\n")
    assert main(["chaos", str(prog), "--kills", "1"]) == 2
    assert "has no chaos_job" in capsys.readouterr().err
    assert main(["chaos", str(tmp_path / "missing.py")]) == 2
    assert "no example program" in capsys.readouterr().err
    notes = tmp_path / "notes.txt"  # no Python loader for it: a clear error, not AttributeError
    notes.write_text("x = 1\n")
    assert main(["chaos", str(notes)]) == 2
    assert "cannot be imported as a Python module" in capsys.readouterr().err


def test_storage_orphans_finds_partial_checkpoints_and_staging(tmp_path):
    from cutline.spark.chaos import storage_orphans
    from cutline.storage.checkpoints import CheckpointStorage

    storage = CheckpointStorage(f"file://{tmp_path}/ck", "job")
    info = storage.write_task_state(1, "a.0", b"state")
    storage.commit(1, {}, states={"a.0": info})
    storage.write_task_state(2, "a.0", b"half")  # partial: no _metadata
    out = tmp_path / "out"
    (out / "_staging" / "job" / "0").mkdir(parents=True)
    (out / "_staging" / "job" / "0" / "part.parquet").write_bytes(b"x")
    retained, orphans = storage_orphans(storage, (str(out),))
    assert retained == ["chk-1"]
    assert [o.rsplit("/", 2)[-2:] for o in orphans] == [["chk-2", "a.0.state"],
                                                        ["0", "part.parquet"]], orphans
