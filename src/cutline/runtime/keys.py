"""Key functions on the record path, at C speed where the key is a column."""

from __future__ import annotations

from collections.abc import Callable
from operator import itemgetter
from typing import Any

from ..logical import ColumnKey

__all__ = ["fast_key"]


def fast_key(key_fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``key_fn`` as a C callable when it is a column key (``key_by("user")`` /
    ``key_by(["a", "b"])``): an ``itemgetter``, which gives the same value (the column's,
    or the tuple of the columns') and raises the same errors, with no Python frame per
    record.  Any other key function is returned as it is."""
    if type(key_fn) is ColumnKey:
        return itemgetter(*key_fn.columns)
    return key_fn
