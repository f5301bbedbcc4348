"""The ``cutline`` command as a user runs it."""

import json
import subprocess
import sys

import pytest

from cutline.cli import main


def run(*args):
    return subprocess.run([sys.executable, "-m", "cutline.cli", *args],
                          capture_output=True, text=True, timeout=300)


def test_lecture_json_is_exact():
    p = run("simulate", "lecture", "--format", "json")
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    assert data["processes"] == {"P1": ["A", "B"], "P2": ["F", "G", "H"], "P3": ["I"]}
    assert data["channels"]["P2->P1"] == ["H"]
    assert all(v == [] for k, v in data["channels"].items() if k != "P2->P1")


def test_lecture_table_and_diagram(tmp_path, capsys):
    out = tmp_path / "lecture.svg"
    assert main(["simulate", "lecture", "--diagram", str(out)]) == 0
    text = capsys.readouterr().out
    assert "F, G, H" in text and "consistent cut" in text
    assert "<svg" in out.read_text()


@pytest.mark.parametrize("name", ["tokens", "termination", "alignment"])
def test_scenarios_exit_zero_and_print_json(name, capsys):
    assert main(["simulate", name, "--format", "json"]) == 0
    json.loads(capsys.readouterr().out)


def test_explore_command(capsys):
    assert main(["explore", "--processes", "2", "--messages", "1", "--quiet"]) == 0
    assert "interleavings" in capsys.readouterr().out
    assert main(["explore", "--processes", "2", "--mode", "unaligned", "--topology", "dag",
                 "--snapshots", "2", "--overtake", "copy", "--quiet"]) == 0
    assert "overtaken records copied and left queued" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("args, message", [
    (["simulate", "nope"], "invalid choice: 'nope'"),
    (["simulate", "lecture", "--diagram", "x.pdf"], "must end in .png or .svg"),
    (["simulate", "tokens", "--processes", "1"], "--processes must be >= 2"),
    (["simulate", "tokens", "--processes", "two"], "must be a whole number"),
    (["explore", "--mode", "aligned", "--topology", "ring"], "needs a source"),
])
def test_bad_arguments_get_clear_errors(args, message):
    p = run(*args)
    assert p.returncode == 2
    assert message in p.stderr


def test_help_lists_scenarios():
    p = run("simulate", "--help")
    assert p.returncode == 0
    for name in ("lecture", "tokens", "termination", "alignment"):
        assert name in p.stdout
