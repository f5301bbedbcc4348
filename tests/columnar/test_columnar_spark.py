"""The columnar path's exactly-once twins on Spark, against the failure-free output
computed from the input (``columnar_pipelines.expected`` and ``session_events``;
``test_columnar`` and ``test_columnar_windows`` check a failure-free run gives it): the
stateless branch row for row, the keyed aggregates per user, the tumbling windows one row
per user and window, the sessions (allowed lateness: re-emitted rows) and their late rows
as multisets.

* a Python worker killed with ``kill -9`` mid-run, aligned and unaligned;
* a rescale 2 -> 1 -> 2 mid-stream: stopped with a savepoint while the sources still have
  data, resumed at parallelism 1, stopped again, resumed at 2 to the end (keyed state and
  windows move by key group, the generator's splits are handed out again)."""

import functools
import re
import time

import pytest

from columnar_pipelines import (
    columnar,
    expected,
    late_sessions,
    observed,
    observed_sessions,
    session_events,
)
from cutline.spark.faults import Kill

pytestmark = pytest.mark.slow

RECORDS = 40_000
VISITS = 12_000  # the sessions' source: 3,000 rows/s, as long as the other one


def _same(got: tuple, want: tuple, names: tuple[str, ...]) -> None:
    for name, g, w in zip(names, got, want):
        if isinstance(g, dict) and not hasattr(g, "most_common"):  # per user: final values
            bad = {u: (g.get(u), w.get(u)) for u in set(g) | set(w) if g.get(u) != w.get(u)}
            assert not bad, f"{name}: (got, want) {sorted(bad.items())[:4]}"
        else:
            assert g == w, (f"{name}: {sum((g - w).values())} rows too many, "
                            f"{sum((w - g).values())} missing, e.g. {sorted(g - w)[:3]} / "
                            f"{sorted(w - g)[:3]}")


BRANCHES = ("rows", "aggregates", "windows", "latest")
SESSIONS = ("sessions", "late rows")


@functools.lru_cache(maxsize=None)
def _sessions_want(records: int):
    return session_events(records)


@pytest.mark.parametrize("mode", ["aligned", "unaligned"])
def test_kill_9_of_a_worker_recovers_batch_streams_exactly(spark, tmp_path, mode):
    p, rows, aggs, wins, latest = columnar(tmp_path, RECORDS, mode, rate=10_000,
                                           batch_rows=1000)
    sessions = late_sessions(p, tmp_path, VISITS, rate=3_000)
    kill = Kill(after_checkpoint=1, delay=0.3)
    result = p.run(spark=spark, timeout=240, on_start=kill)
    assert kill.killed, "the worker was never killed"
    assert result.attempts >= 2
    assert [c for c in result.checkpoints if c.attempt >= 1], "no checkpoint after the restart"
    _same(observed(rows, aggs, wins, latest), expected(RECORDS), BRANCHES)
    _same(observed_sessions(*sessions), _sessions_want(VISITS), SESSIONS)


def _in_commit_order(sink) -> list[dict]:
    """The sink's rows by (checkpoint id, subtask): a key's rows in the order emitted, also
    across a rescale that moved it to another subtask."""
    import pyarrow.parquet as pq

    def order(f: str) -> tuple:
        m = re.match(r"part-(\d+)-(\d+)-(\d+)\.parquet$", f.rsplit("/", 1)[-1])
        assert m, f
        subtask, cid, n = map(int, m.groups())
        return cid, subtask, n

    return [r for f in sorted(sink.committed_files(), key=order)
            for r in pq.read_table(f).to_pylist()]


RESCALED = 20_000
RESCALED_VISITS = 6_000


def test_rescale_2_to_1_to_2_mid_stream_on_spark(spark, tmp_path):
    savepoint = None
    for par in (2, 1):  # each runs until two checkpoints completed, then stops
        p, rows, *_ = columnar(tmp_path, RESCALED, "unaligned", rate=5_000,
                               parallelism=par, batch_rows=500)
        late_sessions(p, tmp_path, RESCALED_VISITS, rate=1_500)
        running = p.start(spark=spark, timeout=120, restore_from=savepoint)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not (
                running.driver is not None and len(running.driver.run.checkpoints) >= 2):
            time.sleep(0.05)
        savepoint = running.stop_with_savepoint(timeout=60)
        assert running.result(60).savepoint == savepoint
        done = len(rows.read_records())
        assert 0 < done < len(expected(RESCALED)[0]), "stopped before or after the stream"
    p, rows, aggs, wins, latest = columnar(tmp_path, RESCALED, "unaligned", parallelism=2,
                                           batch_rows=500)
    sessions = late_sessions(p, tmp_path, RESCALED_VISITS)
    result = p.run(spark=spark, timeout=120, restore_from=savepoint)
    assert result.restored_from == savepoint
    _same(observed(rows, aggs, wins, latest), expected(RESCALED), BRANCHES)
    _same(observed_sessions(*sessions), session_events(RESCALED_VISITS), SESSIONS)
    starts: dict = {}  # each user's windows fired in order of time, across the rescales
    for r in _in_commit_order(wins):
        assert r["start"] > starts.get(r["user"], -1), r
        starts[r["user"]] = r["start"]
