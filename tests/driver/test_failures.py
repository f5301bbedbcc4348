"""What a user sees when a job fails: one clear cause, at once, on one screen.

Each job runs as a user's script would, in a subprocess (tests/failing_jobs.py), and the
test reads its output: at most ~20 lines, cutline's cause first and last, no Java frames,
the log file it names exists; a failure that repeats on a retry fails the job within
seconds (never at the checkpoint timeout, which is 600 s here) and is never retried.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from failing_jobs import CASES

HERE = Path(__file__).resolve().parents[1]  # tests/, with failing_jobs.py
SCRIPT = HERE / "failing_jobs.py"
JAVA_FRAME = re.compile(r"^\s+at [\w$.]+\(|Py4JJavaError|org\.apache\.spark\.\w+Exception")


def run_script(case: str, engine: str, tmp_path: Path, timeout: float = 300):
    env = dict(os.environ, PYTHONPATH=str(HERE), CUTLINE_LOG_DIR=str(tmp_path / "logs"))
    env.pop("PYTEST_CURRENT_TEST", None)
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, str(SCRIPT), case, engine, str(tmp_path)],
                          capture_output=True, text=True, env=env, timeout=timeout, cwd=tmp_path)
    return proc, time.monotonic() - t0


def check_output(proc, cause: str) -> list[str]:
    """The output a user reads: short, cause first and last, no Java, a log file named."""
    out = (proc.stdout + proc.stderr).strip()
    lines = out.splitlines()
    assert proc.returncode != 0, out
    assert len(lines) <= 20, f"{len(lines)} lines:\n{out}"
    assert not any(JAVA_FRAME.search(ln) for ln in lines), out
    assert cause in lines[0], out
    assert cause in lines[-1] and "JobFailed" in lines[-1], out
    logs = [ln.rsplit(": ", 1)[-1] for ln in lines if ln.startswith("cutline: the task's")]
    assert logs and Path(logs[0]).is_file(), out
    return lines


@pytest.mark.parametrize("case", ["user", "sink_pickle", "keyby_pickle", "config",
                                  "unhashable", "sink_not_a_dir", "sink_denied"])
def test_a_failing_job_on_threads_says_why_in_a_few_lines(tmp_path, case):
    proc, took = run_script(case, "threads", tmp_path, timeout=120)
    check_output(proc, CASES[case])
    assert took < 60, f"the job took {took:.0f} s to fail"


@pytest.mark.slow
@pytest.mark.parametrize("case", ["sink_pickle", "keyby_pickle", "config", "sink_not_a_dir",
                                  "sink_denied"])
def test_a_repeating_failure_on_spark_fails_at_once_in_a_few_lines(tmp_path, case):
    proc, _ = run_script(case, "spark", tmp_path)
    lines = check_output(proc, CASES[case])
    log = Path([ln.rsplit(": ", 1)[-1] for ln in lines
                if ln.startswith("cutline: the task's")][0]).read_text()
    # Spark's own output went to the log file, and the stage was never retried
    assert "log4j" in log or "WARN" in log
    assert not re.search(r"stage 0\.[1-9]", log), "Spark retried the stage"


def wait_for(predicate, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


@pytest.mark.parametrize("engine", ["threads", pytest.param("spark", marks=pytest.mark.slow)])
def test_ctrl_c_stops_cleanly_and_says_how_to_resume(tmp_path, engine):
    env = dict(os.environ, PYTHONPATH=str(HERE), CUTLINE_LOG_DIR=str(tmp_path / "logs"))
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "interrupt", engine, str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    job = tmp_path / "checkpoints" / "failing-interrupt"
    try:
        wait_for(lambda: any(job.glob("chk-*/_metadata")), 240)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    lines = (out + err).strip().splitlines()
    assert proc.returncode != 0
    assert len(lines) <= 10, "\n".join(lines)
    assert not any(JAVA_FRAME.search(ln) for ln in lines), "\n".join(lines)
    text = "\n".join(lines)
    assert "interrupted" in lines[0] and "KeyboardInterrupt" in lines[-1], text
    chk = re.search(r"latest checkpoint is (\S+/chk-\d+)", text)
    assert chk, text
    assert Path(chk.group(1).removeprefix("file://"), "_metadata").is_file()
    assert "restore_from=" in text


PROGRESS_JOB = """
from cutline import CheckpointConfig, Pipeline
from cutline.connectors import DiscardSink, GeneratorSource
p = Pipeline("progress", parallelism=1, checkpoint=CheckpointConfig(
    interval=0.2, storage="file://{d}/chk"))
p.source(GeneratorSource(count=4000, rate=4000)).sink(DiscardSink())
p.run(engine="threads")
print("done")
"""


def run_in_terminal(code: str, env: dict) -> str:
    """Run ``code`` with its stdout and stderr on a pseudo-terminal, as in a user's shell."""
    import pty

    main_fd, child_fd = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=child_fd, stderr=child_fd,
                            env=env)
    os.close(child_fd)
    out = b""
    while True:
        try:
            chunk = os.read(main_fd, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    proc.wait(60)
    os.close(main_fd)
    return out.decode(errors="replace")


def test_progress_is_shown_in_a_terminal_and_not_in_ci_or_a_pipe(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "BUILD_NUMBER",
                                                            "TEAMCITY_VERSION", "TF_BUILD")}
    env["TERM"] = "xterm"
    code = PROGRESS_JOB.format(d=tmp_path / "a")
    assert "records/s" in run_in_terminal(code, env)
    assert "records/s" not in run_in_terminal(PROGRESS_JOB.format(d=tmp_path / "b"),
                                              dict(env, CI="true"))
    piped = subprocess.run([sys.executable, "-c", PROGRESS_JOB.format(d=tmp_path / "c")],
                           capture_output=True, text=True, env=env, timeout=60)
    assert piped.stdout.strip() == "done" and "records/s" not in piped.stderr


def test_a_log_file_deleted_by_another_driver_while_pruning_is_no_error(tmp_path, monkeypatch):
    """Two drivers starting at once both prune the log directory: a file the other one
    deleted between listing and reading its time (here: a dangling link) is skipped."""
    from cutline.driver.logs import KEEP, new_log_file

    monkeypatch.setenv("CUTLINE_LOG_DIR", str(tmp_path))
    (tmp_path / "gone.log").symlink_to(tmp_path / "deleted-meanwhile.log")
    for i in range(KEEP + 2):
        (tmp_path / f"old-{i}.log").write_text("x")
    path = new_log_file("spark")
    assert path.exists() and len(list(tmp_path.glob("*.log"))) <= KEEP + 1
