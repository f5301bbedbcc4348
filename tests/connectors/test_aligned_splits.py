"""Event time over many files per subtask (issue 25): a subtask's watermark is the lowest
over all its unfinished files, those not begun included, and it reads them aligned (each
batch from the file furthest behind), so a directory replay is exact whatever the number
of files per subtask.

Every run compares each window's count with the count computed offline from the files,
and requires zero late records (a ``.late()`` side output that must stay empty):

* threads engine, per record and in batches, 1, 4 and 16 files per subtask, files that
  all cover the same minutes (a server's log each) and files that follow one another in
  time (an hour each); the most windows open at once does not grow with the number of
  files;
* Spark, per record and in batches, 1, 4 and 16 files per subtask, and 16 files with
  three ``kill -9`` of a Python worker in the aligned and the unaligned mode (slow);
* Spark SQL's ``groupBy(window(...), key).count()`` over the same files as the oracle.
"""

from __future__ import annotations

import collections
import json
import random
import time
from pathlib import Path

import pytest

from cutline import CheckpointConfig, Pipeline, tumbling
from cutline.connectors import CollectSink, FileSource
from cutline.runtime import windows as window_module
from cutline.runtime.batch_windows import BatchWindowAggregate

KEYS = 12
SPAN = 400.0  # seconds of event time each file covers (overlapping files)
DELAY = 2.0  # at most this much out of order, and the watermark's max_delay
SIZE = 5  # tumbling window, seconds
PARALLELISM = 2


def write_input(directory: Path, files: int, per_file: int, *, sequential: bool = False,
                seed: int = 7, span: float = SPAN) -> collections.Counter:
    """``files`` JSON-lines files of ``per_file`` events ``{"k", "t"}``, each up to
    ``DELAY`` s behind the newest before it in its file.  Overlapping: every file covers
    the same ``span`` seconds; ``sequential``: file ``f`` covers ``[f * span, (f + 1) *
    span)``.  Returns the count per (key, window start) computed offline."""
    directory.mkdir(parents=True)
    rng = random.Random(seed)
    counts: collections.Counter = collections.Counter()
    step = span / per_file
    for f in range(files):
        base = f * span if sequential else 0.0
        lines = []
        for i in range(per_file):
            t = round(base + max(0.0, i * step - rng.uniform(0, DELAY)), 3)
            k = f"k{rng.randrange(KEYS)}"
            lines.append(json.dumps({"k": k, "t": t}))
            counts[(k, int(t // SIZE) * SIZE)] += 1
        (directory / f"part-{f:03d}.jsonl").write_text("\n".join(lines) + "\n")
    return counts


def schema():
    import pyarrow as pa

    return pa.schema([("k", pa.string()), ("t", pa.float64())])


def slow_records(e: dict) -> dict:
    if random.random() < 0.01:
        time.sleep(0.005)
    return e


def slow_batch(b):
    time.sleep(0.02)
    return b


def build(tmp: Path, inp: Path, *, columnar: bool, mode: str = "aligned",
          interval: float = 0.3, slow: bool = False, sources: int = PARALLELISM,
          rate: float | None = None, parallelism: int = PARALLELISM,
          max_drift: float | None = None) -> tuple[Pipeline, CollectSink, CollectSink]:
    """The job: files -> assign_timestamps -> key_by -> tumbling count, and its late
    records.  ``slow``: a few seconds long (kills land mid-stream); ``sources``: the
    source's parallelism (``assign_timestamps`` right after it takes it: a watermark per
    file, the files read aligned)."""
    cfg = CheckpointConfig(interval=interval, storage=f"file://{tmp}/chk",
                           unaligned=(mode == "unaligned"))
    p = Pipeline("aligned-files", parallelism=parallelism, checkpoint=cfg)
    out, late = CollectSink(str(tmp / "out")), CollectSink(str(tmp / "late"))
    if columnar:
        stamped = (p.source(FileSource(str(inp)).batches(
            schema(), batch_bytes=16_384 if slow else 1 << 20), uid="files",
            parallelism=sources)
            .assign_timestamps("t", max_delay=DELAY, uid="time", max_drift=max_drift))
        if slow:
            stamped = stamped.map_batches(slow_batch, uid="slow")
        counts = stamped.key_by("k").window(tumbling(SIZE)).count(uid="counts")
        counts.rows().sink(out, uid="out")
        counts.late().rows().sink(late, uid="late")
    else:
        stamped = (p.source(FileSource(str(inp), rate=rate), uid="files", parallelism=sources)
                   .assign_timestamps(lambda e: e["t"], max_delay=DELAY, uid="time",
                                      max_drift=max_drift))
        if slow:
            stamped = stamped.map(slow_records, uid="slow")
        counts = (stamped.key_by(lambda e: e["k"]).window(tumbling(SIZE))
                  .count(uid="counts"))
        counts.sink(out, uid="out")
        counts.late().sink(late, uid="late")
    return p, out, late


def got_counts(out: CollectSink, columnar: bool) -> collections.Counter:
    """(key, window start) -> count, each window once (a second row fails the test)."""
    got: collections.Counter = collections.Counter()
    for r in out.results():
        key, start, value = (r["k"], r["start"], r["count"]) if columnar else \
            (r.key, r.start, r.value)
        w = (key, int(start))
        assert w not in got, f"window {w} emitted twice"
        got[w] = value
    return got


def assert_exact(out: CollectSink, late: CollectSink, want: collections.Counter,
                 columnar: bool) -> None:
    late_rows = list(late.results())
    assert not late_rows, f"{len(late_rows)} records late, e.g. {late_rows[:3]}"
    got = got_counts(out, columnar)
    wrong = {w for w in want.keys() | got.keys() if got[w] != want[w]}
    assert not wrong, (f"{len(wrong)} of {len(want)} windows wrong, e.g. "
                       f"{[(w, got[w], want[w]) for w in sorted(wrong)[:3]]}")


@pytest.fixture
def open_windows(monkeypatch):
    """The most (key, window) pairs a window operator (of records or of batches) held at
    once, over the run (threads engine: the operators run in this process)."""
    most = [0]
    for cls in (window_module.WindowOperator, BatchWindowAggregate):
        def on_watermark(self, ts, fire=cls.on_watermark):
            most[0] = max(most[0], self.held_windows())
            return fire(self, ts)

        monkeypatch.setattr(cls, "on_watermark", on_watermark)
    return most


@pytest.mark.parametrize("columnar", [False, True], ids=["records", "batches"])
@pytest.mark.parametrize("per_subtask", [1, 4, 16])
def test_a_directory_replay_is_exact_whatever_the_files_per_subtask(tmp_path, per_subtask,
                                                                     columnar):
    want = write_input(tmp_path / "in", PARALLELISM * per_subtask, 2000)
    p, out, late = build(tmp_path, tmp_path / "in", columnar=columnar)
    result = p.run(engine="threads", timeout=120)
    assert result.attempts == 1
    assert_exact(out, late, want, columnar)


@pytest.mark.parametrize("sequential", [False, True], ids=["overlapping", "sequential"])
def test_open_windows_do_not_grow_with_the_number_of_files(tmp_path, open_windows,
                                                           sequential):
    """1 and 16 files for one source subtask: what the window operators hold open spans
    what is in flight (a batch per file at most), not the input.  Read one file after
    the other (before alignment) the 16 files were late; read all at once without
    alignment, every window of a sequential input stayed open to the end.  (One source
    subtask: subtasks are not aligned with each other, so with several the windows of
    the one that runs ahead stay open too.)"""
    most = {}
    for files in (1, 16):
        tmp = tmp_path / str(files)
        want = write_input(tmp / "in", files, 3000, sequential=sequential)
        p, out, late = build(tmp, tmp / "in", columnar=False, sources=1)
        open_windows[0] = 0
        p.run(engine="threads", timeout=120)
        assert_exact(out, late, want, columnar=False)
        most[files] = open_windows[0]
    windows_per_file = KEYS * (SPAN / SIZE)  # (key, window) pairs one file's span holds
    if sequential:  # 16 files of 400 s each, read one after the other: at most about
        # one file's windows open, never the input's 16 (the 16 files' first records
        # each open one)
        assert most[16] <= 1.5 * windows_per_file + 16, most
    else:  # overlapping files: a batch per file in flight at most
        assert most[16] <= 2 * most[1] + KEYS * 16, most


@pytest.mark.parametrize("columnar", [False, True], ids=["records", "batches"])
def test_max_drift_aligns_the_source_subtasks_with_each_other(tmp_path, open_windows,
                                                              columnar):
    """Files that follow one another in time (100 s each, a batch of 1,000 records spans
    50 s), 16 per subtask, 2 subtasks: without alignment across subtasks one runs ahead
    and the window operator holds up to about two files' windows (measured: 1.6 to 2.3
    files' here); with ``max_drift=50`` a subtask pauses while it is further ahead of the
    slowest, the subtasks take turns, and at most about a file's are open (measured: 0.35
    to 1.07).  Exact either way."""
    span = 100.0
    windows_per_file = KEYS * (span / SIZE)
    want = write_input(tmp_path / "in", PARALLELISM * 16, 2000, sequential=True, span=span)
    p, out, late = build(tmp_path, tmp_path / "in", columnar=columnar, max_drift=span / 2)
    result = p.run(engine="threads", timeout=300)
    assert result.attempts == 1
    assert_exact(out, late, want, columnar)
    if not columnar:  # (the batch window operator is another class)
        # max_drift + a batch + the delay, and a window of each file's first record
        assert open_windows[0] <= 1.3 * windows_per_file + PARALLELISM * 16, open_windows[0]


def test_max_drift_is_refused_away_from_the_source():
    from cutline.connectors import GeneratorSource

    p = Pipeline("drift")
    src = p.source(GeneratorSource(count=10))
    with pytest.raises(ValueError, match="right after the source"):
        src.map(lambda x: x).assign_timestamps(lambda x: x, max_drift=5)
    with pytest.raises(ValueError, match="max_drift"):
        src.assign_timestamps(lambda x: x, max_drift=-1)


def test_a_split_not_begun_holds_the_generator_watermark_back(tmp_path):
    """GeneratorSource splits (after a rescale a reader owns several) are read aligned
    too: the reader picks the split furthest behind, a split not begun first."""
    from cutline.connectors import GeneratorSource
    from cutline.logical import make_node, TimestampSpec
    from cutline.protocol.watermarks import BoundedOutOfOrderness
    from cutline.runtime.operators import AssignTimestamps

    src = GeneratorSource(count=4000, fn=lambda i: i)
    reader = src.create_reader()
    reader.open(0, 1)
    # the split of even and the split of odd indices; odd ones are stamped 10x slower
    reader.rescale([{"splits": [[0, 2], [1, 2]], "subtask": 0, "parallelism": 1}])
    stamps = AssignTimestamps(make_node(0, "stamps", "assign_timestamps", TimestampSpec(
        lambda i: i if i % 2 == 0 else i // 10, BoundedOutOfOrderness(0), None)))
    stamps.read_splits_of(reader)
    seen = []
    while (batch := reader.read_batch(100)) is not None:
        stamps.process(batch)
        seen.append((reader.split_key(), len(batch), stamps.take_watermark()))
    assert seen[:2] == [("0/2", 1, None), ("1/2", 1, 0)]
    wms = [wm for _, _, wm in seen if wm is not None]
    assert wms == sorted(wms)
    # the slow split is read about ten times as often while both run
    rest = seen[2:]
    both = rest[:next(i for i, s in enumerate(rest) if s[0] == "1/2" and s[1] < 100)]
    slow = sum(1 for s in both if s[0] == "1/2")
    assert slow > 5 * (len(both) - slow), both[:20]


@pytest.mark.parametrize("columnar", [False, True], ids=["records", "batches"])
@pytest.mark.parametrize("rescaled", [1, 3])
def test_a_replay_stopped_with_a_savepoint_resumes_rescaled_exactly(tmp_path, rescaled,
                                                                   columnar):
    """16 files per subtask at parallelism 2, stopped with a savepoint mid-way (files
    begun, paused and not begun), resumed at parallelism 1 or 3: each file's position and
    watermark move with it, the files are read aligned again, and every window is exact
    with no record late."""
    want = write_input(tmp_path / "in", PARALLELISM * 16, 1500)
    p, out, late = build(tmp_path, tmp_path / "in", columnar=columnar, sources=PARALLELISM,
                         rate=None if columnar else 20_000, slow=columnar)
    job = p.start(engine="threads")
    time.sleep(1.0)
    savepoint = job.stop_with_savepoint(60)
    first = job.result(60)
    assert not first.latest_checkpoint.final, "the job ended before the savepoint"
    p2, out2, late2 = build(tmp_path, tmp_path / "in", columnar=columnar, sources=rescaled,
                            parallelism=rescaled)
    p2.run(engine="threads", restore_from=savepoint, timeout=120)
    both = CollectSink(str(tmp_path / "out"))  # (the same directory: both runs' output)
    assert_exact(both, late2, want, columnar)


def test_a_followed_file_that_arrives_behind_the_watermark_is_late_and_counted(tmp_path):
    """``follow=True``: a file whose times the watermark has passed when it arrives is late:
    its records are counted as late records dropped (``late_records``), none is silently
    lost and no window fires twice; files arriving in time order are on time."""
    inp = tmp_path / "in"
    inp.mkdir()
    cfg = CheckpointConfig(interval=0.2, storage=f"file://{tmp_path}/chk")
    p = Pipeline("follow", parallelism=1, checkpoint=cfg)
    out = CollectSink(str(tmp_path / "out"))
    (p.source(FileSource(str(inp), follow=True, poll_interval=0.02), uid="files")
     .assign_timestamps(lambda e: e["t"], max_delay=0, uid="time")
     .key_by(lambda e: e["k"]).window(tumbling(10)).count(uid="counts")
     .sink(out, uid="out"))

    def put(name: str, times: range) -> None:
        tmp = inp / f".{name}"  # written elsewhere, renamed in: it appears whole
        tmp.write_text("".join(json.dumps({"k": "a", "t": t}) + "\n" for t in times))
        tmp.rename(inp / name)

    def wait(what, check) -> None:
        deadline = time.monotonic() + 60
        while not check():
            assert time.monotonic() < deadline, f"no {what} in 60 s"
            time.sleep(0.05)

    job = p.start(engine="threads")
    wait("driver", lambda: job.driver is not None)
    put("f1.jsonl", range(100, 200))  # watermark 199: windows up to [180, 190) fire
    wait("watermark", lambda: job.driver.run.late_records() == {"counts": 0} and any(
        r.start == 180 for r in out.results()))
    put("f0.jsonl", range(0, 100))  # all behind the watermark: late
    wait("late records", lambda: job.driver.run.late_records().get("counts") == 100)
    put("f2.jsonl", range(200, 230))  # on time again
    wait("windows of f2", lambda: any(r.start == 210 for r in out.results()))
    job.cancel()
    got = sorted((r.start, r.value) for r in out.results())
    assert got == [(s, 10) for s in range(100, 220, 10)], got


# --------------------------------------------------------------------------- Spark


@pytest.mark.parametrize("columnar", [False, True], ids=["records", "batches"])
@pytest.mark.parametrize("per_subtask", [1, 4, 16])
def test_a_directory_replay_on_spark_equals_the_offline_counts(spark, tmp_path, per_subtask,
                                                               columnar):
    want = write_input(tmp_path / "in", PARALLELISM * per_subtask, 1000)
    p, out, late = build(tmp_path, tmp_path / "in", columnar=columnar)
    result = p.run(spark=spark, timeout=240)
    assert result.attempts == 1
    assert_exact(out, late, want, columnar)
    if per_subtask == 16 and not columnar:  # Spark SQL over the same files: the oracle
        from pyspark.sql import functions as F

        df = spark.read.schema("k string, t double").json(str(tmp_path / "in"))
        rows = (df.groupBy(F.floor(F.col("t") / SIZE).alias("w"), "k").count().collect())
        oracle = collections.Counter({(r["k"], int(r["w"]) * SIZE): r["count"] for r in rows})
        assert oracle == want
        assert got_counts(out, columnar) == oracle


@pytest.mark.slow
def test_max_drift_on_spark_across_two_kills(spark, tmp_path):
    """Subtasks aligned with each other (``max_drift``) on Spark, through the driver's
    control channel, across two ``kill -9``: exact (a restore starts with no floor)."""
    from cutline.spark.chaos import Chaos

    want = write_input(tmp_path / "in", PARALLELISM * 16, 3000, sequential=True)
    p, out, late = build(tmp_path, tmp_path / "in", columnar=False, max_drift=SPAN / 4,
                         slow=True, interval=0.2)
    chaos = Chaos(kills=2, seed=182, mean_delay=1.0)
    result = p.run(spark=spark, timeout=600, on_start=chaos)
    assert len(chaos.killed) == 2, chaos.killed
    assert result.attempts >= 3
    assert_exact(out, late, want, columnar=False)


@pytest.mark.slow
@pytest.mark.parametrize("columnar", [False, True], ids=["records", "batches"])
@pytest.mark.parametrize("mode", ["aligned", "unaligned"])
def test_three_kills_on_spark_keep_a_16_file_replay_exact(spark, tmp_path, mode, columnar):
    from cutline.spark.chaos import Chaos

    want = write_input(tmp_path / "in", PARALLELISM * 16, 6000)
    p, out, late = build(tmp_path, tmp_path / "in", columnar=columnar, mode=mode,
                         interval=0.2, slow=True)
    chaos = Chaos(kills=3, seed=25, mean_delay=1.0)
    result = p.run(spark=spark, timeout=600, on_start=chaos)
    assert len(chaos.killed) == 3, chaos.killed
    assert result.attempts >= 4
    assert_exact(out, late, want, columnar)


def test_stateless_operators_before_assign_timestamps_keep_a_watermark_per_file(tmp_path):
    """files -> map -> filter -> assign_timestamps: the batches that reach the assigner are
    still one file's records, so it keeps a watermark per file and the files are read
    aligned, as with the assigner right after the source (a watermark per subtask over 4
    overlapping files per subtask made most of the records late)."""
    want = write_input(tmp_path / "in", PARALLELISM * 4, 2000)
    cfg = CheckpointConfig(interval=0.3, storage=f"file://{tmp_path}/chk")
    p = Pipeline("aligned-files-map", parallelism=PARALLELISM, checkpoint=cfg)
    out, late = CollectSink(str(tmp_path / "out")), CollectSink(str(tmp_path / "late"))
    counts = (p.source(FileSource(str(tmp_path / "in")), uid="files")
              .map(slow_records, uid="m").filter(lambda e: "t" in e, uid="f")
              .assign_timestamps(lambda e: e["t"], max_delay=DELAY, uid="time")
              .key_by(lambda e: e["k"]).window(tumbling(SIZE)).count(uid="counts"))
    counts.sink(out, uid="out")
    counts.late().sink(late, uid="late")
    result = p.run(engine="threads", timeout=120)
    assert result.attempts == 1
    assert_exact(out, late, want, columnar=False)
