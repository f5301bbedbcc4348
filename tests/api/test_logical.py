"""The typed logical graph (issue 26, item 3): a node class per kind, one factory, each
payload checked when the node is made, and what checkpoints know of nodes unchanged."""

from __future__ import annotations

import dataclasses
import operator
import pickle
import types

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from cutline import Pipeline, tumbling
from cutline.api import Node
from cutline.connectors import CollectSink, GeneratorSource
from cutline.logical import (
    NODE_CLASSES,
    AggSpec,
    BatchFunction,
    BatchWindowSpec,
    ColumnTime,
    CountSpec,
    FallibleNode,
    IterateNode,
    Kind,
    LatestSpec,
    MapNode,
    ProcessNode,
    TimestampSpec,
    make_node,
    node_class,
)
from cutline.plan import plan
from cutline.protocol.watermarks import BoundedOutOfOrderness
from cutline.protocol.windows import WindowSpec, columns, counting
from cutline.runtime.restore import fingerprint


def _own_operator(node, subtask, parallelism, max_parallelism, **kw):  # Kind.OPERATOR
    raise AssertionError("not built here")


_WINDOW = WindowSpec(tumbling(10), 0.0, len, counting())
_BATCH_WINDOW = BatchWindowSpec(("user",), (("n", None, "count"),), tumbling(10), 0.0, "ts",
                                columns((("n", None, "count"),)))
# a payload of each kind (picklable: module-level functions and specs)
PAYLOADS = {
    Kind.SOURCE: GeneratorSource(count=3),
    Kind.MAP: str,
    Kind.FLAT_MAP: list,
    Kind.FILTER: bool,
    Kind.UNION: None,
    Kind.ITERATE: None,
    Kind.ASSIGN_TIMESTAMPS: TimestampSpec(len, BoundedOutOfOrderness(1.0)),
    Kind.REDUCE: operator.add,
    Kind.PROCESS: operator.add,
    Kind.COUNT: CountSpec("checkpoint"),
    Kind.WINDOW: _WINDOW,
    Kind.WINDOW_RESULTS: _WINDOW,
    Kind.WINDOW_LATE: _BATCH_WINDOW,
    Kind.COMBINE: AggSpec(("user",), (("n", None, "count"),)),
    Kind.SINK: CollectSink(),
    Kind.OPERATOR: _own_operator,
    Kind.MAP_BATCHES: BatchFunction(len),
    Kind.FILTER_BATCHES: BatchFunction(len, "pandas"),
    Kind.SELECT: ["a", "b"],
    Kind.WHERE: pc.field("a") > 3,
    Kind.WITH_COLUMN: ("b", pc.field("a") * 2),
    Kind.TO_ROWS: None,
    Kind.TO_BATCHES: pa.schema([("a", pa.int64())]),
    Kind.AGGREGATE: AggSpec(("user",), (("n", None, "count"),), "batch"),
    Kind.WINDOW_AGG: _BATCH_WINDOW,
    Kind.LATEST: LatestSpec(("user",), ("ts", "price"), "batch"),
}


def test_every_kind_has_a_node_class_of_its_own():
    assert set(NODE_CLASSES) == set(Kind) == set(PAYLOADS)
    assert len(set(NODE_CLASSES.values())) == len(Kind)
    for kind, cls in NODE_CLASSES.items():
        assert issubclass(cls, Node) and cls.kind is kind
        assert node_class(kind) is cls is node_class(kind.value)


@pytest.mark.parametrize("kind", list(Kind))
def test_the_factory_builds_the_kinds_class_with_its_payload(kind):
    node = make_node(3, "n3", kind, PAYLOADS[kind], 2, [1], "hash", len, columnar=True)
    assert type(node) is NODE_CLASSES[kind] and node.kind is kind
    assert (node.id, node.uid, node.parallelism, node.inputs, node.partitioning, node.key_fn,
            node.columnar) == (3, "n3", 2, [1], "hash", len, True)
    assert node.fn is PAYLOADS[kind]
    # a node of the same kind by its string, and by its class
    assert type(make_node(3, "n3", kind.value, PAYLOADS[kind])) is NODE_CLASSES[kind]
    assert NODE_CLASSES[kind](3, "n3", PAYLOADS[kind]).kind is kind


@pytest.mark.parametrize("kind", list(Kind))
def test_a_payload_of_the_wrong_type_is_refused_naming_the_node_its_kind_and_what_it_needs(
        kind):
    cls = NODE_CLASSES[kind]
    with pytest.raises(TypeError, match=rf"^node 'n7' \({kind.value}\): fn must be "
                                        rf"{_escaped(cls.payload)}, got object <object"):
        make_node(7, "n7", kind, object())


def _escaped(text: str) -> str:
    import re

    return re.escape(text)


def test_what_each_payload_needs_is_said():
    assert MapNode.payload == "a function record -> record"
    with pytest.raises(TypeError, match=r"node 'm' \(map\): fn must be a function record -> "
                                        r"record, got None"):
        make_node(0, "m", "map")
    with pytest.raises(TypeError, match=r"node 's' \(select\): fn must be a list of column "
                                        r"names, got list \[1\]"):
        make_node(0, "s", "select", [1])
    with pytest.raises(TypeError, match=r"node 'c' \(with_column\): fn must be \(name, "
                                        r"expression\)"):
        make_node(0, "c", "with_column", ("", pc.field("a")))
    # None: a count per record (operators built without the API's spec)
    assert make_node(0, "c", Kind.COUNT).fn == CountSpec()


def test_the_base_and_the_error_handling_base_are_no_kinds_nodes():
    for cls in (Node, FallibleNode):
        with pytest.raises(TypeError, match=rf"node 'x': {cls.__name__} is no kind's node: "
                                            r"make_node\(id, uid, kind, fn\)"):
            cls(0, "x", str)


def test_a_field_of_another_kind_is_refused_naming_the_node():
    with pytest.raises(TypeError, match=r"node 'm' \(map\): a map node has no on_timer "
                                        r"\(its fields: .*on_error"):
        make_node(0, "m", "map", str, on_timer=len)
    with pytest.raises(TypeError, match=r"node 'u' \(union\): a union node has no feedback"):
        make_node(0, "u", "union", feedback={})
    with pytest.raises(ValueError, match=r"node 'm' \(map\): on_error must be 'fail' or "
                                         r"'dead_letter', got 'skip'"):
        make_node(0, "m", "map", str, on_error="skip")
    with pytest.raises(TypeError, match=r"node 'p' \(process\): on_timer must be a function "
                                        r"\(ctx, key, when\) or None, got int 3"):
        make_node(0, "p", "process", operator.add, on_timer=3)


def test_an_unknown_kind_is_refused_naming_it_and_the_known_ones():
    with pytest.raises(ValueError, match=r"node 'x': unknown kind 'mapp' \(one of source, map, "
                                         r"flat_map, .*, window_agg, latest\)"):
        make_node(0, "x", "mapp", str)


@pytest.mark.parametrize("kind", list(Kind))
def test_a_node_pickles_round_trip(kind):
    node = make_node(5, "n5", kind, PAYLOADS[kind], None, [2, 4], "hash", len,
                     timestamp_fn=len, timestamps_from="ts", auto_uid=True)
    if isinstance(node, IterateNode):
        node.feedback[4] = ("hash", len)
    if isinstance(node, ProcessNode):
        node.on_timer = operator.sub
    if isinstance(node, FallibleNode):
        node.on_error, node.dead_letter = "dead_letter", CollectSink()
    back = pickle.loads(pickle.dumps(node))
    assert type(back) is type(node) and back.kind is kind
    for f in dataclasses.fields(node):
        was, now = getattr(node, f.name), getattr(back, f.name)
        assert type(now) is type(was), f.name
        if f.name != "dead_letter" and (was is None or isinstance(
                was, (int, str, list, dict, type, types.BuiltinFunctionType))):
            assert now == was, f.name  # (functions by reference: the same one)
    assert back.on_timer is operator.sub if kind is Kind.PROCESS else True


def test_keyed_and_batch_kinds():
    keyed = {k for k in Kind if k.keyed}
    assert keyed == {Kind.REDUCE, Kind.PROCESS, Kind.COUNT, Kind.WINDOW, Kind.AGGREGATE,
                     Kind.WINDOW_AGG, Kind.LATEST}
    assert {k for k in Kind if k.batch} == {
        Kind.MAP_BATCHES, Kind.FILTER_BATCHES, Kind.SELECT, Kind.WHERE, Kind.WITH_COLUMN,
        Kind.TO_ROWS, Kind.TO_BATCHES, Kind.AGGREGATE, Kind.WINDOW_AGG, Kind.LATEST}
    for kind in Kind:
        assert make_node(0, "n", kind, PAYLOADS[kind]).keyed == kind.keyed
    assert Kind.MAP == "map" and f"{Kind.WINDOW_AGG}" == "window_agg"


def _pipeline() -> Pipeline:
    p = Pipeline("fp", parallelism=2, dead_letter=CollectSink())
    s = p.source(GeneratorSource(count=10)).map(str).filter(bool).flat_map(list)
    t = s.assign_timestamps(len, max_delay=1)
    t.key_by(len).reduce(max).sink(CollectSink())
    t.key_by(len).process(operator.add, on_timer=operator.sub).sink(CollectSink())
    t.key_by(len).count(updates="checkpoint").sink(CollectSink())
    w = t.key_by(len).window(tumbling(5)).count()
    w.sink(CollectSink())
    w.late().sink(CollectSink())
    b = s.batches(pa.schema([("a", pa.string()), ("ts", pa.float64())]))
    b = b.map_batches(len).select("a", "ts").where(pc.field("a") != "x")
    b.key_by("a").agg(n="count").sink(CollectSink())
    bt = b.assign_timestamps("ts")
    bt.key_by("a").window(tumbling(5)).agg(n="count").rows().sink(CollectSink())
    return p


def test_the_api_builds_typed_nodes():
    p = _pipeline()
    assert all(type(n) is NODE_CLASSES[n.kind] for n in p.nodes)
    by_uid = {n.uid: n for n in p.nodes}
    assert by_uid["process-7"].on_timer is operator.sub
    assert by_uid["map-1"].on_error == "dead_letter"  # the pipeline's dead-letter sink
    assert by_uid["assign_timestamps-4"].on_error == "dead_letter"
    assert isinstance(by_uid["assign_timestamps-4"].fn, TimestampSpec)
    assert isinstance(by_uid["assign_timestamps-22"].fn.ts_fn, ColumnTime)
    physical = plan(p)  # the planner's combines are typed too, fed the aggregations' specs
    combines = [n for c in physical.chains for n in c.nodes if n.kind == Kind.COMBINE]
    assert {n.uid for n in combines} == {"count-9.combine", "aggregate-20.combine",
                                         "window_agg-23.combine"}
    assert all(type(n) is NODE_CLASSES[Kind.COMBINE] for n in combines)


def test_the_fingerprints_checkpoints_hold_are_the_untyped_graphs():
    """What a restore compares a checkpoint's operators by (``restore.fingerprint``), as the
    graph of one ``Node`` class gave it: checkpoints written before stay restorable."""
    p = _pipeline()
    nodes = {n.id: n for n in p.nodes}
    got = [f"{n.uid} | {fingerprint(n, nodes)}" for n in p.nodes]
    assert got == [
        "source-0 | source GeneratorSource",
        "map-1 | map str <- source source-0",
        "filter-2 | filter bool <- map map-1",
        "flat_map-3 | flat_map list <- filter filter-2",
        "assign_timestamps-4 | assign_timestamps TimestampSpec <- flat_map flat_map-3",
        "reduce-5 | reduce max keyed by len <- assign_timestamps assign_timestamps-4",
        "sink-6 | sink CollectSink <- reduce reduce-5",
        "process-7 | process add keyed by len <- assign_timestamps assign_timestamps-4",
        "sink-8 | sink CollectSink <- process process-7",
        "count-9 | count CountSpec keyed by len <- assign_timestamps assign_timestamps-4",
        "sink-10 | sink CollectSink <- count count-9",
        "window-11 | window WindowSpec keyed by len <- assign_timestamps assign_timestamps-4",
        "window_results-12 | window_results WindowSpec <- window window-11",
        "sink-13 | sink CollectSink <- window_results window_results-12",
        "window_late-14 | window_late WindowSpec <- window window-11",
        "sink-15 | sink CollectSink <- window_late window_late-14",
        "to_batches-16 | to_batches Schema <- flat_map flat_map-3",
        "map_batches-17 | map_batches BatchFunction <- to_batches to_batches-16",
        "select-18 | select list <- map_batches map_batches-17",
        "where-19 | where Expression <- select select-18",
        "aggregate-20 | aggregate AggSpec keyed by ColumnKey <- where where-19",
        "sink-21 | sink CollectSink <- aggregate aggregate-20",
        "assign_timestamps-22 | assign_timestamps TimestampSpec <- where where-19",
        "window_agg-23 | window_agg BatchWindowSpec keyed by ColumnKey <- assign_timestamps "
        "assign_timestamps-22",
        "window_results-24 | window_results BatchWindowSpec <- window_agg window_agg-23",
        "to_rows-25 | to_rows <- window_results window_results-24",
        "sink-26 | sink CollectSink <- to_rows to_rows-25",
    ]


def test_an_iterations_feedback_is_its_heads_own():
    p = Pipeline("loop", parallelism=2)
    s = p.source(GeneratorSource(count=10)).map(str)
    it = s.iterate()
    it.close_with(it.filter(bool).key_by(len))
    it.union(s).sink(CollectSink())
    head = p.nodes[2]
    assert isinstance(head, IterateNode) and head.feedback == {3: ("hash", len)}
    nodes = {n.id: n for n in p.nodes}
    assert fingerprint(head, nodes) == "iterate <- map map-1, filter filter-3, filter filter-3"
    back = [e for e in plan(p).edges if e.back]
    assert [(e.src, e.dst, e.partitioning, e.key_fn) for e in back] == [(2, 1, "hash", len)]
