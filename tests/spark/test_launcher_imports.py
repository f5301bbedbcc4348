"""The embedded context's start imports on a thread, while the JVM starts, what PySpark
would import after it (launcher.WARM_IMPORTS)."""

from __future__ import annotations

import sys

from cutline.spark import launcher


def test_the_imports_meanwhile_run_on_a_thread_and_survive_a_missing_module(monkeypatch):
    monkeypatch.setattr(launcher, "WARM_IMPORTS", ("no_such_module_here", "colorsys"))
    monkeypatch.delitem(sys.modules, "colorsys", raising=False)
    thread = launcher._import_meanwhile()
    thread.join(30)
    assert not thread.is_alive()
    assert "colorsys" in sys.modules  # the one after the missing one too


def test_pysparks_first_call_needs_what_is_imported_meanwhile():
    # PySpark's NumPy converter asks pyspark.testing.utils: the module is there to import
    import importlib.util

    assert all(importlib.util.find_spec(m) is not None for m in launcher.WARM_IMPORTS)
