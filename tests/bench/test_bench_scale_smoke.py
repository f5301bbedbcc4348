"""Smoke tests of ``bench/scale.py`` at tiny sizes: one run per case in its own process, every
output checked against the input's counts, Spark's read schema checked, results JSON and the
exit code; ``--break-output`` (cutline drops one input record) fails the benchmark.
Numbers are not checked: this is a benchmark, not a test."""

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "scale.py"
TINY = ["--sizes", "3000", "--lines-per-file", "1000", "--rounds", "1", "--max-warmup", "0",
        "--spark-grid", "allx2", "--no-plot"]


def scale(tmp_path, *args, timeout=850):
    out = tmp_path / "scale.json"
    proc = subprocess.run([sys.executable, str(BENCH), *TINY, "--data", str(tmp_path / "data"),
                           "--out", str(out), *args],
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "COLUMNS": "250"})
    return proc, (json.loads(out.read_text()) if out.exists() else None)


@pytest.mark.timeout(900)  # about 40 s on a quiet machine; 300+ s seen at load 45 on 2 cores
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


@pytest.mark.timeout(900)
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
@pytest.mark.timeout(2400)
def test_scale_every_case_and_both_queries(tmp_path):
    proc, result = scale(tmp_path, "--sizes", "3000,6000", timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert result["failures"] == []
    # six systems for both queries at both sizes, and Bytewax (keyed only) when installed
    bytewax = importlib.util.find_spec("bytewax") is not None
    assert len(result["summary"]) == 2 * 2 * 6 + (2 if bytewax else 0)
    assert {r["query"] for r in result["summary"] if r["system"] == "bytewax -w2"} == \
        ({"keyed"} if bytewax else set())
    # growth where both sizes have a figure: runs at a load above 1.5 per core (this test
    # under the suite's other worker) are kept out of the figures, as in a real run
    growth = [r for r in result["summary"] if r["records"] == 6000 and "cost_growth" in r]
    assert all(r["cost_growth_of_records"] == 2.0 for r in growth)
    assert all(r.get("end_to_end") is None or r["records"] != 6000 or "cost_growth" in r
               or by_size_missing(result, r) for r in result["summary"])
    for size in result["sizes"]:
        for query in ("keyed", "window"):
            q = size["queries"][query]
            assert q["runs"]["spark sql rocksdb"][0]["state_store"] == \
                "RocksDBStateStoreProvider"
            assert q["runs"]["spark sql"][0]["read_schema"] == [
                "struct<user:string>" if query == "keyed" else "struct<ts:double,user:string>"]


def _bench_module(name):
    sys.path.insert(0, str(BENCH.parent))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(BENCH.parent))


def test_scale_checks_and_statistics(tmp_path):
    """The parts that decide a run's fate, without Spark: the output check (later
    checkpoints win; a missing or wrong key is named), the read-schema check, warm-up
    settling, the bootstrap interval and the load mark."""
    import pickle

    scale = _bench_module("scale")
    common = sys.modules["_common"]
    want = {"user_counts": {"u1": 3, "u2": 5}, "window_counts": {("u1", 60.0): 3}}
    out = tmp_path / "out"
    out.mkdir()
    (out / "0-00000001.pkl").write_bytes(pickle.dumps({"u1": 1, "u2": 5}))
    (out / "1-00000002.pkl").write_bytes(pickle.dumps({"u1": 3}))
    assert scale.check_output(scale.CUTLINE, "keyed", out, want) == {
        "keys": 2, "records_counted": 8, "ok": True}
    (out / "0-00000003.pkl").write_bytes(pickle.dumps({"u2": 4, "sentinel": 1}))
    with pytest.raises(common.RunFailed, match=r"at 1 of 2 keys, e.g. u2: 4 != 5"):
        scale.check_output(scale.CUTLINE, "keyed", out, want)
    scale.check_read_schema({"read_schema": ["struct<ts:double,user:string>"]}, "window")
    with pytest.raises(common.RunFailed, match="column pruning differs"):
        scale.check_read_schema({"read_schema": ["struct<ts:double,user:string>"]}, "keyed")
    assert not common.settled([10.0], 0.1) and common.settled([20.0, 10.5, 10.0], 0.1)
    assert not common.settled([10.0, 11.5], 0.1)
    lo, hi = common.bootstrap_ci([1.0, 2.0, 3.0, 4.0, 100.0])
    assert 1.0 <= lo <= 3.0 <= hi <= 100.0 and common.bootstrap_ci([1.0, 2.0]) is None
    assert common.is_loaded({"max": 3.1}, 2) and not common.is_loaded({"max": 2.9}, 2)
    # where the others' runnable threads were sampled, they decide, not the run's own load
    assert not common.is_loaded({"max": 3.4, "others_mean": 0.2}, 2)
    assert common.is_loaded({"max": 1.0, "others_mean": 0.8}, 2)
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:  # (a child of this process: in its own tree, not another's)
        samples = []
        for _ in range(20):
            time.sleep(0.05)
            samples.append(common.running_threads(os.getpid()))
    finally:
        busy.kill()
        busy.wait()
    assert any(mine >= 1 for _, mine in samples)
    assert all(total >= mine for total, mine in samples)
    # the sampling thread itself is no one's load (a run in this process: vs_spark's)
    assert any(common.running_threads(os.getpid())[1] == 0 for _ in range(5))
    runner = common.Runner(common.console(100))
    out = runner.run("sleeps", lambda: time.sleep(1.3) or {}, r=0, rounds=1)
    assert set(out["load"]) >= {"before", "max", "after", "others_mean"}
    assert out["load"]["others_mean"] is not None
    # a run in a fresh process brings its own sample (run_child's): kept as it is
    own = {"before": 1.0, "max": 1.0, "mean": 1.0, "others_mean": 0.0, "others_max": 0}
    out = runner.run("child", lambda: {"load": dict(own)}, r=0, rounds=1, sample_load=False)
    assert out["load"] == own
    assert scale.parse_grid("all,4,100x2", 20) == [
        (4, 2), (20, 2), (None, 2)]


def by_size_missing(result: dict, row: dict) -> bool:
    """The 3,000-record row of ``row``'s case has no figure (all its runs loaded)."""
    return not any(r["records"] == 3000 and r["query"] == row["query"]
                   and r["system"] == row["system"] and r.get("end_to_end")
                   for r in result["summary"])
