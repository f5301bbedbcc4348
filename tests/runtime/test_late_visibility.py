"""Late records are never dropped silently (issue 25, parts 2 and 5).

A window operator that drops late records counts them per subtask, exactly once (the count
is keyed state, in every checkpoint); the counts reach ``JobResult.late_records``, the live
line, the dashboard, ``/metrics`` (``cutline_late_records_dropped_total``) and ``cutline
checkpoints show``; the first drop prints one console line.  ``window(..., on_late="fail")``
fails the job at once instead.  And metrics count records only: watermarks are not records.

The jobs read ``event(i)`` from one source split: every 31st record from ``LATE_FROM`` on is
``BEHIND`` seconds behind, always behind the watermark (the source reads at most a batch
ahead of it), so the exact number of drops is known: :data:`LATE` of :data:`N`.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import shutil
import subprocess
import time
import urllib.request

import numpy as np
import pyarrow as pa
import pytest
from rich.console import Console

from cutline import CheckpointConfig, Pipeline, tumbling
from cutline.cli import main
from cutline.connectors import CollectSink, GeneratorSource
from cutline.driver.dashboard import Dashboard, JobView
from cutline.driver.dataflow import JobFailed
from cutline.driver.late import LateWarnings
from cutline.protocol import messages as m
from cutline.protocol.watermarks import IDLE, Watermark
from cutline.runtime.task import _count
from cutline.state.keygroups import key_group, subtask_for_key_group

N = 10_000
KEYS = 5
LATE_FROM, EVERY, BEHIND = 3_000, 31, 3_000
WINDOW = 10


def is_late(i: int) -> bool:
    return i >= LATE_FROM and i % EVERY == 0


def event(i: int) -> tuple[str, int]:
    return f"k{i % KEYS}", i - BEHIND if is_late(i) else i


def ts_of(e: tuple[str, int]) -> int:
    return e[1]


def key_of(e: tuple[str, int]) -> str:
    return e[0]


def late_per_subtask(n: int = N, parallelism: int = 2) -> dict[str, int]:
    """Subtask index (as /metrics labels it) -> late records its keys drop."""
    out: dict[str, int] = {str(s): 0 for s in range(parallelism)}
    for i in range(n):
        if is_late(i):
            s = subtask_for_key_group(key_group(f"k{i % KEYS}", 128), parallelism, 128)
            out[str(s)] += 1
    return out


LATE = sum(1 for i in range(N) if is_late(i))


def pipeline(tmp, name: str = "late", *, n: int | None = N, rate: float | None = None,
             on_late: str = "drop", interval: float = 0.2,
             parallelism: int = 2) -> tuple[Pipeline, CollectSink]:
    p = Pipeline(name, parallelism=parallelism, checkpoint=CheckpointConfig(
        storage=f"file://{tmp}/chk", interval=interval))
    out = CollectSink(str(tmp / "out"))
    (p.source(GeneratorSource(count=n, fn=event, rate=rate), uid="events", parallelism=1)
     .assign_timestamps(ts_of, max_delay=2, uid="stamps", parallelism=1)
     .key_by(key_of).window(tumbling(WINDOW), on_late=on_late).count(uid="counts")
     .sink(out, uid="out"))
    return p, out


def expected_windows() -> dict[tuple[str, int], int]:
    counts: dict[tuple[str, int], int] = {}
    for i in range(N):
        if not is_late(i):
            k, t = event(i)
            counts[(k, t - t % WINDOW)] = counts.get((k, t - t % WINDOW), 0) + 1
    return counts


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:  # noqa: S310 - loopback
        return r.read().decode()


def _late_metrics(text: str) -> dict[str, float]:
    """subtask -> cutline_late_records_dropped_total of operator 'counts'."""
    got = {}
    for line in text.splitlines():
        if line.startswith("cutline_late_records_dropped_total{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
            assert labels["operator"] == "counts" and labels["job"] == "late", line
            got[labels["subtask"]] = float(line.rsplit(" ", 1)[1])
    return got


def _chain_of(snapshot: dict, uid: str) -> dict:
    return next(o for o in snapshot["operators"]
                if uid in [n["uid"] for g in snapshot["graph"]["nodes"] if g["uid"] == o["uid"]
                           for n in g["operators"]])


def _warnings(caplog) -> tuple[list[str], list[str]]:
    texts = [r.getMessage() for r in caplog.records if r.name.startswith("cutline")]
    return ([t for t in texts if "dropped a late record" in t],
            [t for t in texts if "late records" in t and "dropped a late record" not in t])


# --------------------------------------------------------------------------- threads


def test_late_records_counted_and_shown_on_threads(tmp_path, caplog, capsys, monkeypatch):
    p, out = pipeline(tmp_path)
    drivers: list = []
    console = Console(file=io.StringIO(), width=400)
    with caplog.at_level(logging.WARNING, logger="cutline"):
        result = p.run(engine="threads", progress=console, on_start=drivers.append,
                       timeout=120)
    # JobResult, per operator: exact
    assert result.late_records == {"counts": LATE}
    assert LATE == 226
    # the windows are right without them
    got = {(r.key, r.start): r.value for r in out.results()}
    assert got == expected_windows()
    # the live line
    live = console.file.getvalue()
    assert f"late dropped {LATE:,}" in live, live
    # the console: one warning at the first drop, naming the operator, the record's time,
    # the watermark and how to keep such records; the rest in one line at the end
    first, more = _warnings(caplog)
    assert len(first) == 1, first
    assert re.search(r"window 'counts' dropped a late record \(subtask [01]: time \d+, "
                     r"watermark \d+: its windows had all fired", first[0]), first[0]
    assert "allowed_lateness" in first[0] and ".late()" in first[0]
    assert 'on_late="fail"' in first[0]
    assert len(more) <= 1 and all(f"dropped {LATE:,} late records in all" in t for t in more)

    # the dashboard and /metrics of the finished job (its driver keeps the last counts)
    driver = drivers[0]
    board = Dashboard(JobView(driver, "threads"))
    try:
        metrics = _get(board.url.replace("/?", "/metrics?"))
        job = json.loads(_get(board.url.replace("/?", "/api/job?")))
    finally:
        board.stop()
    assert _late_metrics(metrics) == {s: float(n) for s, n in late_per_subtask().items()}
    assert "# TYPE cutline_late_records_dropped_total counter" in metrics
    assert job["late_records"] == LATE
    window = _chain_of(job, "counts")
    assert window["late_records"] == LATE and window["late"] == {"counts": LATE}
    assert {s["task"].rsplit(".", 1)[1]: s["late_records"] for s in window["subtasks"]} \
        == late_per_subtask()
    # part 5: records in of the window's chain are the records read, watermarks aside
    assert window["records"] == N
    assert job["source_records"] == N

    # cutline checkpoints show: the final checkpoint holds the counts (keyed state)
    path = result.latest_checkpoint.path
    capsys.readouterr()
    assert main(["checkpoints", "show", path, "--format", "json"]) == 0
    info = json.loads(capsys.readouterr().out)
    ops = {o["uid"]: o for o in info["operators"]}
    assert ops["counts"]["late_records"] == LATE
    assert ops["counts"]["late_by_subtask"] == late_per_subtask()
    assert "late_records" not in ops["events"]
    monkeypatch.setenv("COLUMNS", "250")
    assert main(["checkpoints", "show", path]) == 0
    table = capsys.readouterr().out
    assert "late dropped" in table
    row = next(line for line in table.splitlines() if "│ counts " in line)
    per = late_per_subtask()
    assert f"{LATE} (#0: {per['0']}, #1: {per['1']})" in row, table


def test_records_in_count_records_not_watermarks(tmp_path):
    """Part 5: with assign_timestamps, every operator's records in equal the records read
    (before, watermarks in the batches counted as records: ~2.9x at the window)."""
    p, _ = pipeline(tmp_path, name="records", rate=20_000)
    drivers: list = []
    p.run(engine="threads", on_start=drivers.append, progress=False, timeout=120)
    snap = JobView(drivers[0], "threads").snapshot()
    assert {o["uid"]: o["records"] for o in snap["operators"]} == \
        {o["uid"]: N for o in snap["operators"]}


def test_count_leaves_out_time_items():
    records = [1, Watermark(3.0), 2, IDLE, 3]
    assert _count(records, timed=True) == 3
    assert _count(records) == 5  # without event time a batch holds no time items
    rb = pa.record_batch({"x": pa.array(range(7))})
    assert _count([Watermark(1.0), rb, IDLE, rb], timed=True) == 14
    assert _count([], timed=True) == 0
    assert _count([Watermark(1.0)], timed=True) == 0
    # a window's partial aggregate (two-phase) counts as the records it holds
    from cutline.logical import WindowPartial

    assert _count([WindowPartial("k", 0, 10, 3, 3, 9.5), Watermark(2.0), 7], timed=True) == 4


@pytest.mark.parametrize("parallelism", [2, 3])
def test_late_count_goes_on_after_a_restore_from_a_savepoint(tmp_path, caplog, parallelism):
    """The count is keyed state: a run restored from a savepoint taken mid-way starts from
    the savepoint's count, and its replay counts no record twice; rescaled (3 window
    subtasks instead of 2), each key group's count moves with it."""
    p, out = pipeline(tmp_path, name="resumed", rate=4_000)
    job = p.start(engine="threads")
    deadline = time.monotonic() + 60
    while job.driver is None or not job.driver.run.late_records().get("counts"):
        assert time.monotonic() < deadline, "no late record dropped in 60 s"
        time.sleep(0.05)
    savepoint = job.stop_with_savepoint(60)
    before = job.result(60).late_records["counts"]
    assert 0 < before < LATE
    p2, out2 = pipeline(tmp_path, name="resumed", parallelism=parallelism)
    drivers: list = []
    with caplog.at_level(logging.WARNING, logger="cutline"):
        result = p2.run(engine="threads", restore_from=savepoint, progress=False, timeout=120,
                        on_start=drivers.append)
    assert result.late_records == {"counts": LATE}
    window = _chain_of(JobView(drivers[0], "threads").snapshot(), "counts")
    assert {s["task"].rsplit(".", 1)[1]: s["late_records"] for s in window["subtasks"]} \
        == late_per_subtask(parallelism=parallelism)
    got = {(r.key, r.start): r.value for r in [*out.results(), *out2.results()]}
    assert got == expected_windows()


def test_on_late_fail_fails_at_once_naming_the_record(tmp_path):
    p, _ = pipeline(tmp_path, name="strict", on_late="fail")
    drivers: list = []
    t0 = time.monotonic()
    with pytest.raises(JobFailed) as info:
        p.run(engine="threads", on_start=drivers.append, progress=False, timeout=120)
    text = str(info.value)
    named = re.search(r"window operator 'counts' failed on record \('(k\d)', (\d+)\): "
                      r"LateRecordError: its time (\d+) is behind the watermark \d+ ", text)
    assert named, text
    key, ts = named.group(1), int(named.group(2))
    assert is_late(ts + BEHIND) and event(ts + BEHIND) == (key, ts)
    assert named.group(3) == str(ts)
    assert "on_late='fail'" in text and "allowed_lateness" in text and ".late()" in text
    assert drivers[0].run.attempts == 1
    assert time.monotonic() - t0 < 30


def test_on_late_is_checked_up_front(tmp_path):
    p, _ = pipeline(tmp_path)
    keyed = p.source(GeneratorSource(count=3, fn=event), uid="s").assign_timestamps(
        ts_of, uid="t").key_by(key_of)
    with pytest.raises(ValueError, match=r'window\(on_late=\.\.\.\) is "drop" .* got \'skip\''):
        keyed.window(tumbling(5), on_late="skip")
    strict = keyed.window(tumbling(5), on_late="fail").count(uid="strict")
    with pytest.raises(ValueError, match=r"\.late\(\) keeps late records"):
        strict.late()


def _columns(indices: np.ndarray) -> pa.RecordBatch:
    late = (indices >= LATE_FROM) & (indices % EVERY == 0)
    return pa.record_batch({"k": pa.array([f"k{i % KEYS}" for i in indices.tolist()]),
                            "ts": pa.array(np.where(late, indices - BEHIND, indices),
                                           pa.float64())})


@pytest.mark.parametrize("on_late", ["drop", "fail"])
def test_batch_windows_count_late_rows(tmp_path, on_late):
    p = Pipeline("rows", parallelism=2, checkpoint=CheckpointConfig(
        storage=f"file://{tmp_path}/chk", interval=0.2))
    out = CollectSink(str(tmp_path / "out"))
    (p.source(GeneratorSource(count=N, batch_fn=_columns, batch_rows=500), uid="events",
              parallelism=1)
     .assign_timestamps("ts", max_delay=2, uid="stamps", parallelism=1)
     .key_by("k").window(tumbling(WINDOW), on_late=on_late).count(uid="counts")
     .sink(out, uid="out"))
    drivers: list = []
    if on_late == "fail":
        with pytest.raises(JobFailed, match=r"window operator 'counts' failed on record "
                                            r"\{'k': 'k\d', 'ts': \d+\.0\}: LateRecordError: "
                                            r"its time \d+ is behind the watermark"):
            p.run(engine="threads", progress=False, timeout=120)
        return
    result = p.run(engine="threads", on_start=drivers.append, progress=False, timeout=120)
    assert result.late_records == {"counts": LATE}
    snap = JobView(drivers[0], "threads").snapshot()
    seen = {o["uid"]: o["records"] for o in snap["operators"]}
    # the source reads every row; the window operator gets the combine's partials (one per
    # key and window and flush: two-phase aggregation) and the rows it did not combine
    assert seen["events"] == N and 0 < seen["counts"] < N, seen
    rows = sum(b.num_rows for b in out.results())
    assert rows == len(expected_windows())


def test_warnings_are_rate_limited():
    w = LateWarnings({"w": 0.0}, every=30.0)

    def metrics(task: str, n: int, first: list | None = None) -> m.Metrics:
        return m.Metrics(task, 0, False, 0.0, late={"w": n},
                         first_late={"w": first} if first else None)

    totals = {"w": 3}
    lines = w.on_metrics(metrics("w.1", 3, [1_767_225_600.0, 1_767_225_660.0]), totals, 0.0)
    assert lines == [
        "cutline: window 'w' dropped a late record (subtask 1: time 2026-01-01 00:00:00.000, "
        "watermark 2026-01-01 00:01:00.000: its windows had all fired; 3 so far). To keep "
        "such records, raise window(..., allowed_lateness=...) or read them with .late(); "
        "window(..., on_late=\"fail\") fails the job instead. Drops are counted in "
        "JobResult.late_records, the live line, the dashboard and /metrics, and reported "
        "here at most every 30 s"]
    # another subtask's first drop: no second warning
    assert w.on_metrics(metrics("w.0", 1, [5.0, 9.0]), {"w": 4}, 1.0) == []
    assert w.tick({"w": 50}, 29.0) == []  # not 30 s yet
    assert w.tick({"w": 50}, 31.0) == [
        "cutline: window 'w' dropped 47 more late records in the last 31 s (50 in all)"]
    assert w.tick({"w": 50}, 70.0) == []  # nothing new
    assert w.summary({"w": 52}) == [
        "cutline: window 'w' dropped 52 late records in all (2 since the last report)"]
    assert w.summary({"w": 52}) == []
    # a Metrics message with the counts survives the codec
    msg = metrics("w.0", 7, [1.5, 2.5])
    assert m.decode(m.encode(msg)) == msg


# --------------------------------------------------------------------------- Spark


def test_late_records_on_spark_exactly_once_across_a_kill(spark, tmp_path, caplog, capsys):
    """On Spark, with a kill -9 of the slot of window subtask 1 at checkpoint 3: the
    restored count goes on and the replay counts no record twice."""
    p, out = pipeline(tmp_path, rate=4_000)
    with caplog.at_level(logging.WARNING, logger="cutline"):
        result = p.run(spark, faults=(("snapshot_write", 1, 3),), progress=False,
                       timeout=300)
    assert result.attempts == 2  # the kill happened
    assert result.late_records == {"counts": LATE}
    got = {(r.key, r.start): r.value for r in out.results()}
    assert got == expected_windows()
    first, _ = _warnings(caplog)
    assert len(first) == 1, first
    capsys.readouterr()
    assert main(["checkpoints", "show", result.latest_checkpoint.path, "--format", "json"]) == 0
    ops = {o["uid"]: o for o in json.loads(capsys.readouterr().out)["operators"]}
    assert ops["counts"]["late_records"] == LATE


def test_on_late_fail_on_spark_is_not_retried(spark, tmp_path):
    p, _ = pipeline(tmp_path, name="strict", on_late="fail")
    drivers: list = []
    t0 = time.monotonic()
    with pytest.raises(JobFailed, match=r"window operator 'counts' failed on record "
                                        r"\('k\d', \d+\): LateRecordError: its time \d+ is "
                                        r"behind the watermark"):
        p.run(spark, on_start=drivers.append, progress=False, timeout=300)
    assert drivers[0].run.attempts == 1  # fatal: no new attempt, no stage retry
    assert time.monotonic() - t0 < 60


# --------------------------------------------------------------------------- the page


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or \
        shutil.which("google-chrome")


@pytest.mark.skipif(_chromium() is None, reason="no headless Chromium here (apt-get install "
                                                "chromium): the page is not rendered")
def test_dashboard_shows_late_records_in_headless_chromium(tmp_path):
    p, _ = pipeline(tmp_path, n=40_000, rate=4_000, interval=0.5)
    job = p.start(engine="threads", dashboard=True)
    try:
        deadline = time.monotonic() + 60
        while job.driver is None or job.driver.run.dashboard_url is None or \
                job.driver.controller.checkpoints_completed < 3 or \
                not job.driver.run.late_records().get("counts"):
            assert time.monotonic() < deadline, "no late record dropped in 60 s"
            time.sleep(0.05)
        url = job.driver.run.dashboard_url
        browser = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu",
                   "--hide-scrollbars", "--virtual-time-budget=3000"]
        dom = subprocess.run([*browser, "--dump-dom", url], capture_output=True, text=True,
                             timeout=60).stdout
        png = tmp_path / "dashboard-late.png"
        subprocess.run([*browser, "--window-size=1280,1000", f"--screenshot={png}", url],
                       capture_output=True, timeout=60)
    finally:
        result = job.result(120)
    assert result.late_records == {"counts": sum(1 for i in range(40_000) if is_late(i))}
    # the header, the graph node and the subtask rows show the drops
    assert re.search(r'<span class="kv late" id="late-box">late records dropped <b id="late">'
                     r"[\d,]+</b></span>", dom), dom[:3000]
    assert re.search(r'<text [^>]*class="late">[\d,]+ late dropped</text>', dom)
    assert dom.count('<td class="late" title="counts: ') >= 1
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    keep = os.environ.get("CUTLINE_DASHBOARD_LATE_PNG")  # docs/dashboard-late.png is made so
    if keep:
        shutil.copy(png, keep)
