"""``cutline run`` / ``python examples/X.py`` and ``cutline snapshots list|show``, as a user
runs them (threads engine: no Spark start-up), and the simulator's demonstration that
predicates on inconsistent cuts are unsound."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cutline.cli import main
from cutline.sim.scenarios import inconsistent

ROOT = Path(__file__).resolve().parents[2]


def test_run_bank_then_list_show_and_restore(tmp_path, capsys):
    store = f"file://{tmp_path}/snaps"
    view, diagram = tmp_path / "view.png", tmp_path / "diagram.svg"
    code = main(["run", str(ROOT / "examples/bank.py"), "--engine", "threads",
                 "--snapshot-interval", "0.05", "--accounts", "5", "--transfers", "40",
                 "--storage", store, "--view", str(view), "--diagram", str(diagram),
                 "--format", "json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["stopped"] == "terminated" and not out["violations"]
    assert all(c["holds"] for s in out["snapshots"] for c in s["checks"]
               if c["kind"] == "invariant")
    assert view.read_bytes()[:4] == b"\x89PNG" and "<svg" in diagram.read_text()
    job = f"{tmp_path}/snaps/bank"
    assert main(["snapshots", "list", job]) == 0
    listing = capsys.readouterr().out
    assert "total conserved (500)" in listing and "chk-" in listing
    last = out["snapshots"][-1]["path"]
    assert main(["snapshots", "show", last, "--view", str(tmp_path / "s.svg")]) == 0
    shown = capsys.readouterr().out
    assert "A0" in shown and "balance" in shown and "terminated" in shown
    assert main(["snapshots", "show", job, "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert sum(s["balance"] for s in data["states"].values()) + sum(
        sum(m) for m in data["channels"].values()) == 500
    first = out["snapshots"][0]["path"]
    assert main(["run", str(ROOT / "examples/bank.py"), "--engine", "threads",
                 "--accounts", "5", "--transfers", "40", "--snapshot-interval", "0.05",
                 "--restore", first, "--storage", store]) == 0
    assert f"from {first}: " in capsys.readouterr().out


def test_examples_run_as_plain_python_programs():
    p = subprocess.run([sys.executable, str(ROOT / "examples/token_ring.py"), "--engine",
                        "threads", "--rounds", "5", "--hold", "0.002", "--snapshot-interval",
                        "0.01", "--rows", "3"], capture_output=True, text=True, timeout=120,
                       cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert "mutual exclusion: holds on every snapshot" in p.stdout
    assert "run ended: terminated" in p.stdout


@pytest.mark.parametrize("args, message", [
    (["run", "nope.py"], "no such program file"),
    (["run", "examples/bank.py", "--engine", "threads", "--kill"], "--kill needs --engine spark"),
    (["run", "examples/bank.py", "--view", "x.pdf"], "must end in .png or .svg"),
    (["run", "examples/bank.py", "--engine", "threads", "--restore", "/nonexistent/x"],
     "no such snapshot directory"),
    (["snapshots", "list", "/nonexistent/job"], "no such snapshot directory"),
])
def test_bad_arguments_get_clear_errors(args, message):
    p = subprocess.run([sys.executable, "-m", "cutline.cli", *args], capture_output=True,
                       text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert message in p.stderr


def test_program_help_lists_its_own_options():
    p = subprocess.run([sys.executable, "-m", "cutline.cli", "run", "examples/bank.py",
                        "--help"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert p.returncode == 0
    assert "--accounts" in p.stdout and "number of accounts" in p.stdout
    assert "--snapshot-interval" in p.stdout and "--restore" in p.stdout


def test_states_read_without_markers_give_false_totals_and_false_termination(capsys):
    r = inconsistent.run()
    assert r.snapshot_totals and all(t == r.expected_total for t in r.snapshot_totals)
    naive = [x.value for x in r.token_reads]
    assert any(v > r.expected_total for v in naive), "no read created money"
    assert any(v < r.expected_total for v in naive)
    assert any(x.orphans for x in r.token_reads)  # the checker calls those cuts inconsistent
    assert r.naive_early and all(said < ended for _, said, ended in r.naive_early)
    assert r.snapshot_early == 0
    assert main(["simulate", "inconsistent", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["snapshot_early_termination"] == 0
