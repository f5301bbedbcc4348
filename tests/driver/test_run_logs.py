"""Logs per job and run (cutline.driver.logs.RunLog): beside the job's checkpoints on a local
disk, else in a per-user folder named by job; the newest runs of each job kept, never rotated
by another job; the console keeps what it printed before (WARNING and up) while the file takes
INFO too; Spark's output during the run is copied in."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from cutline.driver.logs import RUNS_KEPT, RunLog, run_log_dir
from cutline.storage.checkpoints import CheckpointStorage

ROOT = Path(__file__).resolve().parents[2]


def test_a_local_jobs_run_logs_live_beside_its_checkpoints(tmp_path, monkeypatch):
    monkeypatch.delenv("CUTLINE_LOG_DIR", raising=False)
    st = CheckpointStorage(f"file://{tmp_path}/chk", "daily")
    assert run_log_dir(st) == tmp_path / "chk" / "daily" / "logs"
    run = RunLog(st, "0123456789ab")
    run.close()
    assert run.path.parent == tmp_path / "chk" / "daily" / "logs"
    assert run.path.name.endswith("-0123456789ab.log")
    # a log folder is not a checkpoint: the storage's listing is unchanged
    assert st.completed() == [] and st.next_id() == 1


def test_cutline_log_dir_or_the_per_user_folder_when_not_local(tmp_path, monkeypatch, s3):
    st = CheckpointStorage(s3.url("logs"), "remote-job", s3.options)
    monkeypatch.delenv("CUTLINE_LOG_DIR", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert run_log_dir(st) == tmp_path / "state" / "cutline" / "logs" / "remote-job"
    monkeypatch.setenv("CUTLINE_LOG_DIR", str(tmp_path / "mine"))
    assert run_log_dir(st) == tmp_path / "mine" / "remote-job"
    local = CheckpointStorage(f"file://{tmp_path}/chk", "j")
    assert run_log_dir(local) == tmp_path / "mine" / "j"  # the user's choice wins


def test_each_job_keeps_its_newest_runs_and_no_other_job_rotates_them(tmp_path, monkeypatch):
    monkeypatch.delenv("CUTLINE_LOG_DIR", raising=False)
    a = CheckpointStorage(f"file://{tmp_path}/chk", "a")
    b = CheckpointStorage(f"file://{tmp_path}/chk", "b")
    first_a = RunLog(a, "aaaaaaaaaaaa")
    first_a.close()
    for i in range(RUNS_KEPT + 5):  # another job's runs
        RunLog(b, f"{i:012x}").close()
    assert first_a.path.exists()
    older = run_log_dir(a) / "20000101-000000-000000000000.log"
    older.write_text("old\n")
    for i in range(RUNS_KEPT - 1):
        RunLog(a, f"{i + 100:012x}").close()
    names = sorted(p.name for p in run_log_dir(a).iterdir())
    assert len(names) == RUNS_KEPT and older.name not in names
    assert len(list(run_log_dir(b).iterdir())) == RUNS_KEPT
    (run_log_dir(a) / "notes.txt").write_text("mine")  # not a run log: never deleted
    RunLog(a, "bbbbbbbbbbbb").close()
    assert (run_log_dir(a) / "notes.txt").exists()


def test_spark_output_during_the_run_is_copied_in(tmp_path, monkeypatch):
    monkeypatch.delenv("CUTLINE_LOG_DIR", raising=False)
    spark_log = tmp_path / f"spark-session-{os.getpid()}.log"  # one per test: _COPIED
    spark_log.write_text("before this run\n")
    st = CheckpointStorage(f"file://{tmp_path}/chk", "j")
    run = RunLog(st, "cccccccccccc", spark_log=spark_log)
    with open(spark_log, "a") as f:
        f.write("WARN TaskSetManager: during the run\n")
    run.failure("cutline: job 'j' failed: boom", "Traceback ...\nValueError: boom")
    with open(spark_log, "a") as f:
        f.write("WARN after the failure\n")
    run.close()
    text = run.path.read_text()
    # the session's first run takes its start-up output too; the next one starts after it
    assert text.count("before this run") == 1
    assert text.count("during the run") == 1 and text.count("after the failure") == 1
    assert text.index("ValueError: boom") < text.index("during the run")
    with open(spark_log, "a") as f:
        f.write("WARN second run\n")
    second = RunLog(st, "eeeeeeeeeeee", spark_log=spark_log)
    second.close()
    assert second.path.read_text().count("WARN") == 1
    assert "second run" in second.path.read_text()


_SCRIPT = textwrap.dedent("""
    import logging, sys
    from cutline.driver.logs import RunLog
    from cutline.storage.checkpoints import CheckpointStorage
    run = RunLog(CheckpointStorage(sys.argv[1], "j"), "dddddddddddd")
    log = logging.getLogger("cutline.driver")
    log.info("checkpoint 1 completed")
    log.warning("cutline: something the user should see")
    run.close()
    log.warning("cutline: after the run")
    print(run.path)
""")


def _python(script: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """``script`` run by a fresh Python (no logging configured), its storage under tmp."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    env.pop("CUTLINE_LOG_DIR", None)
    proc = subprocess.run([sys.executable, "-c", script, f"file://{tmp_path}/chk"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc


def test_the_console_prints_what_it_did_and_the_file_takes_info_too(tmp_path):
    proc = _python(_SCRIPT, tmp_path)
    assert proc.stderr.splitlines() == ["cutline: something the user should see",
                                        "cutline: after the run"]
    text = Path(proc.stdout.strip()).read_text()
    assert "INFO cutline.driver [MainThread] checkpoint 1 completed" in text
    assert "WARNING cutline.driver [MainThread] cutline: something the user should see" in text
    assert "after the run" not in text



def test_a_runs_log_is_in_its_job_folder_and_checkpoints_show_names_it(tmp_path, capsys,
                                                                       monkeypatch):
    import json

    from cutline.cli import main
    from pipelines import wordcount

    monkeypatch.delenv("CUTLINE_LOG_DIR", raising=False)
    p, _ = wordcount(tmp_path, 200)
    p.run(engine="threads", progress=False)
    folder = tmp_path / "checkpoints" / "wordcount" / "logs"
    runs = list(folder.glob("*.log"))
    assert len(runs) == 1
    latest = CheckpointStorage(p.checkpoint.storage, p.name).latest().path
    assert main(["checkpoints", "show", latest, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["logs"] == str(folder)
    monkeypatch.setenv("COLUMNS", "300")
    assert main(["checkpoints", "show", latest]) == 0
    assert f"run logs: {folder}" in capsys.readouterr().out


def test_a_run_that_cannot_serve_its_dashboard_leaves_no_log_handler_behind(tmp_path):
    """The dashboard's port is taken: the run fails before it starts, and its log file is
    closed (its handler on the 'cutline' logger was left behind: every later run's records,
    and an open file, went on into it)."""
    import logging
    import socket

    import pytest

    from cutline import CheckpointConfig, Pipeline
    from cutline.connectors import CollectSink, GeneratorSource

    cutline_log = logging.getLogger("cutline")
    before = list(cutline_log.handlers)
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    try:
        p = Pipeline("busy-board", parallelism=1, checkpoint=CheckpointConfig(
            interval=1.0, storage=f"file://{tmp_path}/chk"))
        p.source(GeneratorSource(count=10)).sink(CollectSink())
        with pytest.raises(OSError, match="cannot serve the dashboard"):
            p.run(engine="threads", progress=False, dashboard=busy.getsockname()[1])
    finally:
        busy.close()
    assert cutline_log.handlers == before
    assert not list((tmp_path / "chk" / "busy-board").glob("_lease-*"))


_OVERLAP = textwrap.dedent("""
    import logging, sys
    from cutline.driver.logs import RunLog
    from cutline.storage.checkpoints import CheckpointStorage
    log = logging.getLogger("cutline.driver")
    a = RunLog(CheckpointStorage(sys.argv[1], "a"), "aaaaaaaaaaaa")
    b = RunLog(CheckpointStorage(sys.argv[1], "b"), "bbbbbbbbbbbb")
    a.close()
    log.info("b goes on after a ended")
    b.close()
    b.close()
    log.info("after both: nowhere")
    log.warning("cutline: the console as before")
    print(b.path, logging.getLogger("cutline").level, logging.getLogger("cutline").handlers)
""")


def test_runs_that_overlap_in_one_process_keep_info_until_the_last_ends(tmp_path):
    proc = _python(_OVERLAP, tmp_path)
    path, level, handlers = proc.stdout.split(" ", 2)
    assert "b goes on after a ended" in Path(path).read_text()
    assert "nowhere" not in Path(path).read_text()
    assert level == "0" and handlers.strip() == "[]"  # as it was before the runs
    assert proc.stderr.splitlines() == ["cutline: the console as before"]
