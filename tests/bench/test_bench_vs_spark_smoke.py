"""Smoke test: ``bench/vs_spark.py --quick`` (small sizes) runs every workload on both
systems, each throughput run a fresh process timed from its spawn to its exit, prints the
ratio table and writes JSON and plots.  Numbers are not checked: this is a benchmark, not a
test."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "vs_spark.py"


@pytest.mark.slow
def test_vs_spark_bench_quick(tmp_path):
    out = tmp_path / "vs_spark.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--smoke", "--records", "8000", "--latency-seconds", "2.5",
         "--warmup", "0.5", "--rate", "300", "--window-latency-seconds", "13", "--no-profile",
         "--keep-loaded", "--out", str(out)],
        capture_output=True, text=True, timeout=900,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert proc.returncode == 0, proc.stderr[-5000:]
    assert "cutline vs Spark: ratios (cutline / Spark)" in proc.stdout, proc.stdout
    result = json.loads(out.read_text())
    assert result["quick"] is True
    assert result["errors"] == [], result["errors"]
    assert result["failures"] == [], result["failures"]
    conditions = result["conditions"]
    assert conditions["cores"] >= 1 and conditions["versions"]["pyspark"]
    assert conditions["input"]["files"] >= 2 and conditions["load_during"]["samples"]
    workloads = {row["workload"] for row in result["summary"]}
    assert workloads == {"stateless", "keyed", "keyed-sql", "windowed"}, workloads
    # cpu rows: the columnar path against Spark SQL and the per-record path (issue 15)
    assert {row["kind"] for row in result["summary"]} == {"throughput", "latency", "cpu"}
    assert sum("columnar" in row["case"] for row in result["summary"]) == 8
    assert result["skipped"] == {}
    # workload 4: cutline's window counts equal Spark SQL's, and both the input's
    check = result["windowed_check"]
    assert check["cutline_equals_spark_sql"] and check["every_run_equals_the_input_counts"]
    for name, runs in result["runs"].items():
        if name.startswith("lat | windowed"):  # windows closed, were measured and are right
            assert all(r["n"] > 0 and r["output"]["ok"] for r in runs), (name, runs)
    for row in result["summary"]:
        assert row["ratio"] is not None and row["ratio"] > 0, row
        if row["kind"] == "throughput":  # end to end the headline, processing beside it
            assert row["key"] == "rate_end_to_end" and row["ratio_processing"] > 0, row
    for name, runs in result["runs"].items():
        assert all(r is not None for r in runs), name
        if name.startswith("tp |"):
            for r in runs:  # a fresh process: its start-up is in end to end, not processing
                assert r["output"]["ok"], (name, r)
                assert r["end_to_end"] > r["processing"] > 0, (name, r)
                assert r["rate_end_to_end"] == pytest.approx(r["records"] / r["end_to_end"])
                assert r["load"]["others_mean"] is not None and "loaded" in r, (name, r)
                assert r["cpu_all"] > 0 and r["master"].startswith("local["), (name, r)
    for plot in result["plots"]:
        assert Path(plot).stat().st_size > 0


@pytest.mark.slow
def test_vs_spark_bench_fails_on_a_wrong_output(tmp_path):
    """``--break-output``: cutline's pipelines drop one event; the keyed runs' check (each
    user's last count against the input's) fails them, and the benchmark exits with 1."""
    out = tmp_path / "vs_spark.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--workloads", "3", "--only", "throughput",
         "--records", "4000", "--rounds", "1", "--max-warmup", "1", "--cutline-only",
         "--keep-loaded", "--break-output", "--out", str(out)],
        capture_output=True, text=True, timeout=900, env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "FAILED" in proc.stdout
    assert "warm-up tp | keyed | cutline" in proc.stdout  # a warm-up round, not counted
    result = json.loads(out.read_text())
    assert result["break_output"] is True
    assert len(result["warm_up"]["tp | keyed | cutline"]["end_to_end"]) == 1
    (wrong,) = result["failures"]  # --cutline-only: the per-record pipeline's run
    assert wrong["case"] == "tp | keyed | cutline", wrong
    assert wrong["error"].startswith("wrong output") and "'users_wrong': 1" in wrong["error"]
    # the failed runs count in no figure
    assert all(r is None for name, runs in result["runs"].items() for r in runs
               if name.startswith("tp |")), result["runs"]


def test_vs_spark_bench_rejects_bad_arguments():
    for args, message in ((["--rate", "-5"], "must be a finite number > 0"),
                          (["--records", "many"], "expected a whole number"),
                          (["--latency-seconds", "2", "--warmup", "3"], "must be shorter"),
                          (["--only", "everything"], "invalid choice")):
        proc = subprocess.run([sys.executable, str(BENCH), *args], capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 2, (args, proc.stderr)
        assert message in proc.stderr, (args, proc.stderr)
