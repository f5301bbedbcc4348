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


def _table(stdout: str) -> dict[str, dict[str, str]]:
    """A piped ``checkpoints show`` table: operator (its first cell) -> column -> cell."""
    lines = stdout.splitlines()
    header = next(line for line in lines if line.startswith("┃"))
    columns = [c.strip() for c in header.split("┃")]
    rows = {}
    for line in lines:
        if line.startswith("│"):
            cells = [c.strip() for c in line.split("│")]
            rows[cells[1]] = dict(zip(columns, cells))
    return rows


def test_show_names_operators_as_the_dashboard_does_with_their_uids(job):
    """Issue 29: the window's results operator showed as its made-up uid
    (``window_results-N``) though the window is named; the dashboard says
    ``window-counts: results``."""
    _, _, _, final = job
    p = cli("checkpoints", "show", final)
    assert p.returncode == 0, p.stderr
    rows = _table(p.stdout)
    results = rows["window-counts: results"]
    assert results["kind"] == "window_results"
    assert re.fullmatch(r"window_results-\d+", results["uid"])
    assert rows["window-counts"]["uid"] == ""  # the user's uid is its name
    data = json.loads(cli("checkpoints", "show", final, "--format", "json").stdout)
    by_uid = {o["uid"]: o for o in data["operators"]}
    assert by_uid[results["uid"]]["name"] == "window-counts: results"
    assert by_uid["window-counts"]["name"] == "window-counts"


def test_show_of_a_job_directory_shows_its_latest_checkpoint_saying_so(job):
    """Issue 29: ``show <job dir>`` said "no completed checkpoint at .../job (partial: no
    _metadata)"."""
    storage, name, _, final = job
    job_dir = f"{storage}/{name}"
    p = cli("checkpoints", "show", job_dir)
    assert p.returncode == 0, p.stderr
    first = p.stdout.splitlines()[0]
    assert first == (f"job directory {job_dir}: its latest completed checkpoint, "
                     f"{final.rsplit('/', 1)[-1]} (all of them: cutline checkpoints list "
                     f"{storage} {name})"), first
    assert f"final checkpoint {final.rsplit('-', 1)[-1]} of job {name!r} at {final}" \
        in p.stdout
    p = cli("checkpoints", "show", job_dir.removeprefix("file://"), "--format", "json")
    assert json.loads(p.stdout)["path"] == final  # the note goes to stderr
    assert "its latest completed checkpoint" in p.stderr


def test_show_of_a_storage_root_lists_its_jobs_and_a_failed_job_names_its_logs(job, tmp_path):
    storage, name, _, _ = job
    root = storage.removeprefix("file://")
    p = cli("checkpoints", "show", storage)  # one job there: that job's latest
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(f"checkpoint storage {storage}, its only job {name!r}: "
                               "its latest completed checkpoint, chk-")
    broken = Pipeline("broken", parallelism=1,
                      checkpoint=CheckpointConfig(interval=60, storage=storage))
    (broken.source(GeneratorSource(count=5), uid="numbers").map(_fail, uid="fail")
       .sink(CollectSink(str(tmp_path / "out")), uid="out"))
    with pytest.raises(cutline.JobFailed):  # before its first checkpoint
        broken.run(engine="threads", progress=False)
    p = cli("checkpoints", "show", storage)
    assert p.returncode == 1 and not p.stdout
    assert p.stderr == (f"cutline: error: {storage} is a checkpoint storage with 2 jobs "
                        f"(broken, {name}): show one of them, e.g. cutline checkpoints show "
                        f"{storage}/broken\n")
    p = cli("checkpoints", "show", f"{root}/broken")
    assert p.returncode == 1 and not p.stdout
    assert p.stderr.startswith(f"cutline: error: job 'broken' ({storage}/broken) has no "
                               "completed checkpoint: its runs failed or stopped before their "
                               "first one"), p.stderr
    assert p.stderr.rstrip().endswith(f"Its run logs: {root}/broken/logs"), p.stderr
    assert any(f.endswith(".log") for f in os.listdir(f"{root}/broken/logs"))
    # a checkpoint directory that is not complete keeps its own word
    p = cli("checkpoints", "show", f"{storage}/{name}/chk-999999")
    assert p.returncode == 1 and "no completed checkpoint at" in p.stderr
    assert "(no such directory)" in p.stderr


def _fail(x):
    raise ValueError(f"record {x} is not welcome")


def _reading(i):
    return (f"s{i % 37}", i / 10)  # 37 sensors, event time 0.0 .. 199.9 s


def test_show_counts_what_state_read_returns_and_the_fired_windows_apart(tmp_path):
    """Issue 29: on a finished job's final checkpoint, show counted 37 keys of a window
    operator whose state read returned no row: the state holds only the windows the end of
    input fired (remembered so that later records for them are late), counted as keys."""
    from cutline.state.reader import window_rows

    storage = f"file://{tmp_path}/checkpoints"
    p = Pipeline("sensors", parallelism=2,
                 checkpoint=CheckpointConfig(interval=0.2, storage=storage))
    (p.source(GeneratorSource(count=2000, fn=_reading), uid="readings")
       .assign_timestamps(_ts, max_delay=0, uid="stamps")
       .key_by(_key)
       .window(tumbling(7)).count(uid="per_sensor")
       .sink(CollectSink(str(tmp_path / "out")), uid="out"))
    final = p.run(engine="threads", progress=False).latest_checkpoint.path
    handle = CheckpointStorage(storage, "sensors").open(final)
    rows = list(window_rows(handle, "per_sensor"))  # what cutline.state.read returns
    assert rows == []  # every window fired, none kept (no allowed_lateness)
    data = json.loads(cli("checkpoints", "show", final, "--format", "json").stdout)
    op = next(o for o in data["operators"] if o["uid"] == "per_sensor")
    assert op["keys"] == len({r["key"] for r in rows}) == 0
    assert op["windows"] == len(rows) == 0
    assert op["fired_at_end"] == 37  # each sensor's last window, [196, 203): end of input
    p = cli("checkpoints", "show", final)
    assert p.returncode == 0, p.stderr
    row = _table(p.stdout)["per_sensor"]
    assert row["keys"] == "0" and row["windows"] == "0 + 37 fired at end"
    assert "fired at end: 37 the end of input fired, only remembered (no row, no key)" \
        in p.stdout


def test_show_counts_the_windows_state_read_returns_when_they_are_kept(job):
    from cutline.state.reader import window_rows
    from cutline.storage.checkpoints import open_checkpoint

    _, _, _, final = job
    rows = list(window_rows(open_checkpoint(final), "window-counts"))  # state.read's rows
    data = json.loads(cli("checkpoints", "show", final, "--format", "json").stdout)
    op = next(o for o in data["operators"] if o["uid"] == "window-counts")
    assert op["keys"] == len({r["key"] for r in rows}) == KEYS
    assert op["windows"] == len(rows) == len(_expected_windows())
    assert op["fired_at_end"] == 0


def test_show_in_a_narrow_terminal_drops_the_uids_not_the_names(job, monkeypatch):
    import io

    from rich.console import Console

    from cutline import cli as cutline_cli, terminal

    _, _, _, final = job
    out: dict[int, str] = {}
    for width in (120, 400):
        screen = Console(width=width, file=io.StringIO())
        monkeypatch.setattr(terminal, "console", lambda screen=screen, **_: screen)
        assert cutline_cli.main(["checkpoints", "show", final]) == 0
        out[width] = screen.file.getvalue()
    assert "window-counts: results" in out[400] and "window_results-" in out[400]
    assert "┃ uid " in out[400]
    assert "window_results-" not in out[120] and "┃ uid " not in out[120]
