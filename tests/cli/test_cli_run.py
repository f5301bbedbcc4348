"""``cutline run FILE`` as a user runs it (the ``cutline`` console script): a pipeline script
with or without build(), a module-level pipeline, and the files it cannot run, each told
what the file must define (issue 29)."""

from __future__ import annotations

import collections
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

CUTLINE = shutil.which("cutline", path=str(Path(sys.executable).parent)) or "cutline"

PIPELINE = """
    import json, sys, tempfile
    from cutline import CheckpointConfig, Pipeline
    from cutline.connectors import CollectSink, GeneratorSource

    tmp = tempfile.mkdtemp()
    p = Pipeline("words", parallelism=2,
                 checkpoint=CheckpointConfig(interval=0.2, storage=f"file://{tmp}/ck"))
    sink = CollectSink(f"{tmp}/out")
    (p.source(GeneratorSource(count=RECORDS, fn=lambda i: f"w{i % 5}"), uid="src")
       .key_by(lambda w: w).count(uid="count").sink(sink, uid="out"))
"""


def _want(records: int) -> list:
    totals = collections.Counter(f"w{i % 5}" for i in range(records))
    return sorted([w, k] for w, n in totals.items() for k in range(1, n + 1))


def cutline(tmp_path: Path, source: str, *args: str) -> subprocess.CompletedProcess:
    program = tmp_path / "program.py"
    program.write_text(textwrap.dedent(source))
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    env.pop("CUTLINE_DASHBOARD", None)
    return subprocess.run([CUTLINE, "run", str(program), *args], capture_output=True,
                          text=True, timeout=240, cwd=tmp_path, env=env)


def test_a_pipeline_script_without_build_runs_as_python_would(tmp_path):
    """The issue's case: the script runs its pipeline at the top level (it ran, then
    `cutline run` exited 2 saying it defines no build())."""
    p = cutline(tmp_path, PIPELINE.replace("RECORDS", "2000") + """
    p.run(engine="threads", progress=False)
    print(json.dumps(sorted(sink.results())))
    """)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout.splitlines()[-1]) == _want(2000)


def test_a_script_gets_its_own_arguments_and_exit_status(tmp_path):
    p = cutline(tmp_path, """
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, required=True)
    args = ap.parse_args()
    """ + PIPELINE.replace("RECORDS", "args.records") + """
    def main():
        p.run(engine="threads", progress=False)
        print(json.dumps(sorted(sink.results())))
        return 3

    if __name__ == "__main__":
        raise SystemExit(main())
    """, "--records", "700")
    assert p.returncode == 3, p.stderr
    assert json.loads(p.stdout.splitlines()[-1]) == _want(700)


def test_a_module_level_pipeline_is_run_with_the_run_options(tmp_path):
    p = cutline(tmp_path, PIPELINE.replace("RECORDS", "1500") + """
    def after_run(result):
        print(json.dumps(sorted(sink.results())))
        return 0
    p.after_run = after_run
    """, "--engine", "threads")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout.splitlines()[-1]) == _want(1500)
    assert "chk-" in p.stdout or "checkpoint" in p.stdout  # the run's checkpoint table


def test_a_script_that_fails_shows_its_traceback(tmp_path):
    p = cutline(tmp_path, """
    def parse(line):
        raise ValueError("bad line 7")
    parse("x")
    """)
    assert p.returncode == 1
    assert "Traceback" in p.stderr and "ValueError: bad line 7" in p.stderr


@pytest.mark.parametrize("source, message", [
    ("x = 1\n", "program.py defines no build() function, runs nothing itself and defines no "
                "Pipeline or ProcessGraph at module level. `cutline run FILE` runs (1) a "
                "function build() returning a Pipeline or a ProcessGraph"),
    ("from cutline import Pipeline\na = Pipeline('a')\nb = Pipeline('b')\n",
     "defines 2 Pipelines/ProcessGraphs at module level (a, b): which one to run?"),
    ("def build(records, storage='x'):\n    pass\n",
     "build() has parameters without defaults (records), which `cutline run` cannot give"),
    ("def build(:\n", "is not valid Python: invalid syntax (line 1)"),
])
def test_a_file_it_cannot_run_is_told_what_to_define(tmp_path, source, message):
    p = cutline(tmp_path, source)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert p.stderr.startswith("cutline: error: ") and message in p.stderr, p.stderr
    assert "Traceback" not in p.stderr


def test_a_build_program_still_runs(tmp_path):
    root = Path(__file__).resolve().parents[2]
    p = subprocess.run([CUTLINE, "run", str(root / "examples/bank.py"), "--engine", "threads",
                        "--snapshot-interval", "0.05", "--transfers", "300", "--rows", "2"],
                       capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "holds on every snapshot" in p.stdout


def test_a_helpers_run_call_does_not_make_a_module_level_pipeline_a_script(tmp_path):
    # a call inside a function runs nothing by itself: the module-level pipeline is run
    # (it ran nothing and exited 0: a review finding)
    p = cutline(tmp_path, PIPELINE.replace("RECORDS", "900") + """
    import subprocess
    def git_version():
        return subprocess.run(["git", "--version"], capture_output=True).stdout
    def after_run(result):
        print(json.dumps(sorted(sink.results())))
        return 0
    p.after_run = after_run
    """, "--engine", "threads")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout.splitlines()[-1]) == _want(900)


def test_a_script_imports_the_modules_beside_it_as_python_would(tmp_path):
    (tmp_path / "helpers_beside.py").write_text("RECORDS = 300\n")
    p = cutline(tmp_path, "from helpers_beside import RECORDS\n" +
                textwrap.dedent(PIPELINE).replace("RECORDS)", "RECORDS)") + """
p.run(engine="threads", progress=False)
print(json.dumps(sorted(sink.results())))
""")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout.splitlines()[-1]) == _want(300)


def test_run_options_a_pipeline_does_not_take_are_refused_naming_them(tmp_path):
    """Issue 29: `cutline run FILE` of a pipeline listed the process-graph options and
    silently ignored them (--tasks, --snapshot-interval, --diagram ...)."""
    p = cutline(tmp_path, PIPELINE.replace("RECORDS", "100") + """
    def after_run(result):
        print("RAN")
        return 0
    p.after_run = after_run
    """, "--engine", "threads", "--tasks", "3", "--snapshot-interval=0.1", "--diag", "x.png")
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert p.stderr.startswith(f"cutline run {tmp_path / 'program.py'}: error: --tasks, "
                               "--snapshot-interval, --diagram: options of process-graph "
                               "runs"), p.stderr
    assert "Pipeline(parallelism=...)" in p.stderr and "Traceback" not in p.stderr
    assert "RAN" not in p.stdout
    p = cutline(tmp_path, PIPELINE.replace("RECORDS", "100"), "--kill-after", "2")
    assert p.returncode == 2 and "--kill-after says when --kill kills" in p.stderr, p.stderr


def test_storage_is_the_pipelines_checkpoint_storage_and_a_refusal_is_one_line(tmp_path):
    storage = f"file://{tmp_path}/elsewhere"
    program = PIPELINE.replace("RECORDS", "300") + """
    def after_run(result):
        print(result.latest_checkpoint.path)
        return 0
    p.after_run = after_run
    """
    p = cutline(tmp_path, program, "--engine", "threads", "--storage", storage)
    assert p.returncode == 0, p.stderr
    final = p.stdout.splitlines()[-1]
    assert final.startswith(f"{storage}/words/chk-"), final
    # the same job on the same storage again: finished, refused in a line (no traceback)
    p = cutline(tmp_path, program, "--engine", "threads", "--storage", storage)
    assert p.returncode == 1, (p.stdout, p.stderr)
    assert p.stderr.startswith("cutline: error: job 'words' already finished"), p.stderr
    assert "Traceback" not in p.stderr
