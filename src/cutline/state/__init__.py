"""State backends, and reading state out of checkpoints."""

from __future__ import annotations

from typing import Any


def read(spark: Any, path: str, operator_uid: str) -> Any:
    """The keyed state of ``operator_uid`` in the checkpoint/savepoint at ``path`` as a Spark
    DataFrame: one row per key (``key``, ``key_group``, a column per state name)."""
    from ..spark.state_reader import read as _read

    return _read(spark, path, operator_uid)


__all__ = ["read"]
