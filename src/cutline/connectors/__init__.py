"""Sources and sinks.

Contracts (``Source`` / ``SourceReader``, ``Sink`` / ``SinkWriter``) are in ``base``; reader
positions and sink transaction handles are plain msgpack-able data. No pyspark imports here.
"""

from typing import TYPE_CHECKING, Any

from .base import (
    CommitError, RecordError, Sink, SinkWriter, Source, SourceReader,
)

if TYPE_CHECKING:
    from .collect import CollectSink, PrintSink
    from .delta import DeltaSink
    from .discard import DiscardSink
    from .files import FileSource
    from .generator import GeneratorSource
    from .kafka import KafkaRecord, KafkaSource
    from .kafka_sink import KafkaSink
    from .parquet_sink import ParquetSink
    from .upsert import UpsertSink

# Each connector's module is imported when its name is first asked for: a task process
# imports the connectors its job uses, not Kafka's, Delta's and the rest (issue 28: the
# fixed cost of a job's start).
_MODULES = {"CollectSink": "collect", "PrintSink": "collect", "DeltaSink": "delta",
            "DiscardSink": "discard", "FileSource": "files", "GeneratorSource": "generator",
            "KafkaRecord": "kafka", "KafkaSource": "kafka", "KafkaSink": "kafka_sink",
            "ParquetSink": "parquet_sink", "UpsertSink": "upsert"}


def __getattr__(name: str) -> Any:
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_MODULES))


__all__ = [
    "CollectSink", "CommitError", "DeltaSink", "DiscardSink", "FileSource", "GeneratorSource",
    "KafkaRecord", "KafkaSink", "KafkaSource", "ParquetSink", "PrintSink", "RecordError", "Sink",
    "SinkWriter", "Source", "SourceReader", "UpsertSink",
]
