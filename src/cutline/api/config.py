"""``CheckpointConfig``, and the checks of what users pass (uids, functions, parallelism,
column keys, schemas, batch formats, what happens to late records) that the streams share."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..logical import ColumnKey
from ..protocol import Mode

_UID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


@dataclass(frozen=True)
class CheckpointConfig:
    """How a job checkpoints; the fields of Flink's ``CheckpointConfig`` that users set."""

    interval: float = 1.0
    mode: str = "exactly_once"  # or "at_least_once"
    unaligned: bool = False
    aligned_timeout: float | None = None
    timeout: float = 600.0
    min_pause: float = 0.0
    max_concurrent: int = 1
    tolerable_failures: int = 0
    retained: int = 3
    retain_on_cancel: bool = True
    storage: str = "file:///tmp/cutline-checkpoints"
    # fsspec options for ``storage`` (s3fs: endpoint_url, key, secret, client_kwargs, ...).
    # Not shown in repr: they may hold credentials.
    storage_options: Mapping[str, Any] | None = field(default=None, repr=False, hash=False)
    # Where keyed state lives: "memory" (dicts, the fastest) or "rocksdb" (embedded RocksDB
    # on local disk: state larger than memory, incremental checkpoints uploaded in the
    # background).
    state_backend: str = "memory"

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> None:
            raise ValueError(f"CheckpointConfig.{name} {why}, got {getattr(self, name)!r}")

        def seconds(v: Any) -> bool:  # a finite number (NaN and infinities are not)
            return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

        if not seconds(self.interval) or self.interval <= 0:
            bad("interval", "must be a positive, finite number of seconds")
        if self.mode not in ("exactly_once", "at_least_once"):
            bad("mode", "must be 'exactly_once' or 'at_least_once'")
        if not isinstance(self.unaligned, bool):
            bad("unaligned", "must be True or False")
        if self.unaligned and self.mode != "exactly_once":
            bad("unaligned", "applies to mode 'exactly_once' only")
        if self.aligned_timeout is not None:
            if self.mode != "exactly_once":
                bad("aligned_timeout", "applies to mode 'exactly_once' only")
            if not seconds(self.aligned_timeout) or self.aligned_timeout < 0:
                bad("aligned_timeout", "must be None or a finite number of seconds >= 0")
            if self.unaligned:
                bad("aligned_timeout", "applies to aligned checkpoints only (it switches "
                    "them to unaligned after the timeout): with unaligned=True leave it None")
        if not isinstance(self.retain_on_cancel, bool):
            bad("retain_on_cancel", "must be True or False")
        if not seconds(self.timeout) or self.timeout <= 0:
            bad("timeout", "must be a positive, finite number of seconds")
        if not seconds(self.min_pause) or self.min_pause < 0:
            bad("min_pause", "must be a finite number of seconds >= 0")
        for name in ("max_concurrent", "retained"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                bad(name, "must be a whole number >= 1")
        v = self.tolerable_failures
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            bad("tolerable_failures", "must be a whole number >= 0")
        if not isinstance(self.storage, str) or not self.storage:
            bad("storage", "must be a storage URL such as file:///path or s3://bucket/path")
        if self.state_backend not in ("memory", "rocksdb"):
            bad("state_backend", "must be 'memory' or 'rocksdb'")
        if self.state_backend == "rocksdb":
            import importlib.util

            if importlib.util.find_spec("rocksdict") is None:
                bad("state_backend", "needs the rocksdict package for 'rocksdb' "
                    "(pip install rocksdict)")
        if self.storage_options is not None:
            opts = self.storage_options
            if not isinstance(opts, Mapping) or not all(isinstance(k, str) for k in opts):
                raise ValueError("CheckpointConfig.storage_options must be a dict of fsspec "
                                 "options with string keys (e.g. {'endpoint_url': ..., 'key': "
                                 "..., 'secret': ...} for s3://), got "
                                 f"{type(opts).__name__}")
            object.__setattr__(self, "storage_options", dict(opts))

    @property
    def protocol_mode(self) -> Mode:
        if self.mode == "at_least_once":
            return Mode.AT_LEAST_ONCE
        if self.unaligned:
            return Mode.UNALIGNED
        return Mode.ALIGNED


def _check_callable(name: str, fn: Any) -> None:
    if not callable(fn):
        raise TypeError(f"{name}() needs a function, got {type(fn).__name__}: {fn!r}")



def _check_parallelism(p: Any, what: str = "parallelism") -> None:
    if p is not None and (not isinstance(p, int) or isinstance(p, bool) or p < 1):
        raise ValueError(f"{what} must be a whole number >= 1, got {p!r}")


def _on_late(on_late: Any) -> str:
    if on_late not in ("drop", "fail"):
        raise ValueError('window(on_late=...) is "drop" (count late records, the default) '
                         f'or "fail" (fail the job on one), got {on_late!r}')
    return on_late


def _keep_late(spec: Any) -> None:
    """``.late()`` keeps the late records: refused after ``window(on_late="fail")``."""
    if spec.on_late == "fail":
        raise ValueError('.late() keeps late records, window(..., on_late="fail") fails the '
                         "job on one: choose one of them")


def _column_key(what: str, columns: Any) -> ColumnKey:
    cols = (columns,) if isinstance(columns, str) else tuple(columns)
    if not cols or not all(isinstance(c, str) and c for c in cols):
        raise TypeError(f"{what}() takes a column name or a list of column names, got "
                        f"{columns!r}")
    return ColumnKey(cols)


def _check_schema(what: str, schema: Any) -> None:
    import pyarrow as pa

    if not isinstance(schema, pa.Schema):
        raise TypeError(f"{what}(schema=...) takes a pyarrow.Schema, got "
                        f"{type(schema).__name__}: {schema!r}")


_BATCH_FORMATS = ("arrow", "pandas", "polars")


def _check_batch_format(what: str, batch_format: Any) -> None:
    if batch_format not in _BATCH_FORMATS:
        raise ValueError(f"{what}(batch_format=...) must be 'arrow', 'pandas' or 'polars', "
                         f"got {batch_format!r}")
    if batch_format != "arrow":
        import importlib.util

        if importlib.util.find_spec(batch_format) is None:
            raise ValueError(f"{what}(batch_format={batch_format!r}) needs the "
                             f"{batch_format} package (pip install {batch_format})")
