"""What a checkpoint gives each subtask of a job, rescaled or changed since it was taken.

State is matched to operators by ``uid``, never by position:

- **keyed state** goes to every subtask of the operator with that uid; each keeps the key
  groups it owns (after a parallelism change, a subtask reads every old subtask's state);
- **source positions** of an old source are handed to the new readers (``reader.rescale``
  picks a reader's share of all old positions);
- **sink transactions** pre-committed by old subtask ``i`` are recovered by new subtask
  ``i % parallelism``, so a scale-down commits or aborts them too;
- **in-flight records** (unaligned checkpoints) of a rescaled exchange are re-routed by key
  (hash edges) or by their old receiver (other edges) to the new subtasks; when the senders
  kept their parallelism, the **watermarks** in flight go with them, each after the records
  its sender sent before it (:func:`merge_in_flight`), and each new input channel starts at
  the lowest watermark the old receivers had from its sender: a rescaled job fires every
  window and timer at the same point of its input as a job that never stopped.

:func:`check_compatible` is the up-front check a run makes before it restores: an operator
whose state the pipeline no longer has, an operator whose kind (or, for windows, whose
windows or aggregate) changed, or a changed
``max_parallelism`` is an :class:`IncompatibleCheckpointError` naming them, unless the user
allows dropping the unmatched state (``allow_non_restored_state=True``, as Flink's flag).
An operator without an explicit uid has a default one, its position (``count-3``); the
checkpoint records what stood there (:func:`fingerprint`: kind, function, key function,
inputs), and a restore whose operator at a position with state is another one is refused
naming them, whatever ``allow_non_restored_state`` says: two stateful operators swapped
between runs would otherwise swap their state (Flink refuses what it cannot map, too).
"""

from __future__ import annotations

import pickle
from collections import defaultdict
from collections.abc import Mapping

from ..logical import IterateNode, Node
from ..plan import HASH, Chain, ChannelId, PhysicalPlan
from ..protocol.watermarks import NO_WATERMARK, Watermark, is_time_item, restored_ts
from ..state.keygroups import key_group, subtask_for_key_group
from ..storage.schema import TaskState, read_task_states

__all__ = ["IncompatibleCheckpointError", "RestoreView", "check_compatible", "fingerprint",
           "plan_summary", "read_states"]

# Every task state of a checkpoint, decoded (:mod:`cutline.storage.schema`).
read_states = read_task_states


class IncompatibleCheckpointError(ValueError):
    """The pipeline changed since its checkpoint in a way its state cannot follow."""


def plan_summary(plan: PhysicalPlan) -> dict:
    """What a checkpoint records of the plan it was taken with (to check a restore)."""
    nodes = {n.id: n for c in plan.chains for n in c.nodes}
    return {
        "max_parallelism": plan.max_parallelism,
        "operators": {n.uid: _operator_summary(n, c, nodes)
                      for c in plan.chains for n in c.nodes},
    }


def _operator_summary(node: Node, chain: Chain, nodes: Mapping[int, Node]) -> dict:
    out: dict = {"kind": node.kind, "chain": chain.uid, "parallelism": chain.parallelism}
    signature = _state_signature(node)
    if signature is not None:
        out["state"] = signature
    if node.auto_uid:  # its uid is its position: what sits there, to check a restore by
        out["fingerprint"] = fingerprint(node, nodes)
    return out


def _name(fn: object) -> str:
    """A user function's or object's name as a fingerprint shows it: a function's qualified
    name (a lambda's with what it reads: its arguments, the names and constants it uses), an
    object's type."""
    if fn is None:
        return ""
    name = getattr(fn, "__qualname__", None)
    if not isinstance(name, str):
        return type(fn).__name__
    code = getattr(fn, "__code__", None)
    if name.endswith("<lambda>") and code is not None:
        consts = [c for c in code.co_consts if not hasattr(c, "co_code") and c is not None]
        uses = [*code.co_varnames[:code.co_argcount], *code.co_names, *map(_const, consts)]
        return f"{name}[{','.join(uses)}]"
    return name


def _const(c: object) -> str:
    """A constant as the same text in every process (a set's order is its hashes')."""
    if isinstance(c, frozenset):
        return "{" + ",".join(sorted(map(_const, c))) + "}"
    if isinstance(c, tuple):
        return "(" + ",".join(map(_const, c)) + ")"
    return repr(c)


def fingerprint(node: Node, nodes: Mapping[int, Node]) -> str:
    """What an operator without an explicit uid is, by structure: its kind, its function
    (or its definition's type), its key function, and the kind and uid of each input.
    A checkpoint records it under the operator's default uid (its position); a restore whose
    operator at that position has another fingerprint is refused (:func:`check_compatible`),
    as two such operators swapped would otherwise swap their state."""
    out = f"{node.kind} {_name(node.fn)}".rstrip()
    if node.key_fn is not None:
        out += f" keyed by {_name(node.key_fn)}"
    back = node.feedback if isinstance(node, IterateNode) else {}
    inputs = [nodes[i] for i in [*node.inputs, *back] if i in nodes]
    if inputs:
        out += " <- " + ", ".join(f"{n.kind} {n.uid}" for n in inputs)
    return out


def _state_signature(node: Node) -> str | None:
    """What a keyed operator's state means, when its definition says (windows: the assigner
    and the aggregate, ``WindowSpec.state_signature``): a restore into another is refused."""
    signature = getattr(node.fn, "state_signature", None)
    return signature() if node.keyed and callable(signature) else None


def _stateful_uids(states: Mapping[str, TaskState]) -> dict[str, str]:
    """uid -> what state of it the checkpoint holds ("keyed", "source", "sink", "in-flight")."""
    out: dict[str, str] = {}
    for st in states.values():
        for uid in st.ops:
            out[uid] = "keyed state"
        if st.source is not None and st.source_uid is not None:
            out[st.source_uid] = "source position"
        if st.sink and st.sink_uid is not None:
            out[st.sink_uid] = "sink transactions"
        for part in (st.channels, st.out_channels):
            for ch, blobs in part.items():
                if blobs:
                    out.setdefault(ch.dst_chain, "in-flight records")
    return out


def _moved(old_ops: Mapping[str, dict], states: Mapping[str, TaskState],
           plan: PhysicalPlan) -> list[str]:
    """The operators of ``plan`` without an explicit uid whose default uid holds state in
    the checkpoint that another operator's fingerprint was taken with: each described, with
    the default uid its own state is under when the checkpoint has an operator like it."""
    nodes = {n.id: n for c in plan.chains for n in c.nodes}
    by_uid = {n.uid: n for n in nodes.values()}
    stateful = {uid for uid, what in _stateful_uids(states).items()
                if what != "in-flight records"}
    old_of: dict[str, list[str]] = defaultdict(list)  # fingerprint -> old default uids
    for uid, old in old_ops.items():
        if uid in stateful and old.get("fingerprint"):
            old_of[old["fingerprint"]].append(uid)
    out = []
    for uid in sorted(stateful):
        node, old = by_uid.get(uid), old_ops.get(uid) or {}
        if node is None or not node.auto_uid or not old.get("fingerprint") \
                or old.get("kind") != node.kind:  # (a changed kind is reported as such)
            continue
        now = fingerprint(node, nodes)
        if now == old["fingerprint"]:
            continue
        line = f"{uid!r} holds the state of [{old['fingerprint']}] and is [{now}] now"
        was = [u for u in old_of.get(now, []) if u != uid]
        if len(was) == 1:
            line += f" (its state is under {was[0]!r}: uid={was[0]!r} restores it)"
        out.append(line)
    return out


def check_compatible(metadata: dict, states: Mapping[str, TaskState], plan: PhysicalPlan,
                     label: str, allow_non_restored_state: bool = False) -> list[str]:
    """Raise :class:`IncompatibleCheckpointError` if ``plan`` cannot restore this checkpoint.

    Returns the warnings (state dropped because the user allowed it).
    """
    new_ops = {n.uid: n for c in plan.chains for n in c.nodes}
    new_chains = {c.uid for c in plan.chains}
    old_ops: dict[str, dict] = (metadata.get("plan") or {}).get("operators") or {}
    problems, dropped = [], []
    moved = _moved(old_ops, states, plan)
    if moved:
        problems.append(
            "operators without an explicit uid are not at the positions their state was "
            "taken at (a default uid is the operator's position): " + "; ".join(moved)
            + ". Give each stateful operator a uid (uid=... on the method that adds it): "
            "its old default uid to keep its state, or a new one")
    for uid, old in sorted(old_ops.items()):
        node = new_ops.get(uid)
        if node is not None and old.get("kind") and node.kind != old["kind"]:
            problems.append(f"operator {uid!r} was a {old['kind']} in the checkpoint and is "
                            f"a {node.kind} now (give the new operator its own uid)")
        elif node is not None and old.get("state"):
            now = _state_signature(node)
            if now is not None and now != old["state"]:
                problems.append(f"operator {uid!r} keeps state for {old['state']} in the "
                                f"checkpoint and is {now} now (give the new operator its own "
                                "uid)")
    for uid, what in sorted(_stateful_uids(states).items()):
        if what == "in-flight records":
            if uid not in new_chains:
                dropped.append(f"in-flight records for {uid!r}")
        elif uid not in new_ops:
            dropped.append(f"{what} of operator {uid!r}")
    old_maxp = metadata.get("max_parallelism") or (metadata.get("plan") or {}).get(
        "max_parallelism")
    keyed = any(st.ops for st in states.values())
    if keyed and old_maxp is not None and int(old_maxp) != plan.max_parallelism:
        problems.append(f"max_parallelism changed from {old_maxp} to {plan.max_parallelism}: "
                        "keyed state is split into max_parallelism key groups, which cannot "
                        "change (set max_parallelism back)")
    if problems:
        raise IncompatibleCheckpointError(
            f"cannot restore pipeline {plan.name!r} from {label}: " + "; ".join(problems))
    if dropped and not allow_non_restored_state:
        raise IncompatibleCheckpointError(
            f"cannot restore pipeline {plan.name!r} from {label}: the checkpoint holds "
            + ", ".join(dropped) + " that the pipeline no longer has (an operator removed, or "
            "its uid changed: operators are matched by uid). Give the operators their old "
            "uids, or run with allow_non_restored_state=True to drop that state")
    return [f"dropping {d} (allow_non_restored_state)" for d in dropped]


class RestoreView:
    """A checkpoint's task states, read for the subtasks of ``plan``."""

    def __init__(self, states: Mapping[str, TaskState], plan: PhysicalPlan) -> None:
        self.states, self.plan = states, plan
        self.old_parallelism: dict[str, int] = defaultdict(int)
        self.keyed: dict[str, list] = defaultdict(list)
        self.sources: dict[str, list] = defaultdict(list)
        self.sinks: dict[str, dict[int, list]] = defaultdict(dict)
        for st in states.values():
            self.old_parallelism[st.chain] = max(self.old_parallelism[st.chain],
                                                 st.parallelism, st.index + 1)
            for uid, blob in st.ops.items():
                self.keyed[uid].append(blob)
            if st.source is not None and st.source_uid is not None:
                self.sources[st.source_uid].append(st.source)
            if st.sink_uid is not None:
                self.sinks[st.sink_uid][st.index] = list(st.sink)

    def rescaled(self, chain: Chain) -> bool:
        old = self.old_parallelism.get(chain.uid)
        return old is not None and old != chain.parallelism

    def own(self, chain: Chain, index: int) -> TaskState | None:
        """The task's own state, when the chain kept its shape and parallelism."""
        if self.rescaled(chain):
            return None
        return self.states.get(chain.task_id(index))

    def keyed_blobs(self, chain: Chain, index: int, uid: str) -> list:
        own = self.own(chain, index)
        if own is not None and uid in own.ops:
            return [own.ops[uid]]
        return list(self.keyed.get(uid, ()))  # every old subtask's: keep your key groups

    def source_states(self, uid: str) -> list:
        return list(self.sources.get(uid, ()))

    def sink_handles(self, chain: Chain, index: int, uid: str) -> list:
        own = self.own(chain, index)
        if own is not None:
            return list(own.sink)
        return [h for i, hs in sorted(self.sinks.get(uid, {}).items())
                if i % chain.parallelism == index for h in hs]

    def dead_letter_handles(self, chain: Chain, index: int) -> list:
        """The dead-letter handles this subtask recovers: its own, or after a parallelism
        change those of every old subtask ``i`` with ``i % parallelism == index`` (as for
        sinks)."""
        own = self.own(chain, index)
        if own is not None:
            return list(own.dead_letter)
        return [h for _, st in sorted(self.states.items())
                if st.chain == chain.uid and st.index % chain.parallelism == index
                for h in st.dead_letter]

    def inputs_changed(self, chain: Chain) -> bool:
        """The input channels of ``chain``'s subtasks are not those of the checkpoint: it
        or a chain feeding it changed parallelism."""
        plan = self.plan
        return self.rescaled(chain) or any(
            self.rescaled(plan.chains[e.src]) for e in plan.edges if e.dst == chain.id)

    def watermark_states(self, chain: Chain) -> list:
        """Every old subtask's event-time state of ``chain`` (those that have one)."""
        return [st.watermarks for st in self.states.values()
                if st.chain == chain.uid and st.watermarks is not None]

    def upstream_output_floor(self, chain: Chain) -> float:
        """The lowest output watermark of the old subtasks of the chains feeding ``chain``
        (no watermark when one of them had none): where its input channels start after a
        rescale, so that nothing fires early.  (The end of input counts as the last real
        watermark before it: :func:`~cutline.protocol.watermarks.restored_ts`.)"""
        plan = self.plan
        ups = {plan.chains[e.src].uid for e in plan.edges if e.dst == chain.id}
        lows = [restored_ts(st.watermarks.get("output"), st.watermarks.get("real"), "output")
                if st.watermarks is not None else NO_WATERMARK
                for st in self.states.values() if st.chain in ups]
        return min(lows, default=NO_WATERMARK)

    def input_floors(self, chain: Chain, inputs: list[ChannelId]) -> dict[str, float]:
        """Where each input channel's watermark starts after a rescale (never early): the
        lowest the old receivers had from the channel's sender, when the senders kept their
        parallelism (the watermarks in flight then follow, :meth:`channel_records`); else
        :meth:`upstream_output_floor`."""
        floor, out = self.upstream_output_floor(chain), {}
        olds = [st for st in self.states.values() if st.chain == chain.uid]
        for c in inputs:
            if self.rescaled(self._chain(c.src_chain)):
                out[str(c)] = floor
                continue
            lows = []
            for st in olds:
                tracker = (st.watermarks or {}).get("input") or {}
                seen = tracker.get("channels") or {}
                old = str(ChannelId(c.src_chain, c.src_index, chain.uid, st.index))
                lows.append(restored_ts((seen.get(old) or [None])[0],
                                        (tracker.get("real") or {}).get("channels"), old))
            out[str(c)] = min(lows, default=floor)
        return out

    def _chain(self, uid: str) -> Chain:
        return next(c for c in self.plan.chains if c.uid == uid)

    def channel_records(self, chain: Chain, index: int,
                        inputs: list[ChannelId]) -> list[tuple[ChannelId, list]]:
        """``[(input channel, records)]`` to inject, in order, for this subtask."""
        if not self.inputs_changed(chain):
            own = self.states.get(chain.task_id(index))
            recorded = own.channels if own is not None else {}
            sent: dict[ChannelId, tuple[bytes, ...]] = {}
            for st in self.states.values():
                sent.update(st.out_channels)
            out = []
            # Per channel: what the receiver recorded, then what the sender still held.
            for ch in inputs:
                recs = [r for blob in recorded.get(ch, ()) for r in pickle.loads(blob)]
                recs += [r for blob in sent.get(ch, ()) for r in pickle.loads(blob)]
                if recs:
                    out.append((ch, recs))
            return out
        return self._rerouted(chain, index, inputs)

    def _rerouted(self, chain: Chain, index: int,
                  inputs: list[ChannelId]) -> list[tuple[ChannelId, list]]:
        plan = self.plan
        edges = {plan.chains[e.src].uid: e for e in plan.edges if e.dst == chain.id}
        per_channel: dict[ChannelId, list] = defaultdict(list)  # old channel -> records
        states = list(self.states.values())
        # what receivers recorded, then what senders still held
        for part in [st.channels for st in states] + [st.out_channels for st in states]:
            for ch, blobs in part.items():
                if ch.dst_chain == chain.uid:
                    per_channel[ch].extend(r for b in blobs for r in pickle.loads(b))
        out: dict[ChannelId, dict[ChannelId, list]] = defaultdict(dict)
        p, maxp = chain.parallelism, plan.max_parallelism
        for ch in sorted(per_channel, key=str):
            edge = edges.get(ch.src_chain) or (next(iter(edges.values())) if len(edges) == 1
                                               else None)
            if edge is None:
                raise IncompatibleCheckpointError(
                    f"in-flight records of channel {str(ch)!r} have no input of {chain.uid!r} "
                    "to go to: the pipeline changed around an unaligned checkpoint")
            src_chain = plan.chains[edge.src]
            mine = [c for c in inputs if c.src_chain == src_chain.uid]
            if not mine:
                continue
            # From a sender that kept its parallelism, in-flight watermarks go to the new
            # channel from the same sender (merge_in_flight); from a rescaled one they stay
            # behind: the new channels start at the old senders' lowest output watermark
            # (upstream_output_floor), which covers them.
            same = [] if self.rescaled(src_chain) else [
                c for c in mine if c.src_index == ch.src_index]
            items = [r for r in per_channel[ch]
                     if type(r) is Watermark or not is_time_item(r)] if same else [
                r for r in per_channel[ch] if not is_time_item(r)]
            if edge.partitioning == HASH and edge.columnar:
                from .batches import rows_for_subtask  # record batches: split by key

                keep = [part for r in items for part in (
                    [r] if type(r) is Watermark else
                    rows_for_subtask([r], edge.key_fn.columns, index, p, maxp))]
            elif edge.partitioning == HASH:
                kf = edge.key_fn
                keep = [r for r in items if type(r) is Watermark or
                        subtask_for_key_group(key_group(kf(r), maxp), p, maxp) == index]
            else:
                keep = items if ch.dst_index % p == index else [
                    r for r in items if type(r) is Watermark]
            if keep:
                out[(same or mine)[0]][ch] = keep
        return [(c, merge_in_flight(list(olds.values()))) for c, olds in out.items()]


def merge_in_flight(channels: list[list]) -> list:
    """The items in flight on several old channels of one sender, as one channel's: each
    record goes after the watermarks its sender sent before it.  A sender broadcasts every
    watermark on all its channels in order with its records, so a record belongs just
    before the first watermark after it on its own channel; records before the same
    watermark keep their channel's order (one channel's before the next one's), and each
    watermark follows once."""
    groups: dict[float, list] = defaultdict(list)
    for items in channels:
        part: list = []
        for r in items:
            if type(r) is Watermark:
                groups[r.ts].extend(part)
                part = []
            else:
                part.append(r)
        groups[float("inf")].extend(part)
    out: list = []
    for ts in sorted(groups):
        out.extend(groups[ts])
        if ts != float("inf"):
            out.append(Watermark(ts))
    return out
