"""``cutline checkpoints list|show`` as a user runs them (the console script, piped) and
``cutline.state.read`` of a window operator, on a windowed job whose windows all stay in
its final checkpoint (issue 29)."""

from __future__ import annotations

import collections
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import cutline.state
from cutline import CheckpointConfig, Pipeline, tumbling
from cutline.connectors import CollectSink, GeneratorSource
from cutline.storage.checkpoints import CheckpointStorage

CUTLINE = shutil.which("cutline", path=str(Path(sys.executable).parent)) or "cutline"
N = 1000
KEYS = 5


def _event(i):
    return (f"k{i % KEYS}", float(i))  # (key, event time in seconds), in order


def _key(e):
    return e[0]


def _ts(e):
    return e[1]


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """A tumbling 100 s count per key; its allowed lateness keeps every window (fired) in
    the final checkpoint.  A savepoint is taken while it runs."""
    tmp = tmp_path_factory.mktemp("cli-checkpoints")
    # a long storage path: piped tables must show it whole
    storage = f"file://{tmp}/a-storage-folder-with-a-rather-long-name/checkpoints"
    p = Pipeline("windowed-job", parallelism=2,
                 checkpoint=CheckpointConfig(interval=0.2, storage=storage))
    (p.source(GeneratorSource(count=N, fn=_event, rate=1500), uid="events")
       .assign_timestamps(_ts, max_delay=0, uid="stamps")
       .key_by(_key)
       .window(tumbling(100), allowed_lateness=1_000_000).count(uid="window-counts")
       .sink(CollectSink(str(tmp / "out")), uid="out"))
    running = p.start(engine="threads")
    savepoint = running.savepoint(timeout=120)
    running.result(timeout=120)
    final = CheckpointStorage(storage, p.name).latest().path
    return storage, p.name, savepoint, final


def cli(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}  # rich's own default: 80
    return subprocess.run([CUTLINE, *args], capture_output=True, text=True, timeout=120,
                          env=env)


def _expected_windows() -> dict:
    want: dict = collections.Counter()
    for i in range(N):
        k, t = _event(i)
        start = int(t // 100) * 100
        want[(k, start, start + 100)] += 1
    return dict(want)


def test_list_marks_the_final_checkpoint_and_the_savepoint_in_a_piped_table(job):
    storage, name, savepoint, final = job
    p = cli("checkpoints", "list", storage, name)
    assert p.returncode == 0, p.stderr
    assert "…" not in p.stdout  # not cut at 80 columns
    rows = {line.split("│")[1].strip(): line for line in p.stdout.splitlines()
            if line.count("│") > 3 and line.split("│")[1].strip().isdigit()}
    sp_id, final_id = (re.search(r"(?:chk|savepoint)-(\d+)", path.rsplit("/", 1)[-1])[1]
                       for path in (savepoint, final))
    assert "savepoint" in rows[sp_id] and savepoint in rows[sp_id]
    assert "final checkpoint" in rows[final_id] and final in rows[final_id]
    others = [line for i, line in rows.items() if i not in (sp_id, final_id)]
    assert all("final" not in line and "savepoint" not in line for line in others)
    data = json.loads(cli("checkpoints", "list", storage, name, "--format", "json").stdout)
    assert [r["id"] for r in data if r["final"]] == [int(final_id)]
    assert [r["id"] for r in data if r["kind"] == "savepoint"] == [int(sp_id)]


def test_show_counts_a_window_operators_keys_not_its_key_groups(job):
    _, _, _, final = job
    p = cli("checkpoints", "show", final)
    assert p.returncode == 0, p.stderr
    assert "…" not in p.stdout and "final checkpoint" in p.stdout
    row = next(line for line in p.stdout.splitlines() if "window-counts" in line)
    cells = [c.strip() for c in row.split("│")]
    header = next(line for line in p.stdout.splitlines() if "operator" in line)
    columns = [c.strip() for c in header.split("┃")]
    assert cells[columns.index("keys")] == str(KEYS)
    data = json.loads(cli("checkpoints", "show", final, "--format", "json").stdout)
    assert data["final"] is True
    op = next(o for o in data["operators"] if o["uid"] == "window-counts")
    assert op["keys"] == KEYS


def test_state_read_of_a_window_operator_gives_its_windows(spark, job):
    _, _, _, final = job
    df = cutline.state.read(spark, final, "window-counts")
    assert df.columns == ["key", "start", "end", "accumulator", "fired"]
    rows = df.collect()
    got = {(r["key"], int(r["start"]), int(r["end"])): r["accumulator"] for r in rows}
    assert len(got) == len(rows)
    assert got == _expected_windows()
    assert all(r["fired"] for r in rows)  # the end of input fired every one


def test_state_read_of_a_savepoint_taken_midway(spark, job):
    """The savepoint's windows: one the watermark fired holds all its records (the
    watermark passed its end in every source split, after them), an open one some."""
    _, _, savepoint, _ = job
    rows = cutline.state.read(spark, savepoint, "window-counts").collect()
    want = _expected_windows()
    for r in rows:
        n = want[(r["key"], int(r["start"]), int(r["end"]))]
        if r["fired"]:
            assert r["accumulator"] == n, r
        else:
            assert 0 < r["accumulator"] <= n, r
