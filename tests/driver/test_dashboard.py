"""The live dashboard: its JSON and Prometheus endpoints scraped during real runs (threads and
Spark) and checked against exact counts, its token, and the page in headless Chromium.

A job is held open at its final checkpoint by :class:`GateSink` (its commit waits for a
file): then every task has drained and reported its final counts, checkpoint 1 is committed,
and the numbers are exact while the dashboard still serves."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from cutline import CheckpointConfig, Pipeline, tumbling
from cutline.connectors.collect import CollectSink, CollectWriter
from cutline.connectors.generator import GeneratorSource
from cutline.driver.dashboard import DASHBOARD_ENV, dashboard_port
from cutline.state.keygroups import key_group, subtask_for_key_group

N = 600  # records of the exact runs
KEYS = 5


class GateSink(CollectSink):
    """A CollectSink whose commits wait until the file ``release`` exists (at most 60 s)."""

    def __init__(self, path: str, release: str) -> None:
        super().__init__(path)
        self.release = release

    def create_writer(self) -> CollectWriter:
        return _GateWriter(self)


class _GateWriter(CollectWriter):
    def commit(self, handles: list) -> None:
        deadline = time.monotonic() + 60
        while not os.path.exists(self._sink.release) and time.monotonic() < deadline:
            time.sleep(0.02)
        super().commit(handles)


def _key(i: int) -> int:
    return i % KEYS


def _exact_pipeline(name: str, tmp_path: Path) -> tuple[Pipeline, Path]:
    release = tmp_path / "release"
    p = Pipeline(name, parallelism=2, checkpoint=CheckpointConfig(
        storage=f"file://{tmp_path}/chk", interval=600))  # the final checkpoint only
    (p.source(GeneratorSource(count=N), uid="numbers")
     .key_by(_key).count(uid="counts")
     .sink(GateSink(str(tmp_path / "out"), str(release)), uid="out"))
    return p, release


def _get(url: str, headers: dict | None = None) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}),
                                    timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _api(url: str) -> dict:
    status, body = _get(url.replace("/?", "/api/job?"))
    assert status == 200, body
    return json.loads(body)


def _wait_for(url: str, done, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        job = _api(url)
        if done(job):
            return job
        assert time.monotonic() < deadline, f"dashboard never showed it: {job}"
        time.sleep(0.05)


def _url_of(job) -> str:
    """A started job's dashboard URL, once it serves."""
    deadline = time.monotonic() + 30
    while job.driver is None or job.driver.run.dashboard_url is None:
        assert time.monotonic() < deadline, "the job's dashboard never started"
        time.sleep(0.01)
    return job.driver.run.dashboard_url


def _prometheus(text: str) -> dict[str, float]:
    """``name{labels}`` -> value of a Prometheus text exposition."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def _check_held_job(url: str, job_name: str, tmp_path: Path, engine: str) -> dict:
    """The job holds at its final checkpoint: JSON and /metrics give exact counts."""
    job = _wait_for(url, lambda j: j["checkpoints"]["completed"] == 1)
    status, text = _get(url.replace("/?", "/metrics?"))
    assert status == 200
    prom = _prometheus(text.decode())
    per_counter = [0, 0]
    for i in range(N):
        per_counter[subtask_for_key_group(key_group(_key(i), 128), 2, 128)] += 1
    want = {"numbers.0": N // 2, "numbers.1": N // 2,
            "counts.0": per_counter[0], "counts.1": per_counter[1]}
    assert {s["task"]: s["records"] for o in job["operators"] for s in o["subtasks"]} == want
    for task, n in want.items():
        op = task.split(".")[0]
        assert prom[f'cutline_task_records_in_total{{job="{job_name}",operator="{op}",'
                    f'task="{task}"}}'] == n
    assert job["source_records"] == N
    assert prom[f'cutline_source_records_total{{job="{job_name}"}}'] == N
    assert (job["status"], job["attempt"], job["restarts"]) == ("running", 0, 0)
    assert job["engine"].startswith(engine)
    assert [a["number"] for a in job["attempts"]] == [0]
    assert {n["uid"]: n["depth"] for n in job["graph"]["nodes"]} == {
        "numbers": 0, "counts": 1}
    assert [(e["src"], e["dst"], e["partitioning"]) for e in job["graph"]["edges"]] == [
        ("numbers", "counts", "hash")]
    assert [o["uid"] for n in job["graph"]["nodes"] for o in n["operators"]] == [
        "numbers", "counts", "out"]
    # checkpoint 1, the final one, as committed: its state files' sizes, per task
    (ck,) = job["checkpoints"]["history"]
    assert (ck["id"], ck["status"], ck["final"], ck["attempt"]) == (1, "completed", True, 0)
    # bytes written: the state file, and the keyed state's files in shared/ (the in-memory
    # backend's incremental snapshots, under its operator's "<uid>.<subtask>")
    job_dir = tmp_path / "chk" / job_name
    files = sorted(f.stat().st_size + sum(x.stat().st_size for x in
                                          (job_dir / "shared" / f.stem).glob("1-*"))
                   for f in (job_dir / "chk-1").glob("*.state"))
    assert sorted(t["bytes"] for t in ck["tasks"]) == files
    assert ck["bytes"] == sum(files) > sum(f.stat().st_size
                                           for f in (job_dir / "chk-1").glob("*.state"))
    assert [t["task"] for t in ck["tasks"]] == sorted(want)
    assert (ck["in_flight"], ck["in_flight_bytes"]) == (0, 0)  # aligned: no channel state
    for t in ck["tasks"]:
        assert 0 <= t["sync"] and 0 <= t["async"] and 0 <= t["alignment"]
        assert t["end_to_end"] <= ck["duration"] + 1e-6
    label = f'{{job="{job_name}"}}'
    assert prom[f"cutline_checkpoints_completed_total{label}"] == 1
    assert prom[f"cutline_checkpoints_failed_total{label}"] == 0
    assert prom[f"cutline_last_checkpoint_id{label}"] == 1
    assert prom[f"cutline_last_checkpoint_size_bytes{label}"] == sum(files)
    assert prom[f"cutline_job_restarts_total{label}"] == 0
    assert prom[f"cutline_job_running{label}"] == 1
    assert sorted(v for k, v in prom.items()
                  if k.startswith("cutline_last_checkpoint_task_size_bytes")) == files
    return job


def test_threads_run_exact_counts_and_token(tmp_path, capsys):
    p, release = _exact_pipeline("dash-threads", tmp_path)
    job = p.start(engine="threads", dashboard=True)
    try:
        url = _url_of(job)
        _check_held_job(url, "dash-threads", tmp_path, "threads")
        base, token = url.split("/?token=")
        for path in ("/", "/api/job", "/metrics", "/nothing"):
            assert _get(base + path)[0] == 403  # a stranger
            assert _get(f"{base}{path}?token=x{token}")[0] == 403
        assert _get(base + "/metrics", {"Authorization": f"Bearer {token}"})[0] == 200
        assert _get(f"{base}/nothing?token={token}")[0] == 404
        status, page = _get(url)
        assert status == 200 and b'id="checkpoint-detail"' in page
        assert "http" not in page.decode().replace("http://www.w3.org/2000/svg", "")  # no CDN
    finally:
        release.touch()
    result = job.result(60)
    assert [c.id for c in result.checkpoints] == [1]
    assert sorted(GateSink(str(tmp_path / "out"), "").results()) == [
        (k, n) for k in range(KEYS) for n in range(1, N // KEYS + 1)]  # running counts
    err = capsys.readouterr().err
    assert f"cutline: dashboard of job 'dash-threads': {url}" in err
    # the server is gone with the job
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url, timeout=5)


def test_spark_run_exact_counts(spark, tmp_path):
    p, release = _exact_pipeline("dash-spark", tmp_path)
    seen: dict = {}

    def watch(driver) -> None:
        def main() -> None:
            try:
                seen["job"] = _check_held_job(driver.run.dashboard_url, "dash-spark", tmp_path,
                                              "spark local")
            except BaseException as exc:  # noqa: BLE001 - reported below
                seen["error"] = exc
            finally:
                release.touch()
        threading.Thread(target=main, daemon=True).start()

    result = p.run(spark, dashboard=True, on_start=watch, timeout=120)
    if "error" in seen:
        raise seen["error"]
    assert [c.id for c in result.checkpoints] == [1]
    assert seen["job"]["operators"][0]["subtasks"][0]["records"] == N // 2
    # the page after the job: the same counts, in the job directory
    from test_dashboard_report import embedded

    assert result.report == str(tmp_path / "chk" / "dash-spark" / "report.html")
    report = embedded(Path(result.report).read_text())
    assert report["status"] == "finished" and report["engine"].startswith("spark local")
    assert [(o["uid"], o["records"]) for o in report["operators"]] == [
        (o["uid"], o["records"]) for o in seen["job"]["operators"]]
    assert [h["id"] for h in report["checkpoints"]["history"]] == [1]


def test_dashboard_option(monkeypatch):
    monkeypatch.delenv(DASHBOARD_ENV, raising=False)
    monkeypatch.setenv("CI", "true")
    assert dashboard_port(None) is None  # like the progress line: not in CI
    assert dashboard_port(True) == 0 and dashboard_port(8123) == 8123
    assert dashboard_port(False) is None
    for env, port in (("1", 0), ("0", None), ("9000", 9000), ("off", None)):
        monkeypatch.setenv(DASHBOARD_ENV, env)
        assert dashboard_port(None) == port
        assert dashboard_port(False) is None  # the argument wins
    monkeypatch.setenv(DASHBOARD_ENV, "maybe")
    with pytest.raises(ValueError, match="CUTLINE_DASHBOARD must be 1, 0 or a port"):
        dashboard_port(None)
    with pytest.raises(ValueError, match="dashboard= must be True, False, None or a port"):
        dashboard_port(70000)


# ---------------------------------------------------------------------------- the page

def _slow(record):
    time.sleep(0.0004)  # 2,500 records/s per subtask: slower than the source
    return record


def _reading(i: int) -> dict:
    return {"sensor": f"s{i % 4}", "t": 1_767_225_600 + i * 0.05, "v": i % 10}


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or \
        shutil.which("google-chrome")


@pytest.mark.skipif(_chromium() is None, reason="no headless Chromium here (apt-get install "
                                                "chromium): the page is not rendered")
def test_page_in_headless_chromium(tmp_path):
    p = Pipeline("sensors", parallelism=2, checkpoint=CheckpointConfig(
        storage=f"file://{tmp_path}/chk", interval=0.3, unaligned=True))
    (p.source(GeneratorSource(count=None, rate=8000, fn=_reading), uid="readings")
     .assign_timestamps(lambda r: r["t"], max_delay=1, uid="timestamps")
     .rebalance().map(_slow, uid="slow", parallelism=2)
     .key_by(lambda r: r["sensor"]).window(tumbling(5)).count()
     .sink(CollectSink(str(tmp_path / "out")), uid="out"))
    job = p.start(engine="threads", dashboard=True)
    try:
        url = _url_of(job)
        state = _wait_for(url, lambda j: j["checkpoints"]["completed"] >= 3 and any(
            o["uid"] == "readings" and o["backpressure"] > 0.5 for o in j["operators"]) and any(
            h.get("in_flight_bytes") for h in j["checkpoints"]["history"]))
        # unaligned barriers overtook the backpressured buffers: persisted in flight
        for h in state["checkpoints"]["history"]:
            if h["status"] == "completed":
                assert (h["type"], h["acked"], h["tasks_total"]) == ("unaligned", 6, 6)
                assert h["in_flight"] == sum(t["in_flight"] for t in h["tasks"])
                assert h["in_flight_bytes"] == sum(t["in_flight_bytes"] for t in h["tasks"])
                assert (h["in_flight"] == 0) == (h["in_flight_bytes"] == 0)
        ops = {o["uid"]: o for o in state["operators"]}
        assert ops["slow"]["backpressure"] < 0.5 < ops["readings"]["backpressure"]
        assert ops["slow"]["records_per_s"] > 0
        assert state["watermark_text"].startswith("2026-01-01 ")
        browser = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu",
                   "--hide-scrollbars", "--virtual-time-budget=4000"]
        dom = subprocess.run([*browser, "--dump-dom", url], capture_output=True, text=True,
                             timeout=60).stdout
        png = tmp_path / "dashboard.png"
        subprocess.run([*browser, "--window-size=1280,2000", f"--screenshot={png}", url],
                       capture_output=True, timeout=60)
    finally:
        job.cancel()
    with pytest.raises(Exception, match="cancelled"):
        job.result(60)
    # the page as rendered: header, graph, operators, checkpoints, subtasks, attempts
    assert '<span id="job-name">sensors</span>' in dom
    assert 'class="badge running"' in dom
    for uid in ("readings", "slow"):
        assert f'data-uid="{uid}"' in dom
    assert dom.count('class="node bp-high"') >= 1  # the source, backpressured
    assert "watermark 2026-01-01 " in dom
    for task in ("readings.0", "readings.1", "slow.0", "slow.1"):
        assert f'<tr data-task="{task}">' in dom
    assert dom.count('class="l st-completed"') >= 3
    assert 'id="detail-title">Subtasks of checkpoint #' in dom
    detail = dom.split('id="checkpoint-detail"', 1)[1].split("</table>", 1)[0]
    assert detail.count("<tr data-task=") == sum(o["parallelism"] for o in state["operators"])
    assert '<div id="ended"></div>' in dom  # the driver answered every poll
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    keep = os.environ.get("CUTLINE_DASHBOARD_PNG")  # docs/dashboard.png is made so
    if keep:
        shutil.copy(png, keep)


TIMER_KEYS = 50
FAR = 4_000_000_000.0  # processing time in 2096: never due while the test runs


def _hold_a_timer(ctx, record):
    ctx.timers.register_processing_time(FAR)  # one timer per key, however often registered
    return ()


def _never(ctx, key, when):
    return ()


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
def test_pending_timers_per_operator_and_subtask(tmp_path, backend):
    p = Pipeline("timers", parallelism=2, checkpoint=CheckpointConfig(
        storage=f"file://{tmp_path}/chk", interval=0.5, state_backend=backend))
    (p.source(GeneratorSource(count=None, rate=2000), uid="numbers")
     .key_by(lambda i: i % TIMER_KEYS).process(_hold_a_timer, on_timer=_never, uid="hold")
     .sink(CollectSink(str(tmp_path / "out")), uid="out"))
    job = p.start(engine="threads", dashboard=True)
    want = [0, 0]
    for k in range(TIMER_KEYS):
        want[subtask_for_key_group(key_group(k, 128), 2, 128)] += 1
    try:
        url = _url_of(job)
        state = _wait_for(url, lambda j: any(
            o["uid"] == "hold" and o["timers"] == TIMER_KEYS for o in j["operators"]))
        prom = _prometheus(_get(url.replace("/?", "/metrics?"))[1].decode())
    finally:
        job.cancel()
    with pytest.raises(Exception, match="cancelled"):
        job.result(60)
    hold = next(o for o in state["operators"] if o["uid"] == "hold")
    assert [s["timers"] for s in hold["subtasks"]] == want
    assert all(s["timers"] == 0 for o in state["operators"] if o["uid"] != "hold"
               for s in o["subtasks"])
    for i in range(2):
        assert prom[f'cutline_task_timers{{job="timers",operator="hold",task="hold.{i}"}}'] \
            == want[i]


# ---------------------------------------------------------------------------- Flink's tab


def _parse(record):
    return record


def test_operator_names_from_uids():
    from cutline import tumbling
    from cutline.driver.dashboard import _graph
    from cutline.plan import plan

    p = Pipeline("names", parallelism=1)
    stamped = (p.source(GeneratorSource(count=1), uid="readings")
               .assign_timestamps(lambda r: r, max_delay=1))
    (stamped.map(_parse).rebalance().map(lambda r: r).key_by(lambda r: r)
     .window(tumbling(5)).count().sink(CollectSink("/nonexistent/a")))
    (stamped.key_by(lambda r: r).window(tumbling(60, offset=5)).sum(lambda r: r,
                                                                    uid="per_key")
     .sink(CollectSink("/nonexistent/b"), uid="totals"))
    graph = _graph(plan(p))
    ops = {o["uid"]: (o["kind"], o["name"], o["named"])
           for n in graph["nodes"] for o in n["operators"]}
    assert ops == {
        "readings": ("source", "readings", True),
        "assign_timestamps-1": ("assign_timestamps", "Timestamps", False),
        "map-2": ("map", "Map: _parse", False),
        "map-3": ("map", "Map", False),
        "window-4": ("window", "Window: tumbling 5 s, count", False),
        # the windows run in two phases: each one's combine, named after it
        "window-4.combine": ("combine", "Window: tumbling 5 s, count (local half)", False),
        "per_key.combine": ("combine", "per_key (local half)", True),
        "window_results-5": ("window_results", "Window results", False),
        "sink-6": ("sink", "Sink: CollectSink", False),
        "per_key": ("window", "per_key", True),
        "window_results-8": ("window_results", "per_key: results", False),
        "totals": ("sink", "totals", True)}
    node = next(n for n in graph["nodes"] if n["uid"] == "window-4")
    assert node["name"] == "Window: tumbling 5 s, count → Window results → Sink: CollectSink"


def test_checkpoint_history_paged_with_configuration_and_summary(tmp_path):
    cfg = CheckpointConfig(storage=f"file://{tmp_path}/chk", interval=0.05, retained=2,
                           min_pause=0.01, max_concurrent=1, tolerable_failures=3,
                           timeout=30)
    p = Pipeline("paged-live", parallelism=2, checkpoint=cfg)
    (p.source(GeneratorSource(count=None, rate=2000), uid="numbers")
     .key_by(_key).count(uid="counts")
     .sink(CollectSink(str(tmp_path / "out")), uid="out"))
    job = p.start(engine="threads", dashboard=True)
    try:
        url = _url_of(job)
        _wait_for(url, lambda j: j["checkpoints"]["completed"] >= 45, timeout=120)
        api = url.replace("/?", "/api/job?")
        first = json.loads(_get(api + "&limit=20")[1])
        ck = first["checkpoints"]
        top = ck["history"][0]["id"]
        second = json.loads(_get(api + f"&limit=20&offset=20&upto={top}")[1])["checkpoints"]
        time.sleep(0.3)  # more checkpoints complete: the page holds still
        again = json.loads(_get(api + f"&limit=20&offset=20&upto={top}&checkpoint={top - 30}"
                                )[1])["checkpoints"]
        everything = json.loads(_get(api + "&limit=1000")[1])
        bad = _get(api + "&offset=x")
    finally:
        job.cancel()
    with pytest.raises(Exception, match="cancelled"):
        job.result(60)
    ids = [h["id"] for h in ck["history"]] + [h["id"] for h in second["history"]]
    assert len(ids) == 40 and len(set(ids)) == 40 and ids == sorted(ids, reverse=True)
    assert [h["id"] for h in again["history"]] == [h["id"] for h in second["history"]]
    assert again["newer"] > second["newer"] >= 0 and again["upto"] == top
    assert again["selected"]["id"] == top - 30 and len(again["selected"]["tasks"]) == 4
    assert ck["selected"] is None and ck["latest"]["id"] == top
    history = everything["checkpoints"]["history"]
    done = [h for h in history if h["status"] == "completed"]
    assert everything["checkpoints"]["total"] == len(history) >= 45
    for h in done:
        assert (h["type"], h["acked"], h["tasks_total"]) == ("aligned", 4, 4)
        assert h["path"] == f"file://{tmp_path}/chk/paged-live/chk-{h['id']}"
    # Flink's summary: min / avg / max over what the driver remembers, as Python says
    summary = everything["checkpoints"]["summary"]
    for key in ("duration", "bytes", "in_flight_bytes", "alignment"):
        values = [h[key] for h in done]
        assert summary[key]["min"] == pytest.approx(min(values))
        assert summary[key]["max"] == pytest.approx(max(values))
        assert summary[key]["avg"] == pytest.approx(sum(values) / len(values))
    assert summary["count"] == len(done)
    c = everything["config"]
    assert {k: c[k] for k in ("interval", "mode", "unaligned", "aligned_timeout", "timeout",
                              "min_pause", "max_concurrent", "tolerable_failures",
                              "retained", "storage", "state_backend", "max_parallelism",
                              "job_dir")} == {
        "interval": 0.05, "mode": "exactly_once", "unaligned": False,
        "aligned_timeout": None, "timeout": 30, "min_pause": 0.01, "max_concurrent": 1,
        "tolerable_failures": 3, "retained": 2, "storage": f"file://{tmp_path}/chk",
        "state_backend": "memory", "max_parallelism": 128,
        "job_dir": f"file://{tmp_path}/chk/paged-live"}
    assert bad == (400, b"offset must be a whole number >= 0, got 'x'\n")


@pytest.mark.skipif(_chromium() is None, reason="no headless Chromium here")
def test_live_pages_hold_still_in_headless_chromium(tmp_path):
    from chromium import Browser

    p = Pipeline("paging", parallelism=2, checkpoint=CheckpointConfig(
        storage=f"file://{tmp_path}/chk", interval=0.05))
    (p.source(GeneratorSource(count=None, rate=2000), uid="numbers")
     .key_by(_key).count(uid="counts")
     .sink(CollectSink(str(tmp_path / "out")), uid="out"))
    job = p.start(engine="threads", dashboard=True)
    rows = ('[...document.querySelectorAll("#checkpoints tbody tr.ck")]'
            '.filter(t => !t.querySelector(".st-progress")).map(t => +t.dataset.id)')
    try:
        url = _url_of(job)
        _wait_for(url, lambda j: j["checkpoints"]["completed"] >= 45, timeout=120)
        with Browser(1280, 1000) as b:
            b.open(url)
            b.wait(f"{rows}.length === 20")
            top = b.eval(rows)[0]
            b.eval('document.getElementById("older").click()')
            b.wait(f"{rows}.length === 20 && {rows}[0] < {top}")
            page2 = b.eval(rows)
            assert b.eval("location.hash").startswith("#page=2&upto=")
            b.wait('document.getElementById("page-text").textContent.includes("newer since")')
            assert b.eval(rows) == page2  # checkpoints completed meanwhile; the page held
            b.eval('document.querySelector("#checkpoints tbody tr.ck:nth-child(5)").click()')
            b.wait(f'document.getElementById("detail-title").textContent === '
                   f'"Subtasks of checkpoint #{page2[4]}"')
            b.wait('document.querySelectorAll("#checkpoint-detail tbody tr").length === 4')
            b.eval('document.getElementById("newer").click()')
            b.wait(f"{rows}[0] > {top}")  # page 1 is live again
            job.cancel()
            with pytest.raises(Exception, match="cancelled"):
                job.result(60)
            # the server is gone with the job: the page says where its report is
            banner = b.wait('document.getElementById("ended").textContent')
            assert banner.startswith("The job is over: no answer from the driver")
            assert f"file://{tmp_path}/chk/paging/report.html" in banner
            assert (tmp_path / "chk" / "paging" / "report.html").is_file()
    finally:
        job.cancel()


def test_a_failed_checkpoint_shows_how_many_subtasks_had_acknowledged_it():
    from cutline.driver.dashboard import failed_entry, summarize
    from cutline.protocol import messages as m
    from cutline.protocol.coordinator import CheckpointPolicy
    from cutline.protocol.job import JobController, JobShape

    tasks = ("src.0", "src.1", "sink.0", "sink.1")
    slot_of = {"src.0": 0, "sink.0": 0, "src.1": 1, "sink.1": 1}
    c = JobController(JobShape(tasks=tasks, sources=frozenset({"src.0", "src.1"}),
                               slot_of=slot_of, slots=2),
                      CheckpointPolicy(interval=1.0, tolerable_failures=5), job="j",
                      restore=None, first_id=1)
    for slot in (0, 1):
        c.on_message(f"s{slot}", m.Register(slot, 100 + slot, {
            t: None for t in tasks if slot_of[t] == slot}), 0.0)
    c.tick(1.0)  # checkpoint 1 triggered
    for t in ("src.1", "sink.1"):
        c.on_message("s1", m.Ack(t, 1, m.SnapshotStats(bytes=1)), 1.2)
    c.on_message("s0", m.Decline("src.0", 1, "no space"), 1.5)
    (f,) = c.failed_checkpoints
    entry = failed_entry(f, 2.0, 1000.0, {"mode": "exactly_once", "unaligned": True}, 4)
    assert {k: entry[k] for k in ("id", "status", "acked", "tasks_total", "type")} == {
        "id": 1, "status": "failed", "acked": 2, "tasks_total": 4, "type": "unaligned"}
    assert entry["duration"] == pytest.approx(0.5) and "no space" in entry["reason"]
    assert entry["triggered"] == pytest.approx(999.0)
    assert summarize([entry]) == {"count": 0, "duration": None, "bytes": None,
                                  "in_flight_bytes": None, "alignment": None}


def test_a_uid_that_looks_made_up_but_was_given_is_the_name():
    from cutline.driver.dashboard import _graph
    from cutline.plan import plan

    p = Pipeline("given", parallelism=1)
    p.source(GeneratorSource(count=1), uid="source-0").map(_parse, uid="map-9").sink(
        CollectSink("/nonexistent/c"))
    ops = [(o["uid"], o["name"], o["named"])
           for n in _graph(plan(p))["nodes"] for o in n["operators"]]
    assert ops == [("source-0", "source-0", True), ("map-9", "map-9", True),
                   ("sink-2", "Sink: CollectSink", False)]
