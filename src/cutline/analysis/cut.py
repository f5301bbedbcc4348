"""The consistent-cut checker, in Dijkstra's formulation of the snapshot (EWD 864a).

Given a run's trace and a recorded snapshot, colour every application event: *white* if it
happened before its process recorded its state, *red* after.  A message takes the colour
of its send event.  The recorded global state is a consistent cut exactly when

1. no red message is received by a white event (nothing is recorded as received whose
   send is not recorded), and
2. the recorded state of each channel is, in order, the white messages sent on it that
   were not received by a white event (sent before the sender's cut, received after the
   receiver's cut, or not yet at all).

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

    sent: dict[int, tuple[bool, str]] = {}  # message id -> (white?, channel)
    order: dict[str, list[int]] = {}  # channel -> message ids in send order
    received_white: set[int] = set()
    for e in trace:
        if e.kind == "send":
            msg, ch, index = _message_event(e)
            sent[msg] = (white(e.process, index), ch)
            order.setdefault(ch, []).append(msg)
        elif e.kind == "recv":
            msg, ch, index = _message_event(e)
            if white(e.process, index):
                received_white.add(msg)
                if msg in sent and not sent[msg][0]:
                    report.orphans.append((msg, ch))
            elif msg not in sent:
                # delivered from a restored channel state: sent before this run began
                order.setdefault(ch, []).append(msg)
                sent[msg] = (True, ch)
    # Messages re-injected from a restored channel state and received inside the cut
    # have no send event here either: they were sent before the run.
    names_ch = set(channels) if channels is not None else set(order) | set(snapshot.channels)
    for ch in sorted(names_ch):
        expected = [
            m for m in order.get(ch, [])
            if sent[m][0] and m not in received_white
        ]
        recorded = [m.id for m in snapshot.channels.get(ch, [])]
        if expected != recorded:
            report.channel_errors[ch] = (expected, recorded)
    return report
