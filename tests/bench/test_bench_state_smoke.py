"""Smoke test: ``bench/state.py --quick`` runs every case and writes its JSON (numbers are
not checked: a benchmark, not a test)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "state.py"


@pytest.mark.slow
def test_state_bench_quick(tmp_path):
    out = tmp_path / "state.json"
    proc = subprocess.run([sys.executable, str(BENCH), "--smoke", "--out", str(out)],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 0, proc.stderr[-5000:]
    result = json.loads(out.read_text())
    assert result["errors"] == [], result["errors"]
    assert [r["changed"] for r in result["bytes"]] == [0.01, 0.10]
    assert len(result["sizes"]) == 3 and result["count"]
    for kind in ("memory", "rocksdb"):
        assert set(result["rescale"][kind]) >= {"2->2", "2->1", "1->2"}
    assert "6. rescale 2 -> 1 -> 2" in proc.stdout
