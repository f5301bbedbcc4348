"""The consistent-cut checker, in Dijkstra's formulation of the snapshot (EWD 864a).

Given a run's trace and a recorded snapshot, colour every application event: *white* if it
happened before its process recorded its state, *red* after.  A message takes the colour
of its send event.  The recorded global state is a consistent cut exactly when

1. no red message is received by a white event (nothing is recorded as received whose
   send is not recorded), and
2. the recorded state of each channel is, in order, the white messages sent on it that
   were not received by a white event (sent before the sender's cut, received after the
   receiver's cut, or not yet at all).  A message received but never sent in the trace
   was re-delivered from a restored channel state: sent before the run, it precedes on its
   channel every message sent in the run.

The checker knows nothing of markers or barriers: it judges the snapshot by the
happened-before relation alone, so it can judge any protocol, and any driver's trace.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from .trace import Snapshot, TraceEvent

__all__ = ["CutReport", "check_cut"]


@dataclass
class CutReport:
    snapshot_id: int
    #: messages received inside the cut but sent outside it: (message id, channel)
    orphans: list[tuple[int, str]] = field(default_factory=list)
    #: channel -> (expected message ids, recorded message ids), where they differ
    channel_errors: dict[str, tuple[list[int], list[int]]] = field(default_factory=dict)
    #: processes without a recorded state
    missing: list[str] = field(default_factory=list)

    @property
    def consistent(self) -> bool:
        """Condition 1 alone: the cut itself is consistent."""
        return not self.orphans and not self.missing

    @property
    def ok(self) -> bool:
        """Consistent cut *and* exactly the in-transit messages recorded."""
        return self.consistent and not self.channel_errors

    def explain(self) -> str:
        if self.ok:
            return f"snapshot {self.snapshot_id}: consistent cut, channel states exact"
        lines = [f"snapshot {self.snapshot_id}: NOT a consistent snapshot"]
        for p in self.missing:
            lines.append(f"  process {p} recorded no state")
        for mid, ch in self.orphans:
            lines.append(f"  message #{mid} on {ch} is received inside the cut but sent outside it")
        for ch, (exp, got) in self.channel_errors.items():
            lines.append(f"  channel {ch}: recorded {got}, in transit across the cut {exp}")
        return "\n".join(lines)


def _message_event(e: TraceEvent) -> tuple[int, str, int]:
    """(message id, channel, event index) of a send or receive event."""
    if e.message is None or e.channel is None or e.index is None:
        raise ValueError(f"{e.kind} event of {e.process} at t={e.time} lacks its message, "
                         f"channel or index: {e}")
    return e.message, e.channel, e.index


def check_cut(
    trace: Sequence[TraceEvent],
    snapshot: Snapshot,
    processes: Iterable[str] | None = None,
    channels: Iterable[str] | None = None,
) -> CutReport:
    report = CutReport(snapshot.id)
    names = list(processes) if processes is not None else sorted({e.process for e in trace})
    report.missing = [p for p in names if p not in snapshot.cut]
    cut = snapshot.cut

    def white(process: str, index: int) -> bool:
        return index < cut.get(process, 0)

    # Two passes, so nothing depends on how the trace interleaves processes (a merged trace
    # is ordered by clocks): first every send, then every receive.
    sent: dict[int, tuple[bool, str]] = {}  # message id -> (white?, channel)
    order: dict[str, list[tuple[int, int]]] = {}  # channel -> (send index, message id)
    for e in trace:
        if e.kind == "send":
            msg, ch, index = _message_event(e)
            sent[msg] = (white(e.process, index), ch)
            order.setdefault(ch, []).append((index, msg))
    # A message received but never sent in the trace was re-delivered from a restored
    # channel state: it was sent before the run, so on its FIFO channel it comes before
    # every message sent in the run, whenever the trace shows it received.
    before: dict[str, list[tuple[int, int]]] = {}  # channel -> (receive index, message id)
    received_white: set[int] = set()
    for e in trace:
        if e.kind == "recv":
            msg, ch, index = _message_event(e)
            if white(e.process, index):
                received_white.add(msg)
                if msg in sent and not sent[msg][0]:
                    report.orphans.append((msg, ch))
            elif msg not in sent:
                before.setdefault(ch, []).append((index, msg))
    in_order = {ch: [m for _, m in sorted(before.get(ch, []))]
                + [m for _, m in sorted(order.get(ch, [])) if sent[m][0]]
                for ch in set(order) | set(before)}
    names_ch = set(channels) if channels is not None else set(in_order) | set(snapshot.channels)
    for ch in sorted(names_ch):
        expected = [m for m in in_order.get(ch, []) if m not in received_white]
        recorded = [m.id for m in snapshot.channels.get(ch, [])]
        if expected != recorded:
            report.channel_errors[ch] = (expected, recorded)
    return report
