"""Logical pipeline -> physical plan: chains, subtasks, channels and key groups.

* Operators connected by a forward edge with the same parallelism, where the upstream has
  no other consumer, are *chained*: they run in one task, passing batches by function call.
* Every other edge becomes channels: forward (subtask i -> i), rebalance / hash
  (all-to-all), broadcast (all-to-all, every record to every subtask).
* Keys hash to ``max_parallelism`` key groups; a subtask owns a contiguous range of them
  (Flink's assignment, :mod:`cutline.state.keygroups`), so keyed state can be restored at
  another parallelism by moving whole key groups.
* Spark task ``k`` hosts subtask ``k`` of every chain (slot sharing): the job needs as many
  Spark slots as its largest parallelism.
* **Two-phase aggregation** (Spark's partial aggregation, Flink's local-global
  aggregation): a keyed aggregation whose update stream is sized by time (``updates=
  "checkpoint"`` or seconds: ``agg``, ``count``, ``sum``, ... on a batch stream by default,
  ``count(updates=...)`` on records) and an event-time tumbling-window aggregation, of a
  batch stream or of records (no allowed lateness, no ``.late()``, late records dropped;
  on records an aggregate that merges: not ``apply``) get a ``combine``
  at the end of the upstream chain, before the exchange: it merges its input per key (and
  window) and sends one partial per key, which the aggregation merges into its state.  The
  combine holds no state across a checkpoint: it sends what it holds before every barrier
  (and the end of input, each ``updates`` interval, the task going idle; a window's
  partials before the watermark reaching its end), so exactly-once is unchanged
  (:func:`_two_phase`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from .logical import (
    FORWARD,
    HASH,
    AggSpec,
    BatchWindowSpec,
    CountSpec,
    IterateNode,
    Kind,
    Node,
    PartialKey,
    make_node,
)
from .protocol.windows import WindowSpec
from .storage.schema import ChannelId  # what checkpoints store: below the plan

if TYPE_CHECKING:  # the planner is below the user API: it only reads a built Pipeline
    from .api import Pipeline

__all__ = ["Chain", "ChannelId", "Edge", "PhysicalPlan", "plan"]


@dataclass
class Chain:
    id: int
    nodes: list[Node]
    parallelism: int

    @property
    def uid(self) -> str:
        return self.nodes[0].uid

    @property
    def head(self) -> Node:
        return self.nodes[0]

    @property
    def is_source(self) -> bool:
        return self.head.kind == "source"

    def task_id(self, subtask: int) -> str:
        return f"{self.uid}.{subtask}"


@dataclass
class Edge:
    src: int  # chain id
    dst: int  # chain id
    partitioning: str
    key_fn: Any = None
    back: bool = False  # the feedback edge of an iteration (into its head)
    columnar: bool = False  # it carries a batch stream (Arrow record batches)

    def pairs(self, src_p: int, dst_p: int) -> list[tuple[int, int]]:
        if self.partitioning == FORWARD:
            return [(i, i) for i in range(src_p)]
        return [(i, j) for i in range(src_p) for j in range(dst_p)]


@dataclass
class PhysicalPlan:
    name: str
    chains: list[Chain]
    edges: list[Edge]
    max_parallelism: int
    slots: int = field(init=False)
    state_backend: str = "memory"  # where keyed operators keep state (CheckpointConfig)
    # the pipeline uses event time: tasks split batches at watermarks (no cost otherwise)
    timed: bool = False

    def __post_init__(self) -> None:
        self.slots = max(c.parallelism for c in self.chains)

    def channel_id(self, edge: Edge, i: int, j: int) -> ChannelId:
        return ChannelId(self.chains[edge.src].uid, i, self.chains[edge.dst].uid, j)

    def tasks(self) -> list[tuple[Chain, int]]:
        return [(c, i) for c in self.chains for i in range(c.parallelism)]

    def tasks_in_slot(self, slot: int) -> list[tuple[Chain, int]]:
        return [(c, slot) for c in self.chains if slot < c.parallelism]

    def inputs(self, chain: Chain, subtask: int) -> list[ChannelId]:
        out = []
        for e in self.edges:
            if e.dst == chain.id:
                src_p = self.chains[e.src].parallelism
                out += [self.channel_id(e, i, j) for i, j in e.pairs(src_p, chain.parallelism)
                        if j == subtask]
        return out

    def back_channels(self, chain: Chain, subtask: int) -> frozenset[ChannelId]:
        """The input channels of this subtask that are an iteration's feedback edges."""
        return frozenset(
            self.channel_id(e, i, j) for e in self.edges if e.back and e.dst == chain.id
            for i, j in e.pairs(self.chains[e.src].parallelism, chain.parallelism)
            if j == subtask)

    @property
    def loop_heads(self) -> list[Chain]:
        """Chains that hold the head of an iteration."""
        return [c for c in self.chains if any(n.kind == "iterate" for n in c.nodes)]

    def outputs(self, chain: Chain, subtask: int) -> list[tuple[Edge, list[ChannelId]]]:
        """Per outgoing edge, the channel ids to the downstream subtasks, by subtask index."""
        out = []
        for e in self.edges:
            if e.src == chain.id:
                dst_p = self.chains[e.dst].parallelism
                chans = [self.channel_id(e, i, j) for i, j in e.pairs(chain.parallelism, dst_p)
                         if i == subtask]
                out.append((e, chans))
        return out

    def describe(self) -> str:
        lines = [f"pipeline {self.name}: {len(self.chains)} chains, "
                 f"{sum(c.parallelism for c in self.chains)} subtasks on {self.slots} slots"]
        for c in self.chains:
            ops = " -> ".join(f"{n.kind}[{n.uid}]" for n in c.nodes)
            lines.append(f"  chain {c.id} x{c.parallelism}: {ops}")
        for e in self.edges:
            lines.append(f"  {self.chains[e.src].uid} ={e.partitioning}=> "
                         f"{self.chains[e.dst].uid}")
        return "\n".join(lines)


def plan(pipeline: Pipeline) -> PhysicalPlan:
    pipeline.validate()
    nodes = pipeline.nodes
    par = {n.id: n.parallelism or pipeline.parallelism for n in nodes}
    consumers: dict[int, list[int]] = {n.id: [] for n in nodes}
    for n in nodes:
        for i in n.inputs:
            consumers[i].append(n.id)
    chain_of: dict[int, Chain] = {}
    chains: list[Chain] = []
    for n in nodes:  # nodes are in topological order (added after their inputs)
        chainable = (
            len(n.inputs) == 1 and n.partitioning == FORWARD
            and n.kind not in ("source", "iterate")
            and par[n.inputs[0]] == par[n.id] and len(consumers[n.inputs[0]]) == 1
        )
        if chainable:
            chain = chain_of[n.inputs[0]]
            chain.nodes.append(n)
        else:
            chain = Chain(len(chains), [n], par[n.id])
            chains.append(chain)
        chain_of[n.id] = chain
    heads, own = _two_phase(pipeline, chains, chain_of, consumers)
    edges = []
    for n_id, c in own.items():  # a combine of its own: fed by its input's chain
        i = nodes[n_id].inputs[0]
        edges.append(Edge(chain_of[i].id, c.id, FORWARD, columnar=nodes[i].columnar))
    for n in nodes:
        if chain_of[n.id].head is not n and n.id not in heads:
            continue
        combined = heads.get(n.id)
        if combined is not None:
            chain_of[n.id].nodes[0] = n = combined
        feedback = n.feedback if isinstance(n, IterateNode) else {}
        for i in n.inputs:
            if i in feedback:  # an iteration's back edge: logged, never chained
                part, key_fn = feedback[i]
                edges.append(Edge(chain_of[i].id, chain_of[n.id].id, part,
                                  key_fn if part == HASH else None, back=True))
                continue
            part = n.partitioning
            if part == FORWARD and par[i] != par[n.id]:
                part = "rebalance"
            key_fn = n.key_fn
            if combined is not None and isinstance(n.fn, (CountSpec, WindowSpec)) \
                    and key_fn is not None:
                key_fn = PartialKey(key_fn)  # partials carry their key
            src = own[n.id] if n.id in own else chain_of[i]
            edges.append(Edge(src.id, chain_of[n.id].id, part,
                              key_fn if part == HASH else None,
                              columnar=nodes[i].columnar))
    return PhysicalPlan(pipeline.name, chains, edges, pipeline.max_parallelism,
                        state_backend=pipeline.checkpoint.state_backend,
                        timed=any(n.kind == "assign_timestamps" for n in nodes))


def combinable(node: Node) -> bool:
    """A keyed aggregation the planner splits in two (the module docstring)."""
    spec = node.fn
    if node.kind == "aggregate" and isinstance(spec, AggSpec):
        return spec.updates != "batch"
    if node.kind == "count" and isinstance(spec, CountSpec):
        return spec.updates != "record"
    if node.kind == "window_agg" and isinstance(spec, BatchWindowSpec):
        a = spec.assigner
        return (type(a).__name__ == "Tumbling" and a.exact and not spec.allowed_lateness
                and not spec.emit_late and spec.on_late == "drop")
    if node.kind == "window" and isinstance(spec, WindowSpec):
        # a per-record window: tumbling, no lateness, late records dropped (a partial's
        # records have no identity to fail on or to emit), an aggregate that merges
        # (count, sum, min, max, mean, reduce, aggregate with merge; not apply)
        a, agg = spec.assigner, spec.aggregate
        return (type(a).__name__ == "Tumbling" and a.exact and not spec.allowed_lateness
                and not spec.emit_late and spec.on_late == "drop" and agg.merge is not None
                and agg.full is None)
    return False


def _two_phase(pipeline: Pipeline, chains: list[Chain], chain_of: dict[int, Chain],
               consumers: dict[int, list[int]]) -> tuple[dict[int, Node], dict[int, Chain]]:
    """Put a ``combine`` before each :func:`combinable` keyed aggregation whose input comes
    on one hash edge: at the end of the upstream chain when the operator before it feeds
    nothing else, else in a chain of its own at the upstream's parallelism, reached by a
    forward edge (the same slot: no network).  Returns the aggregations, by node id, as they
    run (told that their input is partial), and the chains of combines of their own (by
    aggregation node id: its input comes from there)."""
    if any(n.kind == "iterate" for n in pipeline.nodes):
        return {}, {}
    out: dict[int, Node] = {}
    own: dict[int, Chain] = {}
    for chain in list(chains):
        n = chain.head
        if n.partitioning != HASH or len(n.inputs) != 1 or not combinable(n):
            continue
        i = n.inputs[0]
        up = chain_of[i]
        last = up.nodes[-1]
        if up is chain or last.id != i:  # (an operator feeding others ends its chain)
            continue
        local = make_node(len(pipeline.nodes) + n.id, f"{n.uid}.combine", Kind.COMBINE, n.fn,
                          up.parallelism, [i], FORWARD, n.key_fn,
                          timestamp_fn=last.timestamp_fn, timestamps_from=last.timestamps_from,
                          columnar=last.columnar)
        if consumers[i] == [n.id]:
            up.nodes.append(local)
        else:  # the stream feeds other operators too: the combine in a chain of its own
            own[n.id] = Chain(len(chains), [local], up.parallelism)
            chains.append(own[n.id])
        out[n.id] = replace(n, fn=replace(n.fn, partial=True))
    return out, own
