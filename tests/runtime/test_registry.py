"""The operator registry: which operator runs each kind of the logical graph (issue 26; the
kinds and their node classes: tests/api/test_logical.py)."""

from __future__ import annotations

import pytest

from cutline.connectors import CollectSink
from cutline.logical import Kind, make_node
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


def test_sources_and_sinks_are_not_built_as_operators():
    with pytest.raises(ValueError, match="no operator runs kind 'sink' \\(the task reads"):
        build_operator(make_node(0, "out", Kind.SINK, fn=CollectSink()), 0, 1, 128)


def test_a_built_operator_runs():
    op = build_operator(make_node(0, "m", Kind.MAP, fn=lambda r: r * 2), 0, 1, 128)
    assert op.process([1, 2]) == [2, 4]
    count = build_operator(make_node(0, "c", Kind.COUNT, key_fn=lambda r: r), 0, 1, 128)
    assert count.process(["a", "b", "a"]) == [("a", 1), ("b", 1), ("a", 2)]
