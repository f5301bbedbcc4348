"""Imports made on a thread of their own, while the process waits for something else."""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Iterable

log = logging.getLogger("cutline")

__all__ = ["import_meanwhile"]


def import_meanwhile(names: Iterable[str], why: str) -> threading.Thread:
    """Import the modules ``names`` on a daemon thread (started; join it to wait).  A module
    that fails to import is left to whoever imports it next, which says why; ``why`` names
    the wait the imports overlap, in the debug log."""
    names = tuple(names)

    def run() -> None:
        for name in names:
            try:
                importlib.import_module(name)
            except Exception as exc:  # noqa: BLE001 - imported again where it is needed
                log.debug("cutline: %s not imported %s: %s", name, why, exc)

    thread = threading.Thread(target=run, name="cutline-imports", daemon=True)
    thread.start()
    return thread
