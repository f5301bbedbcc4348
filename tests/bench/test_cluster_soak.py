"""The soak's judgement as data (``make soak`` itself runs for an hour, outside the suite):
the output check, the flatness and drift checks on a synthetic run, and the kill counter."""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

from _kills import record  # noqa: E402
from cluster_jobs import soak_check, soak_event  # noqa: E402
from soak import judge  # noqa: E402


def committed(count: int) -> list[tuple]:
    n: collections.Counter = collections.Counter()
    rows = []
    for i in range(count):
        u = soak_event(i)["user"]
        n[u] += 1
        rows.append((u, n[u], i))
    return rows


def test_the_output_check_counts_lost_and_duplicated_records():
    rows = committed(500)
    assert soak_check(rows, 500)["exact"]
    lost = soak_check(rows[:100] + rows[101:], 500)
    assert (lost["lost"], lost["duplicated"], lost["exact"]) == (1, 0, False)
    dup = soak_check(rows + [rows[7]], 500)
    assert (dup["lost"], dup["duplicated"], dup["exact"]) == (0, 1, False)
    # the tail the sources read but the sink never committed is lost too
    assert soak_check(rows, 510)["lost"] == 10


def run(minutes: int = 10) -> dict:
    """A flat, driftless run: samples every 5 s, a checkpoint every second."""
    role = {"rss_mb": 100.0, "fds": 20, "threads": 12, "n": 1}
    # every minute a sample between a kill and the next attempt: no task processes
    none = {"rss_mb": 0, "fds": 0, "threads": 0, "n": 0}
    samples = [{"t": t, "driver": dict(role), "driver_jvm": dict(role), "executors": dict(role),
                "tasks": dict(role, n=2) if t % 60 else dict(none), "cluster_procs": 9}
               for t in range(0, minutes * 60, 5)]
    checkpoints = [{"completed": t, "duration": 0.02} for t in range(minutes * 60)]
    return {"samples": samples, "checkpoint_log": checkpoints, "warmup": minutes * 12,
            "exact": True}


def test_flatness_and_drift_checks_pass_a_flat_run_and_fail_a_growing_one():
    flat = judge(run())
    assert flat["ok"]
    # the tasks' memory while they run (not 0 between a kill and the next attempt)
    assert flat["flatness"]["tasks.rss_mb"] == {"first": 100.0, "last": 100.0, "growth": 0.0,
                                                "bound": 32.0, "ok": True}
    leak = run()
    for i, s in enumerate(leak["samples"]):
        s["driver"]["fds"] += i // 5  # a file every other restart, say
    out = judge(leak)
    assert out["checks"] == {"output": True, "flat": False, "durations": True}
    assert [k for k, v in out["flatness"].items() if not v["ok"]] == ["driver.fds"]
    slow = run()
    for c in slow["checkpoint_log"][len(slow["checkpoint_log"]) // 2:]:
        c["duration"] = 0.2
    assert judge(slow)["checks"]["durations"] is False
    # a leak in the tasks is not hidden by kills coming faster at the end (more samples with
    # no task process: their zeros would pull the median down)
    late = run()
    for i, s in enumerate(late["samples"]):
        if s["tasks"]["n"]:
            s["tasks"]["rss_mb"] += i
        if i > 100 and i % 5 < 3:
            s["tasks"] = {"rss_mb": 0, "fds": 0, "threads": 0, "n": 0}
    assert not judge(late)["flatness"]["tasks.rss_mb"]["ok"]


def test_the_kill_counter_adds_up_survived_kills(tmp_path):
    path = tmp_path / "kills.json"
    record({"kind": "soak", "mode": "aligned", "kills": 18, "lost": 0, "duplicated": 0,
            "targets": {"worker": 8, "executor": 10}}, path)
    record({"kind": "chaos", "mode": "at_least_once", "kills": 5, "lost": 0,
            "duplicated": 3}, path)
    totals = record({"kind": "chaos", "mode": "unaligned", "kills": 4, "lost": 1,
                     "duplicated": 0}, path)
    assert totals == {"kills_survived": 23, "runs": 3, "runs_not_exact": 1,
                      "by_mode": {"aligned": 18, "at_least_once": 5},
                      "by_kind": {"chaos": 5, "soak": 18},
                      "by_target": {"executor": 10, "worker": 13}}
    assert json.loads(path.read_text())["totals"] == totals
