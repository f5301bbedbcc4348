"""The driver process dies (``kill -9``) mid-job; a new run pointed at the same checkpoint
storage resumes from the latest completed checkpoint.  Sink transactions that checkpoint
pre-committed, but that the dead driver never told the tasks to commit, are committed by the
new run exactly once: the output equals the failure-free output."""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cutline.storage.checkpoints import CheckpointStorage

from pipelines import expected_rows, wordcount

TESTS = Path(__file__).resolve().parents[1]  # tests/, with pipelines.py
N = 40_000

SCRIPT = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    sys.path.insert(0, {tests!r})
    from pipelines import wordcount
    from cutline.driver.shell import Driver
    from cutline.protocol import messages as m
    from cutline.protocol.job import Send
    from cutline.spark.launcher import embedded_session

    tmp, when = Path({tmp!r}), {when!r}
    original = Driver._perform

    def perform(self, commands):
        # die the moment checkpoint 2 is complete in storage, before any sink commits it
        for cmd in commands:
            if when == "before_commit" and type(cmd) is Send \
                    and type(cmd.msg) is m.Complete and cmd.msg.checkpoint >= 2:
                os.kill(os.getpid(), signal.SIGKILL)
        return original(self, commands)

    Driver._perform = perform
    p, _ = wordcount(tmp, {n}, "aligned", rate=6_000, interval=0.3)
    if when == "later":
        import threading, time
        def killer():
            storage = None
            while True:
                time.sleep(0.05)
                d = tmp / "checkpoints" / "wordcount"
                if len([x for x in d.glob("chk-*/_metadata")]) >= 1:
                    time.sleep(1.3)
                    os.kill(os.getpid(), signal.SIGKILL)
        threading.Thread(target=killer, daemon=True).start()
    p.run(spark=embedded_session(2))
    print("the driver was not killed")
""")


@pytest.mark.slow
@pytest.mark.parametrize("when", ["before_commit", "later"])
def test_a_new_run_after_the_driver_died_is_exact(spark, tmp_path, when):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT.format(tests=str(TESTS), tmp=str(tmp_path), when=when, n=N))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == -9, (proc.returncode, proc.stdout[-2000:], proc.stderr[-3000:])
    storage = CheckpointStorage(f"file://{tmp_path}/checkpoints", "wordcount")
    latest = storage.latest()
    assert latest is not None, "the dead run completed a checkpoint"
    if when == "before_commit":
        # its transactions were pre-committed but never committed by the dead driver
        assert latest.id >= 2
    p, sink = wordcount(tmp_path, N, "aligned", interval=0.3)
    result = p.run(spark=spark, timeout=240)
    assert result.restored_from == latest.path
    assert collections.Counter(sink.results()) == expected_rows(N)
