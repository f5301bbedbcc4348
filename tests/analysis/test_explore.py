"""The exhaustive explorer: every interleaving of small systems (runs in CI)."""

import pytest

from cutline.analysis.explore import explore
from cutline.protocol import handler as handler_mod

SMALL = [
    dict(processes=2, messages=2, snapshots=2),
    dict(processes=3, messages=1, snapshots=1),
    dict(processes=3, messages=1, snapshots=1, initiators=2),
    dict(processes=3, messages=1, snapshots=2, topology="ring"),
    dict(processes=3, messages=2, snapshots=1, topology="ring"),
    dict(processes=3, messages=2, snapshots=2, mode="aligned", topology="dag"),
    dict(processes=3, messages=2, snapshots=2, mode="unaligned", topology="dag"),
    dict(processes=3, messages=1, snapshots=2, mode="unaligned", topology="dag"),
    # as the runtime's input gate: overtaken records copied and left queued (two snapshots
    # open at a task recorded them twice until the handler recorded a copy for one)
    dict(processes=3, messages=1, snapshots=2, mode="unaligned", topology="dag",
         overtake="copy"),
]


@pytest.mark.parametrize("config", SMALL, ids=lambda c: "-".join(map(str, c.values())))
def test_every_interleaving_gives_a_consistent_snapshot(config):
    r = explore(**config)
    assert r.ok, r.summary()
    assert r.interleavings > r.states > 10


def test_at_least_once_is_caught_with_a_counterexample():
    r = explore(processes=3, messages=1, snapshots=1, mode="at_least_once", topology="dag")
    assert not r.ok
    assert 0 < r.violating < r.interleavings
    assert any("received inside the cut but sent outside it" in p for p in r.problems)
    assert r.counterexample[0].startswith("P1 ")


def test_a_broken_protocol_that_forgets_channel_state_is_caught(monkeypatch):
    # Mutation: Chandy-Lamport that never records in-flight messages.
    real = handler_mod.SnapshotHandler.on_records

    def forgetful(self, channel, records):
        return [a for a in real(self, channel, records)
                if type(a).__name__ != "RecordChannelState"]

    monkeypatch.setattr(handler_mod.SnapshotHandler, "on_records", forgetful)
    r = explore(processes=3, messages=1, snapshots=1)
    assert not r.ok
    assert any("recorded []" in p for p in r.problems)


def test_aligned_needs_a_source():
    with pytest.raises(ValueError, match="needs a source"):
        explore(processes=3, mode="aligned", topology="ring")


# (processes=3, messages=1, snapshots=2 on the complete graph, ~2.3e12 interleavings, takes
# ~80 s: too long for the suite; `cutline explore --processes 3 --messages 1 --snapshots 2`)
LARGER = [
    dict(processes=3, messages=1, snapshots=2, initiators=2, topology="ring"),
    dict(processes=4, messages=2, snapshots=2, mode="aligned", topology="dag"),
    dict(processes=4, messages=1, snapshots=2, mode="unaligned", topology="dag"),
]


@pytest.mark.slow
@pytest.mark.parametrize("config", LARGER, ids=lambda c: "-".join(map(str, c.values())))
def test_larger_exhaustive_configurations(config):
    r = explore(**config)
    assert r.ok, r.summary()
    assert r.interleavings > 10**8
