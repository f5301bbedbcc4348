"""Continuing a finished job (issue 25, part 3): day 1's files, then day 2's added, and
``restore_from`` the final checkpoint.

The final checkpoint of a bounded run holds the end of input (watermark ``inf``); a restore
takes the last real watermark instead, and the window operators remember which windows the
end of input fired.  So, with day 2's records (some for day 1's last windows, the rest
later):

* every window of day 1 is emitted exactly once, and none again;
* a day-2 record for a window that fired on day 1 (for its key) is late: it goes to
  ``.late()``, or is counted; with ``allowed_lateness`` it updates the window and emits it
  again;
* every other day-2 record lands in its window, and day 2's windows equal the counts
  computed offline from the files.

On the threads engine and on Spark, per record and in batches (``FileSource.batches``).
"""

from __future__ import annotations

import collections
import json
import math
from pathlib import Path

import pyarrow as pa
import pytest

from cutline import CheckpointConfig, Pipeline, session, sliding, tumbling
from cutline.connectors import CollectSink, FileSource
from cutline.protocol.watermarks import WatermarkTracker, restored_ts
from cutline.protocol.windows import WindowSpec, counting
from cutline.logical import make_node
from cutline.runtime.registry import build_operator
from cutline.runtime.windows import LateRecord
from cutline.storage.checkpoints import CheckpointStorage

DELAY = 2  # max_delay: each file is out of order by less than this
KEYS = "abc"
SCHEMA = pa.schema([("k", pa.string()), ("ts", pa.float64())])


def day1() -> list[dict]:
    """Three keys, a record every 1/3 s from 0 to 99.67 (each key every second), every
    7th 1.5 s late: the last real watermark is 99.67 - 2."""
    return [{"k": KEYS[i % 3], "ts": i / 3 - (1.5 if i % 7 == 3 else 0)} for i in range(300)]


def day2(start: float = 100) -> tuple[list[dict], list[dict], list[dict]]:
    """(records for day 1's windows, two records of a new key "z" in day 1's last window,
    records after day 1 from ``start``), in that order in the file."""
    old = [{"k": KEYS[j % 3], "ts": 80 + j * 0.6} for j in range(33)]  # 80 .. 99.2
    new_key = [{"k": "z", "ts": 96.0}, {"k": "z", "ts": 97.0}]
    later = [{"k": KEYS[i % 3], "ts": start + i / 3 - (1.5 if i % 7 == 3 else 0)}
             for i in range(5, 300)]
    return old, new_key, later


def write(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


# ------------------------------------------------------------------ offline oracle

REAL = 299 / 3 - DELAY  # day 1's last real watermark


def windows_of(assigner, ts: float) -> list[tuple]:
    return [(float(s), float(e)) for s, e in assigner.bounds(ts)]


def fixed_oracle(assigner, lateness: float, d1: list[dict], d2: list[dict]):
    """Tumbling / sliding: (final value per (key, start, end), late day-2 records, the
    values each window is emitted with)."""
    day1_counts: collections.Counter = collections.Counter()
    for r in d1:
        for w in windows_of(assigner, r["ts"]):
            day1_counts[(r["k"], *w)] += 1
    emitted = {kw: [n] for kw, n in day1_counts.items()}
    counts = dict(day1_counts)
    fresh: collections.Counter = collections.Counter()
    late = []
    for r in d2:
        landed = False
        for w in windows_of(assigner, r["ts"]):
            kw = (r["k"], *w)
            if w[1] + lateness <= REAL:
                continue  # behind the watermark, past the lateness
            if kw in day1_counts:  # fired on day 1 (at the end of input, or before)
                if lateness:
                    counts[kw] += 1
                    emitted[kw].append(counts[kw])
                    landed = True
                continue
            fresh[kw] += 1
            landed = True
        if not landed:
            late.append(r)
    for kw, n in fresh.items():
        counts[kw] = n
        emitted[kw] = [n]
    return counts, late, emitted


def session_oracle(gap: float, d1: list[dict], d2: list[dict]):
    """Sessions, day 2 after a gap: day 1's sessions, day 2's "old" records late (they
    would merge into a session the end of day 1's input fired), z's session, day 2's."""
    def sessions(records):
        out = {}
        for k in sorted({r["k"] for r in records}):
            ts = sorted(r["ts"] for r in records if r["k"] == k)
            start = prev = ts[0]
            n = 0
            for t in ts:
                if t > prev + gap:
                    out[(k, start, prev + gap)] = n
                    start, n = t, 0
                prev, n = t, n + 1
            out[(k, start, prev + gap)] = n
        return out
    old, new_key, later = d2
    return {**sessions(d1), **sessions(new_key), **sessions(later)}, old


# ------------------------------------------------------------------ pipelines


def per_record(p: Pipeline, src: Path, out: Path, assigner, lateness: float, late: bool):
    counts = (p.source(FileSource(str(src)), uid="files")
              .assign_timestamps(lambda r: r["ts"], max_delay=DELAY, uid="time")
              .key_by(lambda r: r["k"])
              .window(assigner, allowed_lateness=lateness).count(uid="windows"))
    results = CollectSink(str(out / "results"))
    counts.sink(results, uid="out")
    late_sink = None
    if late:
        late_sink = CollectSink(str(out / "late"))
        counts.late(uid="late").sink(late_sink, uid="late-out")
    return results, late_sink


def columnar(p: Pipeline, src: Path, out: Path, assigner, lateness: float, late: bool):
    counts = (p.source(FileSource(str(src)).batches(SCHEMA), uid="files")
              .assign_timestamps("ts", max_delay=DELAY, uid="time")
              .key_by("k").window(assigner, allowed_lateness=lateness).count(uid="windows"))
    results = CollectSink(str(out / "results"))
    counts.sink(results, uid="out")
    late_sink = None
    if late:
        late_sink = CollectSink(str(out / "late"))
        counts.late(uid="late").sink(late_sink, uid="late-out")
    return results, late_sink


def rows_of(results: CollectSink, batches: bool) -> list[tuple]:
    if batches:
        return [(r["k"], float(r["start"]), float(r["end"]), r["count"])
                for b in results.results() for r in b.to_pylist()]
    return [(r.key, float(r.start), float(r.end), r.value) for r in results.results()]


def late_of(sink: CollectSink, batches: bool) -> list[dict]:
    if batches:
        return [r for b in sink.results() for r in b.to_pylist()]
    return list(sink.results())


def two_days(tmp_path: Path, build, assigner, lateness: float, *, late: bool = True,
             spark=None, later_from: float = 100, batches: bool = False):
    """Run day 1, add day 2's file, run again from the final checkpoint: (day 1's run,
    day 2's run, result rows of both, late records of both)."""
    src, out = tmp_path / "in", tmp_path / "out"
    src.mkdir()
    write(src / "day1.jsonl", day1())

    def pipeline():
        p = Pipeline("days", parallelism=2, checkpoint=CheckpointConfig(
            interval=0.5, storage=f"file://{tmp_path}/checkpoints"))
        return p, *build(p, src, out, assigner, lateness, late)

    def run(p, **kw):
        if spark is not None:
            return p.run(spark=spark, timeout=240, **kw)
        return p.run(engine="threads", timeout=90, **kw)

    p, results, late_sink = pipeline()
    first = run(p)
    final = first.latest_checkpoint
    assert final.final
    old, new_key, later = day2(later_from)
    write(src / "day2.jsonl", old + new_key + later)
    p, results, late_sink = pipeline()
    second = run(p, restore_from=final.path)
    assert second.restored_from == final.path
    return (first, second, rows_of(results, batches),
            late_of(late_sink, batches) if late_sink is not None else None)


def by_window(rows: list[tuple]) -> dict[tuple, list]:
    out: dict[tuple, list] = collections.defaultdict(list)
    for k, s, e, n in rows:
        out[(k, s, e)].append(n)
    return {kw: sorted(v) for kw, v in out.items()}


def check_fixed(rows, late, assigner, lateness):
    old, new_key, later = day2()
    counts, want_late, emitted = fixed_oracle(assigner, lateness, day1(), old + new_key + later)
    got = by_window(rows)
    # every window of both days, with its count; none emitted twice (unless the lateness
    # let a day-2 record update it: then once per such record, with the running count)
    assert {kw: v[-1] for kw, v in got.items()} == counts
    assert got == {kw: sorted(v) for kw, v in emitted.items()}
    assert sorted(map(json.dumps, late)) == sorted(map(json.dumps, want_late))
    return counts, want_late


# ------------------------------------------------------------------ threads engine

TUMBLING = tumbling(5)
SLIDING = sliding(10, 5)


@pytest.mark.parametrize("batches", [False, True], ids=["records", "columnar"])
@pytest.mark.parametrize("assigner", [TUMBLING, SLIDING], ids=["tumbling", "sliding"])
def test_day_two_continues_from_day_ones_final_checkpoint(tmp_path, assigner, batches):
    _, second, rows, late = two_days(tmp_path, columnar if batches else per_record,
                                     assigner, 0, batches=batches)
    counts, want_late = check_fixed(rows, late, assigner, 0)
    # day 1's windows ending after its last real watermark fired at its end of input;
    # day 2's old records are all late, "z" is new in [95, 100): on time; day 2's windows
    assert len(want_late) == 33
    z = (("z", 95.0, 100.0) if assigner is TUMBLING else ("z", 90.0, 100.0))
    assert counts[z] == 2
    assert any(kw[1] >= 150 for kw in counts)


@pytest.mark.parametrize("batches", [False, True], ids=["records", "columnar"])
def test_allowed_lateness_updates_a_window_the_end_of_input_fired(tmp_path, batches):
    _, _, rows, late = two_days(tmp_path, columnar if batches else per_record, TUMBLING,
                                10, batches=batches)
    counts, want_late = check_fixed(rows, late, TUMBLING, 10)
    got = by_window(rows)
    # [95, 100) fired at the end of day 1 (above its last real watermark) and again for
    # each of day 2's records in it, not once more when day 2's watermark passed 100
    a = [v for (k, s, _), v in got.items() if k == "a" and s == 95.0][0]
    assert len(a) > 1 and a == list(range(a[0], a[0] + len(a)))
    assert want_late and all(r["ts"] < 85 for r in want_late)  # [80, 85): past 85 + 10


@pytest.mark.parametrize("batches", [False, True], ids=["records", "columnar"])
def test_sessions_continue_and_a_record_for_a_fired_session_is_late(tmp_path, batches):
    _, _, rows, late = two_days(tmp_path, columnar if batches else per_record, session(3),
                                0, later_from=110, batches=batches)
    want, want_late = session_oracle(3, day1(), day2(110))
    got = by_window(rows)
    assert all(len(v) == 1 for v in got.values())  # none twice
    assert {kw: v[0] for kw, v in got.items()} == pytest.approx(want)
    assert sorted(map(json.dumps, late)) == sorted(map(json.dumps, want_late))


def test_dropped_late_records_are_counted(tmp_path):
    _, second, rows, late = two_days(tmp_path, per_record, TUMBLING, 0, late=False)
    assert late is None
    counts, want_late, _ = fixed_oracle(TUMBLING, 0, day1(), sum(day2(), []))
    assert {kw: v[-1] for kw, v in by_window(rows).items()} == counts
    assert all(len(v) == 1 for v in by_window(rows).values())
    late_records = getattr(second, "late_records", None)
    if late_records is not None:  # (RunResult counts them per operator)
        assert sum(late_records.values()) == len(want_late) == 33


# ------------------------------------------------------------------ Spark


@pytest.mark.parametrize("batches", [False, True], ids=["records", "columnar"])
def test_day_two_continues_on_spark(tmp_path, spark, batches):
    _, _, rows, late = two_days(tmp_path, columnar if batches else per_record, TUMBLING, 0,
                                spark=spark, batches=batches)
    check_fixed(rows, late, TUMBLING, 0)


# ------------------------------------------------------------------ units


def test_a_restored_watermark_is_the_last_real_one_not_the_end_of_input():
    t = WatermarkTracker(["a", "b"])
    t.on_watermark("a", 10)
    t.on_watermark("b", 7)
    assert t.current == 7
    t.on_watermark("a", math.inf)
    t.on_close("b")
    assert t.current == math.inf
    snap = t.snapshot()
    assert snap["current"] == "inf" and snap["real"]["current"] == 7
    again = WatermarkTracker(["a", "b"])
    again.restore(snap)
    assert again.current == 7 and again.watermark_of("a") == 10
    assert again.watermark_of("b") == 7
    assert again.on_watermark("a", 12) is None and again.on_watermark("b", 9) == 9
    # an input that had no watermark (its sender read nothing) holds nothing back at the
    # end: the last real watermark is the same whichever input ended last
    for last in ("a", "b"):
        t = WatermarkTracker(["a", "b"])
        t.on_watermark("a", 10)
        t.on_watermark(last, math.inf)
        t.on_close("b" if last == "a" else "a")
        assert t.current == math.inf and t.real == 10
    # an old checkpoint without the real watermark keeps the end of input
    assert restored_ts("inf") == math.inf and restored_ts("inf", {"x": 3}, "x") == 3
    assert restored_ts(5, {"x": 3}, "x") == 5


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
def test_the_window_operator_remembers_what_the_end_of_input_fired(tmp_path, monkeypatch,
                                                                   backend):
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path / "local"))
    def op():
        spec = WindowSpec(tumbling(5), 0, lambda r: r[1], counting(), emit_late=True)
        return build_operator(make_node(0, "w", "window", spec, key_fn=lambda r: r[0]), 0, 1, 16,
                              state_backend=backend)

    first = op()
    assert first.process([("a", 1), ("a", 6), ("b", 7)]) == []
    assert [tuple(r) for r in first.on_watermark(5)] == [("a", 0, 5, 1)]
    assert sorted(tuple(r) for r in first.on_watermark(math.inf)) == [
        ("a", 5, 10, 1), ("b", 5, 10, 1)]
    blob = first.snapshot()
    if not isinstance(blob, bytes):
        blob = blob.finish(CheckpointStorage(str(tmp_path / "chk"), "job"), 1)
    second = op()
    second.restore([blob])
    assert second.wm == 5  # the last real watermark, not inf
    out = second.process([("a", 8), ("c", 9), ("b", 12)])
    assert out == [LateRecord(("a", 8))]  # a's [5, 10) fired at the end of input
    assert sorted(tuple(r) for r in second.on_watermark(20)) == [
        ("b", 10, 15, 1), ("c", 5, 10, 1)]  # and not again; c's is new
    assert not second.fired  # the marks go once the watermark passed their windows
