"""Smoke test: ``bench/protocol.py --quick`` runs, prints its table and writes JSON."""

import json
import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "protocol.py"


def test_protocol_bench_quick(tmp_path):
    out = tmp_path / "protocol.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert proc.returncode == 0, proc.stderr
    assert "ratio" in proc.stdout or "records/s" in proc.stdout, proc.stdout
    result = json.loads(out.read_text())
    assert {c["case"] for c in result["cases"]} == {
        "bare loop",
        "bare loop again (noise control)",
        "handler, no checkpoint",
        "handler, one checkpoint in flight",
    }
    assert set(result["target"]) == {"aligned", "chandy_lamport", "unaligned"}
