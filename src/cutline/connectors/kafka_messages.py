"""Kafka messages as the sink writes them: serialisers, Kafka's murmur2 partitioner, the
``cutline-id`` header that makes a commit idempotent, and the sink's errors.

Shared by :mod:`.kafka_sink`; nothing here imports ``confluent_kafka``.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

from .base import UnsupportedRecordError
from .kafka import KafkaBrokerError, KafkaTopicError

__all__ = ["ACCEPTS", "ID_HEADER", "KafkaBrokerError", "KafkaTopicError",
           "UndeliverableRecordError", "identity", "murmur2", "murmur2_partition",
           "serialiser"]

ID_HEADER = "cutline-id"
_SERIALISERS = ("bytes", "str", "json")


class UndeliverableRecordError(UnsupportedRecordError):
    """The broker (or the client) refused a record for good (too large, invalid): the job
    fails at once, naming the record, the topic and partition, and the broker's reason.
    A record is never dropped silently."""


ACCEPTS = ("records whose serialised key, value and headers the broker accepts (under "
           "message.max.bytes)")


# ------------------------------------------------------------------ partitioning, serialising

def murmur2(data: bytes) -> int:
    """Kafka's murmur2 hash (the Java client's ``Utils.murmur2``), as an unsigned int."""
    m, length = 0x5BD1E995, len(data)
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    n4 = length & ~3
    for i in range(0, n4, 4):
        k = data[i] | data[i + 1] << 8 | data[i + 2] << 16 | data[i + 3] << 24
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> 24
        k = (k * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
    extra = length & 3
    if extra == 3:
        h ^= data[n4 + 2] << 16
    if extra >= 2:
        h ^= data[n4 + 1] << 8
    if extra >= 1:
        h ^= data[n4]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h


@functools.lru_cache(maxsize=1 << 16)
def murmur2_partition(key: bytes, partitions: int) -> int:
    """The partition of ``key`` as the Java client and librdkafka's ``murmur2`` partitioner
    choose it: ``(murmur2(key) & 0x7fffffff) % partitions``."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def serialiser(spec: Any, what: str) -> Callable[[Any], bytes | None]:
    if callable(spec):
        return spec
    if spec == "bytes":
        return _as_bytes
    if spec == "str":
        return _as_str
    if spec == "json":
        return _as_json
    raise ValueError(f"KafkaSink {what}_serializer must be one of {', '.join(_SERIALISERS)} "
                     f"or a function of the {what} returning bytes, got {spec!r}")


def _as_bytes(x: Any) -> bytes | None:
    if x is None or type(x) is bytes:
        return x
    if isinstance(x, (bytes, bytearray, memoryview)):
        return bytes(x)
    raise TypeError(f"the 'bytes' serializer needs bytes, got {type(x).__name__}")


def _as_str(x: Any) -> bytes | None:
    if x is None or type(x) is bytes:
        return x
    return str(x).encode()


def _as_json(x: Any) -> bytes:
    return json.dumps(x, separators=(",", ":"), ensure_ascii=False, default=_json_default).encode()


def _json_default(x: Any) -> Any:
    import dataclasses

    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return dataclasses.asdict(x)
    if hasattr(x, "_asdict"):
        return x._asdict()
    if isinstance(x, (set, frozenset)):
        raise TypeError(f"a {type(x).__name__} is not JSON (make it a list)")
    if type(x).__module__ == "numpy":
        return x.tolist()
    raise TypeError(f"Object of type {type(x).__name__} is not JSON serializable")


def header_list(h: Any) -> list[list[Any]] | None:
    if not h:
        return None
    items = h.items() if isinstance(h, dict) else h
    return [[str(k), v.encode() if isinstance(v, str) else v] for k, v in items]


def identity(headers: Any) -> tuple[str, int, str, int] | None:
    """``(job, subtask, batch, seq)`` of a ``cutline-id`` header, if there is one."""
    for k, v in headers or ():
        if k == ID_HEADER and v:
            try:
                job, sub, batch, seq = v.decode().rsplit("/", 3)
                return job, int(sub), batch, int(seq)
            except ValueError:
                return None
    return None


def id_header(job: str, subtask: int, batch: str, seq: int) -> tuple[str, bytes]:
    return ID_HEADER, f"{job}/{subtask}/{batch}/{seq}".encode()
