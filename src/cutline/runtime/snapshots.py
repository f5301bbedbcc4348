"""A subtask's part of checkpoints: assembled, written, acknowledged, committed, restored.

At ``TakeSnapshot`` the keyed operators' state, the source position and the sink's (and
dead-letter writer's) pre-committed transaction are captured; in-flight records recorded
by the protocol join it (input channel state, and for unaligned barriers the output
buffers the barrier overtook).  At ``FinishSnapshot`` it becomes a
:class:`~cutline.storage.schema.TaskState`, is written to checkpoint storage (after a
state backend's files upload, on the subtask's upload thread) and acknowledged to the
coordinator; a storage failure declines that checkpoint only.  Pre-committed transactions
wait in :attr:`Snapshots.uncommitted` until their checkpoint completes (two-phase commit).
:meth:`Snapshots.restore` gives a subtask back what a checkpoint holds for it.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..plan import Chain
from ..protocol import messages as m
from ..storage.schema import ChannelId, TaskState, encode_task_state
from .background import SnapshotUploads
from .faults import FaultPlan
from .restore import RestoreView

__all__ = ["PendingSnapshot", "Snapshots"]


@dataclass(slots=True)
class PendingSnapshot:
    """A snapshot taken, not yet written: what the protocol still adds to it."""

    started: float
    alignment: float  # seconds the task held channels blocked for it
    forward_closed: bool  # an iteration head whose outside inputs all ended
    ops: dict[str, Any]  # keyed operator uid -> bytes, or a backend's deferred snapshot
    source: Any = None
    sink: tuple[Any, ...] = ()
    dead_letter: tuple[Any, ...] = ()
    channels: dict[str, list[bytes]] = field(default_factory=dict)
    out_channels: dict[str, list[bytes]] = field(default_factory=dict)
    in_flight: int = 0  # records in channels + out_channels
    in_flight_bytes: int = 0  # their pickled size
    sync: float = 0.0  # seconds on the task's thread: state captured, barrier sent on
    watermarks: dict[str, Any] | None = None  # event-time state (EventTime.snapshot)


class Snapshots:
    """The checkpoints of one subtask in progress, and its transactions not yet committed.

    ``send`` delivers a message to the coordinator; ``faults`` (set by the slot, only when
    faults are planned) kills the process at the ``snapshot_write``, ``alignment``,
    ``before_commit`` and ``after_commit`` points."""

    def __init__(self, task_id: str, chain: Chain, index: int, ops: list, reader: Any,
                 writer: Any, dead_letters: Any, storage: Any,
                 channel_ids: dict[str, ChannelId], send: Callable[[m.Message], None]) -> None:
        self.task_id, self.chain, self.index = task_id, chain, index
        self.keyed = [op for op in ops if op.keyed]
        self.reader, self.writer, self.dead_letters = reader, writer, dead_letters
        self.storage, self.channel_ids, self.send = storage, channel_ids, send
        self.source_uid = chain.head.uid if reader is not None else None
        self.sink_uid = chain.nodes[-1].uid if writer is not None else None
        self.pending: dict[int, PendingSnapshot] = {}
        self.uncommitted: dict[int, dict] = {}  # checkpoint -> the sink's pre-commit handle
        # a reader that hears of completed checkpoints (notify_checkpoint_complete: Kafka
        # commits the offsets to its group): its position in each pending checkpoint
        self.notify = getattr(reader, "notify_checkpoint_complete", None)
        self.source_pending: dict[int, Any] = {}
        self.alignment_started: dict[str, float] = {}  # blocked channel -> since when
        self.uploads: SnapshotUploads | None = None  # asynchronous parts of snapshots
        self.faults: FaultPlan | None = None
        self.event_time: Any = None  # the task's EventTime, when the pipeline is timed

    # ------------------------------------------------------------------ taking

    def channel_blocked(self, channel: str, aligning: int | None) -> None:
        """The protocol blocked ``channel`` while aligning checkpoint ``aligning``."""
        if self.faults is not None and aligning is not None:
            self.faults.alignment(aligning)
        self.alignment_started.setdefault(channel, time.monotonic())

    def take(self, n: int, forward_closed: bool) -> None:
        now = time.monotonic()
        started = self.alignment_started
        snap = PendingSnapshot(now, now - min(started.values()) if started else 0.0,
                               forward_closed, {op.uid: op.snapshot() for op in self.keyed})
        started.clear()
        if self.reader is not None:
            snap.source = self.reader.snapshot()
            if self.notify is not None:
                self.source_pending[n] = snap.source
        if self.writer is not None:
            self.uncommitted[n] = self.writer.pre_commit(n)
            snap.sink = tuple(self.uncommitted[k] for k in sorted(self.uncommitted))
        if self.dead_letters is not None:
            snap.dead_letter = tuple(self.dead_letters.pre_commit(n))
        if self.event_time is not None:
            snap.watermarks = self.event_time.snapshot()
        self.pending[n] = snap

    def record_channel(self, n: int, channel: str, records: Any) -> None:
        """In-flight records of input ``channel`` that belong to snapshot ``n``."""
        snap = self.pending[n]
        # bytes now: a later in-place change of a record must not alter the snapshot
        data = pickle.dumps(records, protocol=5)
        snap.channels.setdefault(channel, []).append(data)
        snap.in_flight += len(records)
        snap.in_flight_bytes += len(data)

    def record_output(self, n: int, buffers: dict[str, list]) -> None:
        """An unaligned barrier of ``n`` leaves ahead of ``buffers``: their records are
        output channel state of snapshot ``n`` (re-sent first on restore)."""
        snap = self.pending.get(n)
        if snap is not None:
            snap.out_channels = {ch: [pickle.dumps(buf, protocol=5)]
                                 for ch, buf in buffers.items() if buf}
            snap.in_flight += sum(len(b) for b in buffers.values())
            snap.in_flight_bytes += sum(len(b[0]) for b in snap.out_channels.values())

    def drop(self, n: int) -> None:
        """Snapshot ``n`` was aborted or declined."""
        self.pending.pop(n, None)
        self.source_pending.pop(n, None)

    # ------------------------------------------------------------------ writing

    def finish(self, n: int) -> None:
        snap = self.pending.pop(n, None)
        if snap is None:
            return
        snap.sync = time.monotonic() - snap.started  # the rest is the write: asynchronous
        if any(not isinstance(b, bytes) for b in snap.ops.values()):
            # A state backend's files (RocksDB) upload on this subtask's upload thread while
            # records keep flowing; the ack leaves once they are up.
            if self.uploads is None:
                self.uploads = SnapshotUploads(self.task_id)
            self.uploads.submit(lambda: self._write(n, snap))
        else:
            self._write(n, snap)

    def _write(self, n: int, snap: PendingSnapshot) -> None:
        deferred = {uid: b for uid, b in snap.ops.items() if not isinstance(b, bytes)}
        try:
            ops = {uid: deferred[uid].finish(self.storage, n) if uid in deferred else b
                   for uid, b in snap.ops.items()}
        except Exception as exc:  # noqa: BLE001 - storage failure declines this checkpoint only
            self.send(m.Decline(self.task_id, n, f"uploading state failed: {exc}"))
            return
        ids = self.channel_ids
        data = encode_task_state(TaskState(
            task=self.task_id, chain=self.chain.uid, index=self.index,
            parallelism=self.chain.parallelism, ops=ops, source_uid=self.source_uid,
            source=snap.source, sink_uid=self.sink_uid, sink=snap.sink,
            dead_letter=snap.dead_letter,
            channels={ids[ch]: tuple(b) for ch, b in snap.channels.items()},
            out_channels={ids[ch]: tuple(b) for ch, b in snap.out_channels.items()},
            watermarks=snap.watermarks))
        try:
            info = self.storage.write_task_state(n, self.task_id, data)
        except Exception as exc:  # noqa: BLE001 - storage failure declines this checkpoint only
            self.send(m.Decline(self.task_id, n, f"writing state failed: {exc}"))
            return
        if self.faults is not None:
            self.faults.snapshot_written(n)
        stats = m.SnapshotStats(
            path=info.get("path"), size=info.get("size"), sha256=info.get("sha256"),
            bytes=len(data) + sum(d.uploaded for d in deferred.values()),
            in_flight=snap.in_flight, alignment=snap.alignment,
            duration=time.monotonic() - snap.started, chain=self.chain.uid,
            sync=snap.sync, in_flight_bytes=snap.in_flight_bytes,
            forward_closed=snap.forward_closed,
            # shared files the state references: listed in _metadata
            shared={rel: ref for d in deferred.values() for rel, ref in d.shared.items()}
            if deferred else None)
        self.send(m.Ack(self.task_id, n, stats))

    # ------------------------------------------------------------------ committing

    def commit_upto(self, n: int) -> None:
        """Checkpoint ``n`` completed: commit the transactions pre-committed up to it."""
        faults = self.faults
        if faults is not None and self.writer is not None:
            faults.before_commit(n)
        done = sorted(k for k in self.uncommitted if k <= n)
        if done and self.writer is not None:
            self.writer.commit([self.uncommitted[k] for k in done])
        for k in done:
            del self.uncommitted[k]
        if self.dead_letters is not None:
            self.dead_letters.commit_upto(n)
        if self.notify is not None:
            mine = sorted(k for k in self.source_pending if k <= n)
            if mine:
                state = self.source_pending[mine[-1]]
                for k in mine:
                    del self.source_pending[k]
                self.notify(n, state)
        if faults is not None and self.writer is not None:
            faults.after_commit(n)

    # ------------------------------------------------------------------ restoring

    def restore(self, view: RestoreView | None, gate: Any, inputs: list[str]) -> None:
        """Give the opened source, sink, dead letters, keyed operators and input ``gate``
        (channels ``inputs``) what ``view`` (a checkpoint) holds for this subtask: matched
        by operator uid, rescaled when the parallelism changed."""
        chain, index = self.chain, self.index
        if self.dead_letters is not None:
            self.dead_letters.open([] if view is None
                                   else view.dead_letter_handles(chain, index))
        if view is None:
            if self.writer is not None:
                self.writer.recover([])  # drop staging left by an earlier run of the job
            return
        for op in self.keyed:
            op.restore(view.keyed_blobs(chain, index, op.uid))
        own = view.own(chain, index)
        if self.reader is not None:
            if own is not None and own.source is not None:
                self.reader.restore(own.source)
            elif view.source_states(chain.head.uid):
                rescale = getattr(self.reader, "rescale", None)
                if rescale is None:
                    raise RuntimeError(
                        f"source {chain.head.uid!r} cannot be rescaled (its reader has no "
                        f"rescale()): restore it at its old parallelism "
                        f"{view.old_parallelism.get(chain.uid)}")
                rescale(view.source_states(chain.head.uid))
        if self.writer is not None:
            self.writer.recover(view.sink_handles(chain, index, chain.nodes[-1].uid))
        ids = [self.channel_ids[ch] for ch in inputs]
        if self.event_time is not None:
            changed = view.inputs_changed(chain)
            self.event_time.restore(
                own.watermarks if own is not None else None,
                [] if own is not None else view.watermark_states(chain),
                view.input_floors(chain, ids) if changed and inputs else None)
        if gate is None:
            return
        # inject() puts a batch at the front of its channel: one batch per channel.
        for ch, records in view.channel_records(chain, index, ids):
            gate.inject(str(ch), records)

    def close(self) -> None:
        if self.uploads is not None:
            self.uploads.close()
