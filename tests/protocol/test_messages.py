"""The typed control plane: every message round-trips; anything else is refused by name."""

import dataclasses

import msgpack
import pytest
from hypothesis import given, strategies as st

from cutline.protocol import messages as m

ALL = [cls for cls in vars(m).values()
       if isinstance(cls, type) and dataclasses.is_dataclass(cls) and hasattr(cls, "TAG")]

_names = st.text(min_size=1, max_size=12)
_addr = st.one_of(st.none(), st.tuples(st.just("127.0.0.1"), st.integers(1, 65535)).map(list))
_stats = st.builds(m.SnapshotStats, path=st.one_of(st.none(), _names),
                   size=st.one_of(st.none(), st.integers(0, 2**40)),
                   bytes=st.integers(0, 2**40), in_flight=st.integers(0, 10**6),
                   alignment=st.floats(0, 1e6), forward_closed=st.booleans())

MESSAGES = st.one_of(
    st.builds(m.Register, st.integers(0, 64), st.integers(1, 2**22),
              st.dictionaries(_names, _addr, max_size=4)),
    st.builds(m.Ack, _names, st.integers(1, 2**31), _stats),
    st.builds(m.Decline, _names, st.integers(1, 2**31), st.text()),
    st.builds(m.Drained, _names), st.builds(m.ForwardClosed, _names),
    st.builds(m.Metrics, _names, st.integers(0, 2**40), st.booleans(), st.floats(0, 1e6),
              st.booleans(), st.one_of(st.none(), st.just("inf"), st.floats(-1e12, 1e12))),
    st.builds(m.Finished, _names, st.floats(0, 1e6)),
    st.builds(m.Failed, _names, st.booleans(), st.text(), st.text()),
    st.builds(m.Start, st.integers(0, 99), st.dictionaries(_names, _addr, max_size=4),
              st.one_of(st.none(), _names), st.floats(0, 2e9)),
    st.builds(m.Trigger, st.integers(1, 2**31), _names),
    st.builds(m.Abort, st.integers(1, 2**31)),
    st.builds(m.Complete, st.integers(1, 2**31), st.booleans()),
    st.builds(m.CloseLoop, _names), st.builds(m.Stop, st.booleans()),
    st.builds(m.Align, _names, st.one_of(st.none(), st.just("inf"), st.floats(-1e12, 1e12))),
    st.builds(m.Initiated, st.integers(1, 2**31), _names),
    st.builds(m.IdsWanted, st.integers(0, 64)),
    st.builds(m.Ids, st.lists(st.integers(1, 2**31), max_size=8)),
    st.builds(m.TriggerProcesses, st.integers(1, 2**31), st.lists(_names, max_size=4)),
    st.builds(m.FinalStates, st.integers(0, 64), st.dictionaries(_names, st.binary())),
    st.builds(m.SavepointRequest, st.booleans(), st.floats(0.1, 1e4)),
    st.builds(m.SavepointReply, st.booleans(), st.one_of(st.none(), _names)),
)


@given(MESSAGES)
def test_every_message_round_trips(msg):
    assert m.decode(m.encode(msg)) == msg


def test_every_message_class_is_covered_and_frozen():
    assert len({cls.TAG for cls in ALL}) == len(ALL)
    for cls in ALL:
        assert cls.__dataclass_params__.frozen, cls


@pytest.mark.parametrize("frame, says", [
    (b"\xc1", "not a msgpack frame"),
    (msgpack.packb({"op": "ack", "task": "a.0"}), "not a control message frame"),
    (msgpack.packb([99, "ack", "a.0", 1, []]), "codec version 99"),
    (msgpack.packb([m.VERSION, "akc", "a.0", 1]), "unknown control message 'akc'"),
    (msgpack.packb([m.VERSION, "ack", "a.0"]), "malformed 'ack' message: 1 fields"),
    (msgpack.packb([m.VERSION, "ack", "a.0", "7", []]), "field 'checkpoint' is '7'"),
    (msgpack.packb([m.VERSION, "ack", "a.0", 7, [None, "big"]]), "field 'size' is 'big'"),
    (msgpack.packb([m.VERSION, "complete", True]), "field 'checkpoint' is True"),
])
def test_anything_else_is_refused_by_name(frame, says):
    with pytest.raises(m.MessageError, match=says.replace("(", r"\(")):
        m.decode(frame)


def test_only_messages_encode():
    with pytest.raises(TypeError, match="not a control message"):
        m.encode({"op": "stop"})
