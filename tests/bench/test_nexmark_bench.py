"""The pure parts of ``bench/nexmark.py``'s latency and kill measurements: whether a run kept
up with its input, and when a system caught up after a kill.  No Spark."""

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def nx():
    sys.path.insert(0, str(BENCH))
    try:
        import nexmark

        yield nexmark
    finally:
        sys.path.remove(str(BENCH))


def test_growth_is_zero_when_keeping_up_and_the_lag_rate_when_falling_behind(nx):
    # every commit 1 s apart; keeping up: the same latency throughout (several rows each)
    steady = [(t, lat) for t in range(10) for lat in (0.2, 0.3, 0.4)]
    assert nx.growth(steady) == pytest.approx(0.0)
    # capacity 0.6 x the rate: a result's latency grows by 0.4 s per s of run
    behind = [(t, 1.0 + 0.4 * t) for t in range(10)]
    assert nx.growth(behind) == pytest.approx(0.4)
    assert nx.growth(behind) > nx.KEEPS_UP >= nx.growth(steady)
    # per commit the median counts, not a slow outlier row
    outliers = [(t, lat) for t in range(6) for lat in (0.2, 0.3, 9.0 if t > 2 else 0.3)]
    assert nx.growth(outliers) == pytest.approx(0.0)
    assert nx.growth(behind[:3]) is None  # too few commits to tell


def test_caught_up_is_the_first_commit_from_which_results_stay_fast_for_a_while(nx):
    kill = 100.0
    points = [(99.0, 0.1), (101.0, 0.2), (103.0, 4.0), (104.0, 2.5), (105.0, 0.3),
              (106.0, 0.2), (106.0, 0.1)]
    assert nx.caught_up(points, kill, bound=1.0) == pytest.approx(5.0)
    assert nx.caught_up(points, kill, bound=5.0) == pytest.approx(1.0)
    assert nx.caught_up(points + [(107.0, 3.0)], kill, bound=1.0) is None  # slow to the end
    # a slow result more than 10 s after the recovery is noise, not the recovery; but a
    # stall with no commit for 10 s is not recovered: its first commit counts
    assert nx.caught_up([(100.5, 0.1), (112.0, 11.0), (113.0, 0.1)], kill, bound=1.0) == \
        pytest.approx(13.0)
    assert nx.caught_up(points + [(115.5, 0.1), (117.0, 3.0)], kill, bound=1.0) == \
        pytest.approx(5.0)
    assert nx.caught_up(points + [(114.0, 3.0), (115.0, 0.1)], kill, bound=1.0) == \
        pytest.approx(15.0)
    side = {"caught_up": None, "after_kill": [7.0]}
    assert nx.caught_up_text(side) == "> 7"
    assert nx.caught_up_text(side | {"caught_up": 5.0}) == "5.00"


def test_a_kill_that_held_back_no_result_only_bounds_the_recovery(nx):
    """Sessions 10 s apart: the first result after the kill came 13 s later and on time;
    the figure is shown as a bound ("<= 13.00"), not as 13 s of outage."""
    kill, bound = 100.0, 0.5
    quiet = [(90.0, 0.2), (113.0, 0.2), (114.0, 0.2), (120.0, 0.2), (125.0, 0.2)]
    slow = [(90.0, 0.2), (101.5, 1.4), (103.0, 0.2), (104.0, 0.2), (120.0, 0.2)]
    runs = {"kill q11 cutline": [{"points": quiet, "killed": {"time": kill, "what": "w"}}],
            "kill q11 spark": [{"points": slow, "killed": {"time": kill, "what": "a"}}]}
    latency = [{"query": "q11", "cutline_p99": 0.2, "spark_p99": {nx.SPARK_DEFAULT: 0.2}}]
    row = nx.summarise_kills(runs, ["q11"], latency)[0]
    assert row["cutline"]["first_only"] and row["cutline"]["first_result"] == [13.0]
    assert nx.caught_up_text(row["cutline"]) == "<= 13.00"
    assert not row["spark"]["first_only"]  # a result was held back: the recovery shows
    assert nx.caught_up_text(row["spark"]) == "3.00"
    assert row["spark"]["bound"] == bound


def test_q11_is_killed_after_its_first_sessions_close_the_others_at_20_percent(nx):
    ctx = {"kill_seconds": 50.0, "kill_queries": ["q3", "q11"]}
    assert nx.kill_time(ctx, "q3") == pytest.approx(10.0)
    assert nx.kill_time(ctx, "q11") == pytest.approx(30.0)  # its first sessions: ~23 s in
    cases = dict(nx.kill_cases(ctx))
    assert list(cases) == ["kill q3 cutline", "kill q3 spark", "kill q11 cutline",
                           "kill q11 spark"]
    # each case closes over its own query's kill time (not the loop's last)
    assert [c.__defaults__ for c in cases.values()] == [
        ("q3", 10.0), ("q3", 10.0), ("q11", 30.0), ("q11", 30.0)]


def test_a_merged_run_replaces_its_queries_runs_and_rows_and_keeps_the_rest(nx):
    settings = {"quick": False, "rate": 500.0, "latency_seconds": 25.0, "kill_seconds": 50.0,
                "warmup": 5.0}
    old = settings | {
        "runs": {"warm-up spark": [1], "lat q7 cutline EO 0.1 s": ["q7"],
                 "lat q8 cutline EO 0.1 s": ["old"], "lat q8 spark processingTime 100 ms":
                 ["old"], "kill q8 cutline": ["old"], "q8 spark": ["kept"]},
        "latency": [{"query": "q7", "p99": 1}, {"query": "q8", "p99": 2}],
        "kills": [{"query": "q8", "s": 9}], "summary": [{"query": "q8", "ratio": 3}]}
    new = settings | {
        "runs": {"warm-up spark": [0], "lat q8 cutline EO 0.1 s": ["new"],
                 "lat q8 spark default trigger": ["new"]},
        "latency": [{"query": "q8", "p99": 0.1}], "kills": [], "summary": [],
        "stamp": {"when": "now"}, "git": {"commit": "c"}, "load": {"p50": 1.0}, "failures": []}
    got = nx.merge_into(old, new)
    assert got["runs"] == {"warm-up spark": [1], "q8 spark": ["kept"],
                           "lat q7 cutline EO 0.1 s": ["q7"],
                           "lat q8 cutline EO 0.1 s": ["new"],
                           "lat q8 spark default trigger": ["new"],
                           "kill q8 cutline": ["old"]}
    assert list(got["runs"])[-1] == "kill q8 cutline"  # in part, then query order
    assert got["latency"] == [{"query": "q7", "p99": 1}, {"query": "q8", "p99": 0.1}]
    assert got["kills"] == old["kills"] and got["summary"] == old["summary"]
    assert got["merged"] == [{"runs": ["lat q8"], "stamp": {"when": "now"},
                              "git": {"commit": "c"}, "load": {"p50": 1.0}, "failures": []}]
    # a kill-only run (no latency runs of its own): its kills are bounded by the merged
    # file's failure-free p99s, the other queries' kill rows kept
    killed = {"points": [(99.0, 0.2), (101.0, 3.0), (102.0, 0.3), (113.0, 0.3)],
              "killed": {"time": 100.0, "what": "w"}}
    kill_only = settings | {
        "runs": {"kill q7 cutline": [killed], "kill q7 spark": [killed]},
        "latency": [], "kills": [{"query": "q7", "cutline": None}], "summary": [],
        "stamp": {}, "git": {}, "load": {}, "failures": []}
    got = nx.merge_into(old | {"latency": [{"query": "q7", "cutline_p99": 0.4,
                                            "spark_p99": {nx.SPARK_DEFAULT: 0.2}}]}, kill_only)
    assert [r["query"] for r in got["kills"]] == ["q7", "q8"]
    q7 = got["kills"][0]
    assert q7["cutline"]["bound"] == pytest.approx(0.8) and q7["spark"]["bound"] == 0.5
    assert q7["cutline"]["caught_up"] == q7["spark"]["caught_up"] == pytest.approx(2.0)
    with pytest.raises(SystemExit, match="rate 500.0 there, 250.0 here"):
        nx.merge_into(old, new | {"rate": 250.0})
