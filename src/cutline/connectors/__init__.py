"""Sources and sinks.

Contracts (``Source`` / ``SourceReader``, ``Sink`` / ``SinkWriter``) are in ``base``; reader
positions and sink transaction handles are plain msgpack-able data. No pyspark imports here.
"""

from .base import (
    CommitError, RecordError, Sink, SinkWriter, Source, SourceReader,
)
from .collect import CollectSink, PrintSink
from .delta import DeltaSink
from .discard import DiscardSink
from .files import FileSource
from .generator import GeneratorSource
from .kafka import KafkaRecord, KafkaSource
from .kafka_sink import KafkaSink
from .parquet_sink import ParquetSink
from .upsert import UpsertSink

__all__ = [
    "CollectSink", "CommitError", "DeltaSink", "DiscardSink", "FileSource", "GeneratorSource",
    "KafkaRecord", "KafkaSink", "KafkaSource", "ParquetSink", "PrintSink", "RecordError", "Sink",
    "SinkWriter", "Source", "SourceReader", "UpsertSink",
]
