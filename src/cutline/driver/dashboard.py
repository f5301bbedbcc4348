"""The live dashboard: a web page and a Prometheus endpoint the driver serves while a job runs.

What Flink's web UI shows of a job, from what the driver already knows (the
:class:`~cutline.protocol.job.JobController`, the tasks' ``Metrics`` and their checkpoint
acks): the job graph with each operator's records/s, backpressure and watermark; the
checkpoint history with, per subtask, the end-to-end, alignment, synchronous and
asynchronous times, state size and persisted in-flight data; the attempts and what
restarted them.

* ``/``: the page (one self-contained HTML file, its script polls ``/api/job``);
* ``/api/job``: the same as JSON (:meth:`JobView.snapshot`);
* ``/metrics``: the same numbers in Prometheus' text format (``prometheus-client``).

The server listens on loopback only, on a thread of the driver, and answers only requests
that carry the job's token (``?token=...``, or ``Authorization: Bearer ...`` for a
Prometheus scrape config); anyone else gets 403, and is logged.  With the job's TLS on it
serves HTTPS with the job's certificate (its SHA-256 fingerprint is printed with the URL; a
client that cannot pin it must be told to trust it).  It stops with the job.

On by default where the progress line is (an interactive terminal, not CI); ``p.run(
dashboard=True)`` or ``CUTLINE_DASHBOARD=1`` turn it on anywhere, ``False`` / ``0`` off; a
number is the port (default: any free one).
"""

from __future__ import annotations

import hmac
import json
import logging
import math
import os
import secrets
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlsplit

from ..protocol.messages import TIMERS_COUNTED
from ..protocol.watermarks import decode_ts
from ..report import format_event_time
from ..runtime.tls import JobSecret
from .late import late_by_subtask

log = logging.getLogger("cutline.dashboard")

__all__ = ["DASHBOARD_ENV", "Dashboard", "JobView", "dashboard_port"]

DASHBOARD_ENV = "CUTLINE_DASHBOARD"
_HISTORY = 50  # checkpoints (completed and failed) /api/job lists unless asked for a page


def dashboard_port(option: Any) -> int | None:
    """The port to serve the dashboard on (0: any free one), or ``None`` for none.

    ``option`` is ``p.run(dashboard=...)``: True, False, a port, or None for the default:
    ``$CUTLINE_DASHBOARD`` (1 / 0 / a port) if set, else on where the progress line shows
    (an interactive terminal, not CI, a notebook or a pipe)."""
    if option is None:
        env = os.environ.get(DASHBOARD_ENV, "").strip().lower()
        if not env:
            from ..report import progress_by_default

            return 0 if progress_by_default() else None
        if env in ("0", "false", "no", "off"):
            return None
        if env in ("1", "true", "yes", "on"):
            return 0
        option = int(env) if env.isdigit() else env
        if isinstance(option, str):
            raise ValueError(f"{DASHBOARD_ENV} must be 1, 0 or a port number, got {env!r}")
    if option is True:
        return 0
    if option is False:
        return None
    if isinstance(option, int) and 0 < option < 65536:
        return option
    raise ValueError(f"dashboard= must be True, False, None or a port number (1-65535), "
                     f"got {option!r}")


# ---------------------------------------------------------------------------- the numbers


class _Rates:
    """Records/s and backpressure per task between samples at least ``every`` seconds apart
    (counters restart with each attempt: a new attempt starts a new sample)."""

    def __init__(self, every: float = 1.0) -> None:
        self.every = every
        self.lock = threading.Lock()
        self.prev: tuple[float, int, dict[str, tuple[int, float]]] | None = None
        self.rates: dict[str, tuple[float, float]] = {}

    def sample(self, now: float, attempt: int,
               counters: dict[str, tuple[int, float]]) -> dict[str, tuple[float, float]]:
        with self.lock:
            prev = self.prev
            if prev is None or prev[1] != attempt:
                self.prev, self.rates = (now, attempt, counters), {}
            elif now - prev[0] >= self.every:
                dt = now - prev[0]
                self.rates = {
                    t: (max(0.0, (n - prev[2][t][0]) / dt),
                        min(1.0, max(0.0, (bp - prev[2][t][1]) / dt)))
                    for t, (n, bp) in counters.items() if t in prev[2]}
                self.prev = (now, attempt, counters)
            return dict(self.rates)


def _wall(mono: float, now_mono: float, now_wall: float) -> float:
    return now_wall - (now_mono - mono)


class JobView:
    """What the page and ``/metrics`` show of a running job, read from its driver (a
    :class:`~cutline.driver.shell.Driver` whose run is a
    :class:`~cutline.driver.dataflow.DataflowRun`) without stopping it."""

    def __init__(self, driver: Any, engine: str) -> None:
        self.driver, self.engine = driver, engine
        self.run = driver.run  # the DataflowRun: the job's plan, config, controller
        self.rates = _Rates()
        self.started = time.monotonic()
        plan = self.run.plan
        self.chain_of = {c.task_id(i): c.uid for c, i in plan.tasks()}
        self.graph = _graph(plan)
        self.config = config_of(self.run.config, self.run.storage, plan)
        self.tasks_total = len(list(plan.tasks()))

    def sample(self) -> dict[str, tuple[float, float]]:
        c = self.run.controller
        counters = {t: (x.records, x.backpressured) for t, x in list(c.metrics.items())}
        return self.rates.sample(time.monotonic(), c.attempt.number, counters)

    def snapshot(self, offset: int = 0, limit: int = _HISTORY, selected: int | None = None,
                 upto: int | None = None) -> dict[str, Any]:
        """The job as JSON-able data (``/api/job``): the checkpoint history's entries
        ``offset`` to ``offset + limit`` (newest first; ``upto``: of those with ids up to
        it, so that pages stay put while new checkpoints complete), and checkpoint
        ``selected``'s."""
        for _ in range(5):  # the driver thread changes the controller meanwhile: retry
            try:
                return self._snapshot(offset, limit, selected, upto)
            except RuntimeError:  # a dict changed size while read
                time.sleep(0.001)
        return self._snapshot(offset, limit, selected, upto)

    def checkpoint_entry(self, r: Any, now: float, wall: float,
                         tasks: bool = True) -> dict[str, Any]:
        """A completed checkpoint (a ``CheckpointRecord``) as the page shows it."""
        return completed_entry(r, now, wall, self.config, self.tasks_total, tasks)

    def failed_entry(self, f: Any, now: float, wall: float) -> dict[str, Any]:
        return failed_entry(f, now, wall, self.config, self.tasks_total)

    def history(self, now: float, wall: float) -> tuple[list[dict[str, Any]], dict[int, Any]]:
        """Every checkpoint the driver remembers (completed and failed, newest first, without
        their per-task rows), and the completed ones' records by id."""
        c = self.run.controller
        records = {r.id: r for r in list(c.checkpoints)}
        out = [self.checkpoint_entry(r, now, wall, tasks=False) for r in records.values()]
        out += [self.failed_entry(f, now, wall) for f in list(c.failed_checkpoints)]
        out.sort(key=lambda h: h["id"], reverse=True)
        return out, records

    def _snapshot(self, offset: int, limit: int, selected: int | None,
                  upto: int | None) -> dict[str, Any]:
        d, run, c = self.driver, self.run, self.run.controller
        now, wall = time.monotonic(), time.time()
        rates = self.sample()
        metrics = dict(c.metrics)
        operators = []
        for chain, node in zip(run.plan.chains, self.graph["nodes"]):
            subtasks = [_subtask(chain.task_id(i), metrics.get(chain.task_id(i)),
                                 rates.get(chain.task_id(i), (0.0, 0.0)))
                        for i in range(chain.parallelism)]
            marks = [decode_ts(metrics[s["task"]].watermark) for s in subtasks if s["timed"]]
            operators.append({
                "uid": chain.uid, "name": node["name"], "parallelism": chain.parallelism,
                "records": sum(s["records"] for s in subtasks),
                "records_per_s": sum(s["records_per_s"] for s in subtasks),
                "backpressure": max(s["backpressure"] for s in subtasks),
                "watermark_text": format_event_time(min(marks)) if marks else None,
                "timers": sum(s["timers"] for s in subtasks),
                "late_records": sum(s["late_records"] for s in subtasks),
                "late": _sum_late(s["late"] for s in subtasks),
                "lag": (sum(s["lag"] for s in subtasks if s["lag"] is not None)
                        if any(s["lag"] is not None for s in subtasks) else None),
                "stalled": [f'{s["task"]}: {s["stalled"]}' for s in subtasks if s["stalled"]],
                "subtasks": subtasks})
        history, records = self.history(now, wall)
        coordinator = c.coordinator
        pending = []
        if coordinator is not None and c.running:
            for n in list(coordinator.pending):
                p = coordinator.pending.get(n)
                if p is not None:
                    pending.append({"id": n, "status": "in progress",
                                    "acked": len(p.acks), "tasks": len(c.shape.tasks),
                                    "tasks_total": len(c.shape.tasks),
                                    "duration": now - c.triggered.get(n, now)})

        def full(h: dict[str, Any]) -> dict[str, Any]:
            r = records.get(h["id"]) if h["status"] == "completed" else None
            return self.checkpoint_entry(r, now, wall) if r is not None else h

        checkpoints = page_of(history, offset, limit, selected, full, upto)
        checkpoints.update(completed=c.checkpoints_completed, failed=c.checkpoints_failed,
                           in_progress=pending, summary=summarize(history))
        status = ("failed" if c.error or d.error else "finished" if c.done
                  else "running" if c.attempt.started
                  else "restarting" if c.attempt.number else "starting")
        return {
            "job": run.job, "engine": self.engine, "status": status,
            "error": c.error or d.error,
            "uptime": now - self.started, "time": wall,
            "mode": run.config.protocol_mode.value, "interval": run.config.interval,
            "config": self.config,
            "restored_from": run.restored_from,
            "attempt": c.attempt.number, "restarts": max(0, c.started_attempts - 1),
            "attempts": [attempt_entry(a, now, wall) for a in list(c.attempt_log)],
            "last_failure": c.last_failure,
            "source_records": c.source_records_before + c.source_records(),
            "late_records": sum(o["late_records"] for o in operators),
            "records_per_s": sum(o["records_per_s"] for o in operators
                                 if o["uid"] in self.graph["sources"]),
            "watermark_text": (format_event_time(c.watermark())
                               if c.watermark() is not None else None),
            "graph": self.graph, "operators": operators,
            "checkpoints": checkpoints,
        }


# ---------------------------------------------------------------------------- checkpoints


def config_of(cfg: Any, storage: Any, plan: Any = None) -> dict[str, Any]:
    """A job's checkpointing configuration, as Flink's checkpoint tab shows it (never the
    storage options: they may hold credentials)."""
    return {
        "interval": cfg.interval, "mode": cfg.mode, "unaligned": cfg.unaligned,
        "aligned_timeout": cfg.aligned_timeout, "timeout": cfg.timeout,
        "min_pause": cfg.min_pause, "max_concurrent": cfg.max_concurrent,
        "tolerable_failures": cfg.tolerable_failures, "retained": cfg.retained,
        "retain_on_cancel": cfg.retain_on_cancel, "storage": cfg.storage,
        "job_dir": storage.fs.unstrip_protocol(storage.dir) if storage is not None else None,
        "state_backend": cfg.state_backend,
        "max_parallelism": plan.max_parallelism if plan is not None else None,
    }


def checkpoint_type(config: dict[str, Any] | None, *, savepoint: bool = False,
                    final: bool = False, in_flight: int = 0) -> str:
    """``savepoint``, ``final`` (a bounded run's last), ``unaligned`` (its barriers overtook
    in-flight records: the mode, or an aligned checkpoint past ``aligned_timeout``),
    ``aligned`` or ``at least once``."""
    if savepoint:
        return "savepoint"
    if final:
        return "final"
    config = config or {}
    if config.get("mode") == "at_least_once":
        return "at least once"
    return "unaligned" if config.get("unaligned") or in_flight else "aligned"


def completed_entry(r: Any, now: float, wall: float, config: dict[str, Any] | None,
                    tasks_total: int, tasks: bool = True) -> dict[str, Any]:
    """A ``CheckpointRecord`` as the page and the history file hold it (``tasks``: with its
    per-subtask rows, which the driver keeps for its newest 100)."""
    out = {"id": r.id, "status": "completed", "attempt": r.attempt,
           "triggered": _wall(r.started, now, wall), "duration": r.duration,
           "bytes": r.bytes, "in_flight": r.in_flight, "in_flight_bytes": r.in_flight_bytes,
           "alignment": r.alignment, "final": r.final, "savepoint": r.savepoint,
           "type": checkpoint_type(config, savepoint=r.savepoint, final=r.final,
                                   in_flight=r.in_flight or r.in_flight_bytes),
           "acked": tasks_total, "tasks_total": tasks_total, "path": r.path}
    if tasks:
        out["tasks"] = [{"task": t, **s} for t, s in sorted(r.tasks.items())]
    return out


def failed_entry(f: Any, now: float, wall: float, config: dict[str, Any] | None,
                 tasks_total: int) -> dict[str, Any]:
    """A ``FailedCheckpoint`` as the page and the history file hold it."""
    return {"id": f.id, "status": "failed", "attempt": f.attempt,
            "triggered": _wall(f.started, now, wall), "duration": f.failed - f.started,
            "reason": f.reason, "type": checkpoint_type(config),
            "acked": getattr(f, "acked", None), "tasks_total": tasks_total}


def attempt_entry(a: Any, now: float, wall: float) -> dict[str, Any]:
    return {"number": a.number, "started": _wall(a.at, now, wall),
            "restored_from": a.restored_from, "after_failure": a.after_failure}


SUMMARIZED = ("duration", "bytes", "in_flight_bytes", "alignment")


def summarize(history: list[dict[str, Any]]) -> dict[str, Any]:
    """Min, average and max of the completed checkpoints' end-to-end duration, state size,
    persisted in-flight bytes and alignment (Flink's checkpoint summary), over ``history``;
    a value a checkpoint does not know (``None``) is left out."""
    done = [h for h in history if h["status"] == "completed"]
    out: dict[str, Any] = {"count": len(done)}
    for key in SUMMARIZED:
        values = [h[key] for h in done if h.get(key) is not None]
        out[key] = ({"min": min(values), "avg": sum(values) / len(values),
                     "max": max(values), "count": len(values)} if values else None)
    return out


def page_of(history: list[dict[str, Any]], offset: int, limit: int, selected: int | None,
            full: Any = None, upto: int | None = None) -> dict[str, Any]:
    """Entries ``offset`` .. ``offset + limit`` of ``history`` (newest first; ``upto``:
    of its entries with ids up to that), and the entry of checkpoint ``selected``
    (wherever it is); ``full(entry)``: the entry with its per-subtask rows.  ``total``:
    the entries paged, ``newer``: those above ``upto``."""
    full = full or (lambda h: h)
    offset, limit = max(0, offset), max(1, limit)
    paged = history if upto is None else [h for h in history if h["id"] <= upto]
    shown = [full(h) for h in paged[offset:offset + limit]]
    chosen = next((h for h in shown if h["id"] == selected), None)
    if chosen is None and selected is not None:
        chosen = next((full(h) for h in history if h["id"] == selected), None)
    return {"history": shown, "total": len(paged), "newer": len(history) - len(paged),
            "offset": offset, "limit": limit, "upto": upto, "selected": chosen,
            **latest_of(history)}


def latest_of(history: list[dict[str, Any]]) -> dict[str, Any]:
    """The newest completed checkpoint, failed checkpoint and savepoint of ``history``
    (newest first), without their per-subtask rows."""
    def newest(test: Any) -> dict[str, Any] | None:
        h = next((h for h in history if test(h)), None)
        return {k: v for k, v in h.items() if k != "tasks"} if h is not None else None

    return {"latest": newest(lambda h: h["status"] == "completed"),
            "latest_failed": newest(lambda h: h["status"] == "failed"),
            "latest_savepoint": newest(lambda h: h["status"] == "completed"
                                       and h.get("savepoint"))}


def _subtask(task: str, x: Any, rate: tuple[float, float]) -> dict[str, Any]:
    """One task's row: ``x`` its latest ``Metrics`` (None before the first)."""
    wm = decode_ts(x.watermark) if x is not None and x.timed else None
    return {"task": task, "records": x.records if x else 0, "records_per_s": rate[0],
            "backpressure": rate[1], "backpressured_s": x.backpressured if x else 0.0,
            "timed": wm is not None,
            "watermark": "end" if wm == math.inf else None if wm == -math.inf else wm,
            "watermark_text": format_event_time(wm) if wm is not None else None,
            "timers": x.timers if x else 0,
            # late records dropped, per window operator of the chain (uid) and in all
            "late": late_by_subtask(x), "late_records": sum(late_by_subtask(x).values()),
            # a source that tells them (Kafka): records behind per split, and in all;
            # why it cannot read now
            "lag_splits": dict(x.lag) if x is not None and x.lag else {},
            "lag": sum(x.lag.values()) if x is not None and x.lag is not None else None,
            "stalled": x.stalled if x is not None else None}


def _sum_late(per_subtask: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for late in per_subtask:
        for uid, n in late.items():
            out[uid] = out.get(uid, 0) + n
    return out


def _graph(plan: Any) -> dict[str, Any]:
    """Chains as nodes (an operator chain runs as one task, as in Flink), edges between them,
    and each chain's column: its longest distance from a source (feedback edges aside).
    Each operator has its uid, kind and a name for people (:func:`operator_name`)."""
    depth = {c.id: 0 for c in plan.chains}
    for _ in plan.chains:  # chains are few: relax until stable
        for e in plan.edges:
            if not e.back:
                depth[e.dst] = max(depth[e.dst], depth[e.src] + 1)
    by_id = {n.id: n for c in plan.chains for n in c.nodes}
    nodes = []
    for c in plan.chains:
        ops = [{"uid": n.uid, "kind": str(n.kind), "name": operator_name(n, by_id),
                "named": not _is_auto(_combined(n, by_id) or n)} for n in c.nodes]
        nodes.append({"uid": c.uid, "parallelism": c.parallelism, "depth": depth[c.id],
                      "name": " → ".join(o["name"] for o in ops), "operators": ops})
    return {
        "nodes": nodes,
        "edges": [{"src": plan.chains[e.src].uid, "dst": plan.chains[e.dst].uid,
                   "partitioning": e.partitioning, "back": e.back} for e in plan.edges],
        "sources": [c.uid for c in plan.chains if c.is_source],
    }


_KINDS = {"source": "Source", "sink": "Sink", "map": "Map", "flat_map": "Flat map",
          "filter": "Filter", "reduce": "Reduce", "process": "Process", "count": "Count",
          "union": "Union", "iterate": "Iteration", "assign_timestamps": "Timestamps",
          "window": "Window", "window_results": "Window results", "window_late": "Late records",
          "to_batches": "To batches"}


def kind_label(kind: str) -> str:
    """``flat_map`` -> ``Flat map``."""
    return _KINDS.get(kind) or kind.replace("_", " ").capitalize()


def _auto_uid(uid: str, kind: str) -> bool:
    """Whether ``uid`` is one cutline made up (``<kind>-<node id>``), not the user's."""
    head, _, tail = uid.rpartition("-")
    return head == kind and tail.isdigit()


def _is_auto(node: Any) -> bool:
    """Whether cutline named the operator (``Node.auto_uid``; else by its uid's form)."""
    flag = getattr(node, "auto_uid", None)
    return flag if isinstance(flag, bool) else _auto_uid(node.uid, node.kind)


def _combined(node: Any, by_id: dict[int, Any] | None) -> Any:
    """The aggregation whose local half ``node`` is (a planner's ``combine``, uid
    ``<aggregation uid>.combine``), or None."""
    if node.kind != "combine":
        return None
    of = node.uid.rsplit(".", 1)[0]
    return next((n for n in (by_id or {}).values() if n.uid == of and n.kind != "combine"),
                None)


def operator_names(plan: Any) -> dict[str, str]:
    """uid -> :func:`operator_name` of every operator of ``plan`` whose name is not its uid
    (a checkpoint's ``_metadata`` records them: ``cutline checkpoints show`` and the report
    name operators as the dashboard does)."""
    by_id = {n.id: n for c in plan.chains for n in c.nodes}
    names = {n.uid: operator_name(n, by_id) for n in by_id.values()}
    return {uid: name for uid, name in names.items() if name != uid}


def operator_name(node: Any, by_id: dict[int, Any] | None = None) -> str:
    """What the dashboard calls an operator: the user's uid when they gave one, else its
    kind and what it runs (``Map: parse``, ``Source: FileSource``, ``Window: tumbling 5 s,
    count``), as Flink names operators; a window's results take the window's name; a
    two-phase aggregation's combine is its aggregation's ``(local half)``."""
    agg = _combined(node, by_id)
    if agg is not None:
        return f"{operator_name(agg, by_id)} (local half)"
    if not _is_auto(node):
        return node.uid
    label, fn = kind_label(node.kind), node.fn
    if node.kind in ("source", "sink") and fn is not None:
        return f"{label}: {type(fn).__name__}"
    if node.kind == "window_results":
        window = (by_id or {}).get(node.inputs[0]) if node.inputs else None
        if window is not None and not _is_auto(window):
            return f"{window.uid}: results"
        return label
    if node.kind == "window" and fn is not None and hasattr(fn, "assigner"):
        return f"{label}: {_assigner(fn.assigner)}, {fn.aggregate.name}"
    name = getattr(fn, "__name__", None)
    if node.kind in ("map", "flat_map", "filter", "reduce", "process") and name and \
            name != "<lambda>":
        return f"{label}: {name}"
    return label


def _assigner(assigner: Any) -> str:
    """``tumbling(size=5, offset=0)`` -> ``tumbling 5 s``; ``sliding 10 s every 5 s``."""
    kind = repr(assigner).split("(", 1)[0]
    parts = [kind]
    for field, text in (("size", "{:g} s"), ("gap", "gap {:g} s"), ("slide", "every {:g} s"),
                        ("offset", "offset {:g} s")):
        value = getattr(assigner, field, None)
        if isinstance(value, (int, float)) and not (field == "offset" and value == 0):
            parts.append(text.format(value))
    return " ".join(parts)


# ---------------------------------------------------------------------------- Prometheus


class _Collector:
    """The snapshot's numbers as Prometheus metric families, read at each scrape."""

    def __init__(self, view: JobView) -> None:
        self.view = view

    def describe(self) -> list:
        return []  # no fixed set: the registry does not call collect() at registration

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        s = self.view.snapshot()
        name = s["job"]

        def job_metric(kind: type, metric: str, doc: str, value: float) -> Any:
            family = kind(f"cutline_{metric}", doc, labels=["job"])
            family.add_metric([name], value)
            return family

        ck = s["checkpoints"]
        for kind, metric, doc, value in (
                (GaugeMetricFamily, "job_attempt", "The attempt the job runs (0: the first).",
                 s["attempt"]),
                (CounterMetricFamily, "job_restarts", "Restarts of the job's tasks.",
                 s["restarts"]),
                (GaugeMetricFamily, "job_uptime_seconds", "Seconds since the driver started.",
                 s["uptime"]),
                (GaugeMetricFamily, "job_running", "1 while the job's tasks run.",
                 1.0 if s["status"] == "running" else 0.0),
                (CounterMetricFamily, "source_records",
                 "Records the sources read, over every attempt.", s["source_records"]),
                (CounterMetricFamily, "checkpoints_completed",
                 "Checkpoints completed (savepoints included).", ck["completed"]),
                (CounterMetricFamily, "checkpoints_failed",
                 "Checkpoints aborted: declined, expired, storage failed.", ck["failed"]),
                (GaugeMetricFamily, "checkpoints_in_progress",
                 "Checkpoints triggered, not yet complete.", len(ck["in_progress"]))):
            yield job_metric(kind, metric, doc, value)

        labels = ["job", "operator", "task"]
        per_task = {key: kind(f"cutline_task_{metric}", doc, labels=labels)
                    for key, kind, metric, doc in (
            ("records", CounterMetricFamily, "records_in",
             "Records a task took in (a source: read), this attempt."),
            ("records_per_s", GaugeMetricFamily, "records_per_second",
             "Records/s a task took in, over the last second or more."),
            ("backpressured_s", CounterMetricFamily, "backpressured_seconds",
             "Seconds a task's output waited for credit from a slower receiver, "
             "this attempt."),
            ("backpressure", GaugeMetricFamily, "backpressure_ratio",
             "Share of the last second or more a task was backpressured."),
            ("timers", GaugeMetricFamily, "timers",
             "A task's pending timers (process with on_timer), counted every 5 s up to "
             f"{TIMERS_COUNTED:,}."),
            ("watermark", GaugeMetricFamily, "watermark_seconds",
             "A task's output watermark (event time)."))}
        for op in s["operators"]:
            for st in op["subtasks"]:
                values = [name, op["uid"], st["task"]]
                for key, family in per_task.items():
                    if key != "watermark":
                        family.add_metric(values, st[key])
                    elif st["timed"]:
                        w = st[key]
                        family.add_metric(values, math.inf if w == "end" else
                                          -math.inf if w is None else w)
        yield from per_task.values()

        late = CounterMetricFamily(
            "cutline_late_records_dropped",
            "Records a window operator's subtask dropped as late: later than allowed_lateness "
            "for every window they belong to (records read with .late() are not dropped). "
            "Counted exactly once, in its checkpoints: a restored count goes on.",
            labels=["job", "operator", "subtask"])
        for op in s["operators"]:
            for st in op["subtasks"]:
                for uid, n in st["late"].items():
                    late.add_metric([name, uid, st["task"].rsplit(".", 1)[-1]], n)
        yield late

        lag = GaugeMetricFamily(
            "cutline_source_lag_records",
            "Records a source subtask is behind the end of a split (Kafka: a partition's high "
            "watermark minus the next offset the source reads).",
            labels=["job", "operator", "subtask", "split"])
        stalled = GaugeMetricFamily(
            "cutline_source_stalled",
            "1 while a source subtask cannot read (a Kafka broker not answering).",
            labels=["job", "operator", "subtask"])
        for op in s["operators"]:
            for st in op["subtasks"]:
                sub = st["task"].rsplit(".", 1)[-1]
                for split, n in sorted(st["lag_splits"].items()):
                    lag.add_metric([name, op["uid"], sub, split], n)
                if st["lag"] is not None or st["stalled"]:
                    stalled.add_metric([name, op["uid"], sub], 1.0 if st["stalled"] else 0.0)
        yield lag
        yield stalled

        latest = next((h for h in ck["history"] if h["status"] == "completed"), None)
        if latest is None:
            return
        for metric, key, doc in (
                ("id", "id", "Id of the latest completed checkpoint."),
                ("timestamp_seconds", "triggered", "When it was triggered (Unix time)."),
                ("duration_seconds", "duration", "From its trigger to its last ack."),
                ("size_bytes", "bytes", "State it persisted, every task."),
                ("alignment_seconds", "alignment", "Longest alignment of any task."),
                ("in_flight_records", "in_flight", "In-flight records it persisted."),
                ("in_flight_bytes", "in_flight_bytes", "Their persisted size.")):
            yield job_metric(GaugeMetricFamily, f"last_checkpoint_{metric}", doc, latest[key])
        for metric, key, doc in (
                ("end_to_end_seconds", "end_to_end", "From the trigger to this task's ack."),
                ("alignment_seconds", "alignment", "Channels held blocked for the barriers."),
                ("sync_seconds", "sync", "The synchronous part: state captured, barrier sent."),
                ("async_seconds", "async", "The asynchronous part: state written."),
                ("size_bytes", "bytes", "State this task persisted."),
                ("in_flight_records", "in_flight", "In-flight records this task persisted."),
                ("in_flight_bytes", "in_flight_bytes", "Their persisted size.")):
            g = GaugeMetricFamily(f"cutline_last_checkpoint_task_{metric}",
                                  f"Latest completed checkpoint, per task: {doc}",
                                  labels=labels)
            for t in latest["tasks"]:
                g.add_metric([name, self.view.chain_of.get(t["task"], ""), t["task"]],
                             t[key])
            yield g


# ---------------------------------------------------------------------------- the server


def _page_args(query: dict[str, list[str]]) -> dict[str, Any]:
    """``/api/job?offset=20&limit=20&upto=80&checkpoint=17``: which checkpoints to list."""
    def number(name: str) -> int | None:
        text = query.get(name, [""])[0]
        if not text:
            return None
        if not text.isdigit():
            raise ValueError(f"{name} must be a whole number >= 0, got {text!r}")
        return int(text)

    out: dict[str, Any] = {"selected": number("checkpoint"), "upto": number("upto")}
    offset, limit = number("offset"), number("limit")
    if offset is not None:
        out["offset"] = offset
    if limit is not None:
        out["limit"] = max(1, min(limit, 1000))
    return out


def page(snapshot: dict[str, Any] | None = None) -> bytes:
    """The dashboard's page; with ``snapshot`` (a finished job's, every checkpoint in its
    history) a static, self-contained report: the data is in the page, nothing is polled."""
    html = (resources.files(__package__) / "dashboard.html").read_bytes()
    if snapshot is None:
        return html
    data = json.dumps(snapshot, default=str, separators=(",", ":"))  # ASCII only
    # inside <script>: no "<" at all ("</script>" or "<!--" in an error message would end
    # or derail it); JSON reads the escape back as the same character
    data = data.replace("<", "\\u003c")
    tag = f'<script id="cutline-job" type="application/json">{data}</script>\n'
    marker = b"<script>\n\"use strict\";"
    if marker not in html:  # pragma: no cover - the page and this function go together
        raise RuntimeError("dashboard.html: its script's first line changed")
    return html.replace(marker, tag.encode() + marker, 1)


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection that failed before a request (a plaintext client at the HTTPS
        port, a TLS handshake that failed): logged on one line, no traceback."""
        exc = sys.exc_info()[1]
        log.warning("refused dashboard connection from %s: %s: %s", client_address[0],
                    type(exc).__name__, exc)


class Dashboard:
    """Serves a job's :class:`JobView` on ``127.0.0.1:port`` (0: a free port) until
    :meth:`stop`.  :attr:`url` (with the token) is what the user opens."""

    def __init__(self, view: JobView, port: int = 0) -> None:
        from prometheus_client import CollectorRegistry

        self.view = view
        self.token = secrets.token_urlsafe(16)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(view))
        self._page = page()
        self.server = _Server(("127.0.0.1", port), self._handler())
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        secret = getattr(view.driver, "secret", None)
        self.fingerprint = secret.fingerprint if isinstance(secret, JobSecret) else None
        if isinstance(secret, JobSecret) and secret.tls:  # handshake: in the request's thread
            context = secret.sibling(secret.key, mutual=False).server_context()
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True,
                                                     do_handshake_on_connect=False)
        scheme = "https" if self.fingerprint else "http"
        self.url = f"{scheme}://127.0.0.1:{self.port}/?token={self.token}"
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.2},
                             name="cutline-dashboard", daemon=True),
            threading.Thread(target=self._sample, name="cutline-dashboard-rates", daemon=True)]
        for t in self._threads:
            t.start()

    def _sample(self) -> None:
        while not self._stop.wait(self.view.rates.every):
            try:
                self.view.sample()
            except Exception:  # noqa: BLE001 - a dashboard never fails a job
                log.debug("dashboard sample failed", exc_info=True)

    def stop(self) -> None:
        self._stop.set()
        self.server.shutdown()
        self.server.server_close()
        for t in self._threads:
            t.join(2)

    def announce(self, out: Any = None) -> None:
        print(f"cutline: dashboard of job {self.view.run.job!r}: {self.url}  "
              f"(Prometheus: {self.url.replace('/?', '/metrics?')})",
              file=out or sys.stderr, flush=True)
        if self.fingerprint:
            print(f"cutline: the dashboard's TLS certificate (made for this run): SHA-256 "
                  f"{self.fingerprint}", file=out or sys.stderr, flush=True)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        board = self

        class Handler(BaseHTTPRequestHandler):
            server_version = "cutline"
            sys_version = ""

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                url = urlsplit(self.path)
                given = parse_qs(url.query).get("token", [""])[0]
                auth = self.headers.get("Authorization", "")
                if auth.startswith("Bearer "):
                    given = given or auth[len("Bearer "):].strip()
                if url.path == "/favicon.ico":  # a browser asks without the token
                    self._reply(404, b"not found\n", "text/plain; charset=utf-8")
                    return
                if not hmac.compare_digest(given.encode(), board.token.encode()):
                    log.warning("refused dashboard request from %s: %s",
                                self.client_address[0],
                                "wrong token" if given else "no token")
                    self._reply(403, b"forbidden: this dashboard needs its job's token\n",
                                "text/plain; charset=utf-8")
                    return
                try:
                    if url.path == "/":
                        self._reply(200, board._page, "text/html; charset=utf-8")
                    elif url.path == "/api/job":
                        query = parse_qs(url.query)
                        body = json.dumps(board.view.snapshot(**_page_args(query)),
                                          default=str).encode()
                        self._reply(200, body, "application/json")
                    elif url.path == "/metrics":
                        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

                        self._reply(200, generate_latest(board.registry), CONTENT_TYPE_LATEST)
                    else:
                        self._reply(404, b"not found\n", "text/plain; charset=utf-8")
                except ValueError as exc:  # a bad query: ?offset=x
                    self._reply(400, f"{exc}\n".encode(), "text/plain; charset=utf-8")
                except Exception as exc:  # noqa: BLE001 - a dashboard never fails a job
                    log.debug("dashboard request failed", exc_info=True)
                    self._reply(500, f"{type(exc).__name__}: {exc}\n".encode(),
                                "text/plain; charset=utf-8")

            def _reply(self, code: int, body: bytes, kind: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass  # no access log on the user's terminal

        return Handler
