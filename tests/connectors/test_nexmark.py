"""The Nexmark generator: deterministic, the reference's mix and distributions, the same
events as records, Arrow batches and files, exact positions as a source."""

import collections
import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from cutline.cli import main
from cutline.connectors.nexmark import (
    AUCTION, BID, PERSON, Nexmark, NexmarkConfig, NexmarkSource, event_time, schema,
    write_events,
)

N = 5_000


@pytest.fixture(scope="module")
def events():
    return Nexmark().records(np.arange(N))


def test_event_mix_ids_and_times_follow_the_reference(events):
    kinds = [e["event_type"] for e in events]
    assert kinds[:50] == [PERSON] + [AUCTION] * 3 + [BID] * 46  # 1 : 3 : 46 per 50
    assert collections.Counter(kinds) == {PERSON: N // 50, AUCTION: 3 * N // 50,
                                          BID: 46 * N // 50}
    persons = [e["person"] for e in events if e["person"]]
    auctions = [e["auction"] for e in events if e["auction"]]
    bids = [e["bid"] for e in events if e["bid"]]
    assert [p["id"] for p in persons] == list(range(1000, 1000 + len(persons)))
    assert [a["id"] for a in auctions] == list(range(1000, 1000 + len(auctions)))
    assert {a["category"] for a in auctions} == set(range(10, 15))
    # event i at base + i * 100 us (10,000 events/s), whole milliseconds, in order
    assert [event_time(e) for e in events[:25]] == [1_436_918_400 + (i // 10) / 1000
                                                    for i in range(25)]
    # hot auctions: about half the bids go to the first of the last 100 auctions
    hot = sum(b["auction"] % 100 == 0 for b in bids) / len(bids)
    assert 0.45 < hot < 0.6
    hot_bidders = sum(b["bidder"] % 100 == 1 for b in bids) / len(bids)
    assert 0.7 < hot_bidders < 0.8
    assert all(b["auction"] <= 1000 + len(auctions) + 10 for b in bids)
    assert 95 < np.mean([len(b["extra"]) + 32 for b in bids]) < 105
    assert all(100 <= b["price"] <= 100_000_000 for b in bids)
    assert all(a["dateTime"] < a["expires"] for a in auctions)
    assert all(a["reserve"] >= a["initialBid"] for a in auctions)


def test_every_event_is_computed_alone_and_the_same_in_every_form(events, tmp_path):
    g = Nexmark()
    assert [g.event(i) for i in (0, 1, 7, 4_999)] == [events[i] for i in (0, 1, 7, 4_999)]
    assert g.records(np.arange(1_000, 3_000, 3)) == events[1_000:3_000:3]
    assert g.batch(np.arange(N)).to_pylist() == events
    assert Nexmark(NexmarkConfig(seed=1)).event(10) != events[10]
    write_events(str(tmp_path / "p"), N, format="parquet", files=2, chunk=1_000)
    rows = [r for f in sorted((tmp_path / "p").iterdir()) for r in pq.read_table(f).to_pylist()]
    assert rows == events
    assert main(["nexmark", "generate", "--events", str(N), "--files", "3",
                 str(tmp_path / "j")]) == 0
    lines = [json.loads(line) for f in sorted((tmp_path / "j").iterdir())
             for line in f.read_text().splitlines()]
    assert lines == events
    assert pq.read_table(sorted((tmp_path / "p").iterdir())[0]).schema == schema()


def test_out_of_order_events_stay_within_the_bound():
    cfg = NexmarkConfig(out_of_order=64, events_per_second=1_000)
    shuffled = Nexmark(cfg).records(np.arange(2_048))
    times = [event_time(e) for e in shuffled]
    lag = max(max(times[:i + 1]) - t for i, t in enumerate(times))
    assert 0 < lag <= cfg.max_delay
    ordered = Nexmark(NexmarkConfig(events_per_second=1_000)).records(np.arange(2_048))
    assert sorted(map(repr, shuffled)) == sorted(map(repr, ordered))  # a permutation


def test_source_positions_are_exact_across_restore_and_rescale():
    src = NexmarkSource(count=1_000)
    readers = [src.create_reader() for _ in range(2)]
    got = []
    for s, r in enumerate(readers):
        r.open(s, 2)
        got += r.read_batch(150)
    states = [r.snapshot() for r in readers]
    rescaled = [src.create_reader() for _ in range(3)]
    for s, r in enumerate(rescaled):
        r.open(s, 3)
        r.rescale(states)
        while (batch := r.read_batch(100)) is not None:
            got += batch
    assert sorted(map(repr, got)) == sorted(map(repr, Nexmark().records(np.arange(1_000))))
    cols = NexmarkSource(count=10, batches=True).create_reader()
    cols.open(0, 1)
    assert cols.read_batch(10)[0].to_pylist() == Nexmark().records(np.arange(10))


def test_bad_configuration_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="out_of_order"):
        NexmarkConfig(out_of_order=0)
    with pytest.raises(ValueError, match="events_per_second"):
        NexmarkConfig(events_per_second=0)
