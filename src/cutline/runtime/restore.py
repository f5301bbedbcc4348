"""What a checkpoint gives each subtask of a job, rescaled or changed since it was taken.

State is matched to operators by ``uid``, never by position:

- **keyed state** goes to every subtask of the operator with that uid; each keeps the key
  groups it owns (after a parallelism change, a subtask reads every old subtask's state);
- **source positions** of an old source are handed to the new readers (``reader.rescale``
  picks a reader's share of all old positions);
- **sink transactions** pre-committed by old subtask ``i`` are recovered by new subtask
  ``i % parallelism``, so a scale-down commits or aborts them too;
- **in-flight records** (unaligned checkpoints) of a rescaled exchange are re-routed by key
  (hash edges) or by their old receiver (other edges) to the new subtasks.

:func:`check_compatible` is the up-front check a run makes before it restores: an operator
whose state the pipeline no longer has, an operator whose kind changed, or a changed
``max_parallelism`` is an :class:`IncompatibleCheckpointError` naming them, unless the user
allows dropping the unmatched state (``allow_non_restored_state=True``, as Flink's flag).
"""

from __future__ import annotations

import pickle
from collections import defaultdict
from typing import Any

import msgpack

from ..plan import HASH, Chain, PhysicalPlan
from ..state.keygroups import key_group, subtask_for_key_group

__all__ = ["IncompatibleCheckpointError", "RestoreView", "check_compatible", "plan_summary",
           "read_states"]


class IncompatibleCheckpointError(ValueError):
    """The pipeline changed since its checkpoint in a way its state cannot follow."""


def _split_task(task: str) -> tuple[str, int]:
    chain, _, index = task.rpartition(".")
    return chain, int(index)


def _split_channel(channel: str) -> tuple[str, int, str, int]:
    src, _, dst = channel.partition("->")
    return (*_split_task(src), *_split_task(dst))


def read_states(handle: Any) -> dict[str, dict]:
    """Every task state of a checkpoint (a verified ``CheckpointHandle``), decoded."""
    return {task: msgpack.unpackb(handle.read_task_state(task), raw=False,
                                  strict_map_key=False)
            for task in handle.tasks}


def plan_summary(plan: PhysicalPlan) -> dict:
    """What a checkpoint records of the plan it was taken with (to check a restore)."""
    return {
        "max_parallelism": plan.max_parallelism,
        "operators": {n.uid: {"kind": n.kind, "chain": c.uid, "parallelism": c.parallelism}
                      for c in plan.chains for n in c.nodes},
    }


def _stateful_uids(states: dict[str, dict]) -> dict[str, str]:
    """uid -> what state of it the checkpoint holds ("keyed", "source", "sink", "in-flight")."""
    out: dict[str, str] = {}
    for task, st in states.items():
        for uid in st.get("ops") or {}:
            out[uid] = "keyed state"
        if st.get("source") is not None:
            out[st.get("source_uid") or st.get("chain") or _split_task(task)[0]] = \
                "source position"
        if st.get("sink"):
            uid = st.get("sink_uid")
            if uid:
                out[uid] = "sink transactions"
        for part in ("channels", "out_channels"):
            for ch, blobs in (st.get(part) or {}).items():
                if blobs:
                    out.setdefault(_split_channel(ch)[2], "in-flight records")
    return out


def check_compatible(metadata: dict, states: dict[str, dict], plan: PhysicalPlan,
                     label: str, allow_non_restored_state: bool = False) -> list[str]:
    """Raise :class:`IncompatibleCheckpointError` if ``plan`` cannot restore this checkpoint.

    Returns the warnings (state dropped because the user allowed it).
    """
    new_ops = {n.uid: n for c in plan.chains for n in c.nodes}
    new_chains = {c.uid for c in plan.chains}
    old_ops: dict[str, dict] = (metadata.get("plan") or {}).get("operators") or {}
    problems, dropped = [], []
    for uid, old in sorted(old_ops.items()):
        node = new_ops.get(uid)
        if node is not None and old.get("kind") and node.kind != old["kind"]:
            problems.append(f"operator {uid!r} was a {old['kind']} in the checkpoint and is "
                            f"a {node.kind} now (give the new operator its own uid)")
    for uid, what in sorted(_stateful_uids(states).items()):
        if what == "in-flight records":
            if uid not in new_chains:
                dropped.append(f"in-flight records for {uid!r}")
        elif uid not in new_ops:
            dropped.append(f"{what} of operator {uid!r}")
    old_maxp = metadata.get("max_parallelism") or (metadata.get("plan") or {}).get(
        "max_parallelism")
    keyed = any(st.get("ops") for st in states.values())
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

    def __init__(self, states: dict[str, dict], plan: PhysicalPlan) -> None:
        self.states, self.plan = states, plan
        self.old_parallelism: dict[str, int] = defaultdict(int)
        self.keyed: dict[str, list] = defaultdict(list)
        self.sources: dict[str, list[dict]] = defaultdict(list)
        self.sinks: dict[str, dict[int, list]] = defaultdict(dict)
        for task, st in states.items():
            chain, index = _split_task(task)
            chain = st.get("chain") or chain
            self.old_parallelism[chain] = max(self.old_parallelism[chain],
                                              int(st.get("parallelism") or 0), index + 1)
            for uid, blob in (st.get("ops") or {}).items():
                self.keyed[uid].append(blob)
            if st.get("source") is not None:
                self.sources[st.get("source_uid") or chain].append(st["source"])
            if st.get("sink") is not None:
                uid = st.get("sink_uid") or self._sink_of(chain)
                if uid is not None:
                    self.sinks[uid][index] = list(st["sink"])

    def _sink_of(self, chain_uid: str) -> str | None:
        for c in self.plan.chains:
            if c.uid == chain_uid and c.nodes[-1].kind == "sink":
                return c.nodes[-1].uid
        return None

    def rescaled(self, chain: Chain) -> bool:
        old = self.old_parallelism.get(chain.uid)
        return old is not None and old != chain.parallelism

    def own(self, chain: Chain, index: int) -> dict | None:
        """The task's own state, when the chain kept its shape and parallelism."""
        if self.rescaled(chain):
            return None
        return self.states.get(chain.task_id(index))

    def keyed_blobs(self, chain: Chain, index: int, uid: str) -> list:
        own = self.own(chain, index)
        if own is not None and uid in (own.get("ops") or {}):
            return [own["ops"][uid]]
        return list(self.keyed.get(uid, ()))  # every old subtask's: keep your key groups

    def source_states(self, uid: str) -> list[dict]:
        return list(self.sources.get(uid, ()))

    def sink_handles(self, chain: Chain, index: int, uid: str) -> list:
        own = self.own(chain, index)
        if own is not None:
            return list(own.get("sink") or [])
        return [h for i, hs in sorted(self.sinks.get(uid, {}).items())
                if i % chain.parallelism == index for h in hs]

    def channel_records(self, chain: Chain, index: int,
                        inputs: list[str]) -> list[tuple[str, list]]:
        """``[(input channel, records)]`` to inject, in order, for this subtask."""
        plan = self.plan
        if not self.rescaled(chain) and not any(
                self.rescaled(plan.chains[e.src]) for e in plan.edges if e.dst == chain.id):
            own = self.states.get(chain.task_id(index)) or {}
            out = []
            sent: dict[str, list] = {}
            for st in self.states.values():
                sent.update(st.get("out_channels") or {})
            # Per channel: what the receiver recorded, then what the sender still held.
            for ch in inputs:
                recs = [r for blob in (own.get("channels") or {}).get(ch, ())
                        for r in pickle.loads(blob)]
                recs += [r for blob in sent.get(ch, ()) for r in pickle.loads(blob)]
                if recs:
                    out.append((ch, recs))
            return out
        return self._rerouted(chain, index, inputs)

    def _rerouted(self, chain: Chain, index: int, inputs: list[str]) -> list[tuple[str, list]]:
        plan = self.plan
        edges = {plan.chains[e.src].uid: e for e in plan.edges if e.dst == chain.id}
        per_channel: dict[str, list] = defaultdict(list)  # old channel -> records, in order
        for part in ("channels", "out_channels"):
            for st in self.states.values():
                for ch, blobs in (st.get(part) or {}).items():
                    if _split_channel(ch)[2] == chain.uid:
                        per_channel[ch].extend(r for b in blobs for r in pickle.loads(b))
        out: dict[str, list] = defaultdict(list)
        p, maxp = chain.parallelism, plan.max_parallelism
        for ch in sorted(per_channel):
            src_uid, _, _, old_dst = _split_channel(ch)
            edge = edges.get(src_uid) or (next(iter(edges.values())) if len(edges) == 1
                                          else None)
            if edge is None:
                raise IncompatibleCheckpointError(
                    f"in-flight records of channel {ch!r} have no input of {chain.uid!r} "
                    "to go to: the pipeline changed around an unaligned checkpoint")
            src_chain = plan.chains[edge.src]
            mine = [c for c in inputs if _split_channel(c)[0] == src_chain.uid]
            if not mine:
                continue
            records = per_channel[ch]
            if edge.partitioning == HASH:
                kf = edge.key_fn
                keep = [r for r in records
                        if subtask_for_key_group(key_group(kf(r), maxp), p, maxp) == index]
            else:
                keep = records if old_dst % p == index else []
            if keep:
                out[mine[0]].extend(keep)
        return list(out.items())
