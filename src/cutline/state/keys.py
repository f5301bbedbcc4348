"""Byte encoding of keyed state for stores that sort bytes (RocksDB).

A state entry ``(state name, key)`` of key group ``g`` is stored under::

    g (2 bytes, big-endian) | len(name) (2 bytes) | name (UTF-8) | encoded key

so all entries of a key group are one contiguous range: a subtask restores, or drops, a
range of key groups with one seek or one range delete.  Keys that are equal as dict keys
encode equally (``1``, ``1.0`` and ``True`` are one key, as in the in-memory backend and
in :func:`cutline.state.keygroups.stable_hash`), and every encoding decodes back to an
equal key.
Keys of types other than None / bool / int / float / str / bytes / tuple are pickled:
they must pickle the same way every time they are equal (most do; a set may not).
"""

from __future__ import annotations

import pickle
import struct
from typing import Any

__all__ = ["encode_key", "decode_key", "encode_slot", "decode_slot", "group_prefix"]

_GROUP = struct.Struct(">H")
_LEN = struct.Struct(">I")
_FLOAT = struct.Struct(">d")


def group_prefix(group: int) -> bytes:
    return _GROUP.pack(group)


def encode_key(key: Any) -> bytes:
    t = type(key)
    if t is str:  # the common cases first
        return b"S" + key.encode("utf-8", "surrogatepass")
    if t is int:
        return b"I" + key.to_bytes((key.bit_length() + 8) // 8, "big", signed=True)
    if key is None:
        return b"N"
    if isinstance(key, bool):
        key = int(key)
    elif isinstance(key, float) and key.is_integer():
        key = int(key)
    t = type(key)
    if t is str:
        return b"S" + key.encode("utf-8", "surrogatepass")
    if t is int:
        return b"I" + key.to_bytes((key.bit_length() + 8) // 8, "big", signed=True)
    if t is bytes:
        return b"B" + key
    if t is float:
        return b"F" + _FLOAT.pack(key)
    if t is tuple:
        parts = [encode_key(item) for item in key]
        return b"T" + b"".join(_LEN.pack(len(p)) + p for p in parts)
    return b"P" + pickle.dumps(key, protocol=5)


def decode_key(data: bytes) -> Any:
    tag, body = data[:1], data[1:]
    if tag == b"S":
        return body.decode("utf-8", "surrogatepass")
    if tag == b"I":
        return int.from_bytes(body, "big", signed=True)
    if tag == b"B":
        return bytes(body)
    if tag == b"N":
        return None
    if tag == b"F":
        return _FLOAT.unpack(body)[0]
    if tag == b"T":
        items, i = [], 0
        while i < len(body):
            (n,) = _LEN.unpack_from(body, i)
            items.append(decode_key(body[i + 4:i + 4 + n]))
            i += 4 + n
        return tuple(items)
    if tag == b"P":
        return pickle.loads(body)
    raise ValueError(f"not an encoded state key: {bytes(data[:16])!r}")


def encode_slot(group: int, name: str, key: Any) -> bytes:
    nb = name.encode("utf-8", "surrogatepass")
    return _GROUP.pack(group) + _GROUP.pack(len(nb)) + nb + encode_key(key)


def decode_slot(data: bytes) -> tuple[int, str, Any]:
    """``(key group, state name, key)`` of an encoded entry."""
    group, n = _GROUP.unpack_from(data, 0)[0], _GROUP.unpack_from(data, 2)[0]
    name = data[4:4 + n].decode("utf-8", "surrogatepass")
    return group, name, decode_key(data[4 + n:])
