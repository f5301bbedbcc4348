"""Key groups of the rows of an Arrow record batch, computed per column with numpy.

The columnar path (``key_by("col")`` on a batch stream) routes a row to the key group that
:func:`cutline.state.keygroups.key_group` gives the same key on the per-record path: the
key is the column's value (``key_by("user")`` is ``lambda r: r["user"]`` on the row as a
dict), or the tuple of the columns' values (``key_by(["a", "b"])``).  So the two paths can
be mixed, and keyed state written by either moves by key group on a rescale.

:func:`stable_hash` per Arrow type, vectorised: integers and booleans are the value (two's
complement, 64 bits); strings and binaries the CRC-32 of their bytes (table-driven, one
numpy pass per byte position over the rows still that long); floats are integers when they
hold one, else the CRC-32 of their 8 little-endian bytes; null is 0; a tuple is
``h = 17; h = h * 31 + hash(item)``.  Every hash ends with murmur3's finaliser.  Other
types (timestamps, decimals, lists ...) go through Python per row, exactly as per record.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.types as pat

from .keygroups import stable_hash

__all__ = ["column_hashes", "encode_keys", "key_groups"]

_U64 = np.uint64
_C = _U64(0xFF51AFD7ED558CCD)
_S33 = _U64(33)


def _crc_table() -> np.ndarray:
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = np.where(table & 1, (table >> 1) ^ np.uint32(0xEDB88320), table >> 1)
    return table.astype(np.uint32)


_TABLE = _crc_table()


def _mix(h: np.ndarray) -> np.ndarray:
    h = h ^ (h >> _S33)
    h = h * _C  # wraps modulo 2**64, as the per-record version masks
    return h ^ (h >> _S33)


def _crc32_var(starts: np.ndarray, lens: np.ndarray, data: np.ndarray) -> np.ndarray:
    """CRC-32 of ``data[starts[i]:starts[i] + lens[i]]`` for every i."""
    n = len(starts)
    crc = np.full(n, 0xFFFFFFFF, dtype=np.uint32)
    if n == 0:
        return crc
    order = np.argsort(-lens, kind="stable")  # longest first: the rows still going are a prefix
    s_starts, s_lens = starts[order], lens[order]
    s_crc = crc[order]
    # how many rows are longer than p, for each position p
    longest = int(s_lens[0]) if n else 0
    going = np.searchsorted(-s_lens, -np.arange(longest), side="left")
    table, ff = _TABLE, np.uint32(0xFF)
    for p in range(longest):
        k = int(going[p])
        c = s_crc[:k]
        b = data[s_starts[:k] + p]
        s_crc[:k] = table[(c ^ b) & ff] ^ (c >> np.uint32(8))
    crc[order] = s_crc
    return crc ^ np.uint32(0xFFFFFFFF)


def _values_of(arr: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A string or binary array's values: each one's start and length in ``data``, its
    bytes (the buffers as they are: no copy)."""
    large = pat.is_large_string(arr.type) or pat.is_large_binary(arr.type)
    bufs = arr.buffers()
    n = len(arr)
    off = np.frombuffer(bufs[1], dtype=np.int64 if large else np.int32)[arr.offset:
                                                                         arr.offset + n + 1]
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else \
        np.zeros(0, np.uint8)
    starts = off[:-1].astype(np.int64)
    return starts, off[1:].astype(np.int64) - starts, data


def _binary_hash(arr: pa.Array) -> np.ndarray:
    starts, lens, data = _values_of(arr)
    return _crc32_var(starts, lens, data).astype(_U64)


def _int_hash(values: np.ndarray) -> np.ndarray:
    return values.astype(np.int64, copy=False).view(_U64) if values.dtype.kind == "i" \
        else values.astype(_U64)


def _float_hash(arr: pa.Array) -> np.ndarray:
    x = arr.to_numpy(zero_copy_only=False).astype(np.float64)
    h = np.zeros(len(x), dtype=_U64)
    finite = np.isfinite(x)
    whole = finite & (np.floor(np.where(finite, x, 0.0)) == x)
    small = whole & (np.abs(x) < 2.0 ** 63)
    h[small] = x[small].astype(np.int64).view(_U64)
    rest = ~whole
    if rest.any():  # the CRC-32 of the 8 bytes of the double, little-endian
        raw = np.ascontiguousarray(x[rest].astype("<f8")).view(np.uint8)
        m = int(rest.sum())
        h[rest] = _crc32_var(np.arange(m, dtype=np.int64) * 8, np.full(m, 8, np.int64),
                             raw).astype(_U64)
    huge = whole & ~small  # whole numbers beyond int64: as Python does it
    for i in np.flatnonzero(huge):
        h[i] = _U64(int(x[i]) & 0xFFFFFFFFFFFFFFFF)
    return h


def _unmixed(arr: pa.Array) -> np.ndarray | None:
    """The pre-finaliser hash of every row of ``arr`` (nulls: 0), or None when the type has
    no vectorised form."""
    t = arr.type
    if pat.is_dictionary(t):
        inner = _unmixed(arr.dictionary)
        if inner is None:
            return None
        idx = arr.indices.fill_null(0).to_numpy(zero_copy_only=False)
        h = inner[idx] if len(inner) else np.zeros(len(arr), _U64)
    elif pat.is_null(t):
        return np.zeros(len(arr), dtype=_U64)
    elif pat.is_boolean(t):
        h = arr.fill_null(False).to_numpy(zero_copy_only=False).astype(_U64)
    elif pat.is_integer(t):
        h = _int_hash(arr.fill_null(0).to_numpy(zero_copy_only=False))
    elif pat.is_floating(t):
        h = _float_hash(arr.fill_null(0.0))
    elif pat.is_string(t) or pat.is_large_string(t) or pat.is_binary(t) or \
            pat.is_large_binary(t):
        h = _binary_hash(arr)
    else:
        return None
    if arr.null_count:
        h = np.where(arr.is_null().to_numpy(zero_copy_only=False), _U64(0), h)
    return h


def column_hashes(arr: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """:func:`stable_hash` of every value of ``arr`` (uint64)."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    h = _unmixed(arr)
    if h is None:  # no vectorised form: per row, as the record path does it
        return np.fromiter((stable_hash(v) for v in arr.to_pylist()), dtype=_U64,
                           count=len(arr))
    return _mix(h)


def key_groups(batch: Any, columns: tuple[str, ...] | list[str],
               max_parallelism: int) -> np.ndarray:
    """The key group of every row of ``batch`` (a record batch or table) keyed by
    ``columns``: one column keys by its value, several by the tuple of their values."""
    if len(columns) == 1:
        h = column_hashes(batch.column(columns[0]))
    else:
        h = np.full(batch.num_rows, 17, dtype=_U64)
        for c in columns:
            h = h * _U64(31) + column_hashes(batch.column(c))
        h = _mix(h)
    return (h % _U64(max_parallelism)).astype(np.int64)


# --------------------------------------------------------------------------- key bytes

_MAX_TEXT = 128  # longest string a row's bytes are laid out for (longer: per row)
_THRESHOLDS = np.array([1 << (8 * k - 1) for k in range(1, 9)], dtype=_U64)


def _int_piece(arr: pa.Array) -> tuple[np.ndarray, np.ndarray] | None:
    """``b"I"`` + the value's bytes as ``int.to_bytes((bit_length + 8) // 8, "big",
    signed=True)``, as a byte matrix (one row per value) and the mask of its bytes."""
    t = arr.type
    if pat.is_unsigned_integer(t) and t.bit_width == 64:
        return None  # (values past int64)
    v = arr.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    n = len(v)
    mag = np.abs(v).view(_U64)  # (|-2**63| is 2**63 as uint64)
    size = 1 + (mag[:, None] >= _THRESHOLDS[None, :]).sum(axis=1)  # bytes: 1 .. 9
    mat = np.empty((n, 10), dtype=np.uint8)
    mat[:, 0] = ord("I")
    mat[:, 1] = np.where(v < 0, 0xFF, 0)  # the sign byte of a 9-byte value
    mat[:, 2:] = v.astype(">i8").view(np.uint8).reshape(n, 8)
    mask = np.empty((n, 10), dtype=bool)
    mask[:, 0] = True
    mask[:, 1:] = np.arange(9)[None, :] >= (9 - size)[:, None]
    return mat, mask


def _text_piece(arr: pa.Array) -> tuple[np.ndarray, np.ndarray] | None:
    """``b"S"`` + the string's UTF-8 bytes, as a byte matrix and the mask of its bytes."""
    if not (pat.is_string(arr.type) or pat.is_large_string(arr.type)):
        return None
    starts, lens, data = _values_of(arr)
    n = len(arr)
    width = int(lens.max()) if n else 0
    if width > _MAX_TEXT:
        return None
    mat = np.zeros((n, 1 + width), dtype=np.uint8)
    mat[:, 0] = ord("S")
    mask = np.empty((n, 1 + width), dtype=bool)
    mask[:, 0] = True
    pos = np.arange(width)
    mask[:, 1:] = pos[None, :] < lens[:, None]
    if width and len(data):
        at = np.minimum(starts[:, None] + pos[None, :], len(data) - 1)
        mat[:, 1:] = np.where(mask[:, 1:], data[at], 0)
    return mat, mask


def encode_keys(columns: list[pa.Array]) -> list[bytes] | None:
    """:func:`cutline.state.keys.encode_key` of every row's key (one column: its value;
    several: the tuple of their values), or None when a column is not one this lays out
    (integers to int64, strings up to 128 bytes, no nulls): then key by key."""
    pieces = []
    for col in columns:
        if isinstance(col, pa.ChunkedArray):
            col = col.combine_chunks()
        if col.null_count:
            return None
        t = col.type
        piece = _int_piece(col) if pat.is_integer(t) else _text_piece(col)
        if piece is None:
            return None
        pieces.append(piece)
    if not pieces:
        return None
    n = len(pieces[0][0])
    if len(pieces) == 1:
        mat, mask = pieces[0]
    else:  # b"T" + (the item's length, 4 bytes big-endian, + its bytes) per item
        mats = [np.full((n, 1), ord("T"), dtype=np.uint8)]
        masks = [np.ones((n, 1), dtype=bool)]
        for m, k in pieces:
            lens = k.sum(axis=1).astype(">u4")
            mats += [lens.view(np.uint8).reshape(n, 4), m]
            masks += [np.ones((n, 4), dtype=bool), k]
        mat, mask = np.concatenate(mats, axis=1), np.concatenate(masks, axis=1)
    data = mat[mask].tobytes()  # the rows' bytes, one after another (row-major)
    ends = np.cumsum(mask.sum(axis=1)).tolist()
    return [data[a:b] for a, b in zip([0, *ends[:-1]], ends)]
