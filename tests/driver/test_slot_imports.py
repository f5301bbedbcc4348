"""A slot of a pipeline with batch streams imports pandas (what pyarrow imports at a task's
first ``to_numpy``) on a thread while it starts; a per-record pipeline's slot does not."""

from __future__ import annotations

import sys
import threading
from types import SimpleNamespace

import pytest

from cutline import warm
from cutline.driver import run


def _spec(*columnar: bool) -> SimpleNamespace:
    nodes = [SimpleNamespace(columnar=c) for c in columnar]
    return SimpleNamespace(plan=SimpleNamespace(chains=[SimpleNamespace(nodes=nodes)]))


@pytest.mark.parametrize("columnar, imports", [((False, False), []),
                                               ((False, True), [run.COLUMNAR_IMPORTS])])
def test_a_columnar_slot_imports_pandas_while_it_starts(monkeypatch, columnar, imports):
    seen = []
    monkeypatch.setattr(run, "import_meanwhile", lambda names, why: seen.append(names))
    monkeypatch.setattr(run, "Slot", lambda spec, k: SimpleNamespace(run=lambda: {"slot": k}))
    assert run._slot_main(_spec(*columnar), 3) == {"slot": 3}
    assert seen == imports


def test_import_meanwhile_imports_on_a_thread_and_leaves_failures_to_the_next_import():
    sys.modules.pop("colorsys", None)
    t = warm.import_meanwhile(["colorsys", "cutline_no_such_module"], "in a test")
    assert isinstance(t, threading.Thread) and t.daemon
    t.join(10)
    assert not t.is_alive()
    assert "colorsys" in sys.modules
    assert "cutline_no_such_module" not in sys.modules
