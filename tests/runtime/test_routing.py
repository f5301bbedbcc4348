"""Hash routing of per-record edges (cutline.runtime.routing.Router): where each record goes,
in order, with a function key and a column key; bad keys named with their record's index."""

import pytest

from cutline.logical import ColumnKey
from cutline.plan import Edge
from cutline.runtime.keys import fast_key
from cutline.runtime.operators import UserFunctionError
from cutline.runtime.routing import Router
from cutline.state.keygroups import key_group, subtask_for_key_group

MAXP = 128


def router(key_fn, p):
    chans = [f"c{j}" for j in range(p)]
    r = Router("src.0", [(Edge(0, 1, "hash", key_fn), chans, p, "count")], MAXP, None,
               lambda: "source 'src' subtask 0", 1000, lambda: None)
    return r, chans


def oracle(records, key, p):
    """Each channel's records, in order, computed the plain way."""
    out = [[] for _ in range(p)]
    for r in records:
        out[subtask_for_key_group(key_group(key(r), MAXP), p, MAXP)].append(r)
    return out


RECORDS = [{"user": f"u{i % 37}", "n": i, "pair": (i % 3, f"x{i % 5}")} for i in range(2500)]


@pytest.mark.parametrize("p", [1, 2, 3, 16])
@pytest.mark.parametrize("key", ["lambda", "column", "columns"])
def test_records_go_to_their_key_groups_subtask_in_order(p, key):
    key_fn = {"lambda": lambda r: r["user"], "column": ColumnKey(("user",)),
              "columns": ColumnKey(("user", "pair"))}[key]
    r, chans = router(key_fn, p)
    for i in range(0, len(RECORDS), 700):  # batches, and the key cache across them
        r.emit(RECORDS[i:i + 700])
    want = oracle(RECORDS, key_fn, p)
    assert [r.buffers[c] for c in chans] == want
    assert sum(map(len, want)) == len(RECORDS)


def test_a_column_key_is_an_itemgetter_with_the_same_values_and_errors():
    for cols in (("user",), ("user", "pair")):
        ck = ColumnKey(cols)
        fast = fast_key(ck)
        assert fast is not ck
        assert [fast(x) for x in RECORDS[:50]] == [ck(x) for x in RECORDS[:50]]
        with pytest.raises(KeyError) as a:
            ck({"n": 1})
        with pytest.raises(KeyError) as b:
            fast({"n": 1})
        assert a.value.args == b.value.args
    fn = lambda r: r  # noqa: E731
    assert fast_key(fn) is fn


def test_a_failing_key_names_its_record_and_index():
    batch = [{"user": "a"}, {"user": "b"}, {"nope": 1}, {"user": "a"}]
    r, _ = router(ColumnKey(("user",)), 2)
    with pytest.raises(UserFunctionError, match=r"record 2 of 4 in its batch, source 'src'"):
        r.emit(batch)


def test_an_equal_record_before_the_failing_one_does_not_take_its_index():
    class Flaky:
        def __init__(self, bad):
            self.bad = bad

        def __eq__(self, other):
            return isinstance(other, Flaky)

        __hash__ = None

    def key(rec):
        if rec.bad:
            raise ValueError("bad record")
        return 1

    batch = [Flaky(False), Flaky(False), Flaky(True)]
    r, _ = router(key, 2)
    with pytest.raises(UserFunctionError, match=r"record 2 of 3"):
        r.emit(batch)


def test_an_unhashable_key_is_named():
    r, _ = router(lambda rec: [rec] if rec == 5 else rec, 2)
    with pytest.raises(UserFunctionError, match=r"unhashable key \[5\].*record 1 of 2"):
        r.emit([4, 5])
