"""Smoke test: ``bench/kafka.py --quick`` on tiny sizes runs every section (throughput,
latency, Nexmark from Kafka) against its own Tansu broker, checks every run's output, prints
its tables and writes JSON and the plot.  Numbers are not checked: this is a benchmark, not a
test."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("confluent_kafka")

BENCH = Path(__file__).resolve().parents[2] / "bench" / "kafka.py"


@pytest.mark.slow
def test_kafka_bench_quick(tmp_path):
    out = tmp_path / "kafka.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--records", "3000", "--rate", "500",
         "--latency-seconds", "2", "--warmup", "0.5", "--nexmark-events", "3000",
         "--out", str(out)],
        capture_output=True, text=True, timeout=900,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert out.exists(), proc.stdout[-5000:] + proc.stderr[-5000:]
    assert "Kafka -> keyed count -> Kafka, 3,000 records" in proc.stdout, proc.stdout
    result = json.loads(out.read_text())
    # Every run's output checked, none failed: the live watchers' misses of before (Tansu
    # answering a fetch with a batch stored after one still being stored) are fetched
    # again now, as KafkaSource does.
    assert result["quick"] is True and not result["errors"], result["errors"]
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-5000:]
    assert result["cpus"] and result["load"]["before"] and result["versions"]["librdkafka"]
    cases = {r["case"]: r for r in result["throughput"]}
    for name in ("cutline kafka EO 1 s", "cutline kafka ALO 0.1 s", "cutline files 1 s",
                 "bare consumer", "bare consumer + json + count"):
        assert cases[name]["rate"] > 0, (name, cases)
    assert cases["cutline kafka EO 1 s"]["output_records"] == 3000  # one per input record
    assert cases["cutline kafka EO 1 s"]["duplicates"] == 0
    bytewax = result["bytewax"]
    assert bytewax["usable"] == ("bytewax kafka ALO 1 s" in cases), bytewax
    assert bytewax["usable"] or bytewax["why"]  # measured, or said why not
    latency = {r["case"]: r for r in result["latency"]}
    names = ("cutline kafka EO 0.1 s", "cutline kafka ALO 1 s", "cutline files 0.1 s")
    for name in names:
        assert latency[name]["p99"] > 0 and latency[name]["measured"] > 0, (name, latency)
        assert latency[name]["gaps_refetched"] >= 0, latency[name]
    assert [r["query"] for r in result["nexmark"]] == ["q0", "q5", "q7"]
    for row in result["nexmark"]:
        assert row["generator"] > 0 and row["kafka"] > 0, row
    for plot in result["plots"]:
        assert Path(plot).stat().st_size > 0
