"""The embedded Spark's JVM with its class-data archive, as users' programs run it: the
first program's JVM writes the archive as it exits, the next one maps it and computes the
same; an archive changed since its check is not mapped (a JVM that maps a file cut short
crashes with SIGBUS) and the run goes on, writing a new one.  No word of it on the console."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SCRIPT = textwrap.dedent("""
    import json, sys, tempfile
    from cutline import CheckpointConfig, Pipeline
    from cutline.connectors import CollectSink, GeneratorSource
    from cutline.spark import cds, launcher

    tmp = tempfile.mkdtemp()
    p = Pipeline("words", parallelism=2,
                 checkpoint=CheckpointConfig(interval=0.5, storage=f"file://{tmp}/ck"))
    sink = CollectSink(f"{tmp}/out")
    (p.source(GeneratorSource(count=3000, fn=lambda i: f"w{i % 5}"), uid="src")
       .key_by(lambda w: w).count(uid="count").sink(sink, uid="out"))
    p.run(progress=False)
    sc = launcher.embedded_context(2).sparkContext
    archives = sorted(cds.archive_dir().glob("*.jsa"))
    print(json.dumps({"mapped": [cds.mapped(sc, a) for a in archives],
                      "out": sorted(sink.results()), "jvm": sc._gateway.proc.pid}))
""")


def _run(tmp_path: Path, folder: Path) -> tuple[dict, str]:
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable,
           "PYSPARK_DRIVER_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1",
           "CUTLINE_CDS_DIR": str(folder)}
    env.pop("CUTLINE_SPARK_CDS", None)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         env=env, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def _gone(*pids: int, timeout: float = 240.0) -> None:
    """Wait until the JVMs ``pids`` (which may write an archive as they exit) are gone."""
    deadline = time.monotonic() + timeout
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.2)
        else:
            pytest.fail(f"the JVM {pid} did not exit")


def test_the_second_program_maps_the_archive_the_first_wrote(tmp_path):
    folder = tmp_path / "cds"
    totals = {f"w{k}": 600 for k in range(5)}
    want = sorted([w, n] for w, t in totals.items() for n in range(1, t + 1))
    first, err1 = _run(tmp_path, folder)
    assert first.pop("jvm") and first == {"mapped": [], "out": want}
    _gone(int(next(folder.glob("*.pid")).read_text().partition("\n")[0]))
    assert len(list(folder.glob("*.tmp"))) == 1  # written as the JVM exited
    second, err2 = _run(tmp_path, folder)
    _gone(second.pop("jvm"))  # (a file cut short under a JVM that maps it: SIGBUS)
    assert second == {"mapped": [True], "out": want}  # adopted after its trial, mapped
    assert [p.suffix for p in sorted(folder.iterdir())] == [".jsa", ".seal"]
    for err in (err1, err2):  # the JVM's words on archives stay off the console
        assert "cds" not in err.lower() and "shared archive" not in err.lower(), err[-2000:]

    archive = next(folder.glob("*.jsa"))
    archive.chmod(0o644)
    with open(archive, "r+b") as f:  # cut short since its check
        f.truncate(archive.stat().st_size // 2)
    third, err3 = _run(tmp_path, folder)
    assert third.pop("jvm") and third == {"mapped": [], "out": want}  # not mapped: the run goes on
    assert not archive.exists() and len(list(folder.glob("*.pid"))) == 1  # a new writer
    assert not list(tmp_path.glob("hs_err*")), "the JVM crashed"
    assert "archive" not in err3.lower(), err3[-2000:]
