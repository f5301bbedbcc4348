"""The task state schema (``cutline.storage.schema``): versioned encode/decode, old
checkpoints restoring, newer ones refused by name; and the typed channel id."""

from __future__ import annotations

import collections
import pickle
import shutil
from pathlib import Path

import msgpack
import pytest
from pipelines import sentence, wordcount

from cutline.plan import plan
from cutline.storage.schema import ChannelId
from cutline.state.reader import keyed_rows
from cutline.storage.checkpoints import (
    CheckpointStorage,
    CorruptCheckpointError,
    open_checkpoint,
)
from cutline.storage.schema import (
    VERSION,
    TaskState,
    UnsupportedStateVersionError,
    decode_task_state,
    encode_task_state,
    read_task_states,
)

V1_CHECKPOINT = Path(__file__).parent.parent / "data" / "checkpoint-v1" / "chk-3"
V1_RECORDS = 3000  # tests/data/make_checkpoint_v1.py

CH = ChannelId("src", 0, "count", 1)


def _v1_map(**changes):
    """A task state exactly as cutline up to be9b5d9 wrote it (``Subtask._write_snapshot``)."""
    state = {"task": "count.1", "chain": "count", "index": 1, "parallelism": 2,
             "source_uid": None, "sink_uid": "out", "ops": {"count": b"keyed"},
             "source": None, "sink": [{"files": ["_staging/a"], "checkpoint_id": 3}],
             "channels": {"src.0->count.1": [pickle.dumps([1, 2], protocol=5)]},
             "out_channels": {}}
    state.update(changes)
    return {k: v for k, v in state.items() if v is not ...}


def test_channel_id_has_typed_parts_and_its_text_on_the_wire():
    assert str(CH) == "src.0->count.1"
    assert (CH.src_chain, CH.src_index, CH.dst_chain, CH.dst_index) == ("src", 0, "count", 1)
    assert (CH.src_task, CH.dst_task) == ("src.0", "count.1")
    assert ChannelId.parse("a.b.10->c.2") == ChannelId("a.b", 10, "c", 2)
    assert ChannelId.parse(str(CH)) == CH
    assert pickle.loads(pickle.dumps(CH)) == CH
    for bad in ("a.0", "a->b.1", "a.x->b.1", "a.0->b", ".0->b.1"):
        with pytest.raises(ValueError, match="not a channel id"):
            ChannelId.parse(bad)


def test_the_plan_builds_typed_channel_ids(tmp_path):
    p, _ = wordcount(tmp_path, 10, parallelism=2)
    pp = plan(p)
    source, count = pp.chains
    assert pp.inputs(count, 1) == [ChannelId("sentences", 0, "count", 1),
                                   ChannelId("sentences", 1, "count", 1)]
    ((_, chans),) = pp.outputs(source, 0)
    assert [c.dst_task for c in chans] == ["count.0", "count.1"]


def test_task_state_round_trips_in_the_current_version():
    st = TaskState(task="count.1", chain="count", index=1, parallelism=2,
                   ops={"count": b"\x00keyed"}, source_uid="src", source={"next": 7},
                   sink_uid="out", sink=({"files": ["a"]},), dead_letter=({"files": []},),
                   channels={CH: (b"r1", b"r2")}, out_channels={CH: (b"o",)})
    data = encode_task_state(st)
    assert msgpack.unpackb(data)["version"] == VERSION == 3
    back = decode_task_state(data, "x/count.1.state")
    assert back == st
    assert all(type(ch) is ChannelId for ch in back.channels)
    assert list(msgpack.unpackb(data)["channels"]) == ["src.0->count.1"]  # text in the file
    assert back.in_flight_bytes == 5


def test_a_version_1_map_decodes_as_version_1():
    st = decode_task_state(msgpack.packb(_v1_map(), use_bin_type=True), "chk-3/count.1.state")
    assert st.task == "count.1" and st.chain == "count" and (st.index, st.parallelism) == (1, 2)
    assert st.ops == {"count": b"keyed"} and st.sink_uid == "out"
    assert st.sink == ({"files": ["_staging/a"], "checkpoint_id": 3},)
    assert st.channels == {CH: (pickle.dumps([1, 2], protocol=5),)}
    assert st.dead_letter == () and st.out_channels == {}
    # before unaligned output state (c811a24) and dead letters: those keys absent; no sink
    older = decode_task_state(msgpack.packb(_v1_map(out_channels=..., sink=None,
                                                    sink_uid=None)), "f")
    assert older.out_channels == {} and older.sink == () and older.sink_uid is None
    with_dl = decode_task_state(msgpack.packb(_v1_map(dead_letter=[{"files": ["d"]}])), "f")
    assert with_dl.dead_letter == ({"files": ["d"]},)


@pytest.mark.parametrize("data, match", [
    (b"\xc1", r"unreadable task state chk-3/a\.0\.state"),
    (msgpack.packb([1, 2]), r"task state chk-3/a\.0\.state is a msgpack list, not a map"),
    (msgpack.packb(_v1_map(parallelism=...)),
     r"chk-3/a\.0\.state \(format version 1\) lacks parallelism"),
    (msgpack.packb({**_v1_map(), "version": 2}), r"\(format version 2\) lacks dead_letter"),
    (msgpack.packb(_v1_map(index="1")), r"field 'index' must be an integer >= 0, got str"),
    (msgpack.packb(_v1_map(channels={"nochannel": []})), r"not a channel id: 'nochannel'"),
])
def test_what_is_not_a_task_state_is_refused_naming_the_file(data, match):
    with pytest.raises(CorruptCheckpointError, match=match):
        decode_task_state(data, "chk-3/a.0.state")


@pytest.mark.parametrize("version", [4, 99, "2", True])
def test_an_unknown_version_is_refused_naming_version_and_file(version):
    data = msgpack.packb({**_v1_map(), "version": version, "dead_letter": []})
    with pytest.raises(UnsupportedStateVersionError,
                       match=rf"task state chk-9/count\.1\.state has format version "
                             rf"{version!r}; this cutline reads versions 1, 2, 3"):
        decode_task_state(data, "chk-9/count.1.state")


def _v1_copy(tmp_path) -> str:
    dest = tmp_path / "old" / "wordcount" / V1_CHECKPOINT.name
    shutil.copytree(V1_CHECKPOINT, dest)
    return str(dest)


@pytest.mark.parametrize("parallelism", [2, 3])
def test_a_checkpoint_written_by_be9b5d9_restores(tmp_path, parallelism):
    """The committed fixture: a mid-run checkpoint of ``pipelines.wordcount`` written by the
    code at be9b5d9 (parallelism 2).  Restored as it is or rescaled, the run continues
    exactly: every word's count goes on from the count in the checkpoint."""
    path = _v1_copy(tmp_path)
    handle = open_checkpoint(path)
    states = read_task_states(handle)
    assert sorted(states) == ["count.0", "count.1", "sentences.0", "sentences.1"]
    assert all(st.parallelism == 2 for st in states.values())
    before = {r["key"]: r["count"] for r in keyed_rows(handle, "count")}
    totals = collections.Counter(w for i in range(V1_RECORDS) for w in sentence(i).split())
    assert 0 < sum(before.values()) < sum(totals.values()), "a mid-run checkpoint"
    p, sink = wordcount(tmp_path, V1_RECORDS, "aligned", parallelism=parallelism,
                        interval=0.2)
    result = p.run(engine="threads", timeout=120, restore_from=path)
    assert result.restored_from.rstrip("/").endswith("chk-3")
    assert collections.Counter(sink.results()) == collections.Counter(
        (w, k) for w, n in totals.items() for k in range(before.get(w, 0) + 1, n + 1))


def test_a_checkpoint_of_a_newer_version_is_refused_before_the_run(tmp_path):
    storage = CheckpointStorage(f"file://{tmp_path}/ck", "wordcount")
    newer = {**_v1_map(), "version": VERSION + 1, "dead_letter": []}
    storage.write_task_state(4, "count.1", msgpack.packb(newer, use_bin_type=True))
    path = storage.commit(4, {"plan": {}})
    p, _ = wordcount(tmp_path, 100, "aligned")
    with pytest.raises(UnsupportedStateVersionError,
                       match=rf"task state {path}/count\.1\.state has format version 4"):
        p.run(engine="threads", timeout=60, restore_from=path)
