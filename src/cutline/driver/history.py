"""A job's history beside its checkpoints, and the post-mortem report built from it.

While a job runs, a :class:`Recorder` (a thread of the driver) appends what the dashboard's
checkpoint tab shows to ``<job dir>/history.jsonl``, one JSON object a line:

Each has ``event`` and ``run`` (the run's id):

* ``run``: a run started (its id, engine, configuration, job graph);
* ``attempt``: an attempt of it started (from which checkpoint, after which failure);
* ``checkpoint`` / ``failed``: a checkpoint completed (its type, duration, sizes, path,
  per-subtask rows) or was aborted (why, acknowledgements);
* ``end``: the run ended (finished, failed, cancelled ...; the operators' final counts).

Local files are appended to (every second); object stores have no append, so the file is
rewritten whole (every 10 s).  It is bounded: past :data:`MAX_BYTES` it is rewritten with
the newest :data:`MAX_RUNS` runs, :data:`MAX_CHECKPOINTS` checkpoints and
:data:`MAX_ATTEMPTS` attempts, per-subtask rows for the newest :data:`TASK_ROWS`
checkpoints only.

When the run ends, the dashboard's page is written as a static report,
``<job dir>/report.html``: the page with the job's data inside it (no server, no network),
built by :func:`build_snapshot` from the history file and the checkpoints' ``_metadata``,
as ``cutline report JOB_DIR`` rebuilds it later from storage alone.  Without a history
file (it was deleted, or the job ran before there was one) the report shows what the
retained checkpoints' ``_metadata`` hold.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import sys
import threading
import time
from collections.abc import Iterable
from typing import Any

from ..storage.checkpoints import CheckpointStorage, CheckpointStorageError
from ..storage.fs import url_to_fs
from . import dashboard as _dash

log = logging.getLogger("cutline.history")

__all__ = ["HISTORY_FILE", "REPORT_FILE", "HistoryFile", "Recorder", "build_snapshot",
           "compact", "rebuild_report", "start_recording"]

HISTORY_FILE = "history.jsonl"
REPORT_FILE = "report.html"
MAX_BYTES = 4 << 20   # a history file past this is compacted
MAX_RUNS = 50         # runs kept by a compaction (the newest)
MAX_CHECKPOINTS = 1000  # checkpoint and failed-checkpoint lines kept (the newest)
MAX_ATTEMPTS = 1000   # attempt lines kept (the newest)
TASK_ROWS = 100       # checkpoint lines that keep their per-subtask rows (the newest)
LOCAL_EVERY = 1.0     # seconds between appends to a local history file
REMOTE_EVERY = 10.0   # seconds between rewrites of one on an object store


def _is_local(fs: Any) -> bool:
    protocols = {fs.protocol} if isinstance(fs.protocol, str) else set(fs.protocol)
    return bool(protocols & {"file", "local"})


def compact(entries: list[dict[str, Any]], *, runs: int = MAX_RUNS,
            checkpoints: int = MAX_CHECKPOINTS, attempts: int = MAX_ATTEMPTS,
            task_rows: int = TASK_ROWS) -> list[dict[str, Any]]:
    """``entries`` bounded: the newest ``runs`` runs' lines, of them the newest
    ``checkpoints`` checkpoint lines (completed and failed) and ``attempts`` attempt lines,
    per-subtask rows on the newest ``task_rows`` completed ones only; order kept."""
    run_ids = [e.get("run") for e in entries if e.get("event") == "run"]
    keep_runs = set(run_ids[-runs:]) if runs else set()
    mine = [e for e in entries if e.get("run") in keep_runs]
    cks = [i for i, e in enumerate(mine) if e.get("event") in ("checkpoint", "failed")]
    ats = [i for i, e in enumerate(mine) if e.get("event") == "attempt"]
    drop = set(cks[:max(0, len(cks) - checkpoints)]) | set(ats[:max(0, len(ats) - attempts)])
    out = [e for i, e in enumerate(mine) if i not in drop]
    done = [i for i, e in enumerate(out) if e.get("event") == "checkpoint" and "tasks" in e]
    for i in done[:max(0, len(done) - task_rows)]:
        out[i] = {k: v for k, v in out[i].items() if k != "tasks"}
    return out


def _lines(entries: Iterable[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(e, default=str, separators=(",", ":")).encode() + b"\n"
                    for e in entries)


class HistoryFile:
    """``<job dir>/history.jsonl`` on any fsspec filesystem (``job_dir``: its path there)."""

    def __init__(self, fs: Any, job_dir: str, max_bytes: int = MAX_BYTES) -> None:
        self.fs, self.path, self.max_bytes = fs, f"{job_dir.rstrip('/')}/{HISTORY_FILE}", max_bytes
        self.local = _is_local(fs)
        self._size: int | None = None  # local: the file's size as far as we wrote it
        self._entries: list[dict[str, Any]] | None = None  # object stores: the whole file

    @property
    def url(self) -> str:
        return self.fs.unstrip_protocol(self.path)

    def read(self) -> list[dict[str, Any]]:
        """Every entry; a line that is not JSON (the end of an append cut short by a
        crash) is skipped."""
        try:
            raw = self.fs.cat_file(self.path)
        except FileNotFoundError:
            return []
        out = []
        for line in raw.splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry, dict):
                out.append(entry)
        return out

    def exists(self) -> bool:
        return bool(self.fs.exists(self.path))

    def append(self, entries: list[dict[str, Any]]) -> None:
        if not entries:
            return
        if not self.local:
            if self._entries is None:
                self._entries = self.read()
            self._entries.extend(entries)
            data = _lines(self._entries)
            if len(data) > self.max_bytes:
                self._entries = self._compacted(self._entries)
                data = _lines(self._entries)
            self.fs.pipe_file(self.path, data)
            return
        data = _lines(entries)
        if self._size is None:
            try:
                self._size = os.path.getsize(self.path)
            except FileNotFoundError:
                self._size = 0
            if self._size:
                with open(self.path, "rb") as f:  # a crash cut the last line short
                    f.seek(-1, os.SEEK_END)
                    if f.read(1) != b"\n":
                        data = b"\n" + data
        with open(self.path, "ab") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        self._size += len(data)
        if self._size > self.max_bytes:
            kept = _lines(self._compacted(self.read()))
            tmp = f"{self.path}.{secrets.token_hex(6)}.tmp"
            with open(tmp, "wb") as f:
                f.write(kept)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
            self._size = len(kept)

    def _compacted(self, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Compacted to at most half of ``max_bytes`` where that is possible (so the next
        compaction is far away): fewer per-subtask rows, then fewer checkpoints."""
        out = compact(entries)
        task_rows, checkpoints = TASK_ROWS, MAX_CHECKPOINTS
        while len(_lines(out)) > self.max_bytes // 2 and (task_rows or checkpoints > 10):
            if task_rows:
                task_rows //= 4
            else:
                checkpoints //= 2
            out = compact(entries, task_rows=task_rows, checkpoints=checkpoints)
        return out


# ---------------------------------------------------------------------------- recording


class Recorder:
    """Appends a running job's history to its job directory, and writes the report when
    the run ends (:meth:`finish`).  ``view``: the job's
    :class:`~cutline.driver.dashboard.JobView`.  Never fails the job: a storage error is
    logged (once) and the next flush tries again."""

    def __init__(self, view: Any, every: float | None = None) -> None:
        # the job's driver (its log file) and its run (driver.dataflow.DataflowRun)
        self.view, self.driver, self.dataflow = view, view.driver, view.run
        storage = self.dataflow.storage
        self.fs, self.dir = storage.fs, storage.dir
        self.file = HistoryFile(storage.fs, storage.dir)
        self.every = every if every is not None else (
            LOCAL_EVERY if self.file.local else REMOTE_EVERY)
        # the run's id: its lease's (the log file's name has it too), else one of its own
        lease = getattr(self.dataflow, "lease", None)
        self.run = str(getattr(lease, "run", None) or time.strftime(
            "%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3))
        self._completed: set[int] = set()  # ids recorded, of those the driver remembers
        self._failed: set[int] = set()
        self._attempts = -1
        self._pending: list[dict[str, Any]] = []
        self._warned = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.report: str | None = None  # the report's URL (a path for local storage)

    def start(self) -> None:
        d = self.dataflow
        self._pending.append({
            "event": "run", "run": self.run, "time": time.time(), "job": d.job,
            "engine": self.view.engine, "config": self.view.config, "graph": self.view.graph,
            # what attempt 0 restores (chosen before the run: the latest, or restore_from)
            "restored_from": d.restored_from or getattr(d.controller, "restore", None),
            "host": os.uname().nodename, "pid": os.getpid(), "log": _log_path(self.driver)})
        self.flush()
        self._thread = threading.Thread(target=self._loop, name="cutline-history",
                                        daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            self.flush()

    def _collect(self) -> list[dict[str, Any]]:
        c = self.dataflow.controller
        now, wall = time.monotonic(), time.time()
        out: list[dict[str, Any]] = []
        attempts = self._attempts  # advanced once everything was collected (a RuntimeError
        for a in list(c.attempt_log):  # below drops ``out``: collected again next time)
            if a.number > attempts:
                out.append({"event": "attempt", "run": self.run,
                            **_dash.attempt_entry(a, now, wall)})
                attempts = a.number
        # by id, not by the newest id: with concurrent checkpoints one may complete (or
        # fail) after a newer one did
        new: list[tuple[int, dict[str, Any]]] = []
        done = {r.id: r for r in list(c.checkpoints)}
        for n in sorted(set(done) - self._completed):
            new.append((n, {"event": "checkpoint", "run": self.run,
                            **self.view.checkpoint_entry(done[n], now, wall)}))
        failed = {f.id: f for f in list(c.failed_checkpoints)}
        for n in sorted(set(failed) - self._failed):
            new.append((n, {"event": "failed", "run": self.run,
                            **self.view.failed_entry(failed[n], now, wall)}))
        out += [entry for _, entry in sorted(new, key=lambda x: x[0])]
        # what the driver still remembers (it forgets the oldest): a set that stays small
        self._completed, self._failed = set(done), set(failed)
        self._attempts = attempts
        return out

    def flush(self, extra: list[dict[str, Any]] | None = None) -> None:
        with self._lock:
            try:
                self._pending += self._collect()
            except RuntimeError:  # a list changed size while read: next time
                pass
            self._pending += extra or []
            if not self._pending:
                return
            try:
                self.file.append(self._pending)
                self._pending = []
            except Exception as exc:  # noqa: BLE001 - the history never fails a job
                if not self._warned:
                    log.warning("cutline: job %r: cannot write its history %s (%s: %s); "
                                "trying again", self.dataflow.job, self.file.url,
                                type(exc).__name__, exc)
                    self._warned = True

    def finish(self, exc: BaseException | None = None) -> str | None:
        """The run is over (``exc``: why, None: it finished): the end line, then the
        report; returns where the report is and prints it, or None (could not write).
        Never raises: it runs while the run's own exception, if any, is on its way."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        try:
            return self._finish(exc)
        except Exception as e:  # noqa: BLE001 - the report never fails (or hides) anything
            log.warning("cutline: job %r: no report for this run (%s: %s)", self.dataflow.job,
                        type(e).__name__, e)
            return None

    def _finish(self, exc: BaseException | None) -> str | None:
        status, error = outcome(exc, self.dataflow)
        snap = self.view.snapshot(limit=1)
        end = {"event": "end", "run": self.run, "time": time.time(), "status": status,
               "error": error, "last_failure": snap["last_failure"], "uptime": snap["uptime"],
               "source_records": snap["source_records"], "late_records": snap["late_records"],
               "watermark_text": snap["watermark_text"], "attempt": snap["attempt"],
               "restarts": snap["restarts"],
               "savepoint": self.dataflow.stopped_with_savepoint,
               "restored_from": self.dataflow.restored_from,
               "checkpoints_completed": snap["checkpoints"]["completed"],
               "checkpoints_failed": snap["checkpoints"]["failed"],
               "operators": [{**o, "records_per_s": 0.0, "backpressure": 0.0,
                              "subtasks": [{**s, "records_per_s": 0.0, "backpressure": 0.0}
                                           for s in o["subtasks"]]}
                             for o in snap["operators"]]}
        self.flush([end])
        try:
            try:
                entries = self.file.read() + self._pending
            except Exception:  # noqa: BLE001 - unreadable: what this run still holds
                entries = list(self._pending)
            self.report = write_report(self.fs, self.dir, build_snapshot(
                entries, _handles(self.dataflow.storage), self.fs.unstrip_protocol(self.dir),
                self.file.url))
        except Exception as e:  # noqa: BLE001 - the report never fails a job
            log.warning("cutline: job %r: cannot write its report to %s (%s: %s)",
                        self.dataflow.job, self.fs.unstrip_protocol(self.dir),
                        type(e).__name__, e)
            return None
        print(f"cutline: report of job {self.dataflow.job!r}: {self.report}", file=sys.stderr,
              flush=True)
        if exc is not None:  # JobFailed.report, as JobResult.report
            try:
                exc.report = self.report  # type: ignore[attr-defined]
            except AttributeError:
                pass
        return self.report


def _log_path(driver: Any) -> str | None:
    """This run's log file (driver.logs.RunLog), when it has one."""
    run_log = getattr(driver, "run_log", None)
    path = getattr(run_log, "path", None)
    return str(path) if path is not None else None


def start_recording(driver: Any, engine: str) -> Recorder | None:
    """The run's :class:`Recorder`, started (its ``run`` line written), or None when it
    cannot be (logged: the job runs without a history)."""
    try:
        recorder = Recorder(_dash.JobView(driver, engine))
        recorder.start()
        return recorder
    except Exception as exc:  # noqa: BLE001 - the history never fails a job
        log.warning("cutline: job %r: no history or report for this run (%s: %s)",
                    driver.run.job, type(exc).__name__, exc)
        return None


def outcome(exc: BaseException | None, run: Any) -> tuple[str, str | None]:
    """How a run (a :class:`~cutline.driver.dataflow.DataflowRun`) ended, for the report:
    ``(status, error)``."""
    from .run import JobCancelled

    if exc is None:
        if run.stopped_with_savepoint:
            return "stopped", f"stopped with savepoint {run.stopped_with_savepoint}"
        return "finished", None
    if isinstance(exc, JobCancelled):
        return "cancelled", str(exc)
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted", str(exc) or "interrupted"
    return "failed", str(exc) or type(exc).__name__


# ---------------------------------------------------------------------------- the report


def _handles(storage: CheckpointStorage) -> list[Any]:
    """The job's completed checkpoints and savepoints, as their ``_metadata`` says."""
    import re

    out = []
    for name in sorted(storage._entries()):
        if re.match(r"^(chk|savepoint)-\d+", name):
            try:
                out.append(storage.open(name))
            except CheckpointStorageError:
                continue  # partial or corrupt: not a checkpoint
    return out


def _metadata_config(metadata: dict[str, Any]) -> dict[str, Any]:
    mode = metadata.get("mode")
    return {"mode": "at_least_once" if mode == "at_least_once" else "exactly_once",
            "unaligned": mode == "unaligned",
            "max_parallelism": metadata.get("max_parallelism")}


def _from_metadata(h: Any, config: dict[str, Any] | None) -> dict[str, Any]:
    """A retained checkpoint the history file does not have, from its ``_metadata``:
    no timings, no in-flight numbers (``None``: not known)."""
    md = h.metadata
    final = bool(md.get("final"))
    tasks = [{"task": t, "bytes": int(i.get("size") or 0)} for t, i in sorted(h.states.items())]
    # bytes written: the state files, and the shared files uploaded for this checkpoint
    # (named "<id>-<sha256>": state backends' incremental files)
    uploaded = sum(int(i.get("size") or 0) for rel, i in h.shared.items()
                   if rel.rsplit("/", 1)[-1].startswith(f"{h.id}-"))
    return {"id": h.id, "status": "completed", "attempt": md.get("attempt"),
            "triggered": None, "committed": md.get("time"), "duration": None,
            "bytes": sum(t["bytes"] for t in tasks) + uploaded, "in_flight": None,
            "in_flight_bytes": None, "alignment": None, "final": final,
            "savepoint": h.is_savepoint,
            "type": _dash.checkpoint_type(config or _metadata_config(md),
                                          savepoint=h.is_savepoint, final=final),
            "acked": len(tasks), "tasks_total": len(tasks), "path": h.path,
            "tasks": tasks, "from_metadata": True}


def _graph_from_metadata(metadata: dict[str, Any]) -> dict[str, Any]:
    """The job graph as far as a checkpoint records it: chains and their operators (no
    edges, no names beyond the uids)."""
    ops = (metadata.get("plan") or {}).get("operators") or {}
    chains: dict[str, list[dict[str, Any]]] = {}
    for uid, op in ops.items():
        chains.setdefault(op.get("chain") or uid, []).append(
            {"uid": uid, "kind": op.get("kind"), "named": not _dash._auto_uid(uid, op.get(
                "kind") or ""), "name": uid if not _dash._auto_uid(uid, op.get("kind") or "")
             else _dash.kind_label(op.get("kind") or "")})
    parallelism = metadata.get("chains") or {}
    nodes = [{"uid": chain, "parallelism": parallelism.get(chain, 1), "depth": 0,
              "name": " → ".join(o["name"] for o in members), "operators": members}
             for chain, members in chains.items()]
    return {"nodes": nodes, "edges": [], "sources": [
        n["uid"] for n in nodes if n["operators"] and n["operators"][0]["kind"] == "source"]}


def _dirname(path: str | None) -> str | None:
    return path.rstrip("/").rsplit("/", 1)[-1] if path else None


def _strip(entry: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in entry.items() if k not in ("event", "run")}


def build_snapshot(entries: list[dict[str, Any]], handles: list[Any], job_dir: str,
                   history_url: str | None) -> dict[str, Any]:
    """The dashboard's data (``/api/job``'s shape, every checkpoint in ``history``) of the
    job's latest run, from its history ``entries`` and its retained checkpoints
    (``handles``); without entries, what the checkpoints' ``_metadata`` hold."""
    runs = [e for e in entries if e.get("event") == "run"]
    run = runs[-1] if runs else None
    mine = [e for e in entries if run is not None and e.get("run") == run["run"]]
    end = next((e for e in reversed(mine) if e.get("event") == "end"), None)
    config = dict(run["config"]) if run else None
    latest = max(handles, key=lambda h: h.id) if handles else None
    if config is None and latest is not None:
        config = _metadata_config(latest.metadata)
    # by directory name (chk-7, savepoint-8-ab12cd34): a job directory copied elsewhere
    # (from s3 to a laptop) still knows which of its checkpoints it holds
    kept = {_dirname(h.path) for h in handles}
    cks: dict[int, dict[str, Any]] = {}
    for e in mine:
        if e.get("event") in ("checkpoint", "failed"):
            cks[e["id"]] = {**_strip(e), "kept": _dirname(e.get("path")) in kept}
    for h in handles:  # checkpoints of this run the history file missed (a crash)
        started = run["time"] if run else None
        when = h.metadata.get("time")
        if h.id not in cks and (started is None or (when is not None and when >= started)):
            cks[h.id] = {**_from_metadata(h, config), "kept": True}
    history = sorted(cks.values(), key=lambda h: h["id"], reverse=True)
    if run is not None:
        graph = run["graph"]
    elif latest is not None:
        graph = _graph_from_metadata(latest.metadata)
    else:
        graph = {"nodes": [], "edges": [], "sources": []}
    if end is not None:
        operators = end["operators"]
        status, error = end["status"], end.get("error")
    else:
        operators = [_idle_operator(n) for n in graph["nodes"]]
        status = "unknown"
        error = ("the history has no end of this run: its driver stopped without writing "
                 "it (killed, or its storage failed)" if run is not None else
                 "this job directory has no history file (history.jsonl): what its "
                 "checkpoints' _metadata hold")
    attempts = [_strip(e) for e in mine if e.get("event") == "attempt"]
    completed = [h for h in history if h["status"] == "completed"]
    end = end or {}
    return {
        "job": run["job"] if run else (latest.job if latest is not None else
                                       job_dir.rstrip("/").rsplit("/", 1)[-1]),
        "engine": run["engine"] if run else "-", "status": status, "error": error,
        "uptime": end.get("uptime"), "time": end.get("time") or (run or {}).get("time"),
        "mode": _protocol(config), "interval": (config or {}).get("interval"),
        "config": config or {},
        "restored_from": end.get("restored_from", (run or {}).get("restored_from")),
        "attempt": end.get("attempt", attempts[-1]["number"] if attempts else 0),
        "restarts": end.get("restarts", max(0, len(attempts) - 1)),
        "attempts": attempts, "last_failure": end.get("last_failure"),
        "source_records": end.get("source_records"),
        "late_records": end.get("late_records", 0),
        "records_per_s": 0.0, "watermark_text": end.get("watermark_text"),
        "graph": graph, "operators": operators,
        "checkpoints": {
            "completed": end.get("checkpoints_completed", len(completed)),
            "failed": end.get("checkpoints_failed",
                              sum(1 for h in history if h["status"] == "failed")),
            "in_progress": [], "summary": _dash.summarize(history), "history": history,
            "total": len(history), "newer": 0, "offset": 0, "limit": len(history),
            "upto": None, "selected": None,
            **_dash.latest_of(history)},
        "report": {
            "written": time.time(), "job_dir": job_dir, "history_file": history_url,
            "source": "history" if run is not None else "metadata",
            "run": run["run"] if run else None,
            "runs": _runs(entries)},
    }


def _protocol(config: dict[str, Any] | None) -> str:
    if not config:
        return "-"
    if config.get("mode") == "at_least_once":
        return "at_least_once"
    return "unaligned" if config.get("unaligned") else "aligned"


def _idle_operator(node: dict[str, Any]) -> dict[str, Any]:
    """An operator of a run whose final counts were never written: none known."""
    subtasks: list[dict[str, Any]] = [
        {"task": f"{node['uid']}.{i}", "records": None, "records_per_s": 0.0,
         "backpressure": 0.0, "backpressured_s": None, "timed": False, "watermark": None,
         "watermark_text": None, "timers": 0, "late": {}, "late_records": 0,
         "lag_splits": {}, "lag": None, "stalled": None}
                for i in range(node["parallelism"])]
    return {"uid": node["uid"], "name": node["name"], "parallelism": node["parallelism"],
            "records": None, "records_per_s": 0.0, "backpressure": 0.0,
            "watermark_text": None, "timers": 0, "late_records": 0, "late": {}, "lag": None,
            "stalled": [], "subtasks": subtasks}


def _runs(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every run the history holds, newest first: when, how it ended, its checkpoints."""
    out: dict[str, dict[str, Any]] = {}
    for e in entries:
        rid = str(e.get("run"))
        if e.get("event") == "run":
            out[rid] = {"run": rid, "started": e.get("time"), "engine": e.get("engine"),
                        "log": e.get("log"),
                        "restored_from": e.get("restored_from"), "status": "unknown",
                        "ended": None, "error": None, "checkpoints": 0, "failed": 0,
                        "first": None, "last": None}
        elif rid in out:
            r = out[rid]
            if e.get("event") == "end":
                r.update(status=e.get("status"), ended=e.get("time"), error=e.get("error"))
            elif e.get("event") == "checkpoint":
                r["checkpoints"] += 1
                r["first"] = e["id"] if r["first"] is None else min(r["first"], e["id"])
                r["last"] = e["id"] if r["last"] is None else max(r["last"], e["id"])
            elif e.get("event") == "failed":
                r["failed"] += 1
    return list(reversed(out.values()))


def write_report(fs: Any, job_dir: str, snapshot: dict[str, Any]) -> str:
    """``<job dir>/report.html``: the page with ``snapshot`` in it.  Returns its path
    (local storage) or URL."""
    path = f"{job_dir.rstrip('/')}/{REPORT_FILE}"
    data = _dash.page(snapshot)
    if _is_local(fs):
        tmp = f"{path}.{secrets.token_hex(6)}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        return path
    fs.pipe_file(path, data)
    return fs.unstrip_protocol(path)


def rebuild_report(job_dir: str, storage_options: dict[str, Any] | None = None,
                   out: str | None = None) -> tuple[str, dict[str, Any]]:
    """``cutline report JOB_DIR``: the job's report rebuilt from storage alone (its
    history file and its checkpoints' ``_metadata``), written to ``out`` (a local file)
    or into the job directory.  Returns where it is and its data."""
    fs, path = url_to_fs(job_dir, storage_options)
    path = fs._strip_protocol(path).rstrip("/") or "/"
    where = fs.unstrip_protocol(path)
    if not fs.isdir(path):
        raise FileNotFoundError(f"no job directory at {job_dir} ({where} is "
                                f"{'a file' if fs.exists(path) else 'missing'})")
    history = HistoryFile(fs, path)
    parent, _, name = path.rpartition("/")
    storage = CheckpointStorage(fs.unstrip_protocol(parent or "/"), name, storage_options,
                                read_only=True)
    handles = _handles(storage)
    entries = history.read()
    if not entries and not handles:
        jobs = _jobs_under(fs, path)
        raise FileNotFoundError(
            f"{where} is not a cutline job directory: it has no {HISTORY_FILE} and no "
            "completed checkpoint" + (f" (it holds the jobs {', '.join(jobs)}: give "
                                      f"{where}/<job>)" if jobs else ""))
    snapshot = build_snapshot(entries, handles, where, history.url if entries else None)
    if out is None:
        return write_report(fs, path, snapshot), snapshot
    with open(out, "wb") as f:
        f.write(_dash.page(snapshot))
    return out, snapshot


def _jobs_under(fs: Any, path: str) -> list[str]:
    """Names of the job directories right under ``path`` (a storage root given instead of
    a job directory)."""
    jobs = []
    for e in fs.ls(path, detail=True):
        if e.get("type") != "directory":
            continue
        names = [p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(e["name"], detail=False)]
        if HISTORY_FILE in names or any(n.startswith(("chk-", "savepoint-")) for n in names):
            jobs.append(e["name"].rstrip("/").rsplit("/", 1)[-1])
    return sorted(jobs)
