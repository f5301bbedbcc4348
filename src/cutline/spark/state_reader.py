"""A checkpoint's keyed state as a Spark DataFrame (``cutline.state.read``).

The state files are read and decoded in the driver process (sized for debugging and
bootstrapping, not for state larger than the driver's memory).  Columns: ``key``, ``key_group``, then one per state
name; a window operator's: ``key``, ``start``, ``end``, ``accumulator``, ``fired``, one row
per key and window.  A column whose values are all of one scalar type gets that Spark type
(long, double, string, boolean); lists / dicts of scalars become arrays / maps; anything
else is JSON text.
"""

from __future__ import annotations

import json
from typing import Any

from ..state.reader import is_window_operator, keyed_rows, window_rows
from ..storage.checkpoints import open_checkpoint
from ..storage.schema import read_task_states

__all__ = ["read"]

_SCALARS = ((bool, "boolean"), (int, "bigint"), (float, "double"), (str, "string"))


def _scalar_type(values: list) -> str | None:
    for py, sql in _SCALARS:
        if values and all(type(v) is py for v in values):
            return sql
    if values and all(type(v) in (int, float) for v in values):
        return "double"
    return None


def _column_type(values: list) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "string"
    t = _scalar_type(values)
    if t is not None:
        return t
    if all(isinstance(v, (list, tuple)) for v in values):
        inner = _scalar_type([x for v in values for x in v if x is not None])
        if inner is not None:
            return f"array<{inner}>"
    if all(isinstance(v, dict) for v in values):
        kt = _scalar_type([k for v in values for k in v])
        vt = _scalar_type([x for v in values for x in v.values() if x is not None])
        if kt is not None and vt is not None:
            return f"map<{kt},{vt}>"
    return "json"


def _json_keys(value: Any) -> Any:
    """Dicts with keys JSON cannot hold (a window state's ``(start, end)``) keyed by their
    ``repr``."""
    if isinstance(value, dict):
        return {k if isinstance(k, str) else repr(k): _json_keys(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_keys(v) for v in value]
    return value


def _encode(value: Any, kind: str) -> Any:
    if value is None:
        return None
    if kind == "json":
        return json.dumps(_json_keys(value), default=repr, sort_keys=True)
    if kind == "double":
        return float(value)
    if kind.startswith("array<double"):
        return [None if x is None else float(x) for x in value]
    if kind.startswith("array"):
        return list(value)
    return value


def read(spark: Any, path: str, operator_uid: str) -> Any:
    """The keyed state of operator ``operator_uid`` in the checkpoint or savepoint at ``path``,
    one row per key: ``key``, ``key_group`` and a column per state name.  A window
    operator's: one row per key and window, ``key``, ``start``, ``end``, ``accumulator``,
    ``fired`` (:func:`cutline.state.reader.window_rows`)."""
    handle = open_checkpoint(path)
    states = read_task_states(handle)
    if is_window_operator(handle, operator_uid):
        return _windows(spark, list(window_rows(handle, operator_uid, states)))
    rows = list(keyed_rows(handle, operator_uid, states))  # raises naming the operators
    names = sorted({n for r in rows for n in r} - {"key", "key_group"})
    kinds = {c: _column_type([r.get(c) for r in rows]) for c in ["key", *names]}
    ddl = ", ".join(f"`{c}` {'string' if k == 'json' else k}"
                    for c, k in [("key", kinds["key"]), ("key_group", "int")]
                    + [(n, kinds[n]) for n in names])
    data = [tuple([_encode(r["key"], kinds["key"]), r["key_group"]]
                  + [_encode(r.get(n), kinds[n]) for n in names]) for r in rows]
    return spark.createDataFrame(data, schema=ddl)


def _windows(spark: Any, rows: list[dict]) -> Any:
    cols = ("key", "start", "end", "accumulator")
    kinds = {c: _column_type([r[c] for r in rows]) for c in cols}
    ddl = ", ".join(f"`{c}` {'string' if kinds[c] == 'json' else kinds[c]}" for c in cols)
    data = [tuple([_encode(r[c], kinds[c]) for c in cols] + [bool(r["fired"])]) for r in rows]
    return spark.createDataFrame(data, schema=ddl + ", `fired` boolean")
