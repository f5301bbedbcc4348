"""The operator registry and the logical graph's kinds (issue 26: a typed graph)."""

from __future__ import annotations

import pytest

from cutline.logical import Kind, Node
from cutline.runtime.operators import Keyed, Operator
from cutline.runtime.registry import NOT_OPERATORS, OPERATORS, _resolve, build_operator


def test_every_kind_has_an_operator_or_is_the_tasks_own():
    assert set(OPERATORS) | NOT_OPERATORS == set(Kind)
    assert not set(OPERATORS) & NOT_OPERATORS


@pytest.mark.parametrize("kind", sorted(OPERATORS))
def test_each_entry_resolves_and_keyed_kinds_build_keyed_operators(kind):
    made = _resolve(OPERATORS[kind])
    if isinstance(made, type):
        assert issubclass(made, Operator)
        # a keyed kind's class keeps keyed state (and is built with its subtask's place)
        assert issubclass(made, Keyed) == kind.keyed, kind
    else:
        assert callable(made) and not kind.keyed


def test_a_kind_is_its_string_and_a_node_takes_either():
    assert Kind.MAP == "map" and f"{Kind.WINDOW_AGG}" == "window_agg"
    node = Node(0, "m", "map", fn=str)
    assert node.kind is Kind.MAP and not node.keyed
    assert Node(1, "c", Kind.COUNT).keyed
    assert Kind.AGGREGATE.batch and Kind.AGGREGATE.keyed and not Kind.MAP.batch


def test_an_unknown_kind_is_refused_naming_it_and_the_known_ones():
    with pytest.raises(ValueError, match=r"node 'x': unknown kind 'mapp' \(one of source, map,"):
        Node(0, "x", "mapp")


def test_sources_and_sinks_are_not_built_as_operators():
    with pytest.raises(ValueError, match="no operator runs kind 'sink' \\(the task reads"):
        build_operator(Node(0, "out", Kind.SINK, fn=None), 0, 1, 128)


def test_a_built_operator_runs():
    op = build_operator(Node(0, "m", Kind.MAP, fn=lambda r: r * 2), 0, 1, 128)
    assert op.process([1, 2]) == [2, 4]
    count = build_operator(Node(0, "c", Kind.COUNT, key_fn=lambda r: r), 0, 1, 128)
    assert count.process(["a", "b", "a"]) == [("a", 1), ("b", 1), ("a", 2)]
