"""Keys to key groups, key groups to subtasks: how keyed state and hash-partitioned records
find the subtask that owns them.

Keys hash (the same in every process) to ``max_parallelism`` key groups; a subtask owns a
contiguous range of them (Flink's assignment), so keyed state can be restored at another
parallelism by moving whole key groups.  The planner routes records with these functions
and the state backends place state with them: the two must agree.
"""

from __future__ import annotations

import pickle
import struct
import zlib
from typing import Any

__all__ = ["stable_hash", "key_group", "key_group_range", "subtask_for_key_group"]


def stable_hash(key: Any) -> int:
    """A hash of ``key`` that is the same in every process (``hash()`` of str is not)."""
    t = type(key)
    if t is str:  # the common cases first (the same values as below)
        return _mix(zlib.crc32(key.encode("utf-8", "surrogatepass")))
    if t is int:
        return _mix(key & 0xFFFFFFFFFFFFFFFF)
    if t is tuple:  # (the value below: a composite key skips the checks before it)
        return _mix(_items_hash(key))
    # Equal keys hash equally, as in a dict: 1, 1.0 and True are one key.
    if isinstance(key, bool):
        key = int(key)
    elif isinstance(key, float) and key.is_integer():
        key = int(key)
    if key is None:
        h = 0
    elif isinstance(key, int):
        h = key & 0xFFFFFFFFFFFFFFFF
    elif isinstance(key, str):
        h = zlib.crc32(key.encode("utf-8", "surrogatepass"))
    elif isinstance(key, bytes):
        h = zlib.crc32(key)
    elif isinstance(key, float):
        h = zlib.crc32(struct.pack("<d", key))
    elif isinstance(key, tuple):
        h = _items_hash(key)
    else:
        h = zlib.crc32(pickle.dumps(key, protocol=5))
    return _mix(h)


def _items_hash(key: tuple) -> int:
    """A tuple's items combined (before :func:`_mix`)."""
    h = 17
    for item in key:
        h = (h * 31 + stable_hash(item)) & 0xFFFFFFFFFFFFFFFF
    return h


def _mix(h: int) -> int:
    """murmur3's finaliser: spreads consecutive keys over key groups."""
    h ^= h >> 33
    h = (h * 0xFF51AFD7ED558CCD) & 0xFFFFFFFFFFFFFFFF
    return h ^ (h >> 33)


def key_group(key: Any, max_parallelism: int) -> int:
    return stable_hash(key) % max_parallelism


def key_group_range(subtask: int, parallelism: int, max_parallelism: int) -> range:
    """The contiguous key groups owned by ``subtask`` (Flink's formula)."""
    start = (subtask * max_parallelism + parallelism - 1) // parallelism
    end = ((subtask + 1) * max_parallelism - 1) // parallelism
    return range(start, end + 1)


def subtask_for_key_group(group: int, parallelism: int, max_parallelism: int) -> int:
    return group * parallelism // max_parallelism
