"""A deterministic, seeded discrete-event simulator of processes and FIFO channels.

It is one *driver* of :class:`cutline.protocol.SnapshotHandler`: every process has a handler
in front of it; the simulator turns channel activity into protocol events and carries out
the returned actions.  Same seed, same run, event for event.

Model
-----
* A channel is a FIFO queue from one process to another.  A message sent at time ``t``
  arrives at ``max(t + delay, arrival of the previous item)``: random delays, never
  reordering.  Arrived items wait in the receiver's inbox until it takes them.
* A process handles one thing at a time; ``service_time`` per record makes inboxes fill
  (backpressure), which is where alignment and unaligned barriers differ.
* Every application event (send, receive, internal) is numbered per process and logged in
  the trace with the time it happened; the consistent-cut checker reads the trace.

It is longer than most modules on purpose: the clock, the channels, the processes and the
trace are one event loop whose ordering rules (FIFO, one thing at a time) every scenario
and the explorer rely on, so they are read together.
"""

from __future__ import annotations

import copy
import heapq
import random
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, cast

from ..protocol import (
    Barrier,
    BlockChannel,
    DeclineSnapshot,
    Deliver,
    EmitBarrier,
    FinishSnapshot,
    Mode,
    PrioritizeBarrier,
    RecordChannelState,
    ScheduleTimeout,
    SnapshotHandler,
    TakeSnapshot,
    UnblockChannel,
)

from ..analysis.trace import Message, Snapshot, TraceEvent

__all__ = ["Message", "TraceEvent", "Snapshot", "SimProcess", "SimContext", "Simulation"]

_EOF = object()


class SimProcess:
    """Base class for simulated process logic.  Keep all state in ``self.state``.

    The simulator works on channels: :meth:`on_receive` gets the channel (``"A->B"``) a
    message came on, and :meth:`SimContext.send` takes a channel.  Process graphs
    (:class:`cutline.graph.Process`) have their own, process-level vocabulary
    (``on_message(ctx, sender, msg)``, ``ctx.send(dst, msg)``); a subclass defining
    ``on_message`` here is refused rather than silently never called.
    """

    state: Any = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "on_message" in cls.__dict__:
            raise TypeError(
                f"{cls.__qualname__} defines on_message, which a SimProcess never calls: the "
                f"simulator calls on_receive(ctx, channel, payload); on_message(ctx, sender, "
                f"msg) belongs to cutline.graph.Process")

    def on_start(self, ctx: SimContext) -> None:
        """Called once when the run starts (or resumes after a restore)."""

    def on_receive(self, ctx: SimContext, channel: str, payload: Any) -> None:
        """An application message was delivered on ``channel`` (``"sender->receiver"``)."""

    def on_timer(self, ctx: SimContext, tag: Any) -> None:
        """A timer set with :meth:`SimContext.schedule` fired."""

    def on_input_closed(self, ctx: SimContext, channel: str) -> None:
        """Input ``channel`` ended (its sender closed it)."""

    def on_end_of_input(self, ctx: SimContext) -> None:
        """Every input ended; outputs are closed right after this returns."""

    def snapshot_state(self) -> Any:
        return copy.deepcopy(self.state)

    def restore_state(self, state: Any) -> None:
        self.state = copy.deepcopy(state)


class _Chan:
    __slots__ = ("name", "src", "dst", "inbox", "last_arrival", "back_edge", "closed")

    def __init__(self, name: str, src: str, dst: str, back_edge: bool) -> None:
        self.name, self.src, self.dst, self.back_edge = name, src, dst, back_edge
        self.inbox: deque = deque()
        self.last_arrival = 0.0
        self.closed = False  # sender closed it


class _Proc:
    def __init__(self, name: str, logic: SimProcess) -> None:
        self.name = name
        self.logic = logic
        self.inputs: list[str] = []
        self.outputs: list[str] = []
        self.handler: SnapshotHandler | None = None
        self.blocked: set[str] = set()
        self.busy_until = 0.0
        self.wake_scheduled = False
        self.events = 0  # application events so far
        self.done = False  # outputs closed

    @property
    def h(self) -> SnapshotHandler:
        """The process's snapshot handler (there is one once the simulation started)."""
        if self.handler is None:
            raise RuntimeError(f"process {self.name}: the simulation has not started")
        return self.handler


class SimContext:
    """What simulated process logic may do: the only door to the simulated world."""

    def __init__(self, sim: Simulation, proc: _Proc) -> None:
        self._sim, self._p = sim, proc
        self._current: TraceEvent | None = None

    @property
    def name(self) -> str:
        return self._p.name

    @property
    def now(self) -> float:
        return self._sim.now

    @property
    def rng(self) -> random.Random:
        return self._sim.rng

    @property
    def outputs(self) -> tuple[str, ...]:
        return tuple(self._p.outputs)

    @property
    def inputs(self) -> tuple[str, ...]:
        return tuple(self._p.inputs)

    def send(self, channel: str, payload: Any, *, label: str | None = None) -> Message:
        if channel not in self._p.outputs:
            raise ValueError(f"{self.name} has no output channel {channel!r}")
        return self._sim._send(self._p, channel, payload, label)

    def internal(self, label: str | None = None) -> None:
        self._sim._app_event(self._p, "internal", label=label)

    def label(self, label: str) -> None:
        """Name the receive event being handled (used by scripted examples)."""
        if self._current is not None:
            self._current.label = label

    def schedule(self, delay: float, tag: Any = None) -> None:
        self._sim._at(self._sim.now + delay, self._sim._fire_timer, self._p, tag)

    def initiate_snapshot(self, checkpoint_id: int) -> None:
        """Start (or join) snapshot ``checkpoint_id`` from this process."""
        self._sim._trigger(self._p, checkpoint_id)

    def finish(self) -> None:
        """No more output from this process: close its output channels."""
        self._sim._close_outputs(self._p)


DelayFn = Callable[[str, Any, random.Random], float]


class Simulation:
    """Processes, FIFO channels and a snapshot handler per process, on a virtual clock."""

    def __init__(
        self,
        mode: Mode | str = Mode.CHANDY_LAMPORT,
        *,
        seed: int = 0,
        delay: tuple[float, float] | DelayFn = (0.5, 1.5),
        service_time: float | dict[str, float] = 0.0,
        aligned_timeout: float | None = None,
        batch_size: int = 64,
        min_checkpoint_id: int = 0,
    ) -> None:
        self.mode = Mode.parse(mode)
        self.seed = seed
        self.rng = random.Random(seed)
        if callable(delay):
            self._delay = delay
        else:
            lo, hi = delay
            if not 0 <= lo <= hi:
                raise ValueError(f"delay range must satisfy 0 <= low <= high, got {delay!r}")
            self._delay = lambda _c, _item, rng: rng.uniform(lo, hi)
        self._service = service_time
        self.aligned_timeout = aligned_timeout
        self.batch_size = batch_size
        self.min_checkpoint_id = min_checkpoint_id
        self.now = 0.0
        self.procs: dict[str, _Proc] = {}
        self.chans: dict[str, _Chan] = {}
        self.trace: list[TraceEvent] = []
        self.snapshots: dict[int, Snapshot] = {}
        self.on_snapshot_complete: list[Callable[[Snapshot], None]] = []
        self._heap: list = []
        self._seq = 0
        self._msg_ids = 0
        self._started = False
        self._stopped = False

    # ------------------------------------------------------------------ building

    def add_process(self, name: str, logic: SimProcess) -> None:
        if name in self.procs:
            raise ValueError(f"duplicate process name {name!r}")
        self.procs[name] = _Proc(name, logic)

    def connect(self, src: str, dst: str, *, back_edge: bool = False) -> str:
        for p in (src, dst):
            if p not in self.procs:
                raise ValueError(f"unknown process {p!r} in channel {src}->{dst}")
        name = f"{src}->{dst}"
        if name in self.chans:
            raise ValueError(f"duplicate channel {name}")
        self.chans[name] = _Chan(name, src, dst, back_edge)
        self.procs[src].outputs.append(name)
        self.procs[dst].inputs.append(name)
        return name

    def snapshot_at(
        self, time: float, checkpoint_id: int, initiators: Iterable[str] | None = None
    ) -> None:
        """Initiate ``checkpoint_id`` at ``time`` from ``initiators`` (default: sources)."""
        names = list(initiators) if initiators is not None else None
        unknown = [n for n in names or () if n not in self.procs]
        if unknown:
            raise ValueError(f"unknown initiator(s) {', '.join(map(repr, unknown))}; "
                             f"processes are {', '.join(self.procs)}")
        self._at(time, self._initiate, checkpoint_id, names)

    def snapshot_every(
        self, interval: float, *, start: float | None = None, until: float,
        initiators: Iterable[str] | None = None, first_id: int | None = None,
    ) -> None:
        t = interval if start is None else start
        n = first_id if first_id is not None else self.min_checkpoint_id + 1
        names = list(initiators) if initiators is not None else None
        while t <= until:
            self.snapshot_at(t, n, names)
            t += interval
            n += 1

    def restore(self, snapshot: Snapshot) -> None:
        """Start this (fresh) world from a completed snapshot: states, then in-flight data."""
        if not snapshot.complete:
            raise ValueError(f"snapshot {snapshot.id} is not complete; cannot restore from it")
        missing = set(self.procs) - set(snapshot.states)
        if missing:
            raise ValueError(f"snapshot {snapshot.id} has no state for {sorted(missing)}")
        for name, state in snapshot.states.items():
            if name not in self.procs:
                raise ValueError(f"snapshot {snapshot.id} has state for unknown process {name!r}")
            self.procs[name].logic.restore_state(state)
        unknown = sorted(set(snapshot.channels) - set(self.chans))
        if unknown:
            raise ValueError(f"snapshot {snapshot.id} records channels this world lacks: "
                             f"{', '.join(unknown)} (the graph changed since the snapshot)")
        for cname, msgs in snapshot.channels.items():
            ch = self.chans[cname]
            for m in msgs:  # re-inject recorded in-flight messages, in order, first
                ch.inbox.append(Message(self._next_msg_id(), cname, m.payload, m.label))
        self.min_checkpoint_id = max(self.min_checkpoint_id, snapshot.id + 1)

    # ------------------------------------------------------------------ running

    def run(self, until: float = float("inf"), max_events: int = 5_000_000) -> Simulation:
        if not self._started:
            self._start()
        steps = 0
        while self._heap and not self._stopped:
            t = self._heap[0][0]
            if t > until:
                self.now = until
                break
            t, _, fn, args = heapq.heappop(self._heap)
            self.now = t
            fn(*args)
            steps += 1
            if steps > max_events:
                raise RuntimeError(f"simulation exceeded {max_events} events (livelock?)")
        return self

    def stop(self) -> None:
        self._stopped = True

    @property
    def completed(self) -> list[Snapshot]:
        return sorted((s for s in self.snapshots.values() if s.complete), key=lambda s: s.id)

    def latest_completed(self) -> Snapshot | None:
        done = self.completed
        return done[-1] if done else None

    # ------------------------------------------------------------------ internals

    def _start(self) -> None:
        self._started = True
        for p in self.procs.values():
            back = [c for c in p.inputs if self.chans[c].back_edge]
            p.handler = SnapshotHandler(
                p.inputs, self.mode, back_edges=back,
                aligned_timeout=self.aligned_timeout, min_checkpoint_id=self.min_checkpoint_id,
            )
        for p in self.procs.values():
            p.logic.on_start(SimContext(self, p))
        for p in self.procs.values():
            self._wake(p)

    def _at(self, t: float, fn: Callable, *args: Any) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, fn, args))

    def _next_msg_id(self) -> int:
        self._msg_ids += 1
        return self._msg_ids

    def _service_time(self, p: _Proc) -> float:
        s = self._service
        return s.get(p.name, 0.0) if isinstance(s, dict) else s

    def _app_event(self, p: _Proc, kind: str, **kw: Any) -> TraceEvent:
        ev = TraceEvent(self.now, p.name, kind, index=p.events, **kw)
        p.events += 1
        self.trace.append(ev)
        return ev

    def _transmit(self, ch: _Chan, item: Any) -> None:
        arrive = max(self.now + self._delay(ch.name, item, self.rng), ch.last_arrival)
        ch.last_arrival = arrive
        self._at(arrive, self._arrive, ch, item)

    def _send(self, p: _Proc, channel: str, payload: Any, label: str | None) -> Message:
        ch = self.chans[channel]
        if ch.closed:
            raise RuntimeError(f"{p.name} sent on {channel} after closing it")
        msg = Message(self._next_msg_id(), channel, payload, label)
        self._app_event(p, "send", label=label, message=msg.id, channel=channel)
        self._transmit(ch, msg)
        return msg

    def _close_outputs(self, p: _Proc) -> None:
        if p.done:
            return
        p.done = True
        for c in p.outputs:
            ch = self.chans[c]
            self._transmit(ch, _EOF)
            ch.closed = True

    def _arrive(self, ch: _Chan, item: Any) -> None:
        ch.inbox.append(item)
        p = self.procs[ch.dst]
        if isinstance(item, Barrier) and len(ch.inbox) > 1 and p.handler is not None:
            # queued behind data: announce it (a priority event, handled even when busy)
            self._perform(p, p.h.on_announce(ch.name, item))
        self._wake(p)

    def _prioritize(self, p: _Proc, channel: str, n: int) -> None:
        """Pull barrier ``n`` forward in ``channel``'s inbox, past the records ahead of it."""
        inbox = self.chans[channel].inbox
        pos = next((i for i, it in enumerate(inbox) if isinstance(it, Barrier)), None)
        if pos is None or inbox[pos].checkpoint_id != n:
            return  # already taken in order, or behind another barrier: FIFO among barriers
        overtaken = tuple(inbox.popleft() for _ in range(pos))
        inbox.popleft()
        barrier = Barrier(n, unaligned=True)
        self._marker_received(p, channel, barrier)
        self._perform(p, p.h.on_barrier(channel, barrier, overtaken))

    def _fire_timer(self, p: _Proc, tag: Any) -> None:
        p.logic.on_timer(SimContext(self, p), tag)

    def _wake(self, p: _Proc) -> None:
        """Let ``p`` take the next item from its inboxes, if it is free."""
        if p.busy_until > self.now:
            if not p.wake_scheduled:
                p.wake_scheduled = True
                self._at(p.busy_until, self._woken, p)
            return
        while p.busy_until <= self.now and self._step(p):
            pass
        if p.busy_until > self.now and not p.wake_scheduled:
            p.wake_scheduled = True
            self._at(p.busy_until, self._woken, p)

    def _woken(self, p: _Proc) -> None:
        p.wake_scheduled = False
        self._wake(p)

    def _step(self, p: _Proc) -> bool:
        """Handle one inbox item (or one batch of records); False if nothing to do."""
        h = p.h
        ready = [c for c in p.inputs if self.chans[c].inbox and c not in p.blocked]
        if not ready:
            return False
        c = ready[0] if len(ready) == 1 else self.rng.choice(ready)
        inbox = self.chans[c].inbox
        head = inbox[0]
        if head is _EOF:
            inbox.popleft()
            self._perform(p, h.on_close(c))
            p.logic.on_input_closed(SimContext(self, p), c)
            if not h.open_inputs and p.inputs:
                p.logic.on_end_of_input(SimContext(self, p))
                self._close_outputs(p)
                # Snapshots whose barriers never reached us (every upstream finished
                # before it started): our final state is our part of them.
                for n, snap in list(self.snapshots.items()):
                    if snap.aborted is None and not snap.complete and p.name not in snap.states:
                        self._final_state(p, n)
            return True
        if isinstance(head, Barrier):
            inbox.popleft()
            self._marker_received(p, c, head)
            self._perform(p, h.on_barrier(c, head))
            return True
        batch: list[Message] = []
        while inbox and len(batch) < self.batch_size and isinstance(inbox[0], Message):
            batch.append(inbox.popleft())
        self._perform(p, h.on_records(c, tuple(batch)))
        return True

    def _marker_received(self, p: _Proc, channel: str, barrier: Barrier) -> None:
        self.trace.append(TraceEvent(self.now, p.name, "marker_recv", channel=channel,
                                     checkpoint=barrier.checkpoint_id))

    def _initiate(self, checkpoint_id: int, names: list[str] | None) -> None:
        if names is None:
            names = [n for n, p in self.procs.items() if not p.inputs]
        snap = self._snapshot(checkpoint_id)
        if snap.started_at is None:
            snap.started_at = self.now
        for n in names:
            if n not in self.procs:
                raise ValueError(f"unknown initiator {n!r}")
            self._trigger(self.procs[n], checkpoint_id)
        for p in self.procs.values():
            if p.done and p.name not in names:
                self._final_state(p, checkpoint_id)

    def _trigger(self, p: _Proc, checkpoint_id: int) -> None:
        snap = self._snapshot(checkpoint_id)
        if snap.started_at is None:
            snap.started_at = self.now
        if p.done:
            self._final_state(p, checkpoint_id)
            return
        self._perform(p, p.h.on_trigger(checkpoint_id))
        self._wake(p)

    def _final_state(self, p: _Proc, n: int) -> None:
        """A finished process (outputs closed) joins snapshot ``n`` with its final state."""
        if p.name not in self._snapshot(n).states:
            self._perform(p, [TakeSnapshot(n), FinishSnapshot(n)])

    def _snapshot(self, n: int) -> Snapshot:
        snap = self.snapshots.get(n)
        if snap is None:
            snap = self.snapshots[n] = Snapshot(n)
        return snap

    def _perform(self, p: _Proc, actions: list) -> None:
        cost = 0.0
        for a in actions:
            if type(a) is Deliver:
                ctx = SimContext(self, p)
                channel = cast(str, a.channel)  # the simulator's channels are names
                for m in a.records:
                    ctx._current = self._app_event(
                        p, "recv", label=None, message=m.id, channel=channel)
                    p.logic.on_receive(ctx, channel, m.payload)
                    ctx._current = None
                cost += self._service_time(p) * len(a.records)
            elif type(a) is RecordChannelState:
                recorded = self._snapshot(a.checkpoint_id).channels
                recorded.setdefault(cast(str, a.channel), []).extend(a.records)
            elif type(a) is TakeSnapshot:
                snap = self._snapshot(a.checkpoint_id)
                snap.states[p.name] = p.logic.snapshot_state()
                snap.cut[p.name] = p.events
                snap.taken_at[p.name] = self.now
                for c in p.inputs:
                    snap.channels.setdefault(c, [])
                self.trace.append(TraceEvent(self.now, p.name, "snapshot",
                                             checkpoint=a.checkpoint_id))
            elif type(a) is EmitBarrier:
                for c in p.outputs:
                    ch = self.chans[c]
                    if ch.closed:
                        continue
                    self.trace.append(TraceEvent(self.now, p.name, "marker_send", channel=c,
                                                 checkpoint=a.barrier.checkpoint_id))
                    self._transmit(ch, a.barrier)
            elif type(a) is FinishSnapshot:
                self._finish(p, a.checkpoint_id)
            elif type(a) is BlockChannel:
                p.blocked.add(cast(str, a.channel))
            elif type(a) is UnblockChannel:
                p.blocked.discard(a.channel)
            elif type(a) is ScheduleTimeout:
                self._at(self.now + a.delay, self._timeout, p, a.checkpoint_id)
            elif type(a) is PrioritizeBarrier:
                self._prioritize(p, cast(str, a.channel), a.checkpoint_id)
            elif type(a) is DeclineSnapshot:
                self._at(self.now, self._abort, a.checkpoint_id, f"{p.name}: {a.reason}")
            else:  # pragma: no cover - exhaustive over protocol actions
                raise TypeError(f"unknown action {a!r}")
        if cost:
            p.busy_until = max(p.busy_until, self.now) + cost

    def _finish(self, p: _Proc, n: int) -> None:
        snap = self._snapshot(n)
        snap.finished.add(p.name)
        if snap.aborted is None and snap.completed_at is None and len(snap.finished) == len(
            self.procs
        ):
            snap.completed_at = self.now
            for cb in self.on_snapshot_complete:
                cb(snap)

    def _timeout(self, p: _Proc, n: int) -> None:
        self._perform(p, p.h.on_timeout(n))
        self._wake(p)

    def _abort(self, n: int, reason: str) -> None:
        snap = self._snapshot(n)
        if snap.aborted is not None or snap.complete:
            return
        snap.aborted = reason
        for p in self.procs.values():
            self._perform(p, p.h.on_abort(n))
            self._wake(p)
