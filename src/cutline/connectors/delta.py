"""Exactly-once appends to a Delta Lake table (the ``deltalake`` package, delta-rs).

Two-phase commit, keyed by job and checkpoint id:

- ``write``: records are buffered (rolled into staged files past ``roll_records``).
- ``pre_commit(n)``: the records since the last checkpoint become Parquet files under
  ``<table>/_staging/<job>/<subtask>/``.  Delta readers never see them: a Delta table is
  what its log (``_delta_log/``) lists, and nothing lists these yet.
- ``commit``: the staged files move into the table directory
  (``part-<job>-<subtask>-<checkpoint>-<n>.parquet``) and are appended in **one Delta
  transaction** carrying Delta's application transaction (``txn``) action, ``appId =
  cutline-<job>-<subtask>``, ``version = <checkpoint id>``, and in its ``commitInfo`` the
  job, subtask and checkpoint ids.  The ``txn`` action is the Delta protocol's mechanism for
  idempotent writes: before committing, the writer reads its appId's version from the table,
  and checkpoints at or below it are already in the table and are skipped.  So a re-commit
  after recovery (a task killed after the Delta commit but before the checkpoint's
  completion reached every task) is never duplicated, and a commit that never happened is
  re-done from the handles in the checkpoint (never lost).  Two commits of one appId racing
  (a zombie attempt) conflict in Delta (``ConcurrentTransaction``); the loser re-reads and
  finds the work done.
- ``recover``: re-commit the checkpoint's handles idempotently, delete staged files no
  handle covers.

The table is created on the first commit (schema: ``schema`` if given, else the first
file's), or appended to if it exists; records are conformed to the table's schema (a missing
field is null; an unknown field, or a value that does not cast to its column's type, fails
the job at once, never retried).  Records become rows as in :mod:`.parquet_sink`: a
``WindowResult`` is ``key, start, end, value`` with no ``map``.  Partitioned tables are not
supported.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from ..storage.fs import check_storage_options, scheme
from .base import CommitError, UnsupportedRecordError, commit_file, join, sink_label
from .parquet_sink import ACCEPTS as _PARQUET_ACCEPTS
from .parquet_sink import ParquetWriter, table_of

__all__ = ["DeltaSink", "app_id"]

log = logging.getLogger(__name__)

_RETRIES = 5

ACCEPTS = _PARQUET_ACCEPTS + "; every column one of the table's, castable to its type"


def app_id(job: str, subtask: int) -> str:
    """The Delta application transaction id of one sink subtask of a job."""
    return f"cutline-{job}-{subtask}"


def _delta_options(fsspec_options: dict | None) -> dict[str, str] | None:
    """delta-rs (object_store) options from s3fs-style fsspec options."""
    if not fsspec_options:
        return None
    o = fsspec_options
    out: dict[str, str] = {}
    endpoint = o.get("endpoint_url") or (o.get("client_kwargs") or {}).get("endpoint_url")
    if endpoint:
        out["AWS_ENDPOINT_URL"] = str(endpoint)
        if str(endpoint).startswith("http://"):
            out["AWS_ALLOW_HTTP"] = "true"
    for src, dst in (("key", "AWS_ACCESS_KEY_ID"), ("secret", "AWS_SECRET_ACCESS_KEY"),
                     ("token", "AWS_SESSION_TOKEN")):
        if o.get(src):
            out[dst] = str(o[src])
    region = (o.get("client_kwargs") or {}).get("region_name")
    if region:
        out["AWS_REGION"] = str(region)
    return out or None


class DeltaSink:
    """Append records to the Delta table at ``path`` exactly once: dicts, ``WindowResult``
    (columns ``key, start, end, value``), named tuples and dataclasses as rows, tuples as
    ``value_0, value_1, ...``, other values as ``{"value": record}``
    (:func:`~.parquet_sink.row_of`).  See the module docstring for
    the protocol.

    ``schema``: a ``pyarrow.Schema`` for a table that does not exist yet (default: the schema
    of the first file written).  ``storage_options``: fsspec options for ``path`` (used to
    stage and move files); ``delta_storage_options``: delta-rs options for the log (default:
    derived from ``storage_options`` for ``s3://``: endpoint, keys, region).
    """

    def __init__(self, path: str, name: str | None = None, *, schema: Any = None,
                 roll_records: int = 100_000, compression: str = "snappy",
                 storage_options: dict | None = None,
                 delta_storage_options: dict | None = None):
        if roll_records < 1:
            raise ValueError(f"roll_records must be >= 1, got {roll_records}")
        if schema is not None and not hasattr(schema, "names"):
            raise TypeError(f"schema must be a pyarrow.Schema, got {schema!r}")
        self.path, self.schema = str(path), schema
        self.roll_records, self.compression = roll_records, compression
        self.storage_options = check_storage_options(storage_options)
        self.delta_storage_options = (check_storage_options(delta_storage_options,
                                                            "delta_storage_options")
                                      or _delta_options(self.storage_options))
        self.name = name or f"delta:{self.path}"

    @property
    def uri(self) -> str:
        """The table URI for delta-rs (a plain path for local tables)."""
        if scheme(self.path) == "file":
            return self.path[len("file://"):] if self.path.startswith("file://") else self.path
        return self.path

    def table(self) -> Any:
        """The ``deltalake.DeltaTable`` (latest version), or None if there is none yet."""
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        try:
            return DeltaTable(self.uri, storage_options=self.delta_storage_options)
        except TableNotFoundError:
            return None

    def read_records(self) -> list[dict]:
        """Every row of the table's latest version (a convenience for tests and notebooks)."""
        dt = self.table()
        return [] if dt is None else dt.to_pyarrow_table().to_pylist()

    def create_writer(self) -> "DeltaWriter":
        return DeltaWriter(self)

    def __repr__(self) -> str:
        return f"DeltaSink({self.path!r})"


class DeltaWriter(ParquetWriter):
    """Stages Parquet files like :class:`ParquetWriter`; commits them in Delta transactions."""

    _sink: DeltaSink

    def open(self, subtask: int, parallelism: int, job: str) -> None:
        super().open(subtask, parallelism, job)
        self._schema = self._sink.schema

    # ------------------------------------------------------------------ staging

    def _table(self, records: list) -> Any:
        """The file's Arrow table, conformed to the table's schema once there is one."""
        label = sink_label(self)
        table = table_of(records, label, ACCEPTS)
        schema = self._table_schema()
        return table if schema is None else _conform(table, schema, records, label)

    def _expected_schema(self, first: Any) -> Any:
        """Record batches must have the table's schema (the user's, or the table's once it
        exists), else the first batch's."""
        return self._table_schema() or first

    def _table_schema(self) -> Any:
        """The schema records are written with: the user's, else the table's once it exists."""
        if self._schema is None:
            dt = self._sink.table()
            if dt is not None:
                import pyarrow as pa
                self._schema = pa.schema(dt.schema().to_arrow())
        return self._schema

    # ------------------------------------------------------------------ commit

    def _destination(self, handle: dict, n: int) -> str:
        return join(self._root, f"part-{handle['job']}-{handle['subtask']}-"
                                f"{handle['checkpoint_id']}-{n}.parquet")

    def _commit(self, handles: list[dict], strict: bool) -> None:
        apps: dict[str, list[dict]] = {}
        for h in sorted(handles, key=lambda h: h["checkpoint_id"]):
            apps.setdefault(app_id(h.get("job", self._job), h["subtask"]), []).append(h)
        for app, hs in apps.items():
            self._commit_app(app, hs, strict)

    def _commit_app(self, app: str, handles: list[dict], strict: bool) -> None:
        from deltalake.exceptions import CommitFailedError

        error: Exception | None = None
        for _ in range(_RETRIES):
            dt = self._sink.table()
            done = dt.transaction_version(app) if dt is not None else None
            todo = [h for h in handles if done is None or h["checkpoint_id"] > done]
            self._check_committed([h for h in handles if h not in todo], app, done)
            if not todo:
                return
            adds = []
            for h in todo:
                for n, rel in enumerate(h["files"]):
                    dest = self._destination(h, n)
                    self._fs.makedirs(dest.rsplit("/", 1)[0], exist_ok=True)
                    commit_file(self._fs, join(self._root, rel), dest, strict=strict)
                    if self._fs.exists(dest):  # absent only in a lenient recovery
                        adds.append(self._add_action(dest))
            if not adds:
                return  # nothing to append: nothing to duplicate either
            try:
                self._append(dt, adds, app, todo)
                return
            except CommitFailedError as e:  # a concurrent commit: re-read and decide again
                error = e
                time.sleep(0.05)
        # Transient (concurrent writers kept winning): not a CommitError, so the task fails
        # and Spark restarts it, recovering from the checkpoint.
        raise RuntimeError(f"could not commit checkpoints "
                          f"{[h['checkpoint_id'] for h in handles]} of {app} to Delta table "
                          f"{self._sink.path}: {error}")

    def _check_committed(self, handles: list[dict], app: str, done: int | None) -> None:
        """Checkpoints the table says are committed must have had their files moved; staged
        files still waiting mean the table's ``txn`` versions come from another run of a job
        of the same name (its checkpoint ids would be skipped: refuse)."""
        for h in handles:
            for n, rel in enumerate(h["files"]):
                if self._fs.exists(join(self._root, rel)) and \
                        not self._fs.exists(self._destination(h, n)):
                    raise CommitError(
                        f"Delta table {self._sink.path} has commits of {app} up to checkpoint "
                        f"{done}, but checkpoint {h['checkpoint_id']} of this run was never "
                        "committed: an earlier run of a job with the same name wrote this "
                        "table. Restore that job from its checkpoints, or use another job "
                        "name or table")

    def _add_action(self, dest: str) -> Any:
        import pyarrow.parquet as pq
        from deltalake.transaction import AddAction

        with self._fs.open(dest, "rb") as f:
            rows = pq.ParquetFile(f).metadata.num_rows
        return AddAction(self._rel(dest), int(self._fs.size(dest)), {},
                         int(time.time() * 1000), True, json.dumps({"numRecords": rows}))

    def _append(self, dt: Any, adds: list, app: str, todo: list[dict]) -> None:
        from deltalake import CommitProperties, DeltaTable, Transaction

        if dt is None:
            schema = self._sink.schema
            if schema is None:
                import pyarrow.parquet as pq
                with self._fs.open(join(self._root, adds[0].path), "rb") as f:
                    schema = pq.ParquetFile(f).schema_arrow
            # mode="ignore": another subtask may create it at the same moment
            DeltaTable.create(self._sink.uri, schema, mode="ignore",
                              storage_options=self._sink.delta_storage_options)
            dt = self._sink.table()
        if dt.metadata().partition_columns:
            raise CommitError(f"Delta table {self._sink.path} is partitioned by "
                              f"{dt.metadata().partition_columns}: DeltaSink appends to "
                              "unpartitioned tables only")
        ids = [h["checkpoint_id"] for h in todo]
        props = CommitProperties(
            custom_metadata={"cutline.job": todo[0].get("job", self._job),
                             "cutline.subtask": todo[0]["subtask"], "cutline.checkpoints": ids},
            app_transactions=[Transaction(app, max(ids))])
        dt.create_write_transaction(adds, "append", dt.schema(), commit_properties=props)
        log.info("committed checkpoints %s of %s to %s", ids, app, self._sink.path)


def _conform(table: Any, schema: Any, records: list, sink: str) -> Any:
    """``table`` (of ``records``) with the columns of ``schema``, in its order and types; a
    column the table lacks is null.  A field that is no column of the table, or a value that
    does not cast to its column's type, raises :class:`UnsupportedRecordError`: it would
    fail the same way on every retry."""
    import pyarrow as pa

    extra = [n for n in table.column_names if n not in schema.names]
    if extra:
        raise UnsupportedRecordError(
            sink, _first_with(records, extra), ACCEPTS,
            f"its fields {extra} are not columns of the Delta table (columns: "
            f"{', '.join(schema.names)})")
    cols = [table.column(f.name) if f.name in table.column_names
            else pa.nulls(table.num_rows, f.type) for f in schema]
    try:
        return pa.Table.from_arrays(cols, schema=schema) if cols else table
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        pass
    cast = []
    for c, f in zip(cols, schema):
        try:
            cast.append(c if c.type == f.type else c.cast(f.type))
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
            raise UnsupportedRecordError(
                sink, _first_with(records, [f.name]), ACCEPTS,
                f"its column {f.name!r} ({c.type}) does not fit the Delta table's column "
                f"{f.name}: {f.type} ({e})") from e
    return pa.Table.from_arrays(cast, schema=schema)


def _first_with(records: list, names: list[str]) -> Any:
    """The first of ``records`` (rows) that has one of the columns ``names``."""
    return next((r for r in records if isinstance(r, dict) and any(n in r for n in names)),
                records[0])
