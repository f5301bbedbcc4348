"""``key_by(cols).latest(by)`` on batch streams: per key the row with the largest ``by``
(nulls smallest), as an update stream; against a plain Python reference, through
snapshots, restores at another parallelism, both backends and a whole pipeline."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cutline import CheckpointConfig, Pipeline
from cutline.connectors import CollectSink, FileSource
from cutline.logical import HASH, ColumnKey, LatestSpec, make_node
from cutline.runtime.batches import split_by_key
from cutline.runtime.operators import UserFunctionError
from cutline.runtime.registry import build_operator

SCHEMA = pa.schema([("k", pa.string()), ("t", pa.int64()), ("x", pa.float64()),
                    ("s", pa.string())])
rows = st.fixed_dictionaries({
    "k": st.sampled_from(["a", "b", "c", "d", None]),
    "t": st.one_of(st.none(), st.integers(0, 5)),
    "x": st.one_of(st.none(), st.sampled_from([0.5, 1.0, 2.0])),
    "s": st.text("xyz", max_size=2)})
batches = st.lists(st.lists(rows, min_size=0, max_size=12), min_size=1, max_size=6)


def order(r, by):
    return tuple((r[c] is not None, r[c]) for c in by)


def reference(all_rows, by):
    """The best row per key (the first of equals), the plain way."""
    best = {}
    for r in all_rows:
        if r["k"] not in best or order(r, by) > order(best[r["k"]], by):
            best[r["k"]] = r
    return best


def node(by=("t", "x"), updates="batch"):
    return make_node(0, "latest-op", "latest", LatestSpec(("k",), tuple(by), updates),
                     key_fn=ColumnKey(("k",)), partitioning=HASH, columnar=True)


def rb(rs):
    return pa.RecordBatch.from_pylist(rs, schema=SCHEMA)


def best_of(out):
    """The last row per key of an update stream (record batches)."""
    last = {}
    for b in out:
        for r in b.to_pylist():
            last[r["k"]] = r
    return last


def same_order(got, want, by):
    """Equal keys, each key's row equal in ``by`` (ties may pick either row)."""
    return got.keys() == want.keys() and all(
        order(got[k], by) == order(want[k], by) for k in want)


@settings(max_examples=60, deadline=None)
@given(batches, st.sampled_from([("t",), ("t", "x"), ("x", "s")]))
def test_each_batch_emits_the_keys_whose_best_row_changed(data, by):
    op = build_operator(node(by), 0, 1, 128)
    seen, out = [], []
    for rs in data:
        emitted = op.process([rb(rs)]) if rs else []
        seen.extend(rs)
        before = reference(seen[:len(seen) - len(rs)], by)
        now = reference(seen, by)
        changed = {k for k in now if k not in before or order(now[k], by) > order(
            before[k], by)}
        assert set(best_of(emitted)) == changed  # an update exactly where one was due
        out.extend(emitted)
    assert same_order(best_of(out), reference(seen, by), by)


@settings(max_examples=40, deadline=None)
@given(batches, st.integers(0, 6))
def test_a_snapshot_restored_at_another_parallelism_goes_on_alike(data, cut):
    """Two subtasks, a snapshot after ``cut`` batches, restored as one subtask: the updates
    after it (flushed per checkpoint) end at the reference's best rows."""
    by = ("t", "x")
    ops = [build_operator(node(by, "checkpoint"), s, 2, 128) for s in range(2)]
    cut = min(cut, len(data))
    out = []
    for rs in data[:cut]:
        if rs:
            for s, part in enumerate(split_by_key([rb(rs)], ("k",), 128, 2)):
                ops[s].process(part)
    for op in ops:
        out.extend(op.flush())  # (a flush precedes every barrier)
    blobs = [op.snapshot() for op in ops]
    one = build_operator(node(by, "checkpoint"), 0, 1, 128)
    one.restore(blobs)
    for rs in data[cut:]:
        if rs:
            one.process([rb(rs)])
    out.extend(one.flush())
    assert same_order(best_of(out), reference([r for rs in data for r in rs], by), by)


def test_the_update_stream_is_sized_by_checkpoints_by_default():
    op = build_operator(node(), 0, 1, 128)  # updates="batch" given
    assert op.process([rb([{"k": "a", "t": 1, "x": 1.0, "s": ""}])])
    op = build_operator(node(updates="checkpoint"), 0, 1, 128)
    for t in range(5):
        assert op.process([rb([{"k": "a", "t": t, "x": 1.0, "s": ""},
                               {"k": "b", "t": 0, "x": 1.0, "s": ""}])]) == []
    rows_out = pa.Table.from_batches(op.flush()).to_pylist()
    assert sorted((r["k"], r["t"]) for r in rows_out) == [("a", 4), ("b", 0)]
    assert op.flush() == []  # nothing changed since


def _files(tmp_path, n=6, per=500):
    d = tmp_path / "in"
    d.mkdir()
    want = {}
    for f in range(n):
        rs = [{"k": f"u{(f * per + i) * 7 % 97}", "t": (f * per + i) % 311,
               "x": float(i % 5), "s": "p"} for i in range(per)]
        pq.write_table(pa.Table.from_pylist(rs, schema=SCHEMA), d / f"part-{f:03d}.parquet")
        for r in rs:
            if r["k"] not in want or (r["t"], r["x"]) > (want[r["k"]]["t"],
                                                         want[r["k"]]["x"]):
                want[r["k"]] = r
    return d, want


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
def test_a_pipeline_of_latest_rows_per_key(tmp_path, backend):
    pytest.importorskip("rocksdict") if backend == "rocksdb" else None
    d, want = _files(tmp_path)
    p = Pipeline("latest", parallelism=2, checkpoint=CheckpointConfig(
        interval=0.05, storage=f"file://{tmp_path}/ck", state_backend=backend))
    sink = CollectSink(str(tmp_path / "out"))
    (p.source(FileSource(str(d), format="parquet").batches(), uid="rows")
     .key_by("k").latest(by=["t", "x"], uid="latest").sink(sink, uid="out"))
    p.run(engine="threads", timeout=120)
    got = best_of(sink.results())
    assert {k: (r["t"], r["x"]) for k, r in got.items()} == {
        k: (r["t"], r["x"]) for k, r in want.items()}


def test_latest_refuses_a_key_column_in_by_and_names_a_missing_column(tmp_path):
    p = Pipeline("bad", parallelism=1, checkpoint=CheckpointConfig(
        storage=f"file://{tmp_path}/ck"))
    s = p.source(FileSource(str(tmp_path)).batches(), uid="rows")
    with pytest.raises(ValueError, match="k is the key"):
        s.key_by("k").latest(by=["t", "k"])
    with pytest.raises(TypeError, match="column name"):
        s.key_by("k").latest(by=[])
    op = build_operator(node(by=("when",)), 0, 1, 128)
    with pytest.raises(UserFunctionError, match="no column 'when'"):
        op.process([rb([{"k": "a", "t": 1, "x": 1.0, "s": ""}])])


# --------------------------------------------------------------------------- ColumnarRows


class CountingTable(dict):
    """A backend table: ``fast`` is the dict itself; ``get`` counts the keys read."""

    def __init__(self):
        super().__init__()
        self.fast = self
        self.reads = []

    def get(self, key, default=None):
        self.reads.append(key)
        return super().get(key, default)


ALL_TYPES = pa.schema([
    ("k", pa.int32()), ("u", pa.uint16()), ("f", pa.float32()), ("b", pa.bool_()),
    ("ts", pa.timestamp("us", tz="UTC")), ("d", pa.date32()), ("tm", pa.time64("ns")),
    ("du", pa.duration("ms")), ("dec", pa.decimal128(9, 3)), ("s", pa.string()),
    ("bin", pa.binary()), ("l", pa.list_(pa.int64())),
    ("st", pa.struct([("a", pa.int8()), ("b", pa.string())]))])


def test_rows_of_every_type_come_back_as_they_went_in_and_save_as_tuples():
    import datetime as dt
    import decimal

    full = {"k": 1, "u": 65535, "f": 1.5, "b": True,
            "ts": dt.datetime(2026, 12, 5, 7, 0, 0, 123456, tzinfo=dt.timezone.utc),
            "d": dt.date(2026, 12, 5), "tm": dt.time(7, 1, 2, 3), "du": dt.timedelta(
                milliseconds=-5), "dec": decimal.Decimal("-12.345"), "s": "é\x00z",
            "bin": b"\x00\xff", "l": [1, None, 3], "st": {"a": -1, "b": None}}
    rows_in = [full, {"k": 2, **{c: None for c in ALL_TYPES.names if c != "k"}},
               {**full, "k": 3, "l": [], "s": ""}]
    table = pa.Table.from_pylist(rows_in, schema=ALL_TYPES)
    from cutline.state.columnar import ColumnarRows

    backend = CountingTable()
    cr = ColumnarRows(ALL_TYPES, ["ts", "dec"], backend, fresh=True)
    won = cr.offer([1, 2, 3], table)
    assert won.tolist() == [0, 1, 2] and backend.reads == []  # new keys: nothing to read
    assert cr.batch(cr.take_changed()).to_pylist() == rows_in
    cr.save()
    assert backend == {r["k"]: tuple(r.values()) for r in rows_in}  # the per-key format
    # read back into new columns (a restore): the same rows, and the same order by `by`
    again = ColumnarRows(ALL_TYPES, ["ts", "dec"], backend, fresh=False)
    older = pa.Table.from_pylist([{**full, "k": 1, "dec": decimal.Decimal("-20")},
                                  {**full, "k": 2}], schema=ALL_TYPES)
    assert again.offer([1, 2], older).tolist() == [1]  # k=2's stored row is all null
    assert sorted(backend.reads) == [1, 2]
    assert again.batch(again.take_changed()).to_pylist() == [{**full, "k": 2}]
    assert again.batch(np.arange(2)).to_pylist() == [rows_in[0], {**full, "k": 2}]


@settings(max_examples=80, deadline=None)
@given(batches, st.sampled_from([("t",), ("t", "x"), ("x", "s"), ("s",)]),
       st.lists(st.booleans(), min_size=6, max_size=6), st.integers(1, 3))
def test_rows_emptied_out_and_read_back_order_as_if_held(data, by, saves, max_keys):
    """Saves after random batches with room for only ``max_keys`` rows: the best row per
    key is the reference's, and only keys once emptied out are ever read back."""
    from cutline.state.columnar import ColumnarRows

    backend = CountingTable()
    cr = ColumnarRows(SCHEMA, list(by), backend, max_keys=max_keys, fresh=True)
    seen, evicted = [], set()
    for rs, save in zip(data, saves):
        if rs:
            from cutline.runtime.batch_latest import best_per_key

            best = best_per_key(pa.Table.from_pylist(rs, schema=SCHEMA), ["k"], list(by))
            keys = best.column("k").to_pylist()
            before = set(backend.reads)
            cr.offer(keys, best)
            assert set(backend.reads) - before <= evicted & set(keys)
            seen.extend(rs)
        if save:
            held = set(cr.keys)
            cr.take_changed()
            cr.save()
            evicted |= held - set(cr.keys)
    cr.save()
    final = dict(backend)
    for k in cr.keys:
        final[k] = tuple(cr.batch(np.array([cr.index[k]])).to_pylist()[0].values())
    got = {k: dict(zip(SCHEMA.names, v)) for k, v in final.items()}
    assert same_order(got, reference(seen, by), by)


def test_past_max_keys_a_save_keeps_the_most_recently_seen_half_and_changed_rows():
    """The least recently seen keys leave the columns (and only those are read back); the
    keys seen since the last saves, and rows not yet taken by the update stream, stay."""
    from cutline.state.columnar import ColumnarRows

    def batch(keys, t):
        return pa.Table.from_pylist([{"k": k, "t": t, "x": 1.0, "s": ""} for k in keys],
                                    schema=SCHEMA)

    backend = CountingTable()
    cr = ColumnarRows(SCHEMA, ["t"], backend, max_keys=4, fresh=True)
    cr.offer(list("abcdef"), batch("abcdef", 1))
    cr.take_changed()
    cr.save()  # 6 rows, none seen since: 2 kept (ties: any 2), 4 emptied out
    assert len(cr.keys) == 2 and set(backend) == set("abcdef")
    cr.offer(list("gh"), batch("gh", 2))  # changed, not taken by the update stream
    cr.save()  # 4 rows: none forgotten
    assert len(cr.keys) == 4
    assert cr.offer(list("abc"), batch("abc", 0)).tolist() == []  # seen, not changed
    cr.save()  # 7 rows: g, h (not taken yet) and the 2 newest (of a, b, c) are kept
    kept = set(cr.keys)
    assert len(kept) == 4 and set("gh") <= kept and kept - set("gh") <= set("abc")
    assert sorted(cr.take_changed().tolist()) == sorted([cr.index["g"], cr.index["h"]])
    backend.reads.clear()
    won = cr.offer(list("abcdefgh"), batch("abcdefgh", 3))
    assert len(won) == 8 and set(backend.reads) == set("abcdefgh") - kept
    assert {k: v[1] for k, v in backend.items()} == {**dict.fromkeys("abcdef", 1),
                                                     **dict.fromkeys("gh", 2)}


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.integers(0, 40), max_size=15), min_size=1, max_size=12),
       st.integers(2, 12))
def test_eviction_keeps_the_keys_seen_at_the_latest_saves(batches_of_keys, max_keys):
    """After each save the columns hold at most ``max_keys`` rows, and every key seen since
    the save before (when those fit in half of them) is still held."""
    from cutline.state.columnar import ColumnarRows

    cr = ColumnarRows(SCHEMA, ["t"], CountingTable(), max_keys=max_keys, fresh=True)
    for i, keys in enumerate(batches_of_keys):
        keys = sorted(set(map(str, keys)))
        cr.offer(keys, pa.Table.from_pylist([{"k": k, "t": i, "x": 1.0, "s": ""}
                                             for k in keys], schema=SCHEMA))
        cr.take_changed()
        cr.save()
        assert cr.size <= max(max_keys, len(keys))
        if len(keys) <= max_keys // 2:
            assert set(keys) <= set(cr.keys)
        assert cr.index == {k: r for r, k in enumerate(cr.keys)}
        assert cr.batch(np.arange(cr.size)).column("k").to_pylist() == cr.keys


def test_after_a_restore_every_new_key_is_read():
    from cutline.state.columnar import ColumnarRows

    backend = CountingTable()
    backend["a"] = ("a", 5, 1.0, "")
    cr = ColumnarRows(SCHEMA, ["t"], backend, fresh=True)
    cr.restored()  # (the operator's restore: the backend's content replaced)
    won = cr.offer(["a", "b"], pa.Table.from_pylist(
        [{"k": "a", "t": 4, "x": 1.0, "s": ""}, {"k": "b", "t": 0, "x": 1.0, "s": ""}],
        schema=SCHEMA))
    assert won.tolist() == [1] and backend.reads == ["a", "b"]


def test_restored_rows_that_do_not_fit_the_schema_fail_with_a_clear_error():
    """State written by a pipeline whose rows had other columns: the operator names the
    mismatch instead of comparing the wrong values."""
    op = build_operator(node(("t",)), 0, 1, 128)
    op.state.table("latest").fast["a"] = ("a", 1)  # two values, where rows have four
    op.restore([op.state.snapshot()])
    with pytest.raises(UserFunctionError,
                       match="does not fit the rows .4 columns: k string, t int64"):
        op.process([rb([{"k": "a", "t": 2, "x": 1.0, "s": ""}])])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(-50, 50), max_size=30), max_size=5),
       st.lists(st.integers(-60, 60), max_size=40), st.booleans())
def test_held_keys_say_maybe_for_every_key_emptied_out_and_only_those(evictions, asked,
                                                                      fresh):
    from cutline.state.columnar import HeldKeys

    held, gone = HeldKeys(fresh), set()
    for keys in evictions:
        held.evicted(keys)
        gone |= set(keys)
    got = held.maybe(asked).tolist()
    hashes = {hash(k) for k in gone}  # (a key sharing an emptied key's hash: read too)
    assert got == ([hash(k) in hashes for k in asked] if fresh else [True] * len(asked))
    if fresh:  # each hash once, sorted: a key emptied out again is not added twice
        assert held.hashes.tolist() == sorted(hashes)
    held.restored()
    assert held.maybe(asked).tolist() == [True] * len(asked)
