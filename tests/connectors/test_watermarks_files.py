"""A watermark per file of a ``FileSource``: every unfinished file holds the watermark
back (one not begun too), a finished file stops holding it; the files are read aligned
(each batch from the file furthest behind); checkpointed and restored with the
positions."""

from __future__ import annotations

import collections
import json

import pytest

from cutline import CheckpointConfig, Pipeline, tumbling
from cutline.connectors import CollectSink, FileSource
from cutline.logical import make_node, TimestampSpec
from cutline.protocol.watermarks import BoundedOutOfOrderness
from cutline.runtime.operators import AssignTimestamps

PER_FILE = 3000


def write_files(directory) -> None:
    """``a.jsonl``: times 0..2999; ``b.jsonl``: the same span of keys, three records a
    second (0..999): read a batch from each in turn, b falls behind a."""
    directory.mkdir()
    for name, div in (("a", 1), ("b", 3)):
        with open(directory / f"{name}.jsonl", "w") as f:
            for i in range(PER_FILE):
                f.write(json.dumps({"k": f"{name}{i % 3}", "t": i // div}) + "\n")


def t_of(e: dict) -> int:
    return e["t"]


def _reader_and_stamps(directory):
    reader = FileSource(str(directory), files_at_once=2).create_reader()
    reader.open(0, 1)
    stamps = AssignTimestamps(make_node(0, "stamps", "assign_timestamps",
                                   TimestampSpec(t_of, BoundedOutOfOrderness(0), None)))
    stamps.read_splits_of(reader)
    return reader, stamps


def _read(reader, stamps, batches: int | None = None) -> list:
    """[(file, records, watermark emitted after the batch or None)] per batch."""
    out = []
    while batches is None or len(out) < batches:
        batch = reader.read_batch(1000)
        if batch is None:
            return out
        stamps.process(batch)
        out.append((reader.split_key(), len(batch), stamps.take_watermark()))
    return out


def test_a_file_behind_holds_the_watermark_and_a_finished_one_stops(tmp_path):
    write_files(tmp_path / "in")
    reader, stamps = _reader_and_stamps(tmp_path / "in")
    got = _read(reader, stamps)
    # aligned: a record of each file first (b, not begun, holds the watermark back until
    # then); then b, behind a, is read until it is past a (1000); then a alone drives it
    assert [(f, n) for f, n, _ in got] == [("a.jsonl", 1), ("b.jsonl", 1), ("a.jsonl", 1000)] \
        + [("b.jsonl", 1000)] * 2 + [("b.jsonl", 999), ("a.jsonl", 1000), ("a.jsonl", 999)]
    assert [wm for _, _, wm in got] == [None, 0, None, 333, 666, 1000, 2000, 2999]
    assert reader.split_keys() == []


def test_per_file_watermarks_are_checkpointed_with_the_positions(tmp_path):
    write_files(tmp_path / "in")
    reader, stamps = _reader_and_stamps(tmp_path / "in")
    whole = _read(reader, stamps)
    for cut in (1, 2, 3):
        reader, stamps = _reader_and_stamps(tmp_path / "in")
        first = _read(reader, stamps, cut)
        position, times = reader.snapshot(), stamps.time_snapshot()
        assert set(times["splits"]) == {f for f, _, _ in first}
        reader, stamps = _reader_and_stamps(tmp_path / "in")
        reader.restore(json.loads(json.dumps(position)))
        stamps.time_restore([json.loads(json.dumps(times))], exact=True)
        assert first + _read(reader, stamps) == whole, cut


@pytest.mark.parametrize("at_once", [1, 2])
def test_windows_over_files_read_together_see_no_late_record(tmp_path, at_once):
    """Read aligned, b's records are on time whatever ``files_at_once``: b, not begun,
    holds the job's watermark back (before alignment, one file after the other, a's end
    passed all of b's windows and b was late)."""
    write_files(tmp_path / "in")
    cfg = CheckpointConfig(interval=0.2, storage=f"file://{tmp_path}/chk")
    p = Pipeline("files", parallelism=2, checkpoint=cfg)
    out, late = CollectSink(str(tmp_path / "out")), CollectSink(str(tmp_path / "late"))
    counts = (p.source(FileSource(str(tmp_path / "in"), files_at_once=at_once), parallelism=1)
              .assign_timestamps(t_of, max_delay=0, parallelism=1)
              .key_by(lambda e: e["k"]).window(tumbling(100)).count())
    counts.sink(out)
    counts.late().sink(late)
    p.run(engine="threads", timeout=60)
    got = collections.Counter({(r.key, r.start): r.value for r in out.results()})
    late_keys = collections.Counter(e["k"][0] for e in late.results())
    assert not late_keys
    assert sum(got.values()) == 2 * PER_FILE and got[("b0", 0)] == 100
    assert got[("a0", 0)] == 34 and got[("a1", 2900)] == 33


def test_a_batch_comes_from_one_file_and_the_files_are_read_aligned(tmp_path):
    """With a watermark per file a batch comes from one file (its ``split_key``), the one
    furthest behind: b, not begun, holds the watermark back until it is read."""
    write_files(tmp_path / "in")
    reader = FileSource(str(tmp_path / "in")).create_reader()
    reader.open(0, 1)
    stamps = AssignTimestamps(make_node(0, "stamps", "assign_timestamps",
                                   TimestampSpec(t_of, BoundedOutOfOrderness(0), None)))
    stamps.read_splits_of(reader)
    got = []
    while (batch := reader.read_batch(700)) is not None:
        stamps.process(batch)
        got.append((reader.split_key()[0], len(batch), stamps.take_watermark()))
    # a record of a, one of b (not begun, it held the watermark back), then always the
    # file furthest behind: b (3 records a second) is read three times as often
    assert got[:3] == [("a", 1, None), ("b", 1, 0), ("a", 700, None)]
    assert sum(n for f, n, _ in got if f == "a") == sum(n for f, n, _ in got if f == "b") \
        == PER_FILE
    wms = [wm for _, _, wm in got if wm is not None]
    assert wms == sorted(wms) and wms[-1] == PER_FILE - 1
    for i, (f, _, _) in enumerate(got[1:-1], 1):  # never read a file that is ahead
        assert f == min("ab", key=lambda x: _behind(got[:i], x)), (i, got)


def test_a_followed_directory_moves_the_watermark_with_each_new_file(tmp_path):
    """Following a directory, each file is read to its end in one batch and no other is
    begun: the watermark is the newest file's, not the first file's for good."""
    directory = tmp_path / "in"
    directory.mkdir()
    reader = FileSource(str(directory), follow=True, poll_interval=0.001).create_reader()
    reader.open(0, 1)
    stamps = AssignTimestamps(make_node(0, "stamps", "assign_timestamps",
                                   TimestampSpec(t_of, BoundedOutOfOrderness(0), None)))
    stamps.read_splits_of(reader)
    got = []
    for k in range(3):
        with open(directory / f"f{k}.jsonl", "w") as f:
            f.writelines(json.dumps({"k": "a", "t": 100 * k + i}) + "\n" for i in range(100))
        batch = []
        while not batch:
            batch = reader.read_batch(1000)
        stamps.process(batch)
        assert reader.split_keys() == []
        got.append(stamps.take_watermark())
    assert got == [99, 199, 299]


def _behind(before: list, name: str) -> tuple:
    """(how far file ``name`` got, name): what the aligned reader picks the lowest of."""
    n = sum(k for f, k, _ in before if f == name)
    if n >= PER_FILE:
        return (float("inf"), name)
    if n == 0:
        return (float("-inf"), name)
    return ((n - 1) // (1 if name == "a" else 3), name)
