"""The database keys of many keys built at once (``cutline.state.arrow_keys.encode_keys``
and ``_RocksTable.prime``) are byte for byte those built key by key: state written either
way is read back by the other, and restores as before."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cutline.state.arrow_keys import encode_keys, key_groups
from cutline.state.columnar import ColumnarRows
from cutline.state.keygroups import key_group
from cutline.state.keys import encode_key

INT_TYPES = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(),
             pa.uint32()]
edges = st.sampled_from([0, 1, -1, 127, 128, -128, -129, 255, 256, 32767, -32769,
                         2**31 - 1, -2**31, 2**55, -2**55 - 1, 2**63 - 1, -2**63])
int64s = st.integers(-2**63, 2**63 - 1) | edges
texts = st.text(max_size=40) | st.sampled_from(["", "é", "\x00", "日本語", "x" * 128])


def _strip(s):  # (Arrow strings are UTF-8: no lone surrogates)
    return s.encode("utf-8", "ignore").decode("utf-8")


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(int64s, texts, st.integers(0, 2**32 - 1)), min_size=1,
                max_size=50), st.integers(0, 3), st.sampled_from(INT_TYPES))
def test_keys_built_at_once_equal_those_built_one_by_one(rows, cut, int_type):
    rows = [(i, _strip(s), u) for i, s, u in rows]
    a = pa.array([i for i, _, _ in rows], pa.int64())
    s = pa.array([t for _, t, _ in rows], pa.string())
    lo, hi = pa.types.is_signed_integer(int_type), int_type.bit_width
    fitted = [u % (2 ** hi) - (2 ** (hi - 1) if lo else 0) for _, _, u in rows]
    u = pa.array(fitted, int_type)
    cut = min(cut, len(rows) - 1)  # (a slice: its offset into the buffers)
    for cols, keys in [([a], [i for i, _, _ in rows]), ([s], [t for _, t, _ in rows]),
                       ([u], fitted),
                       ([a, s], [(i, t) for i, t, _ in rows]),
                       ([s, u, a], [(t, f, i) for (i, t, _), f in zip(rows, fitted)])]:
        assert encode_keys(cols) == [encode_key(k) for k in keys]
        assert encode_keys([c.slice(cut) for c in cols]) == [encode_key(k)
                                                               for k in keys[cut:]]
        assert encode_keys([pa.chunked_array([c[:cut], c[cut:]]) for c in cols]) == \
            [encode_key(k) for k in keys]


def test_columns_it_does_not_lay_out_are_left_to_the_key_by_key_way():
    assert encode_keys([pa.array([1, None])]) is None  # nulls
    assert encode_keys([pa.array([1.0])]) is None  # floats (1.0 encodes as 1)
    assert encode_keys([pa.array([2**64 - 1], pa.uint64())]) is None
    assert encode_keys([pa.array(["x" * 129])]) is None  # long strings
    assert encode_keys([pa.array([b"x"])]) is None  # binary
    assert encode_keys([pa.array([1]), pa.array([True])]) is None
    assert encode_keys([pa.array([], pa.int64())]) == []


def test_primed_database_keys_are_those_the_table_builds_and_ownership_holds():
    pytest.importorskip("rocksdict")
    from cutline.state.rocksdb import RocksDBStateBackend

    b = RocksDBStateBackend(range(64, 128), 128, name="prime.1")
    try:
        t = b.table("latest")
        cols = [pa.array(list(range(1000)), pa.int64()), pa.array([f"u{i % 7}" for i in
                                                                    range(1000)])]
        groups = key_groups(pa.table({"a": cols[0], "b": cols[1]}), ["a", "b"], 128)
        mine = groups >= 64
        keys = [k for k, m in zip(zip(cols[0].to_pylist(), cols[1].to_pylist()), mine) if m]
        t.prime(keys, groups[mine], encode_keys([c.filter(pa.array(mine)) for c in cols]))
        primed = {k: t._enc[k] for k in keys}
        t._enc.clear()
        assert primed == {k: t.encode(k) for k in keys}
        other = next(k for k, m in zip(zip(cols[0].to_pylist(), cols[1].to_pylist()), mine)
                     if not m)
        with pytest.raises(RuntimeError, match="is not owned by this subtask"):
            t.prime([other], groups[~mine][:1], encode_keys([pa.array([other[0]]),
                                                             pa.array([other[1]])]))
    finally:
        b.close()


def test_rows_saved_with_primed_keys_restore_as_those_saved_key_by_key(storage):
    pytest.importorskip("rocksdict")
    from cutline.state.rocksdb import RocksDBStateBackend

    schema = pa.schema([("bidder", pa.int64()), ("auction", pa.int64()), ("t", pa.int64()),
                        ("extra", pa.string())])
    rows = pa.table({"bidder": [i % 97 for i in range(3000)], "auction": list(range(3000)),
                     "t": [i * 7 % 13 for i in range(3000)],
                     "extra": [f"e{i}" for i in range(3000)]}, schema=schema)
    keys = list(zip(rows.column("bidder").to_pylist(), rows.column("auction").to_pylist()))
    snaps = []
    for prime in (True, False):
        b = RocksDBStateBackend(range(0, 128), 128, name=f"rows.{prime}", storage=storage)
        cr = ColumnarRows(schema, ["t"], b.table("latest"), fresh=True,
                          key_columns=["bidder", "auction"] if prime else None,
                          max_parallelism=128)
        cr.offer(keys, rows)
        cr.save()
        snaps.append(b.snapshot().finish(storage, 1 + prime))
        b.close()
    for blob in snaps:  # each restored at 2 subtasks: the same rows, read by either way
        got = {}
        for lo, hi in ((0, 64), (64, 128)):
            b = RocksDBStateBackend(range(lo, hi), 128, name=f"back.{lo}", storage=storage)
            b.restore([blob])
            here = {k: v for _, name, k, v in b.entries() if name == "latest"}
            assert all(lo <= key_group(k, 128) < hi for k in here)  # in its key group
            got.update(here)
            b.close()
        assert got == {k: tuple(r.values()) for k, r in zip(keys, rows.to_pylist())}
    assert np.all(np.array([len(s) for s in snaps]) > 0)


def test_aggregates_saved_with_primed_keys_restore_in_their_key_groups(storage):
    pytest.importorskip("rocksdict")
    from cutline.runtime.batches import Partials
    from cutline.state.columnar import ColumnarAggregates
    from cutline.state.rocksdb import RocksDBStateBackend

    partials = Partials((("n", None, "count"), ("s", "v", "sum")))
    t = pa.table({"user": [f"u{i % 50}" for i in range(4000)],
                  "day": pa.array([i % 3 for i in range(4000)], pa.int32()),
                  "v": list(range(4000))})
    key_cols, arrays = partials.arrow(t, ["user", "day"])
    b = RocksDBStateBackend(range(0, 128), 128, name="agg.0", storage=storage)
    cols = ColumnarAggregates([f for _, f in partials.parts], [a.type for a in arrays],
                              [c.type for c in key_cols], partials.reads,
                              b.table("aggregate"), fresh=True, max_parallelism=128)
    cols.merge(key_cols, arrays)
    cols.save()
    keys = list(zip(key_cols[0].to_pylist(), key_cols[1].to_pylist()))
    assert set(keys) <= set(b.table("aggregate")._enc)  # built at once, before the write
    blob = b.snapshot().finish(storage, 1)
    b.close()
    want = {}
    for r in t.to_pylist():
        n, s = want.get((r["user"], r["day"]), (0, 0))
        want[(r["user"], r["day"])] = (n + 1, s + r["v"])
    got = {}
    for lo, hi in ((0, 64), (64, 128)):
        r = RocksDBStateBackend(range(lo, hi), 128, name=f"agg.{lo}", storage=storage)
        r.restore([blob])
        here = {k: tuple(v) for _, name, k, v in r.entries() if name == "aggregate"}
        assert all(lo <= key_group(k, 128) < hi for k in here)
        got.update(here)
        r.close()
    assert got == want
