"""Smoke test: ``bench/ab.py`` compares two versions side by side (here the last commit and
the working tree), each server importing its own checkout's cutline, and writes its table
and JSON.  Numbers are not checked: a benchmark, not a test."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "ab.py"


@pytest.mark.slow
def test_ab_quick_one_round(tmp_path):
    out = tmp_path / "ab.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--before", "HEAD", "--quick", "--rounds", "1",
         "--only", "vs_spark", "--out", str(out)],
        capture_output=True, text=True, timeout=900, env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 0, proc.stderr[-5000:]
    assert "after (worktree) / before (HEAD)" in proc.stdout, proc.stdout
    result = json.loads(out.read_text())
    assert result["errors"] == [], result["errors"]
    before, after = result["versions"]["before"], result["versions"]["after"]
    assert before["cutline_in_spark_task"].startswith(before["src"])
    assert after["cutline_in_spark_task"].startswith(after["src"])
    assert before["src"] != after["src"]
    assert {"vs_spark: records/s, stateless", "vs_spark: records/s, keyed"} <= \
        set(result["summary"])
    for name, row in result["summary"].items():
        if "records/s" in name:
            assert row["verdict"] == "noise not measured", row  # one round
        else:  # a short run may take no periodic checkpoint
            assert row["verdict"] in ("noise not measured", "n/a"), row


def test_ab_needs_a_before_revision():
    proc = subprocess.run([sys.executable, str(BENCH)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and "--before REV is required" in proc.stderr
