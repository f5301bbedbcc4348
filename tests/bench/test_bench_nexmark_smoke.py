"""Smoke test: ``bench/nexmark.py --quick`` on a small input runs throughput (per record and
columnar) and latency on both systems, prints its tables and writes JSON and plots.  Numbers
are not checked: this is a benchmark, not a test.  (The kill runs restart a Spark
application from its checkpoint: minutes, and not the benchmark's code under test.)"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "nexmark.py"


@pytest.mark.slow
def test_nexmark_bench_quick(tmp_path):
    out = tmp_path / "nexmark.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--events", "20000", "--queries", "q1", "q7",
         "--only", "throughput", "--only", "latency", "--latency-queries", "q1",
         "--short-trigger-queries", "--latency-seconds", "4", "--warmup", "1",
         "--out", str(out)],
        capture_output=True, text=True, timeout=900,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert proc.returncode == 0, proc.stderr[-5000:]
    assert "Nexmark, 20,000 events: records/s at saturation" in proc.stdout, proc.stdout
    result = json.loads(out.read_text())
    assert result["quick"] is True and result["errors"] == [], result["errors"]
    assert [r["query"] for r in result["summary"]] == ["q1", "q7"]
    for row in result["summary"]:  # both forms of cutline, and Spark, measured
        assert row["cutline"] > 0 and row["cutline_columnar"] > 0 and row["spark"] > 0, row
        assert row["target"] == 1.5 and row["verdict"] in ("PASS", "FAIL", "undecided")
    for name, runs in result["runs"].items():
        assert all(r is not None for r in runs), name
        if name.split()[0] in ("q1", "q7") and name.endswith(("cutline", "columnar")):
            assert all(r["attempts"] == 1 for r in runs), (name, runs)
            if name.startswith("q1 "):  # every bid of 20,000 events, and the sentinel bid
                assert all(r["rows"] == 20_000 * 46 // 50 + 1 for r in runs), (name, runs)
    (lat,) = result["latency"]
    assert lat["query"] == "q1" and lat["cutline_p99"] > 0, lat
    for plot in result["plots"]:
        assert Path(plot).stat().st_size > 0
