"""The columnar Kafka source: :meth:`KafkaSource.batches`, JSON values as Arrow batches.

A :class:`~.kafka.KafkaReader` whose reads are one Arrow record batch of up to
``batch_rows`` records of one partition: the values parsed by pyarrow's JSON reader (with
the schema given, or inferred), optional metadata columns from the records.  Offsets,
assignment, checkpoints and event time are the per-record reader's.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from .kafka import KafkaReader, KafkaRecord, KafkaRecordError, KafkaSource, _as_bytes

__all__ = ["ColumnarKafkaReader", "ColumnarKafkaSource"]


class ColumnarKafkaSource:
    """:meth:`KafkaSource.batches`: JSON values as Arrow record batches."""

    columnar = True
    METADATA = ("key", "topic", "partition", "offset", "timestamp")

    def __init__(self, source: KafkaSource, schema: Any, batch_rows: int,
                 metadata: Sequence[str]) -> None:
        import pyarrow as pa

        if schema is not None and not isinstance(schema, pa.Schema):
            raise TypeError(f"batches(schema=...) takes a pyarrow.Schema or None, "
                            f"got {type(schema).__name__}: {schema!r}")
        if not isinstance(batch_rows, int) or isinstance(batch_rows, bool) or batch_rows < 1:
            raise ValueError(f"batches(batch_rows=...) must be a whole number >= 1, "
                             f"got {batch_rows!r}")
        bad = [m for m in metadata if m not in self.METADATA]
        if bad:
            raise ValueError(f"batches(metadata=...): unknown {bad}; choose from "
                             f"{', '.join(self.METADATA)}")
        self.kafka, self.schema, self.batch_rows = source, schema, batch_rows
        self.metadata = tuple(metadata)
        self.name = source.name

    def parallelism_hint(self) -> int | None:
        return None

    def check(self) -> str | None:
        return self.kafka.check()

    def create_reader(self) -> "ColumnarKafkaReader":
        return ColumnarKafkaReader(self)

    def __repr__(self) -> str:
        return f"{self.kafka!r}.batches(schema={self.schema!r})"


class ColumnarKafkaReader(KafkaReader):
    """A :class:`KafkaReader` whose reads return a list of one Arrow record batch."""

    def __init__(self, source: ColumnarKafkaSource) -> None:
        super().__init__(source.kafka)
        self._columnar = source
        self._key = _as_bytes
        self._value = _as_bytes

    def read_batch(self, max_records: int) -> list | None:
        got = super().read_batch(self._columnar.batch_rows)
        if not got:
            return got
        return [self._parse(got)]

    def _parse(self, records: list[KafkaRecord]) -> Any:
        import pyarrow as pa
        import pyarrow.json as pj
        from io import BytesIO

        src = self._columnar
        data = b"\n".join((r.value or b"null").replace(b"\n", b" ") for r in records)
        opts = pj.ParseOptions(explicit_schema=src.schema,
                               unexpected_field_behavior="ignore") \
            if src.schema is not None else pj.ParseOptions()
        try:
            table = pj.read_json(BytesIO(data), parse_options=opts,
                                 read_options=pj.ReadOptions(block_size=max(1 << 20,
                                                                            len(data) + 1)))
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise self._bad(records, exc) from exc
        if table.num_rows != len(records):
            raise self._bad(records, ValueError(f"{table.num_rows} rows parsed from "
                                                f"{len(records)} records"))
        for m in src.metadata:
            if m == "timestamp":
                col = pa.array([r.timestamp for r in records], pa.float64())
            elif m in ("partition", "offset"):
                col = pa.array([getattr(r, m) for r in records], pa.int64())
            elif m == "topic":
                col = pa.array([r.topic for r in records], pa.string())
            else:
                col = pa.array([r.key for r in records], pa.binary())
            table = table.append_column(m, col)
        batches = table.combine_chunks().to_batches()
        return batches[0] if len(batches) == 1 else pa.concat_batches(batches)

    def _bad(self, records: list[KafkaRecord], exc: BaseException) -> KafkaRecordError:
        for r in records:  # the first record that is not a JSON object names the offset
            try:
                if not isinstance(json.loads(r.value or b"null"), dict):
                    raise ValueError("not a JSON object")
            except ValueError as e:
                return KafkaRecordError(r.topic, r.partition, r.offset, f"value: {e}")
        r = records[0]
        return KafkaRecordError(r.topic, r.partition, r.offset,
                                f"value (a batch from this offset): {exc}")
