"""Per-mode policies of the snapshot handler, one small class per alignment behaviour.

As in Flink's ``streaming/runtime/io/checkpointing`` (``WaitingForFirstBarrier``,
``CollectingBarriers``, ``CollectingBarriersUnaligned``, the barrier tracker), each mode is a
small class; the mechanisms they share (recordings of channel state, blocked channels, late
barrier bookkeeping) live on :class:`~cutline.protocol.handler.SnapshotHandler`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .events import (
    Action,
    Barrier,
    Batch,
    Channel,
    DeclineSnapshot,
    Mode,
    PrioritizeBarrier,
    ProtocolError,
    ScheduleTimeout,
)

if TYPE_CHECKING:
    from .handler import SnapshotHandler


class _Policy:
    def __init__(self, h: SnapshotHandler) -> None:
        self.h = h

    def copy(self, h: SnapshotHandler) -> _Policy:
        """An independent copy serving handler ``h`` (the explorers copy a state per step).

        A policy's state is ids and dicts of channels (one level of nesting at most)."""
        c = object.__new__(type(self))
        for name, v in vars(self).items():
            if isinstance(v, dict):
                v = {k: dict(x) if isinstance(x, dict) else x for k, x in v.items()}
            setattr(c, name, v)
        c.h = h
        return c

    def idle(self) -> bool:
        return True

    def key(self) -> tuple:
        return ()

    def oldest_open(self, default: int) -> int:
        return default

    def barrier(self, channel: Channel, barrier: Barrier, overtaken: Batch) -> list[Action]:
        raise NotImplementedError

    def trigger(self, n: int) -> list[Action]:
        return self.h._trigger_at_edge(n)

    def announce(self, channel: Channel, barrier: Barrier) -> list[Action]:
        return []

    def abort(self, n: int) -> list[Action]:
        return []

    def closed(self, channel: Channel) -> list[Action]:
        return []

    def timeout(self, n: int) -> list[Action]:
        return []


class _Recording(_Policy):
    """Chandy-Lamport and unaligned: snapshot on the first barrier, record the other inputs.

    Any number of snapshots may be open at once (several initiators, concurrent ids).
    """

    def barrier(self, channel: Channel, barrier: Barrier, overtaken: Batch) -> list[Action]:
        h, n = self.h, barrier.checkpoint_id
        if h._seen_before(n):
            return h._late(channel, overtaken)
        unaligned = h.mode is Mode.UNALIGNED
        actions = h._take_snapshot(n, unaligned, h._open)
        actions += h._overtaken(n, channel, overtaken)
        actions += h._channel_done(n, channel)
        return actions

    def announce(self, channel: Channel, barrier: Barrier) -> list[Action]:
        # Unaligned: a barrier is a priority event, it overtakes the queue at once.
        if self.h.mode is Mode.UNALIGNED and not self.h._seen_before(barrier.checkpoint_id):
            return [PrioritizeBarrier(channel, barrier.checkpoint_id)]
        return []

    def trigger(self, n: int) -> list[Action]:
        h = self.h
        if h._seen_before(n) or n in h._recordings:
            return []  # another initiator's marker got here first
        return h._take_snapshot(n, h.mode is Mode.UNALIGNED, h._open)


class _Aligned(_Policy):
    """Exactly-once alignment; with ``aligned_timeout``, a checkpoint that aligns too long
    switches to unaligned (Flink's alternating handler)."""

    def __init__(self, h: SnapshotHandler) -> None:
        super().__init__(h)
        self.aligning: int | None = None
        self.received: dict[Channel, None] = {}
        # checkpoint -> channels where its barrier is queued, not yet taken (timeout only)
        self.announced: dict[int, dict[Channel, None]] = {}

    def idle(self) -> bool:
        return self.aligning is None

    def key(self) -> tuple:
        return (self.aligning, tuple(sorted(self.received, key=repr)),
                tuple(sorted((n, tuple(sorted(c, key=repr))) for n, c in self.announced.items())))

    def announce(self, channel: Channel, barrier: Barrier) -> list[Action]:
        h, n = self.h, barrier.checkpoint_id
        if h.aligned_timeout is None or channel in h._back or barrier.unaligned:
            return []
        if h._seen_before(n) and self.aligning != n:
            return []
        if self.aligning is not None and n < self.aligning:
            return []
        first = n not in self.announced and self.aligning != n
        self.announced.setdefault(n, {})[channel] = None
        return [ScheduleTimeout(n, h.aligned_timeout)] if first else []

    def oldest_open(self, default: int) -> int:
        return default if self.aligning is None else min(default, self.aligning)

    def barrier(self, channel: Channel, barrier: Barrier, overtaken: Batch) -> list[Action]:
        h, n = self.h, barrier.checkpoint_id
        if channel in h._back and h._seen_before(n) and self.aligning != n:
            return h._late(channel, overtaken)
        # A barrier on a back edge before this task's snapshot: another head of the same
        # loop (parallel heads, keyed feedback) went first.  The channel takes part in the
        # alignment like a forward input: held back until the snapshot, and not recorded
        # (what follows its barrier is after the cut).
        if self.aligning is not None and n < self.aligning:
            return h._late(channel, overtaken)
        actions: list[Action] = []
        if self.aligning is not None and n > self.aligning:
            old = self.aligning
            actions += self._cancel()
            actions.append(DeclineSnapshot(old, f"subsumed by checkpoint {n}"))
        if self.aligning is None:
            if h._seen_before(n):
                return actions + h._late(channel, overtaken)
            self.aligning, self.received = n, {}
            h._mark_seen(n)
            announced = n in self.announced
            if h.aligned_timeout is not None and not barrier.unaligned and not announced:
                actions.append(ScheduleTimeout(n, h.aligned_timeout))
        self.announced.get(n, {}).pop(channel, None)
        if barrier.unaligned:
            if h.aligned_timeout is None:
                raise ProtocolError(
                    f"unaligned barrier {n} reached an aligned task without aligned_timeout"
                )
            # Upstream already gave up aligning: so do we, at once.
            actions += self._switch()
            actions += h._overtaken(n, channel, overtaken)
            actions += h._channel_done(n, channel)
            return actions
        self.received[channel] = None
        if all(c in self.received for c in h._forward_inputs()):
            return actions + self._complete()
        return actions + h._block(channel)

    def _forget_announced(self, n: int) -> dict[Channel, None]:
        for m in [m for m in self.announced if m <= n]:
            got = self.announced.pop(m)
            if m == n:
                return got
        return {}

    def _aligning_id(self) -> int:
        if self.aligning is None:
            raise ProtocolError("no alignment in progress")
        return self.aligning

    def _complete(self) -> list[Action]:
        h, n = self.h, self._aligning_id()
        self._forget_announced(n)
        back = [c for c in h._back if c not in self.received]  # no barrier yet: record
        self.aligning, self.received = None, {}
        actions = h._take_snapshot(n, False, back)
        return actions + h._unblock_all()

    def _switch(self) -> list[Action]:
        h, n = self.h, self._aligning_id()
        pending = [c for c in h._open if c not in self.received]
        queued = self._forget_announced(n)
        self.aligning, self.received = None, {}
        actions = h._take_snapshot(n, True, pending)
        actions += h._unblock_all()
        # barriers still stuck in queues: have the driver pull them forward now
        actions += [PrioritizeBarrier(c, n) for c in queued if c in h._open and c in pending]
        return actions

    def _cancel(self) -> list[Action]:
        self.aligning, self.received = None, {}
        return self.h._unblock_all()

    def abort(self, n: int) -> list[Action]:
        self._forget_announced(n)
        return self._cancel() if self.aligning == n else []

    def closed(self, channel: Channel) -> list[Action]:
        if self.aligning is not None and all(
            c in self.received for c in self.h._forward_inputs()
        ):
            return self._complete()
        return []

    def timeout(self, n: int) -> list[Action]:
        if self.aligning == n:
            return self._switch()
        if self.aligning is None and n in self.announced and not self.h._seen_before(n):
            # every barrier of n is still queued: snapshot now, pull them all forward
            self.aligning, self.received = n, {}
            self.h._mark_seen(n)
            return self._switch()
        return []


class _AtLeastOnce(_Policy):
    """Flink's barrier tracker: no blocking; snapshot when every input delivered the barrier.

    Records that arrive after a channel's barrier and before the snapshot are in the
    snapshot *and* replayed after a restore: duplicates, never loss.
    """

    def __init__(self, h: SnapshotHandler) -> None:
        super().__init__(h)
        self.pending: dict[int, dict[Channel, None]] = {}

    def idle(self) -> bool:
        return not self.pending

    def key(self) -> tuple:
        return tuple(sorted((n, tuple(sorted(c, key=repr))) for n, c in self.pending.items()))

    def oldest_open(self, default: int) -> int:
        return min(self.pending, default=default)

    def barrier(self, channel: Channel, barrier: Barrier, overtaken: Batch) -> list[Action]:
        h, n = self.h, barrier.checkpoint_id
        if barrier.unaligned:
            raise ProtocolError(f"unaligned barrier {n} reached an at-least-once task")
        if channel in h._back:
            if h._seen_before(n):
                return []
            raise ProtocolError(
                f"barrier {n} on back edge {channel!r} before this task took checkpoint {n}"
            )
        if n not in self.pending:
            if h._seen_before(n):
                return []
            h._mark_seen(n)
            self.pending[n] = {}
        if channel in self.pending[n]:
            raise ProtocolError(f"second barrier of checkpoint {n} on channel {channel!r}")
        self.pending[n][channel] = None
        return self._complete_ready()

    def _complete_ready(self) -> list[Action]:
        h = self.h
        forward = h._forward_inputs()
        actions: list[Action] = []
        for n in sorted(self.pending):
            got = self.pending[n]
            if all(c in got for c in forward):
                # Older incomplete checkpoints can never complete before this one.
                for old in [m for m in self.pending if m < n]:
                    del self.pending[old]
                    actions.append(DeclineSnapshot(old, f"subsumed by checkpoint {n}"))
                del self.pending[n]
                actions += h._take_snapshot(n, False, h._back)
        return actions

    def abort(self, n: int) -> list[Action]:
        self.pending.pop(n, None)
        return []

    def closed(self, channel: Channel) -> list[Action]:
        return self._complete_ready()


POLICIES = {
    Mode.CHANDY_LAMPORT: _Recording,
    Mode.UNALIGNED: _Recording,
    Mode.ALIGNED: _Aligned,
    Mode.AT_LEAST_ONCE: _AtLeastOnce,
}
