"""Event time exactly once on real Spark, against one failure-free run per state backend
(:mod:`event_time_job`: tumbling windows with late output, merging sessions with theirs,
and event-time timers, all from one source split, so the failure-free output is one fixed
sequence of rows per key):

* a Python worker killed with ``kill -9`` mid-stream, in every exactly-once mode (aligned,
  unaligned, aligned with a timeout that switches to unaligned) on both backends: every
  sink's committed output equals the failure-free run's row for row and, per key, in the
  same order; so the restored job's first window fires at the same point as in the
  failure-free run (between the same re-emits of late records, with the same count);
* a rescale 2 -> 1 -> 2 mid-stream: stopped with a savepoint while the source still has
  data, resumed at parallelism 1, stopped again, resumed at 2: the output of the three
  runs together is the failure-free run's.

The failure-free runs are on the threads engine: the job's items reach every subtask in
the same order on any engine, so Spark must commit exactly that output.
"""

from __future__ import annotations

import collections
import time

import pytest

from cutline.spark.faults import Kill
from cutline.storage.checkpoints import open_checkpoint
from cutline.storage.schema import read_task_states

from event_time_job import MODES, SINKS, first_after, job, sequences
from windows_pipelines import expected, late_rows

pytestmark = pytest.mark.slow

N = 40_000  # ("drop" records, late for good, start at 20,000); the job must run well past
# checkpoint 1 (which waits behind the buffered records), or a kill after it may come too late


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    """backend -> the failure-free run's rows: (sink, key) -> rows in emission order."""
    runs: dict[str, dict] = {}

    def get(backend: str) -> dict:
        if backend not in runs:
            tmp = tmp_path_factory.mktemp(f"baseline-{backend}")
            p, sinks = job(tmp, N, backend=backend)
            assert p.run(engine="threads", timeout=120).attempts == 1
            want, want_late = expected(N, "tumbling")
            assert collections.Counter(sinks["windows"].results()) == want
            assert late_rows(sinks["late"]) == want_late
            runs[backend] = sequences(sinks)
            assert {name for name, _ in runs[backend]} == set(SINKS)
        return runs[backend]

    return get


def _rows(seqs: dict, name: str) -> collections.Counter:
    return collections.Counter(tuple(sorted(r.items())) if isinstance(r, dict) else r
                               for (s, _), rows in seqs.items() if s == name for r in rows)


def _same_rows(got: dict, want: dict) -> None:
    for name in SINKS:
        g, w = _rows(got, name), _rows(want, name)
        assert g == w, (f"{name}: {sum((g - w).values())} rows too many, "
                        f"{sum((w - g).values())} missing, e.g. "
                        f"{sorted(map(repr, g - w))[:2]} / {sorted(map(repr, w - g))[:2]}")
    bad = [k for k in want if got.get(k) != want[k]]
    assert not bad, f"rows in another order for {bad[:4]}"


def _resumes_at_the_same_point(sinks: dict, want: dict, after: int) -> int:
    """Each key's first row after checkpoint ``after`` is the failure-free run's row at the
    same position of the key's sequence; returns how many keys resumed with a window."""
    firsts = first_after(sinks, "windows", after)
    for k, (n, row) in firsts.items():
        assert want[("windows", k)][n] == row, (k, n, row, want[("windows", k)][n - 1:n + 2])
    return len(firsts)


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
@pytest.mark.parametrize("mode", MODES)
def test_kill_9_of_a_worker_event_time_exactly_once(spark, tmp_path, baseline, mode, backend):
    want = baseline(backend)
    p, sinks = job(tmp_path, N, mode, backend=backend, slow=True)
    kill = Kill(after_checkpoint=1, delay=0.3)
    result = p.run(spark=spark, timeout=240, on_start=kill)
    assert kill.killed, "the worker was never killed"
    assert result.attempts >= 2
    assert [c for c in result.checkpoints if c.attempt >= 1], "no checkpoint after the restart"
    in_flight = sum(c.in_flight for c in result.checkpoints)
    assert (in_flight == 0) == (mode == "aligned"), in_flight  # the mode did what it says
    _same_rows(sequences(sinks), want)
    restored = max(c.id for c in result.checkpoints if c.attempt == 0)
    assert _resumes_at_the_same_point(sinks, want, restored) > 0


def _wait_for(path, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear in {timeout} s"
        time.sleep(0.05)


def test_rescale_2_to_1_to_2_mid_stream_on_spark(spark, tmp_path, baseline):
    """Stopped with a savepoint at parallelism 2 while the source still has data (it holds
    at record 8,000 of 24,000, the timers' operator behind it: data in flight), resumed at
    1 and stopped the same way at 16,000, resumed at 2 to the end: the three runs' output
    together is the failure-free run's, each key's rows in the same order, and where a run
    resumed, each key's first window is the failure-free run's next row."""
    want = baseline("memory")
    hold = (8_000, 16_000)
    savepoint, resumed_at, in_flight = None, [], 0
    for par, at in zip((2, 1), hold):
        p, sinks = job(tmp_path, N, "unaligned", parallelism=par, slow=True, hold=hold)
        running = p.start(spark=spark, timeout=120, restore_from=savepoint)
        _wait_for(tmp_path / f"release-{at}.held")
        savepoint = running.stop_with_savepoint(timeout=60)
        assert running.result(60).savepoint == savepoint
        (tmp_path / f"release-{at}").touch()
        handle = open_checkpoint(savepoint)
        resumed_at.append(handle.id)
        in_flight += sum(len(st.channels) + len(st.out_channels)
                         for st in read_task_states(handle).values())
    assert in_flight, "no data in flight in the savepoints: the rescale moved none"
    p, sinks = job(tmp_path, N, "unaligned", parallelism=2, hold=hold)
    result = p.run(spark=spark, timeout=120, restore_from=savepoint)
    assert result.restored_from == savepoint
    _same_rows(sequences(sinks), want)
    for after in resumed_at:
        assert _resumes_at_the_same_point(sinks, want, after) > 0
