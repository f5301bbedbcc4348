"""A pipeline on the user's own SparkSession (``Pipeline.run(spark=session)``) is quiet: no
Spark progress bars over the live line, no Java frames when the program stops its session or
exits right after the run (or stops it right after a failed run), no PySpark pandas warning
(issue 29)."""

from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

# a Spark session started from scratch in a subprocess: minutes on a loaded machine
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SCRIPT = textwrap.dedent("""
    import json, sys, tempfile
    from pathlib import Path

    from cutline import CheckpointConfig, Pipeline
    from cutline.connectors import CollectSink, GeneratorSource
    from pyspark.sql import SparkSession

    # the user's own session, as they would build it: Spark's defaults (a progress bar)
    spark = SparkSession.builder.master("local[2]").appName("mine").getOrCreate()
    tmp = tempfile.mkdtemp()
    cfg = CheckpointConfig(interval=0.3, storage=f"file://{tmp}/ck")
    p = Pipeline("quiet", parallelism=2, checkpoint=cfg)
    sink = CollectSink(f"{tmp}/out")
    MODE = sys.argv[1]  # (a global of the script: Spark's workers get its value)

    def check(w):
        if MODE == "fail" and w == "w3":
            raise ValueError(f"record {w} is bad")
        return w

    (p.source(GeneratorSource(count=6000, fn=lambda i: f"w{i % 7}"), uid="src")
       .map(check, uid="check").key_by(lambda w: w).count(uid="count")
       .sink(sink, uid="out"))
    try:
        result = p.run(spark=spark, progress=False)
    except Exception as exc:
        print(json.dumps({"failed": str(exc)}))
        spark.stop()  # right after the failure
        sys.exit(0)
    print(json.dumps(sorted(sink.results())))
    if sys.argv[1] == "stop":
        spark.stop()
    # "exit": the program ends with the session running (Python's accumulator server goes)
""")

JAVA_FRAME = re.compile(r"^\s+at [\w.$]+[(.]", re.M)


@pytest.mark.parametrize("end", ["stop", "exit", "fail"])
def test_a_run_on_the_users_session_prints_no_spark_noise(tmp_path, end):
    script = tmp_path / "mine.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable,
           "PYSPARK_DRIVER_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    env.pop("CUTLINE_DASHBOARD", None)
    out = subprocess.run([sys.executable, str(script), end], capture_output=True, text=True,
                         env=env, timeout=840, cwd=tmp_path)
    err = out.stderr
    assert out.returncode == 0, err[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    if end == "fail":  # the cause, then the session stopped at once: no Spark error
        assert "ValueError: record w3 is bad" in got["failed"]
    else:  # exactly once: each word's running count 1..n once, as a plain count says
        totals = collections.Counter(f"w{i % 7}" for i in range(6000))
        want = sorted([w, k] for w, n in totals.items() for k in range(1, n + 1))
        assert got == want
    assert not JAVA_FRAME.search(err), err[-3000:]
    assert "[Stage " not in err, err[-3000:]  # Spark's console progress bar
    assert " ERROR " not in err, err[-3000:]
    assert "FutureWarning" not in err, err[-3000:]
