"""A process-graph run's decisions, sans-IO: events in, commands out.

The process-graph twin of :class:`~cutline.protocol.job.JobController`.  It owns the
run's attempts (through the shared :class:`~cutline.protocol.job.AttemptTracker`), when a
snapshot is due (the coordinator's :class:`~cutline.protocol.coordinator.TriggerPolicy`),
which processes to start it at (random or named initiators, plus the processes no marker
can reach from them), the snapshot ids it hands out (to itself and, in pools, to processes
that start snapshots on their own), the parts of each snapshot in flight (the
coordinator's :class:`~cutline.protocol.coordinator.PendingCheckpoints`, one part per
process instead of one ack per task), which snapshot a new attempt restores, and when the
run ends.

What it leaves to its driver: decoding and storing a complete snapshot and evaluating the
predicates on it (:class:`StoreSnapshot`; the driver reports back with
:meth:`GraphController.stored`), sending messages (:class:`~cutline.protocol.job.Send`),
keeping metrics and traces.

Unlike a dataflow's checkpoints, Chandy-Lamport snapshots never time out or subsume each
other, and only the snapshots the driver starts count against ``max_concurrent``: a process
may start its own at any time.  ``now`` is the driver's monotonic clock (seconds);
``clock_offset`` turns it into the wall clock, which :class:`~cutline.protocol.messages.Start`
carries: the hosts time their traces from the run's start on it.
"""

from __future__ import annotations

import logging
import math
import random
from collections import deque
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from . import messages as m
from .coordinator import AckResult, CheckpointPolicy, PendingCheckpoints, TriggerPolicy
from .controller import Conn, Done, DoneCause, Send
from .job import Attempt, AttemptTracker, remember

log = logging.getLogger("cutline.graph.driver")

__all__ = ["AttemptRecord", "GraphCommand", "GraphController", "ID_POOL", "RestorePoint",
           "STOP_GRACE", "StoreSnapshot"]

ID_POOL = 8
"""Snapshot ids handed to a host at a time, for the processes on it that start their own."""

STOP_GRACE = 30.0
"""Seconds the hosts have to send their final states once told to stop."""


@dataclass(frozen=True, slots=True)
class StoreSnapshot:
    """Every process sent its part of snapshot ``snapshot_id``: decode it, evaluate the
    predicates, store it, apply retention, then report :meth:`GraphController.stored`."""
    snapshot_id: int
    parts: dict = field(hash=False)  # process -> part
    initiators: tuple[str, ...]
    by_driver: bool
    attempt: int


GraphCommand: TypeAlias = Send | StoreSnapshot | Done


@dataclass(frozen=True, slots=True)
class RestorePoint:
    """A stored snapshot a new attempt can start from."""
    snapshot_id: int | None
    path: str
    in_transit: int = 0


@dataclass
class AttemptRecord:
    number: int
    started: float  # the driver's clock
    restored_from: str | None
    restored_id: int | None = None
    redelivered: int = 0  # messages in transit in the restored snapshot
    lost_at: float | None = None  # when a host of it went away


@dataclass
class _Snapshot:
    initiators: list[str] = field(default_factory=list)
    by_driver: bool = False


class GraphController:
    """The decisions of one process-graph run (see the module docstring).

    ``placement``: process -> host slot; ``interval`` None: the driver starts no snapshots
    (processes may); ``initiators``: how many processes to pick at random per snapshot, or
    their names; ``restore``: the snapshot the first attempt starts from."""

    def __init__(self, names: Sequence[str], edges: Sequence[tuple[str, str]],
                 placement: dict[str, int], hosts: int, *, interval: float | None,
                 initiators: int | Sequence[str] = 1, max_concurrent: int = 4,
                 duration: float | None = None, first_id: int = 1,
                 restore: RestorePoint | None = None, rng: random.Random | None = None,
                 clock_offset: float = 0.0) -> None:
        self.names = list(names)
        self.placement, self.hosts = placement, hosts
        self.initiators = initiators
        self.duration = duration
        self.rng = rng or random.Random()
        self.policy = (CheckpointPolicy(interval, timeout=math.inf,
                                        max_concurrent=max_concurrent)
                       if interval is not None else None)
        self.trigger: TriggerPolicy | None = None
        self.tracker = AttemptTracker(hosts, first=-1)
        self.next_id = first_id
        self.restore = restore
        self.kept: set[int] | None = None  # ids storage still holds (None: not yet known)
        # stored by this run, in completion order (the newest job.HISTORY: retention keeps
        # far fewer in storage, and a restore picks the newest storage still holds)
        self.completed: list[RestorePoint] = []
        self.pending = PendingCheckpoints(math.inf)
        self.snaps: dict[int, _Snapshot] = {}
        self.attempts: list[AttemptRecord] = []
        self.finals: dict[int, m.FinalStates] = {}  # slot -> final states, this attempt
        self.lost = False  # a host of the current attempt went away: no more triggers
        self.t_run: float | None = None
        self.stopping: str | None = None
        self.stop_deadline = 0.0
        self.done = False
        self.cause: DoneCause | None = None
        self.error: str | None = None
        self.clock_offset = clock_offset  # the wall clock minus ``now``
        # the current attempt's first host failure (the cause of what followed), and the
        # Python traceback of a fatal one
        self.last_failure: str | None = None
        self.trace = ""
        self._adj: dict[str, list[str]] = {n: [] for n in self.names}
        for a, b in edges:
            self._adj[a].append(b)
        self._cover_cache: dict[frozenset, list[str]] = {}

    # ------------------------------------------------------------------ queries

    @property
    def attempt(self) -> Attempt:
        return self.tracker.attempt

    @property
    def started(self) -> bool:
        return self.tracker.attempt.started

    def slot_of(self, conn: Conn) -> int | None:
        return self.tracker.attempt.slot_of(conn)

    def in_flight(self) -> list[int]:
        return list(self.pending)

    @property
    def failure_reported(self) -> bool:
        """A host failure of the current attempt was reported (:attr:`last_failure`)."""
        return self.last_failure is not None

    # ------------------------------------------------------------------ events

    def on_register(self, conn: Conn, msg: m.Register, now: float) -> list[GraphCommand]:
        if self.stopping is not None or self.done:
            return [Send(conn, m.Stop())]
        stale, complete = self.tracker.register(conn, msg)
        cmds: list[GraphCommand] = [Send(c, m.Stop()) for c in stale]
        if stale:  # markers of the lost attempt will never arrive
            self._new_attempt()
        if complete:
            self._start_attempt(now, cmds)
        return cmds

    def on_submitted(self, now: float) -> list[GraphCommand]:
        return []

    def on_message(self, conn: Conn, msg: Any, now: float) -> list[GraphCommand]:
        """A message from a host.  Messages of earlier attempts are dropped."""
        if type(msg) is m.Register:
            return self.on_register(conn, msg, now)
        slot = self.slot_of(conn)
        if slot is None or self.done:
            return []
        cmds: list[GraphCommand] = []
        t = type(msg)
        if t is m.Parts:
            for n, name, part in msg.parts:
                self._part(n, name, part, now, cmds)
        elif t is m.Initiated:
            self._snap(msg.checkpoint, now).initiators.append(msg.process)
            self._trigger(msg.checkpoint, self._cover([msg.process]), cmds)
        elif t is m.IdsWanted:
            cmds.append(Send(conn, m.Ids(self._alloc(ID_POOL))))
        elif t is m.FinalStates:
            self.finals[slot] = msg
            if self.stopping is not None and len(self.finals) == self.hosts:
                self._finish(None, cmds, DoneCause.FINISHED)
        elif t is m.Failed:
            if msg.fatal:
                self.trace = msg.trace
                self._finish(msg.error or "a process failed", cmds, DoneCause.TASK_FAILED)
            else:
                log.warning("host %s failed: %s", slot, msg.error)
                self._note_failure(f"host {slot}: {msg.error}")
        return cmds

    def on_closed(self, conn: Conn, now: float, cause: str | None = None) -> list[GraphCommand]:
        """A host's connection went away: unless it had sent its final states, the attempt
        is lost; no more snapshots start until Spark restarts the stage.  With ``cause``
        (the driver closed it: the host went silent, a frozen process the engine will not
        restart) the run fails naming the host, and the other hosts are told to stop."""
        slot = self.slot_of(conn)
        if slot is None or slot in self.finals or self.done:
            return []
        if cause is not None:
            why = f"host {slot}: {cause}"
            self._note_failure(why)
            cmds: list[GraphCommand] = [Send(c, m.Stop(abandoned=why))
                                        for s, c in sorted(self.tracker.attempt.conns.items())
                                        if s != slot]
            self._finish(f"attempt {self.tracker.number} lost {why}", cmds,
                         DoneCause.TASK_SILENT)
            return cmds
        self._note_failure(f"host {slot}: its connection closed")
        self.lost = True
        if self.attempts and self.attempts[-1].lost_at is None:
            self.attempts[-1].lost_at = now
        log.warning("attempt %d lost host %d; waiting for Spark to restart the stage",
                    self.tracker.number, slot)
        return []

    def on_stage_ended(self, now: float) -> list[GraphCommand]:
        cmds: list[GraphCommand] = []
        if not self.done:
            self._finish("the Spark stage ended before the run did "
                         f"(final states from hosts {sorted(self.finals)})", cmds,
                         DoneCause.STAGE_ENDED)
        return cmds

    def next_due(self, now: float) -> float | None:
        """When :meth:`tick` has something to do next (>= ``now``); None: nothing until
        the next event."""
        if not self.started or self.done:
            return None
        if self.stopping is not None:
            return max(self.stop_deadline, now)
        if self.lost:
            return None
        times: list[float] = []
        if self.duration is not None and self.t_run is not None:
            times.append(self.t_run + self.duration)
        if self.trigger is not None:
            due = self.trigger.next_due(
                now, pending=sum(s.by_driver for s in self.snaps.values()))
            if due is not None:
                times.append(due)
        return max(min(times), now) if times else None

    def shutdown(self, why: str) -> list[GraphCommand]:
        self.done = True
        return []

    def cancel(self, now: float) -> list[GraphCommand]:
        cmds: list[GraphCommand] = []
        if self.stopping is None and not self.done:
            self._stop("cancelled", now, cmds)
        return cmds

    def tick(self, now: float) -> list[GraphCommand]:
        cmds: list[GraphCommand] = []
        if not self.started or self.done:
            return cmds
        if self.stopping is not None:
            if now > self.stop_deadline:
                missing = sorted(set(self.tracker.attempt.conns) - set(self.finals))
                log.warning("run stopped, but hosts %s sent no final state", missing)
                self._finish(None, cmds, DoneCause.FINISHED)
            return cmds
        if self.lost:
            return cmds
        assert self.t_run is not None
        if self.duration is not None and now - self.t_run >= self.duration:
            self._stop("duration", now, cmds)
            return cmds
        if self.trigger is None or not self.trigger.should_trigger(
                now, pending=sum(s.by_driver for s in self.snaps.values())):
            return cmds
        self.trigger.triggered(now)
        if isinstance(self.initiators, int):
            who = self.rng.sample(self.names, self.initiators)
        else:
            who = list(self.initiators)
        n = self._alloc(1)[0]
        snap = self._snap(n, now)
        snap.initiators.extend(who)
        snap.by_driver = True
        self._trigger(n, who + self._cover(who), cmds)
        return cmds

    def stored(self, snapshot_id: int, *, path: str | None, in_transit: int,
               kept: Collection[int] | None, stop: str | None, now: float) -> list[GraphCommand]:
        """The driver stored snapshot ``snapshot_id`` at ``path`` (None: storing failed; the
        run goes on without it); ``kept``: the ids storage holds after retention; ``stop``:
        why the predicates on it end the run, if they do."""
        cmds: list[GraphCommand] = []
        if path is not None:
            remember(self.completed, RestorePoint(snapshot_id, path, in_transit))
            self.kept = set(kept) if kept is not None else None
        if stop is not None and self.stopping is None and not self.done:
            self._stop(stop, now, cmds)
        return cmds

    # ------------------------------------------------------------------ internals

    def _alloc(self, k: int) -> list[int]:
        ids = list(range(self.next_id, self.next_id + k))
        self.next_id += k
        return ids

    def _snap(self, n: int, now: float) -> _Snapshot:
        snap = self.snaps.get(n)
        if snap is None:
            snap = self.snaps[n] = _Snapshot()
            self.pending.start(n, self.names, now)
        return snap

    def _part(self, n: int, name: str, part: Any, now: float, cmds: list[GraphCommand]) -> None:
        snap = self._snap(n, now)
        if self.pending.ack(n, name, now, {"part": part}) is not AckResult.COMPLETE:
            return
        p = self.pending.pop(n)
        del self.snaps[n]
        parts = {who: ack["part"] for who, ack in p.acks.items()}
        cmds.append(StoreSnapshot(n, parts, tuple(sorted(set(snap.initiators))),
                                  snap.by_driver, self.tracker.number))

    def _trigger(self, n: int, names: list[str], cmds: list[GraphCommand]) -> None:
        by_host: dict[int, list[str]] = {}
        for name in names:
            by_host.setdefault(self.placement[name], []).append(name)
        conns = self.tracker.attempt.conns
        for slot, who in by_host.items():
            conn = conns.get(slot)
            if conn is not None:
                cmds.append(Send(conn, m.TriggerProcesses(n, who)))

    def _cover(self, initiators: list[str]) -> list[str]:
        """Processes to trigger besides ``initiators`` so that every process takes part:
        those no marker can reach from the initiators (and what they reach)."""
        key = frozenset(initiators)
        got = self._cover_cache.get(key)
        if got is not None:
            return got
        seen: set[str] = set()

        def reach(start: str) -> None:
            todo = deque([start])
            seen.add(start)
            while todo:
                for b in self._adj[todo.popleft()]:
                    if b not in seen:
                        seen.add(b)
                        todo.append(b)

        for n in initiators:
            if n not in seen:
                reach(n)
        extra = []
        for n in self.names:
            if n not in seen:
                extra.append(n)
                reach(n)
        if len(self._cover_cache) < 4096:
            self._cover_cache[key] = extra
        return extra

    def _new_attempt(self) -> None:
        self.last_failure, self.trace = None, ""
        self.pending = PendingCheckpoints(math.inf)
        self.snaps.clear()
        self.finals.clear()
        self.lost = False

    def _restore_point(self) -> RestorePoint | None:
        """The snapshot this run completed last, if storage still holds it (retention
        keeps the highest ids, and ids handed to processes complete out of order), else
        the one the run started from."""
        for point in reversed(self.completed):
            if self.kept is None or point.snapshot_id in self.kept:
                return point
        return self.restore

    def _start_attempt(self, now: float, cmds: list[GraphCommand]) -> None:
        a = self.tracker.attempt
        if a.number < 0:
            a.number = 0
        a.started = True
        point = self._restore_point()
        if self.t_run is None:
            self.t_run = now  # times of the run count from when its processes started
        self.attempts.append(AttemptRecord(
            a.number, now, point.path if point else None,
            restored_id=point.snapshot_id if point else None,
            redelivered=point.in_transit if point else 0))
        if self.policy is not None:
            self.trigger = TriggerPolicy(self.policy, now)
        for conn in a.conns.values():
            cmds.append(Send(conn, m.Start(a.number, dict(a.addresses),
                                           point.path if point else None,
                                           now + self.clock_offset)))
        log.info("attempt %d started%s", a.number, f" from {point.path}" if point else "")

    def _stop(self, reason: str, now: float, cmds: list[GraphCommand]) -> None:
        self.stopping = reason
        self.stop_deadline = now + STOP_GRACE
        cmds.extend(Send(c, m.Stop()) for c in self.tracker.attempt.conns.values())

    def _note_failure(self, failure: str) -> None:
        if self.last_failure is None:
            self.last_failure = failure

    def _finish(self, error: str | None, cmds: list[GraphCommand], cause: DoneCause) -> None:
        if not self.done:
            self.done = True
            self.cause, self.error = cause, error
            cmds.append(Done(cause, error))
