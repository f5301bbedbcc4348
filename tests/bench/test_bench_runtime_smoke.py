"""Smoke test: ``bench/runtime.py --quick`` runs every case on Spark, prints its summary
table and writes JSON (numbers are not checked: this is a benchmark, not a test)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "runtime.py"


@pytest.mark.slow
def test_runtime_bench_quick(tmp_path):
    out = tmp_path / "runtime.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert proc.returncode == 0, proc.stderr[-5000:]
    assert "cutline runtime benchmark: summary" in proc.stdout, proc.stdout
    for case in ("1. throughput", "2. checkpoint duration", "3. backpressure",
                 "4a. records/s, 1 task", "4b. records/CPU-s per task", "5. recovery",
                 "6. TLS"):
        assert case in proc.stdout, proc.stdout
    result = json.loads(out.read_text())
    assert result["quick"] is True
    assert result["errors"] == [], result["errors"]
    s = result["summary"]
    assert s["checkpoint_overhead"]["ratio"] > 0
    assert s["unaligned_vs_aligned"]["ratio"] > 0
    assert s["tls"]["ratio"] > 0
    per_task = s["per_task_rate"]
    for key in ("ratio_spark", "ratio_threads", "ratio_one_task", "ratio_per_cpu"):
        assert per_task[key] > 0, (key, per_task)
    assert s["recovery"]["output_exact"] is True
    for key in ("checkpoint_overhead", "unaligned_vs_aligned"):
        assert s[key]["verdict"] in ("PASS", "FAIL", "undecided")
