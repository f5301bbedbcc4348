"""Event time in the simulator: watermarks in band across a crash, windows exactly once.

Sources send out-of-order records and their watermarks (FIFO with the records) to window
tasks on the real WatermarkTracker and window assigners, behind the real snapshot handlers,
under every exactly-once mode; the job dies at a random time and restores the latest
completed checkpoint.  The oracle (cutline.sim.eventtime.check): every item applied exactly
once in channel order, and the sink's output equal to a fresh operator's replaying the
items the task applied.  Each injected bug must be caught.
"""

from __future__ import annotations

import json

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from cutline.analysis.explore_time import replay
from cutline.cli import main
from cutline.protocol.windows import session, sliding, tumbling
from cutline.sim.eventtime import Workload
from cutline.sim.scenarios import watermarks


_BACKLOG = {"crash_at": 7.0, "interval": 2.0, "records": 10, "shorter": 0, "pause_at": None,
            "windows": 1, "assigner": tumbling(10), "lateness": 0, "service": 0.6}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# a slow window task: these restore watermarks from channel state
@example(seed=0, mode="unaligned", **_BACKLOG)
@example(seed=4, mode="chandy_lamport", **_BACKLOG)
@example(seed=2, mode="aligned_timeout", **_BACKLOG)
# a straggler soon after the restore, for a window that fired before the checkpoint
@example(seed=2, mode="unaligned", **{**_BACKLOG, "crash_at": 9.0, "service": 0.3})
# S2 is idle at the checkpoint: the restore keeps it idle
@example(seed=8, mode="aligned", **{**_BACKLOG, "pause_at": 1, "service": 0.3})
@given(seed=st.integers(0, 2**31), mode=st.sampled_from(list(watermarks.MODES)),
       crash_at=st.floats(0.5, 15.0).map(lambda t: None if t > 14 else t),  # None: no crash
       interval=st.floats(1.0, 4.0),
       records=st.integers(1, 10), shorter=st.integers(0, 6),
       pause_at=st.none() | st.integers(1, 8), windows=st.integers(1, 2),
       assigner=st.sampled_from([tumbling(10), sliding(10, 5), session(4)]),
       lateness=st.sampled_from([0, 5]), service=st.sampled_from([0.1, 0.3, 0.6]))
def test_windows_fire_exactly_once_across_a_crash_in_every_mode(
        seed, mode, crash_at, interval, records, shorter, pause_at, windows, assigner, lateness,
        service):
    r = watermarks.run(seed, mode, crash_at=crash_at, interval=interval,
                       workload=Workload(records=records, shorter=shorter, pause_at=pause_at),
                       windows=windows,
                       assigner=assigner, lateness=lateness, service=service)
    assert r.ok, r.problems


def test_a_restore_reopens_inputs_that_had_ended():
    """S2 has no records and ends at once, before the checkpoint; after the restore W's
    watermark waits for S2 to end again (a tracker keeps no closed flags, as the runtime's
    does not), so windows fire later than a replay that forgot the restore would say: the
    log marks it."""
    r = watermarks.run(484786, "aligned_timeout", crash_at=7.87, interval=3.87,
                       workload=Workload(records=8, shorter=8, straggle_every=3),
                       assigner=sliding(10, 5), service=0.1)
    assert r.ok, r.problems
    task = r.worlds[-1].procs["W"].logic
    log = task.state["log"]
    restored = log.index((None, ("restored",)))
    assert log[0] == ("S2->W", ("eof",)) and ("S2->W", ("eof",)) in log[restored:]
    without = [e for e in log if e[1] != ("restored",)]
    assert replay(task.channels, task.assigner, 0, without).output != \
        replay(task.channels, task.assigner, 0, log).output


def _first_caught(fault: str, modes: list[str], problem: str) -> watermarks.WatermarksResult:
    """The first of a fixed series of runs with ``fault`` in which the check finds
    ``problem``."""
    for seed in range(60):
        for mode in modes:
            r = watermarks.run(seed, mode, crash_at=3.0 + seed % 12, fault=fault,
                               workload=Workload(records=10))
            if any(problem in p for p in r.problems):
                return r
    raise AssertionError(f"fault {fault} was never caught")


def test_restored_channel_state_without_its_watermarks_is_caught():
    r = _first_caught("watermarks_not_in_channel_state",
                      ["unaligned", "chandy_lamport", "aligned_timeout"], "the channel carried")
    assert r.as_dict()["channel_state"]["watermarks"] == 0  # the fault took them out
    # the same run without the fault: the watermarks were in the channel state
    ok = watermarks.run(r.seed, r.mode, crash_at=r.crash_at, workload=Workload(records=10))
    assert ok.ok and ok.as_dict()["channel_state"]["watermarks"] > 0


def test_a_watermark_that_starts_over_after_a_restore_fires_a_window_twice():
    r = _first_caught("tracker_not_restored", ["aligned"], "fired twice")
    assert any("a failure-free operator makes" in p for p in r.problems), r.problems


def test_simulate_watermarks_prints_draws_and_refuses_mode_elsewhere(tmp_path, capsys):
    r = watermarks.run(8, "unaligned")
    d = r.as_dict()
    assert r.ok and d["restored_checkpoint"] == 2
    assert d["channel_state"] == {"records": 1, "watermarks": 1}
    assert d["late"] == [{"key": "a", "ts": 3}, {"key": "a", "ts": 1}]
    assert [(w["key"], w["start"], w["count"]) for w in d["windows"]] == [
        ("a", 0, 3), ("a", 10, 2), ("b", 10, 4), ("a", 20, 1)]
    run = watermarks.time_run(r)
    assert run.crash is not None and run.restored == 2 and not run.problems
    assert {a[1][0] for a in run.arrows} == {"r", "w", "b", "eof"}
    replayed = [a for a in run.arrows if a[2] >= run.crash and a[2] < run.crash + 1]
    assert sorted(a[1][0] for a in replayed) == ["r", "w"]  # the channel state, from the band
    assert {o[0] for _, o in run.outputs} == {"window", "late"}
    assert run.watermarks[-1][1] == float("inf")

    assert main(["simulate", "watermarks", "--mode", "unaligned", "--seed", "8",
                 "--format", "json", "--diagram", str(tmp_path / "w.svg")]) == 0
    assert json.loads(capsys.readouterr().out) == d
    assert (tmp_path / "w.svg").read_text().count("<svg") == 1
    assert main(["simulate", "watermarks", "--seed", "8"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "late record" in out and "no window fired twice, early or never" in out
    assert main(["simulate", "lecture", "--mode", "aligned"]) == 2
    assert "apply to the watermarks scenario only" in capsys.readouterr().err
