"""Smoke tests of ``bench/scale.py`` at tiny sizes: one run per case in its own process, every
output checked against the input's counts, Spark's read schema checked, results JSON and the
exit code; ``--break-output`` (cutline drops one input record) fails the benchmark.
Numbers are not checked: this is a benchmark, not a test."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "scale.py"
TINY = ["--sizes", "3000", "--lines-per-file", "1000", "--rounds", "1", "--max-warmup", "0",
        "--spark-grid", "allx2", "--no-plot"]


def scale(tmp_path, *args, timeout=600):
    out = tmp_path / "scale.json"
    proc = subprocess.run([sys.executable, str(BENCH), *TINY, "--data", str(tmp_path / "data"),
                           "--out", str(out), *args],
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "COLUMNS": "250"})
    return proc, (json.loads(out.read_text()) if out.exists() else None)


def test_scale_columnar_spark_and_pyarrow_agree_with_the_input(tmp_path):
    proc, result = scale(tmp_path, "--queries", "keyed",
                         "--systems", "cutline columnar,spark sql,pyarrow 1 core,pyarrow pool")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert result["failures"] == []
    assert {r["system"] for r in result["summary"]} == {
        "cutline columnar", "spark sql", "pyarrow 1 core", "pyarrow pool"}
    (size,) = result["sizes"]
    assert size["input"]["keyed"]["files"] == 3
    runs = size["queries"]["keyed"]["runs"]
    for system, (run,) in runs.items():  # each checked: one count per user, every record
        assert run["output"] == {"keys": 1000, "records_counted": 3000, "ok": True}, system
        assert run["end_to_end"] >= run["processing"] > 0, (system, run)
        assert run["cpu"] > 0 and run["load"]["max"] >= 0, (system, run)
    assert runs["spark sql"][0]["read_schema"] == ["struct<user:string>"]
    assert result["conditions"]["versions"]["pyspark"] and result["conditions"]["cores"] >= 1


def test_scale_fails_when_cutline_drops_a_record(tmp_path):
    proc, result = scale(tmp_path, "--queries", "window", "--systems", "cutline columnar",
                         "--break-output")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "FAILED" in proc.stdout
    (failure,) = result["failures"]
    # event 0 is one of the 3 events of user u0000's first window: that window is one short
    assert "differs from the input's counts at 1 of" in failure["error"], failure
    assert "('u0000', 1699999980.0): 2 != 3" in failure["error"], failure


def test_scale_rejects_bad_arguments():
    for args, message in ((["--systems", "flink"], "unknown system 'flink'"),
                          (["--queries", "join"], "unknown query 'join'"),
                          (["--spark-grid", "4x"], "--spark-grid takes"),
                          (["--sizes", "0"], "must be >= 1")):
        proc = subprocess.run([sys.executable, str(BENCH), *args], capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 2, (args, proc.stderr)
        assert message in proc.stderr, (args, proc.stderr)


@pytest.mark.slow
def test_scale_every_case_and_both_queries(tmp_path):
    proc, result = scale(tmp_path, "--sizes", "3000,6000", timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert result["failures"] == []
    assert len(result["summary"]) == 2 * 2 * 6
    growth = [r for r in result["summary"] if r["records"] == 6000]
    assert all(r["cost_growth_of_records"] == 2.0 for r in growth)
    for size in result["sizes"]:
        for query in ("keyed", "window"):
            q = size["queries"][query]
            assert q["runs"]["spark sql rocksdb"][0]["state_store"] == \
                "RocksDBStateStoreProvider"
            assert q["runs"]["spark sql"][0]["read_schema"] == [
                "struct<user:string>" if query == "keyed" else "struct<ts:double,user:string>"]
