"""The dashboard after the job: ``history.jsonl`` beside the checkpoints, ``report.html`` written
when a run ends and rebuilt by ``cutline report JOB_DIR`` from storage alone (local files and
the s3 test server), opened in headless Chromium.

Every number in a report is checked against the run itself (``JobResult``, the checkpoint
directories on disk) or a plain Python computation (key-group partitioning, min/avg/max)."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest

from chromium import Browser, chromium
from cutline import CheckpointConfig, Pipeline
from cutline.cli import main
from cutline.connectors.collect import CollectSink
from cutline.connectors.generator import GeneratorSource
from cutline.driver.history import (
    HISTORY_FILE,
    HistoryFile,
    build_snapshot,
    compact,
    rebuild_report,
)
from cutline.driver.run import JobFailed
from cutline.state.keygroups import key_group, subtask_for_key_group

N = 6000
KEYS = 5


def _key(i: int) -> int:
    return i % KEYS


BOMB: dict = {"at": None}  # the first run's map fails on this record


def _check(i: int) -> int:
    if i == BOMB["at"]:
        raise ValueError(f"boom at record {i}")
    return i


def _pipeline(name: str, storage: str, *, interval: float = 0.1, rate: int = 6000,
              options: dict | None = None, out: str) -> Pipeline:
    p = Pipeline(name, parallelism=2, checkpoint=CheckpointConfig(
        storage=storage, interval=interval, storage_options=options))
    (p.source(GeneratorSource(count=N, rate=rate), uid="numbers")
     .map(_check)
     .key_by(_key).count(uid="counts")
     .sink(CollectSink(out, storage_options=options), uid="out"))
    return p


def embedded(html: str) -> dict:
    """The job data inside a report page."""
    m = re.search(r'<script id="cutline-job" type="application/json">(.*?)</script>', html,
                  re.S)
    assert m, "no data in the page"
    return json.loads(m.group(1))


def _same(a: dict, b: dict) -> None:
    """Two reports' data equal but for when each was written."""
    a, b = json.loads(json.dumps(a)), json.loads(json.dumps(b))
    a["report"].pop("written")
    b["report"].pop("written")
    assert a == b


def _records_per_task() -> dict[str, int]:
    per_counter = [0, 0]
    for i in range(N):
        per_counter[subtask_for_key_group(key_group(_key(i), 128), 2, 128)] += 1
    return {"numbers.0": N // 2, "numbers.1": N // 2, "counts.0": per_counter[0],
            "counts.1": per_counter[1]}


def _check_report(snap: dict, result, job_dir: Path) -> None:
    """A finished run's report: exact counts, every checkpoint as the run recorded it."""
    assert (snap["job"], snap["status"], snap["error"]) == (result.job, "finished", None)
    assert snap["source_records"] == N
    assert {s["task"]: s["records"] for o in snap["operators"]
            for s in o["subtasks"]} == _records_per_task()
    ck = snap["checkpoints"]
    records = {r.id: r for r in result.checkpoints}
    assert [h["id"] for h in ck["history"]] == sorted(records, reverse=True)
    assert ck["completed"] == result.checkpoints_completed == len(records) >= 3
    kept = {int(p.name[4:]) for p in job_dir.glob("chk-*")}
    assert len(kept) == 3  # retained=3
    for h in ck["history"]:
        r = records[h["id"]]
        assert (h["status"], h["bytes"], h["path"], h["attempt"], h["final"]) == (
            "completed", r.bytes, r.path, r.attempt, r.final)
        assert h["duration"] == pytest.approx(r.duration, abs=1e-9)
        assert h["type"] == ("final" if r.final else "aligned")
        assert (h["acked"], h["tasks_total"]) == (4, 4)
        assert h["kept"] == (h["id"] in kept)
        assert sorted(t["task"] for t in h["tasks"]) == sorted(_records_per_task())
        assert sum(t["bytes"] for t in h["tasks"]) == r.bytes
    assert ck["history"][0]["final"] and ck["latest"]["id"] == max(records)
    s = ck["summary"]
    durations = [r.duration for r in records.values()]
    sizes = [r.bytes for r in records.values()]
    assert s["count"] == len(records)
    assert s["duration"]["min"] == pytest.approx(min(durations))
    assert s["duration"]["max"] == pytest.approx(max(durations))
    assert s["duration"]["avg"] == pytest.approx(sum(durations) / len(durations))
    assert (s["bytes"]["min"], s["bytes"]["max"]) == (min(sizes), max(sizes))
    assert s["bytes"]["avg"] == pytest.approx(sum(sizes) / len(sizes))
    assert s["in_flight_bytes"] == {"min": 0, "avg": 0, "max": 0, "count": len(records)}
    c = snap["config"]
    assert (c["interval"], c["mode"], c["unaligned"], c["retained"], c["state_backend"],
            c["max_concurrent"], c["tolerable_failures"], c["timeout"]) == (
        0.1, "exactly_once", False, 3, "memory", 1, 0, 600.0)
    names = [(o["uid"], o["kind"], o["name"], o["named"])
             for n in snap["graph"]["nodes"] for o in n["operators"]]
    assert names == [("numbers", "source", "numbers", True),
                     ("map-1", "map", "Map: _check", False),
                     ("counts", "count", "counts", True), ("out", "sink", "out", True)]


def test_report_at_the_end_of_a_run_and_rebuilt_from_storage(tmp_path, capsys):
    BOMB["at"] = None
    p = _pipeline("rep", f"file://{tmp_path}/chk", out=str(tmp_path / "out"))
    result = p.run(engine="threads", timeout=120)
    job_dir = tmp_path / "chk" / "rep"
    assert result.report == str(job_dir / "report.html")
    assert f"cutline: report of job 'rep': {result.report}\n" in capsys.readouterr().err
    page = Path(result.report).read_text()
    assert "http" not in page.replace("http://www.w3.org/2000/svg", "")  # self-contained
    snap = embedded(page)
    _check_report(snap, result, job_dir)
    assert snap["report"]["source"] == "history"
    (run,) = snap["report"]["runs"]
    # the run's id is its lease's, which its log file is named by
    assert Path(run["log"]).is_file() and run["run"] in Path(run["log"]).name
    assert (run["status"], run["checkpoints"], run["first"], run["last"]) == (
        "finished", len(result.checkpoints), result.checkpoints[0].id,
        result.checkpoints[-1].id)
    events = [json.loads(x)["event"] for x in (job_dir / HISTORY_FILE).read_text().splitlines()]
    assert events == ["run", "attempt", *["checkpoint"] * len(result.checkpoints), "end"]
    # from storage alone, as often as asked: the same page
    assert main(["report", str(job_dir), "--out", str(tmp_path / "again.html")]) == 0
    assert capsys.readouterr().out == (f"report of job 'rep' (finished, "
                                       f"{len(result.checkpoints)} checkpoints): "
                                       f"{tmp_path / 'again.html'}\n")
    _same(embedded((tmp_path / "again.html").read_text()), snap)
    where, again = rebuild_report(f"file://{job_dir}")
    assert where == str(job_dir / "report.html")
    _same(again, snap)
    # a copy of the job directory elsewhere (from s3 to a laptop, say) reports the same
    copy = tmp_path / "elsewhere" / "rep"
    shutil.copytree(job_dir, copy)
    _, moved = rebuild_report(str(copy))
    assert [h["kept"] for h in moved["checkpoints"]["history"]] == [
        h["kept"] for h in snap["checkpoints"]["history"]]
    assert moved["report"]["job_dir"] == f"file://{copy}"


def test_report_after_a_failed_run_and_the_run_that_resumed_it(tmp_path):
    BOMB["at"] = 4000  # about 1.3 s into the run: several checkpoints before it
    p = _pipeline("twice", f"file://{tmp_path}/chk", rate=3000, out=str(tmp_path / "out"))
    with pytest.raises(JobFailed, match="boom at record 4000") as failure:
        p.run(engine="threads", timeout=120)
    job_dir = tmp_path / "chk" / "twice"
    assert failure.value.report == str(job_dir / "report.html")
    failed = embedded((job_dir / "report.html").read_text())
    assert failed["status"] == "failed" and "boom at record 4000" in failed["error"]
    first = [h["id"] for h in failed["checkpoints"]["history"]]
    assert first and failed["checkpoints"]["history"][0]["type"] == "aligned"
    BOMB["at"] = None
    result = p.run(engine="threads", timeout=120)
    # exactly once across the failure: the running counts of a failure-free run
    assert sorted(CollectSink(str(tmp_path / "out")).results()) == [
        (k, n) for k in range(KEYS) for n in range(1, N // KEYS + 1)]
    snap = embedded((job_dir / "report.html").read_text())
    assert snap["status"] == "finished"
    assert snap["restored_from"] == failed["checkpoints"]["latest"]["path"]
    assert [h["id"] for h in snap["checkpoints"]["history"]] == sorted(
        (r.id for r in result.checkpoints), reverse=True)
    assert min(h["id"] for h in snap["checkpoints"]["history"]) > max(first)
    newest, older = snap["report"]["runs"]
    assert (newest["status"], older["status"]) == ("finished", "failed")
    assert "boom at record 4000" in older["error"]
    assert (older["first"], older["last"], older["checkpoints"]) == (
        min(first), max(first), len(first))
    assert newest["restored_from"] == snap["restored_from"]


def test_report_from_what_storage_has_after_a_crash(tmp_path):
    """A driver killed before its last flush leaves no end line and misses its newest
    checkpoints: the report says so and takes them from their _metadata; with no history
    file at all, the report is what the retained checkpoints' _metadata hold."""
    BOMB["at"] = None
    p = _pipeline("crash", f"file://{tmp_path}/chk", out=str(tmp_path / "out"))
    result = p.run(engine="threads", timeout=120)
    job_dir = tmp_path / "chk" / "crash"
    history = job_dir / HISTORY_FILE
    lines = history.read_text().splitlines()
    assert json.loads(lines[-1])["event"] == "end"
    history.write_text("\n".join(lines[:-3]) + '\n{"event":"checkpoint","run":"x","id"')
    _, snap = rebuild_report(str(job_dir))
    assert snap["status"] == "unknown" and "no end of this run" in snap["error"]
    ids = [r.id for r in result.checkpoints]
    got = {h["id"]: h for h in snap["checkpoints"]["history"]}
    assert sorted(got) == ids  # the two lost lines: from their checkpoints' _metadata
    for n in ids[-2:]:
        assert got[n]["from_metadata"] and got[n]["duration"] is None
        assert got[n]["bytes"] == result.checkpoints[-1 if n == ids[-1] else -2].bytes
    assert got[ids[-1]]["type"] == "final"
    assert not any("from_metadata" in got[n] for n in ids[:-2])
    assert {s["records"] for o in snap["operators"] for s in o["subtasks"]} == {None}
    # an append after the torn line starts on a line of its own
    HistoryFile(_local_fs(), str(job_dir)).append([{"event": "attempt", "run": "y"}])
    assert HistoryFile(_local_fs(), str(job_dir)).read()[-1] == {"event": "attempt", "run": "y"}

    history.unlink()
    _, snap = rebuild_report(str(job_dir))
    assert snap["report"]["source"] == "metadata" and snap["status"] == "unknown"
    assert [h["id"] for h in snap["checkpoints"]["history"]] == ids[-3:][::-1]  # retained
    assert [n["uid"] for n in snap["graph"]["nodes"]] == ["numbers", "counts"]
    assert [o["name"] for n in snap["graph"]["nodes"] for o in n["operators"]] == [
        "numbers", "Map", "counts", "out"]
    assert snap["config"]["mode"] == "exactly_once"


def _local_fs():
    import fsspec

    return fsspec.filesystem("file")


def test_cli_report_names_what_is_wrong(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nothing")]) == 1
    assert f"no job directory at {tmp_path / 'nothing'}" in capsys.readouterr().err
    job = tmp_path / "root" / "myjob" / "chk-1"
    job.mkdir(parents=True)
    (job.parent / HISTORY_FILE).write_text('{"event":"run","run":"r"}\n')
    assert main(["report", str(tmp_path / "root")]) == 1
    err = capsys.readouterr().err
    assert "is not a cutline job directory" in err and "it holds the jobs myjob" in err


# ---------------------------------------------------------------------------- bounded


def _entry(n: int, tasks: int = 20) -> dict:
    return {"event": "checkpoint", "run": "r", "id": n, "status": "completed",
            "tasks": [{"task": f"t.{i}", "bytes": n} for i in range(tasks)]}


def test_compaction_keeps_the_newest(tmp_path):
    entries = [{"event": "run", "run": "old"}, {"event": "end", "run": "old"},
               {"event": "run", "run": "r"}]
    entries += [_entry(n) for n in range(1, 301)]
    entries += [{"event": "attempt", "run": "r", "number": a} for a in range(5)]
    out = compact(entries, runs=1, checkpoints=100, attempts=2, task_rows=10)
    assert [e["event"] for e in out][:1] == ["run"] and out[0]["run"] == "r"
    ids = [e["id"] for e in out if e["event"] == "checkpoint"]
    assert ids == list(range(201, 301))
    assert [e["id"] for e in out if "tasks" in e] == list(range(291, 301))
    assert [e["number"] for e in out if e["event"] == "attempt"] == [3, 4]


@pytest.mark.parametrize("where", ["local", "s3"])
def test_history_file_stays_bounded(tmp_path, where, request):
    if where == "local":
        fs, job_dir = _local_fs(), str(tmp_path / "job")
        os.makedirs(job_dir)
    else:
        s3 = request.getfixturevalue("s3")
        fs, job_dir = s3.fs(), s3.url("bounded").replace("s3://", "")
    limit = 40_000
    h = HistoryFile(fs, job_dir, max_bytes=limit)
    h.append([{"event": "run", "run": "r"}])
    for n in range(1, 401, 4):
        h.append([_entry(k) for k in range(n, n + 4)])
        assert fs.size(h.path) <= limit
    got = HistoryFile(fs, job_dir).read()
    ids = [e["id"] for e in got if e["event"] == "checkpoint"]
    assert got[0] == {"event": "run", "run": "r"} and ids == list(range(ids[0], 401))
    assert len(ids) > 40  # per-subtask rows went first
    assert [e["id"] for e in got if "tasks" in e] == ids[-len([e for e in got if "tasks" in e]):]


# ---------------------------------------------------------------------------- s3


def test_report_on_s3_written_at_the_end_and_rebuilt_by_the_cli(s3, tmp_path, monkeypatch,
                                                                capsys):
    BOMB["at"] = None
    storage = s3.url("report")
    p = _pipeline("s3rep", storage, options=s3.options, out=s3.url("out"))
    result = p.run(engine="threads", timeout=120)
    job_url = f"{storage}/s3rep"
    assert result.report == f"{job_url}/report.html"
    assert f"cutline: report of job 's3rep': {result.report}" in capsys.readouterr().err
    fs = s3.fs()
    snap = embedded(fs.cat_file(result.report).decode())
    assert snap["report"]["history_file"] == f"{job_url}/{HISTORY_FILE}"
    assert snap["status"] == "finished" and snap["source_records"] == N
    assert [h["id"] for h in snap["checkpoints"]["history"]] == sorted(
        (r.id for r in result.checkpoints), reverse=True)
    kept = sorted(int(p.rstrip("/").rsplit("-", 1)[-1]) for p in fs.ls(job_url)
                  if p.rstrip("/").rsplit("/", 1)[-1].startswith("chk-"))
    assert [h["id"] for h in snap["checkpoints"]["history"] if h["kept"]] == kept[::-1]
    for var, value in (("AWS_ENDPOINT_URL", s3.endpoint), ("AWS_ACCESS_KEY_ID", "testing"),
                       ("AWS_SECRET_ACCESS_KEY", "testing"), ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(var, value)
    out = tmp_path / "from-s3.html"
    assert main(["report", job_url, "--out", str(out)]) == 0
    _same(embedded(out.read_text()), snap)
    where, again = rebuild_report(job_url, s3.options)
    assert where == result.report
    _same(again, snap)


# ---------------------------------------------------------------------------- Chromium


@pytest.mark.skipif(chromium() is None, reason="no headless Chromium here (apt-get install "
                                               "chromium): the page is not rendered")
def test_report_in_headless_chromium_after_the_job(tmp_path):
    BOMB["at"] = None
    p = _pipeline("paged", f"file://{tmp_path}/chk", interval=0.05, rate=2000,
                  out=str(tmp_path / "out"))
    result = p.run(engine="threads", timeout=120)
    ids = sorted((r.id for r in result.checkpoints), reverse=True)
    assert len(ids) > 20, "the paging needs two pages"
    url = Path(result.report).as_uri()
    rows = ('[...document.querySelectorAll("#checkpoints tbody tr.ck")]'
            '.map(t => +t.dataset.id)')
    with Browser(1280, 1000) as b:
        b.open(url)
        b.wait('document.getElementById("job-name").textContent === "paged"')
        assert b.eval(rows) == ids[:20]
        assert b.eval('document.getElementById("status").className') == "badge finished"
        assert b.eval('document.getElementById("report").textContent').startswith(
            "Report of job paged after it ended (finished)")
        assert b.eval('document.getElementById("ck-completed").textContent') == str(len(ids))
        assert b.eval('document.querySelector("#config tr[data-key=retained] td:last-child")'
                      '.textContent') == "3"
        assert b.eval('document.querySelector("#checkpoint-stats tr[data-stat=bytes] '
                      'td:last-child").textContent').endswith(("B", "KiB"))
        b.eval('document.getElementById("older").click()')
        assert b.eval(rows) == ids[20:40]
        assert b.eval("location.hash") == f"#page=2&upto={ids[0]}"
        b.eval('document.querySelector("#checkpoints tbody tr.ck:nth-child(2)").click()')
        chosen = ids[21]
        assert b.eval('document.getElementById("detail-title").textContent') == \
            f"Subtasks of checkpoint #{chosen}"
        info = b.eval('document.getElementById("checkpoint-info").textContent')
        assert f"{tmp_path}/chk/paged/chk-{chosen}" in info and "(deleted by retention)" in info
        assert b.eval('document.querySelectorAll("#checkpoint-detail tbody tr").length') == 4
        assert "newer" in b.eval('document.getElementById("newer").textContent')
        # a link to it opens the same page and checkpoint
        b.open("about:blank")
        b.open(url + f"#page=2&upto={ids[0]}&checkpoint={chosen}")
        b.wait(f'{rows}.join() === "{",".join(map(str, ids[20:40]))}"')
        assert b.eval('document.querySelector("#checkpoints tr.sel").dataset.id') == str(chosen)
        b.eval('document.getElementById("newer").click()')
        assert b.eval(rows) == ids[:20] and b.eval("location.hash") == f"#checkpoint={chosen}"
        assert b.eval('document.querySelector("#runs tbody tr td:nth-child(4)").textContent') \
            == "finished"
        b.open("about:blank")
        b.open(url)
        b.wait('document.getElementById("job-name").textContent === "paged"')
        png = tmp_path / "report.png"
        b.screenshot(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    keep = os.environ.get("CUTLINE_REPORT_PNG")  # docs/dashboard-report.png is made so
    if keep:
        shutil.copy(png, keep)


def test_build_snapshot_with_nothing_is_empty_not_an_error():
    snap = build_snapshot([], [], "file:///x/job", None)
    assert snap["job"] == "job" and snap["checkpoints"]["history"] == []
    assert snap["graph"] == {"nodes": [], "edges": [], "sources": []}


def test_checkpoint_types():
    from cutline.driver.dashboard import checkpoint_type

    aligned = {"mode": "exactly_once", "unaligned": False}
    timeout = {"mode": "exactly_once", "unaligned": False, "aligned_timeout": 0.1}
    assert checkpoint_type(aligned) == "aligned"
    assert checkpoint_type(timeout, in_flight=3) == "unaligned"  # it timed out into unaligned
    assert checkpoint_type({"mode": "exactly_once", "unaligned": True}) == "unaligned"
    assert checkpoint_type({"mode": "at_least_once"}) == "at least once"
    assert checkpoint_type(aligned, savepoint=True, in_flight=3) == "savepoint"
    assert checkpoint_type(aligned, final=True) == "final"


def test_report_of_a_job_stopped_with_a_savepoint_and_of_a_cancelled_one(tmp_path):
    BOMB["at"] = None
    p = Pipeline("stopped", parallelism=2, checkpoint=CheckpointConfig(
        storage=f"file://{tmp_path}/chk", interval=0.1))
    (p.source(GeneratorSource(count=None, rate=2000), uid="numbers")
     .key_by(_key).count(uid="counts")
     .sink(CollectSink(str(tmp_path / "out")), uid="out"))
    job = p.start(engine="threads")
    while job.driver is None or job.driver.controller.checkpoints_completed < 3:
        time.sleep(0.02)
    savepoint = job.stop_with_savepoint(timeout=60)
    result = job.result(60)
    snap = embedded(Path(result.report).read_text())
    assert snap["status"] == "stopped" and savepoint in snap["error"]
    top = snap["checkpoints"]["history"][0]
    assert (top["type"], top["savepoint"], top["path"]) == ("savepoint", True, savepoint)
    assert snap["checkpoints"]["latest_savepoint"]["id"] == top["id"]
    assert all(h["type"] == "aligned" for h in snap["checkpoints"]["history"][1:])

    job = p.start(engine="threads", restore_from=savepoint)
    while job.driver is None or not job.driver.run.attempt.started:
        time.sleep(0.02)
    job.cancel()
    with pytest.raises(JobFailed, match="cancelled"):
        job.result(60)
    snap = embedded((tmp_path / "chk" / "stopped" / "report.html").read_text())
    assert snap["status"] == "cancelled" and snap["restored_from"] == savepoint
    assert [r["status"] for r in snap["report"]["runs"]] == ["cancelled", "stopped"]


KILLED_JOB = """
import sys
from cutline import CheckpointConfig, Pipeline
from cutline.connectors.collect import CollectSink
from cutline.connectors.generator import GeneratorSource

p = Pipeline("killed", parallelism=2, checkpoint=CheckpointConfig(
    storage="file://" + sys.argv[1] + "/chk", interval=0.1))
(p.source(GeneratorSource(count=None, rate=2000), uid="numbers")
 .key_by(lambda i: i % 5).count(uid="counts")
 .sink(CollectSink(sys.argv[1] + "/out"), uid="out"))
p.run(engine="threads")
"""


def test_post_mortem_of_a_driver_killed_with_sigkill(tmp_path):
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", KILLED_JOB, str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    job_dir = tmp_path / "chk" / "killed"
    history = job_dir / HISTORY_FILE
    try:
        deadline = time.monotonic() + 120
        while not history.exists() or history.read_text().count('"event":"checkpoint"') < 5:
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "no 5 checkpoints in the history in 120 s"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        proc.kill()
        proc.stderr.close()
    assert not (job_dir / "report.html").exists()  # the driver died before its end
    recorded = [json.loads(x)["id"] for x in history.read_text().splitlines()
                if '"event":"checkpoint"' in x]
    kept = sorted(int(p.name[4:]) for p in job_dir.glob("chk-*")
                  if (p / "_metadata").exists())
    assert main(["report", str(job_dir)]) == 0
    snap = embedded((job_dir / "report.html").read_text())
    assert snap["status"] == "unknown" and "killed" in snap["error"]
    ids = [h["id"] for h in snap["checkpoints"]["history"]]
    assert ids == sorted(set(recorded) | set(kept), reverse=True)
    assert {h["id"] for h in snap["checkpoints"]["history"] if h["kept"]} == set(kept)
    assert snap["checkpoints"]["summary"]["count"] == len(ids)
    assert [r["status"] for r in snap["report"]["runs"]] == ["unknown"]


def test_the_recorder_records_each_checkpoint_once_in_any_order(tmp_path):
    """With concurrent checkpoints one may complete after a newer one did: recorded all the
    same, once; what the driver forgets is not recorded again."""
    from types import SimpleNamespace as NS

    from cutline.driver.history import Recorder
    from cutline.storage.checkpoints import CheckpointStorage

    c = NS(attempt_log=[], checkpoints=[], failed_checkpoints=[])
    run = NS(storage=CheckpointStorage(str(tmp_path), "j"), job="j", controller=c,
             restored_from=None, stopped_with_savepoint=None)
    view = NS(driver=NS(run=run, run_log=None), run=run, engine="test", config={}, graph={},
              checkpoint_entry=lambda r, now, wall: {"id": r.id},
              failed_entry=lambda f, now, wall: {"id": f.id, "why": f.reason})
    rec = Recorder(view, every=3600)
    rec.start()
    try:
        c.attempt_log.append(NS(number=0, at=0.0, restored_from=None, after_failure=None))
        c.checkpoints.append(NS(id=8))
        rec.flush()
        c.checkpoints.append(NS(id=7))
        c.failed_checkpoints.append(NS(id=6, reason="declined"))
        rec.flush()
        del c.checkpoints[0]  # the driver forgot 8
        c.checkpoints.append(NS(id=9))
        rec.flush()
    finally:
        rec._stop.set()
    got = [(e["event"], e.get("id", e.get("number"))) for e in
           HistoryFile(run.storage.fs, run.storage.dir).read()]
    assert got == [("run", None), ("attempt", 0), ("checkpoint", 8), ("failed", 6),
                   ("checkpoint", 7), ("checkpoint", 9)]


def test_a_report_that_cannot_be_made_never_hides_the_run_s_outcome(tmp_path, caplog,
                                                                      monkeypatch):
    import cutline.driver.dashboard as dash

    BOMB["at"] = None

    def broken(*args, **kwargs):
        raise RuntimeError("the page is broken")

    monkeypatch.setattr(dash, "page", broken)
    p = _pipeline("nopage", f"file://{tmp_path}/chk", out=str(tmp_path / "out"))
    result = p.run(engine="threads", timeout=120)  # the run itself is fine
    assert result.report is None and result.checkpoints_completed >= 1
    assert "cannot write its report" in caplog.text and "the page is broken" in caplog.text
    assert sorted(CollectSink(str(tmp_path / "out")).results()) == [
        (k, n) for k in range(KEYS) for n in range(1, N // KEYS + 1)]
    monkeypatch.undo()
    assert main(["report", str(tmp_path / "chk" / "nopage")]) == 0  # later, from storage


def test_an_attempt_collected_when_a_checkpoint_changed_meanwhile_is_recorded(tmp_path):
    """A flush whose collection meets a record changing under it (RuntimeError: a dict
    changed size) tries again at the next flush; the attempt it had collected is recorded
    then (it was lost: the recorder had counted it as recorded)."""
    from types import SimpleNamespace as NS

    from cutline.driver.history import Recorder
    from cutline.storage.checkpoints import CheckpointStorage

    changing = [True]

    def checkpoint_entry(r, now, wall):
        if changing.pop() if changing else False:
            raise RuntimeError("dictionary changed size during iteration")
        return {"id": r.id}

    c = NS(attempt_log=[], checkpoints=[], failed_checkpoints=[])
    run = NS(storage=CheckpointStorage(str(tmp_path), "j"), job="j", controller=c,
             restored_from=None, stopped_with_savepoint=None)
    view = NS(driver=NS(run=run, run_log=None), run=run, engine="test", config={}, graph={},
              checkpoint_entry=checkpoint_entry,
              failed_entry=lambda f, now, wall: {"id": f.id, "why": f.reason})
    rec = Recorder(view, every=3600)
    rec.start()
    try:
        c.attempt_log.append(NS(number=0, at=0.0, restored_from=None, after_failure=None))
        c.checkpoints.append(NS(id=1))
        rec.flush()  # the checkpoint's record changes while read: nothing written
        rec.flush()
    finally:
        rec._stop.set()
    got = [(e["event"], e.get("id", e.get("number"))) for e in
           HistoryFile(run.storage.fs, run.storage.dir).read()]
    assert got == [("run", None), ("attempt", 0), ("checkpoint", 1)]
