"""Event time across a restore, every interleaving: windows fire exactly once.

The explorer (cutline.analysis.explore_time) runs two sources with watermarks into a
tumbling-window count behind the real SnapshotHandler and WatermarkTracker, with a crash
and a restore at every point.  Each injected bug must be caught: a check that passes on
a broken model would prove nothing.
"""

from __future__ import annotations

import pytest

from cutline.analysis.explore_time import explore_time
from cutline.cli import main

pytestmark = pytest.mark.slow


def test_aligned_windows_fire_exactly_once_even_when_a_record_is_late_by_interleaving():
    r = explore_time("late", mode="aligned")
    assert r.ok, r.summary()
    assert r.states > 10_000 and r.interleavings > 10**15


def test_a_restore_that_forgets_the_watermark_reopens_a_fired_window():
    r = explore_time("late", mode="aligned", fault="tracker_not_restored", first=True)
    assert not r.ok
    assert any("fired twice" in p for p in r.problems), r.summary()
    assert r.stopped and "stopped at the first counterexample" in r.summary()


def test_unaligned_channel_state_carries_watermarks():
    assert explore_time("small", mode="unaligned").ok
    r = explore_time("small", mode="unaligned", fault="watermarks_not_in_channel_state",
                     first=True)
    assert not r.ok
    assert any("took" in p and "watermark" in p for p in r.problems), r.summary()


def test_a_watermark_snapshotted_after_the_cut_fires_a_window_early():
    assert explore_time("small", mode="chandy_lamport").ok
    r = explore_time("small", mode="chandy_lamport", fault="tracker_ahead", first=True)
    assert not r.ok
    assert any("late" in p for p in r.problems), r.summary()


def test_the_cli_explores_event_time_and_refuses_at_least_once(capsys):
    assert main(["explore", "--event-time", "small", "--mode", "aligned"]) == 0
    assert "every window fires exactly once" in " ".join(capsys.readouterr().out.split())
    with pytest.raises(ValueError, match="at_least_once"):
        explore_time("small", mode="at_least_once")


def test_one_interleaving_with_a_crash_is_drawn(tmp_path):
    from cutline.analysis.time_diagram import draw_time_run, sample_run

    run = sample_run("late", "aligned", seed=1)
    assert run.crash is not None and run.restored == 1 and not run.problems
    assert any(o[0] == "late" for _, o in run.outputs)
    # every item of both channels reached W (the ends after the crash again)
    assert {a[1][0] for a in run.arrows} == {"r", "w", "b", "eof"}
    out = draw_time_run(run, tmp_path / "t.png")
    assert out.stat().st_size > 20_000
    assert main(["explore", "--event-time", "small", "--diagram", str(tmp_path / "c.svg")]) == 0
    assert (tmp_path / "c.svg").read_text().count("<svg") == 1
