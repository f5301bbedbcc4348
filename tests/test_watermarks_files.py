"""A watermark per file of a ``FileSource``: a file that is behind holds the watermark
back, a finished file stops holding it; checkpointed and restored with the positions."""

from __future__ import annotations

import collections
import json

import pytest

from cutline import CheckpointConfig, Pipeline, tumbling
from cutline.connectors import CollectSink, FileSource
from cutline.logical import Node, TimestampSpec
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
    stamps = AssignTimestamps(Node(0, "stamps", "assign_timestamps",
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
    assert [(f, n) for f, n, _ in got] == [("a.jsonl", 1000), ("b.jsonl", 1000)] * 3
    # b (not begun, then behind) holds it back; once a is finished, b alone drives it
    assert [wm for _, _, wm in got] == [None, 333, None, 666, None, 999]
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
    """Read together, b's records are on time (its own watermark holds the job's back);
    read one after the other, a's end has passed all of b's windows: b is late."""
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
    if at_once == 2:
        assert not late_keys
        assert sum(got.values()) == 2 * PER_FILE and got[("b0", 0)] == 100
    else:
        assert late_keys == {"b": PER_FILE}


def test_one_file_at_a_time_a_batch_stops_at_the_end_of_its_file(tmp_path):
    """With a watermark per file a batch comes from one file (its ``split_key``)."""
    write_files(tmp_path / "in")
    reader = FileSource(str(tmp_path / "in")).create_reader()
    reader.open(0, 1)
    stamps = AssignTimestamps(Node(0, "stamps", "assign_timestamps",
                                   TimestampSpec(t_of, BoundedOutOfOrderness(0), None)))
    stamps.read_splits_of(reader)
    got = []
    while (batch := reader.read_batch(700)) is not None:
        stamps.process(batch)
        got.append((reader.split_key()[0], len(batch), stamps.take_watermark()))
    # (once a is finished, b is the file read now: not begun, it holds the watermark)
    assert got == [("a", 700, 699), ("a", 700, 1399), ("a", 700, 2099), ("a", 700, 2799),
                   ("a", 200, None)] + [("b", n, None) for n in (700, 700, 700, 700, 200)]


def test_a_followed_directory_moves_the_watermark_with_each_new_file(tmp_path):
    """Following a directory, each file is read to its end in one batch and no other is
    begun: the watermark is the newest file's, not the first file's for good."""
    directory = tmp_path / "in"
    directory.mkdir()
    reader = FileSource(str(directory), follow=True, poll_interval=0.001).create_reader()
    reader.open(0, 1)
    stamps = AssignTimestamps(Node(0, "stamps", "assign_timestamps",
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
