"""The per-task snapshot handler: a pure state machine, events in, actions out.

One :class:`SnapshotHandler` sits in front of every task (process, subtask).  The driver
feeds it what happens on the task's input channels and carries out the returned actions in
order.  Modes are small policy classes, as in Flink's barrier handlers
(``WaitingForFirstBarrier``, ``CollectingBarriers``, ``CollectingBarriersUnaligned`` ...),
sharing two mechanisms that live on the handler:

* *recordings*: snapshots whose local state is taken and whose channel state is still being
  recorded, one per checkpoint id, any number at once (Chandy-Lamport, unaligned,
  aligned-after-timeout, and the back edges of cyclic graphs in every mode);
* *blocked channels*: inputs held back during alignment.

Correctness rests on FIFO channels: a barrier separates, on each channel, the records sent
before the sender's snapshot from those sent after it.
"""

from __future__ import annotations

from collections.abc import Iterable

from .events import (
    AbortCheckpoint,
    Action,
    AlignmentTimeout,
    Barrier,
    BarrierAnnounced,
    BarrierArrived,
    Batch,
    BlockChannel,
    Channel,
    ChannelClosed,
    Deliver,
    EmitBarrier,
    Event,
    FinishSnapshot,
    Mode,
    PrioritizeBarrier,
    ProtocolError,
    RecordChannelState,
    RecordsArrived,
    TakeSnapshot,
    TriggerCheckpoint,
    UnblockChannel,
)

from .modes import POLICIES

__all__ = ["SnapshotHandler"]

# Ids kept to recognise late barriers; older ones fall below a floor (monotonic modes).
_SEEN_LIMIT = 1024


class _OpenSnapshot:
    """A snapshot taken locally, still recording the channels in ``pending``."""

    __slots__ = ("checkpoint_id", "pending")

    def __init__(self, checkpoint_id: int, pending: dict[Channel, None]) -> None:
        self.checkpoint_id = checkpoint_id
        self.pending = pending


class SnapshotHandler:
    """Snapshot protocol for one task.

    Parameters
    ----------
    inputs:
        The task's input channels (any hashable ids), in a fixed order.  A source has none.
    mode:
        A :class:`~cutline.protocol.events.Mode` or its name.
    back_edges:
        Inputs that close a cycle (feedback edges).  Alignment never waits for them (that
        would deadlock); after the snapshot their records are logged until their barrier
        arrives, as in the ABS paper.  Chandy-Lamport needs no such hint.
    aligned_timeout:
        Aligned mode only: if alignment of a checkpoint takes longer than this (in the
        driver's seconds), switch that checkpoint to unaligned.  ``0`` switches at once.
    min_checkpoint_id:
        Barriers with a smaller id are stale (e.g. the checkpoint restored from).
    """

    def __init__(
        self,
        inputs: Iterable[Channel] = (),
        mode: Mode | str = Mode.ALIGNED,
        *,
        back_edges: Iterable[Channel] = (),
        aligned_timeout: float | None = None,
        min_checkpoint_id: int = 0,
    ) -> None:
        self.mode = Mode.parse(mode)
        inputs = list(inputs)
        self._open: dict[Channel, None] = dict.fromkeys(inputs)
        if len(self._open) != len(inputs):
            raise ValueError(f"duplicate input channel in {inputs!r}")
        self._back = frozenset(back_edges)
        if not self._back <= self._open.keys():
            unknown = sorted(map(repr, self._back - self._open.keys()))
            raise ValueError(f"back edges {', '.join(unknown)} are not inputs of this task")
        if aligned_timeout is not None:
            if self.mode is not Mode.ALIGNED:
                raise ValueError("aligned_timeout applies to mode 'aligned' only")
            if aligned_timeout < 0:
                raise ValueError(f"aligned_timeout must be >= 0, got {aligned_timeout!r}")
        self.aligned_timeout = aligned_timeout
        self._blocked: dict[Channel, None] = {}
        self._recordings: dict[int, _OpenSnapshot] = {}
        self._recording_on: dict[Channel, list[int]] = {}
        self._seen: set[int] = set()
        self._floor = min_checkpoint_id
        self._deliver_overtaken = True
        policy = POLICIES[self.mode]
        self._policy = policy(self)

    # ------------------------------------------------------------------ introspection

    @property
    def open_inputs(self) -> tuple[Channel, ...]:
        return tuple(self._open)

    @property
    def blocked(self) -> tuple[Channel, ...]:
        return tuple(self._blocked)

    @property
    def recording(self) -> dict[int, tuple[Channel, ...]]:
        """Open snapshots and the channels each is still recording."""
        return {n: tuple(r.pending) for n, r in self._recordings.items()}

    @property
    def aligning(self) -> int | None:
        """The checkpoint whose barriers are being aligned, if any."""
        return getattr(self._policy, "aligning", None)

    def copy(self) -> SnapshotHandler:
        """An independent copy, much cheaper than ``copy.deepcopy`` (model checking)."""
        c = object.__new__(SnapshotHandler)
        c.__dict__.update(self.__dict__)
        c._open, c._blocked = dict(self._open), dict(self._blocked)
        c._recordings = {n: _OpenSnapshot(r.checkpoint_id, dict(r.pending))
                         for n, r in self._recordings.items()}
        c._recording_on = {ch: list(ns) for ch, ns in self._recording_on.items()}
        c._seen = set(self._seen)
        c._policy = self._policy.copy(c)
        return c

    def state_key(self) -> tuple:
        """A hashable, order-independent fingerprint of the protocol state (model checking)."""

        def srt(xs: Iterable) -> tuple:
            return tuple(sorted(xs, key=repr))

        return (
            srt(self._open), srt(self._blocked),
            srt((n, srt(r.pending)) for n, r in self._recordings.items()),
            srt(self._seen), self._floor, self._policy.key(),
        )

    @property
    def idle(self) -> bool:
        """No checkpoint is open at this task."""
        return not self._recordings and not self._blocked and self._policy.idle()

    # ------------------------------------------------------------------ events

    def handle(self, event: Event) -> list[Action]:
        try:
            fn = _DISPATCH[type(event)]
        except KeyError:
            raise TypeError(f"not a protocol event: {event!r}") from None
        return fn(self, event)

    def on_records(self, channel: Channel, records: Batch) -> list[Action]:
        """Records taken off ``channel``; the hot path, once per batch."""
        ids = self._recording_on.get(channel)
        if ids is None:
            if channel in self._blocked or channel not in self._open:
                self._bad_channel(channel, "records")
            return [Deliver(channel, records)]
        if channel in self._blocked:
            self._bad_channel(channel, "records")
        if len(ids) == 1 and records:  # one snapshot recording this channel: inline
            return [RecordChannelState(ids[0], channel, records), Deliver(channel, records)]
        return self._record_and_deliver(channel, records)

    def on_barrier(
        self, channel: Channel, barrier: Barrier, overtaken: Batch = (), *,
        deliver_overtaken: bool = True,
    ) -> list[Action]:
        """A barrier on ``channel``.  With ``deliver_overtaken=False`` the driver left the
        overtaken records in its queue (a copy was passed): they are recorded as channel
        state now and delivered later, in order, as ordinary records."""
        self._deliver_overtaken = deliver_overtaken
        try:
            return self._on_barrier(channel, barrier, overtaken)
        finally:
            self._deliver_overtaken = True

    def _on_barrier(self, channel: Channel, barrier: Barrier, overtaken: Batch) -> list[Action]:
        if channel in self._blocked or channel not in self._open:
            self._bad_channel(channel, f"barrier {barrier.checkpoint_id}")
        if overtaken and not barrier.unaligned:
            raise ProtocolError(
                f"only an unaligned barrier may overtake records; checkpoint "
                f"{barrier.checkpoint_id} on channel {channel!r} is aligned"
            )
        n = barrier.checkpoint_id
        if n in self._recordings:
            if channel not in self._recordings[n].pending:
                raise ProtocolError(
                    f"second barrier of checkpoint {n} on channel {channel!r}"
                )
            return self._overtaken(n, channel, overtaken) + self._channel_done(n, channel)
        return self._policy.barrier(channel, barrier, overtaken)

    def on_announce(self, channel: Channel, barrier: Barrier) -> list[Action]:
        """A barrier is queued on ``channel`` behind records not yet taken."""
        if channel not in self._open:
            self._bad_channel(channel, f"announced barrier {barrier.checkpoint_id}")
        n = barrier.checkpoint_id
        rec = self._recordings.get(n)
        if rec is not None and channel in rec.pending and (
            self.mode is Mode.UNALIGNED or self.aligned_timeout is not None
        ):
            return [PrioritizeBarrier(channel, n)]  # snapshot taken: let it overtake
        return self._policy.announce(channel, barrier)

    def on_trigger(self, checkpoint_id: int) -> list[Action]:
        return self._policy.trigger(checkpoint_id)

    def on_abort(self, checkpoint_id: int) -> list[Action]:
        actions = self._policy.abort(checkpoint_id)
        self._drop_recording(checkpoint_id)
        self._mark_seen(checkpoint_id)
        return actions

    def on_close(self, channel: Channel) -> list[Action]:
        if channel not in self._open:
            self._bad_channel(channel, "end of input")
        if channel in self._blocked:
            raise ProtocolError(f"end of input read from blocked channel {channel!r}")
        del self._open[channel]
        actions: list[Action] = []
        # A closed channel carries nothing more: its recorded state is final.
        for n in list(self._recording_on.get(channel, ())):
            actions += self._channel_done(n, channel)
        actions += self._policy.closed(channel)
        return actions

    def on_timeout(self, checkpoint_id: int) -> list[Action]:
        return self._policy.timeout(checkpoint_id)

    # ------------------------------------------------------------------ shared mechanics

    def _bad_channel(self, channel: Channel, what: str) -> None:
        if channel in self._blocked:
            raise ProtocolError(f"{what} read from blocked channel {channel!r}")
        raise ProtocolError(f"{what} on channel {channel!r}, which is not an open input")

    def _seen_before(self, n: int) -> bool:
        return n < self._floor or n in self._seen

    def _mark_seen(self, n: int) -> None:
        self._seen.add(n)
        if len(self._seen) > _SEEN_LIMIT and self.mode is not Mode.CHANDY_LAMPORT:
            # Ids are monotonic outside Chandy-Lamport: everything below the oldest open
            # checkpoint (or the newest seen) is stale and needs no entry.
            low = min(self._recordings, default=max(self._seen))
            low = min(low, self._policy.oldest_open(default=low))
            self._seen = {i for i in self._seen if i >= low}
            self._floor = max(self._floor, low)

    def _take_snapshot(
        self, n: int, unaligned: bool, pending: Iterable[Channel]
    ) -> list[Action]:
        """Local snapshot of ``n`` now; then record ``pending`` until their barriers."""
        self._mark_seen(n)
        actions: list[Action] = [TakeSnapshot(n), EmitBarrier(Barrier(n, unaligned))]
        pend = {c: None for c in pending if c in self._open}
        if pend:
            self._recordings[n] = _OpenSnapshot(n, pend)
            for c in pend:
                self._recording_on.setdefault(c, []).append(n)
        else:
            actions.append(FinishSnapshot(n))
        return actions

    def _record_and_deliver(self, channel: Channel, records: Batch) -> list[Action]:
        if not records:
            return []
        actions: list[Action] = [
            RecordChannelState(n, channel, records) for n in self._recording_on.get(channel, ())
        ]
        actions.append(Deliver(channel, records))
        return actions

    def _overtaken(self, n: int, channel: Channel, records: Batch) -> list[Action]:
        """Records the unaligned barrier of checkpoint ``n`` overtook.

        Taken out of the queue (delivered now): channel state of every snapshot recording
        ``channel``.  Copied (``deliver_overtaken=False``: still queued at the driver):
        channel state of ``n`` only.  Another snapshot recording ``channel`` has its barrier
        further down the channel (FIFO), so it meets the same records again, delivered or
        copied ahead of its own barrier, and records them then: recorded now as well, they
        would be in its channel state twice (two checkpoints open at once: a savepoint
        beside a periodic checkpoint, or ``max_concurrent`` > 1)."""
        if self._deliver_overtaken:
            return self._record_and_deliver(channel, records)
        if records and n in self._recording_on.get(channel, ()):
            return [RecordChannelState(n, channel, records)]
        return []

    def _channel_done(self, n: int, channel: Channel) -> list[Action]:
        rec = self._recordings[n]
        del rec.pending[channel]
        ids = self._recording_on[channel]
        ids.remove(n)
        if not ids:
            del self._recording_on[channel]
        if rec.pending:
            return []
        del self._recordings[n]
        return [FinishSnapshot(n)]

    def _drop_recording(self, n: int) -> None:
        rec = self._recordings.pop(n, None)
        if rec is None:
            return
        for c in rec.pending:
            ids = self._recording_on[c]
            ids.remove(n)
            if not ids:
                del self._recording_on[c]

    def _block(self, channel: Channel) -> list[Action]:
        self._blocked[channel] = None
        return [BlockChannel(channel)]

    def _unblock_all(self) -> list[Action]:
        actions: list[Action] = [UnblockChannel(c) for c in self._blocked]
        self._blocked.clear()
        return actions

    def _forward_inputs(self) -> list[Channel]:
        return [c for c in self._open if c not in self._back]

    def _late(self, channel: Channel, overtaken: Batch) -> list[Action]:
        """A barrier of an aborted or superseded checkpoint: ignore it, keep the data.

        Records it overtook are still ahead of every open snapshot's barrier on ``channel``:
        taken out of the queue, they are those snapshots' channel state now; copied, they
        stay queued and are recorded when delivered."""
        return self._record_and_deliver(channel, overtaken) if self._deliver_overtaken else []

    def _trigger_at_edge(self, n: int) -> list[Action]:
        """Aligned and at-least-once: only a task without open forward inputs initiates."""
        forward = self._forward_inputs()
        if forward:
            raise ProtocolError(
                f"checkpoint {n} triggered at a task with open inputs {forward!r}; in mode "
                f"{self.mode.value!r} only sources (or tasks whose inputs ended) initiate"
            )
        if self._seen_before(n):
            return []
        return self._take_snapshot(n, False, self._back)


_DISPATCH = {
    RecordsArrived: lambda h, e: h.on_records(e.channel, e.records),
    BarrierArrived: lambda h, e: h.on_barrier(e.channel, e.barrier, e.overtaken),
    BarrierAnnounced: lambda h, e: h.on_announce(e.channel, e.barrier),
    TriggerCheckpoint: lambda h, e: h.on_trigger(e.checkpoint_id),
    AbortCheckpoint: lambda h, e: h.on_abort(e.checkpoint_id),
    ChannelClosed: lambda h, e: h.on_close(e.channel),
    AlignmentTimeout: lambda h, e: h.on_timeout(e.checkpoint_id),
}
