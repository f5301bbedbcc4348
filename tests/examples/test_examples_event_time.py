"""The event-time examples (sessions, windowed top-N) give the answer computed offline,
on the threads engine (the scripts themselves run on Spark: `python examples/X.py --kill`)."""

from __future__ import annotations

import collections
import importlib.util
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("mode", ["aligned", "unaligned"])
def test_sessions_equal_the_sessions_computed_offline(tmp_path, mode):
    ex = load("sessions")
    p, sink = ex.build(12_000, 10.0, f"file://{tmp_path}/ck", str(tmp_path / "out"), mode)
    p.run(engine="threads", timeout=120)
    rows = collections.Counter(sink.results())
    want = ex.expected(12_000, 10.0)
    assert rows == want and len(want) > 100
    assert len({r[3] for r in want}) > 10  # sessions of many lengths, not one per wave


def test_top_items_equal_the_ranking_computed_offline(tmp_path):
    ex = load("top_items")
    p, sink = ex.build(20_000, 3, f"file://{tmp_path}/ck", str(tmp_path / "out"))
    p.run(engine="threads", timeout=120)
    rows = collections.Counter(sink.results())
    assert rows == ex.expected(20_000, 3) and len({r[:2] for r in rows}) >= 20
