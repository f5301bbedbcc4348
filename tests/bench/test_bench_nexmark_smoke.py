"""Smoke tests of ``bench/nexmark.py --quick`` on a small input: throughput (each run its own
process, cutline per record and columnar, Spark SQL) with every run's output digest compared
between the systems, latency on both systems (Spark's rows from its memory sink), the
conditions recorded, tables, JSON and plots; ``--break-output`` (cutline's sink leaves out a
row) fails the benchmark.  Numbers are not checked: this is a benchmark, not a test.  (The
kill runs restart a Spark application from its checkpoint: minutes, and not the
benchmark's code under test.)"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "nexmark.py"


def nexmark(tmp_path, *args, timeout=900):
    out = tmp_path / "nexmark.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--events", "20000", "--keep-loaded",
         "--data", str(tmp_path / "data"), "--out", str(out), *args],
        capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "COLUMNS": "200"})
    return proc, (json.loads(out.read_text()) if out.exists() else None)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_nexmark_bench_quick(tmp_path):
    proc, result = nexmark(tmp_path, "--queries", "q1", "--only", "throughput", "--only",
                           "latency", "--latency-queries", "q1", "--short-trigger-queries",
                           "--latency-seconds", "4", "--warmup", "1")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "Nexmark throughput: end to end (process start to exit)" in proc.stdout, proc.stdout
    assert result["quick"] is True and result["failures"] == [], result["failures"]
    cond = result["conditions"]
    assert cond["cores"] >= 1 and len(cond["load_before"]) == 3 and cond["load_after"]
    assert cond["versions"]["pyspark"] and cond["versions"]["pyarrow"]
    tp = result["throughput"]
    assert tp["input"]["events"] == 20_000 and tp["input"]["files"]["files"] == 5
    q1 = tp["queries"]["q1"]
    assert q1["systems"] == ["cutline", "cutline columnar", "spark sql"]
    # every bid of 20,000 events (the sentinel's row left out), the same digest everywhere
    assert q1["check"]["failed"] == 0 and q1["check"]["digest"]["rows"] == 20_000 * 46 // 50
    for system, (run,) in q1["runs"].items():
        assert run["output_ok"] and run["digest"] == q1["check"]["digest"], system
        assert run["end_to_end"] >= run["processing"] > 0, (system, run)
        assert run["cpu"] > 0 and run["load"]["max"] >= 0 and "loaded" in run, system
        assert run.get("attempts", 1) == 1
    assert {r["system"] for r in result["summary"]} == set(q1["systems"])
    (head,) = result["headline"]
    assert head["query"] == "q1" and head["ratio"] > 0 and head["spark_system"] == "spark sql"
    (lat,) = result["latency"]
    assert lat["query"] == "q1" and lat["cutline_p99"] > 0, lat
    (spark_lat,) = result["runs"]["lat q1 spark default trigger"]
    assert spark_lat["sink"] == "memory" and spark_lat["dropped_batches"] == 2, spark_lat
    for plot in result["plots"]:
        assert Path(plot).stat().st_size > 0


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_nexmark_bench_fails_when_cutline_drops_a_row(tmp_path):
    proc, result = nexmark(tmp_path, "--queries", "q1", "--only", "throughput",
                           "--systems", "cutline columnar", "spark sql", "--break-output")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "FAILED" in proc.stdout
    (failure,) = result["failures"]
    assert failure["system"] == "cutline columnar" and failure["query"] == "q1", failure
    assert "output differs from spark" in failure["error"], failure
    assert result["throughput"]["queries"]["q1"]["runs"]["cutline columnar"] == [None]
    assert result["summary"][0]["failed"] == 1


def _nexmark_module():
    sys.path.insert(0, str(BENCH.parent))
    try:
        import nexmark as nx

        return nx
    finally:
        sys.path.remove(str(BENCH.parent))


def test_nexmark_digests_without_spark(tmp_path):
    """cutline's digest sink (rows, record batches, the update queries' last row per key,
    the sentinel's rows left out, ``--break-output``) and the comparison, without Spark."""
    import pyarrow as pa

    nx = _nexmark_module()
    rows = [(1, 2, 300, 4000, "ab"), (5, 6, 700, 8000, "cde"), (-1, -1, 9, 9, "sentinel")]
    w = nx.DigestSink(str(tmp_path / "a"), "q0").create_writer()
    w.open(0, 2, "job")
    w.write(rows)
    w.pre_commit(1)
    got = nx.read_digest(tmp_path / "a")
    assert got == {"rows": 2, "sums": [6, 8, 1000, 12000, 5]}
    cols = list(zip(*rows))
    batch = pa.RecordBatch.from_arrays([pa.array(c) for c in cols],
                                       names=["auction", "bidder", "price", "dateTime", "extra"])
    w = nx.DigestSink(str(tmp_path / "b"), "q0").create_writer()
    w.open(1, 2, "job")
    w.write([batch])
    w.pre_commit(1)
    assert nx.digests_equal(nx.read_digest(tmp_path / "b"), got)
    w = nx.DigestSink(str(tmp_path / "c"), "q0", broken=True).create_writer()
    w.open(0, 2, "job")
    w.write(rows)
    w.pre_commit(1)
    broken = nx.read_digest(tmp_path / "c")
    assert broken["rows"] == 1 and not nx.digests_equal(broken, got)
    # q18: the last row per (bidder, auction) counts, once per key
    w = nx.DigestSink(str(tmp_path / "d"), "q18").create_writer()
    w.open(0, 2, "job")
    w.write([(1, 2, 10, 5, "x"), (1, 3, 11, 6, "yy"), (1, 2, 12, 7, "zzz"), (-1, -1, 1, 1, "s")])
    w.pre_commit(1)
    assert nx.read_digest(tmp_path / "d") == {"rows": 2, "sums": [2, 5, 23, 13, 5]}
    # the same update stream as record batches (q18's columnar form): its last row per key
    w = nx.DigestSink(str(tmp_path / "e"), "q18").create_writer()
    w.open(0, 2, "job")
    names = ["bidder", "auction", "dateTime", "price", "extra"]
    w.write([pa.RecordBatch.from_pylist([dict(zip(names, r)) for r in part])
             for part in ([(1, 2, 10, 5, "x"), (1, 3, 11, 6, "yy")],
                          [(1, 2, 12, 7, "zzz"), (-1, -1, 1, 1, "s")])])
    w.pre_commit(1)
    assert nx.read_digest(tmp_path / "e") == {"rows": 2, "sums": [2, 5, 23, 13, 5]}
    assert nx.digests_equal({"rows": 1, "sums": [1.0 + 1e-12, 3]}, {"rows": 1, "sums": [1.0, 3]})
    assert not nx.digests_equal({"rows": 1, "sums": [1, 3]}, {"rows": 1, "sums": [1, 4]})
    assert nx.systems_of("q4") == ["cutline", "cutline columnar", "spark pandas udf",
                                   "spark pandas udf rocksdb"]
    assert nx.systems_of("q0") == ["cutline", "cutline columnar", "spark sql"]
    # a kill run counts results from before its kill (the default warm-up, 20 s, is past
    # the default kill, 10 s into 50 s of input: it hid the outage)
    assert nx.counted_from({"warmup": 20.0}, 10.0) == 5.0
    assert nx.counted_from({"warmup": 20.0}, None) == 20.0
