"""Process graphs get the dataflow path's heartbeats and TLS from the one driver shell: a
frozen host (SIGSTOP on Spark; on threads, a host whose heartbeats stop while its thread is
blocked) fails the run naming it, long before the run's own timeout, and a run with TLS
gives the same result as one without."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from cutline.driver.dataflow import JobFailed
from cutline.graph import Process, ProcessGraph
from graph_programs import ledger_graph, ledger_problems

FREEZE = threading.Event()  # set: the host of "b" freezes (threads engine)
THAW = threading.Event()  # set: it may go on (the test is over)


class Ping(Process):
    """Sends to its peer every 20 ms, forever: the run never terminates by itself."""

    def __init__(self) -> None:
        self.state = {"sent": 0, "got": 0}

    def on_start(self, ctx) -> None:
        ctx.schedule(0.02)

    def on_timer(self, ctx, tag) -> None:
        self.state["sent"] += 1
        ctx.send(ctx.outputs[0], self.state["sent"])
        ctx.schedule(0.02)

    def on_message(self, ctx, sender, msg) -> None:
        self.state["got"] += 1


class FreezingPing(Ping):
    """On threads, a frozen process is simulated: once FREEZE is set, its host's heartbeat
    monitor stops and its one thread blocks, so nothing more comes from it (as under
    SIGSTOP, which would stop the test process itself here)."""

    def on_timer(self, ctx, tag) -> None:
        if FREEZE.is_set():
            ctx._h.heartbeats.stop()
            THAW.wait(120)
        super().on_timer(ctx, tag)


def ping_graph(cls_b: type = Ping) -> ProcessGraph:
    g = ProcessGraph("pingpong")
    g.add("a", Ping())
    g.add("b", cls_b())
    g.connect_both("a", "b")
    return g


def test_a_frozen_host_fails_the_run_naming_it_by_heartbeat_on_threads():
    FREEZE.clear()
    THAW.clear()
    seen = []

    def on_snapshot(snap) -> None:
        seen.append(snap.id)
        if len(seen) == 3:
            FREEZE.set()  # a few snapshots completed: freeze host 1 now

    t0 = time.monotonic()
    try:
        with pytest.raises(JobFailed) as failed:
            ping_graph(FreezingPing).run(engine="threads", tasks=2, snapshot_interval=0.05,
                                         heartbeat_timeout=3.0, timeout=60,
                                         on_snapshot=on_snapshot)
    finally:
        THAW.set()
    message = str(failed.value)
    assert FREEZE.is_set() and len(seen) >= 3
    assert message.startswith("graph 'pingpong' failed: attempt 0 lost host 1: the host "
                              "went silent: nothing heard for "), message
    assert "(heartbeat_timeout=3)" in message
    # detected by heartbeat, not by the run's timeout (60 s): JobCancelled would say so
    assert time.monotonic() - t0 < 60


def test_a_process_graph_runs_in_tls_with_the_same_result():
    secrets = []
    results = {}
    for tls in (False, True):
        results[tls] = ledger_graph(4, 40, 0.002).run(
            engine="threads", tasks=2, snapshot_interval=0.02, tls=tls, timeout=60, seed=11,
            on_start=lambda driver: secrets.append(driver.secret))
    assert [s.tls for s in secrets] == [False, True]
    for r in results.values():
        assert r.stopped == "terminated" and not r.violations and r.snapshots
        assert not ledger_problems(r.final_states)

    def outcome(r):  # seeded transfers: the same balances and receipts, in any order
        return {a: (s["balance"], sorted(map(tuple, s["seen"])))
                for a, s in r.final_states.items()}

    assert outcome(results[True]) == outcome(results[False])


def test_a_bad_heartbeat_timeout_or_tls_is_refused_naming_it():
    with pytest.raises(ValueError, match="heartbeat_timeout must be a positive"):
        ping_graph().run(engine="threads", heartbeat_timeout=0)
    with pytest.raises(ValueError, match="tls must be True, False or None"):
        ping_graph().run(engine="threads", tls="yes")


@pytest.mark.slow
def test_a_sigstopped_host_fails_the_run_naming_it_on_spark(spark):
    stopped: list[int] = []

    def freeze(driver) -> None:
        def run() -> None:
            while not driver.done.is_set():
                a = driver.run.attempt
                if a.started and len(driver.run.snapshots) >= 3 and 1 in a.pids:
                    os.kill(a.pids[1], signal.SIGSTOP)
                    stopped.append(a.pids[1])
                    return
                time.sleep(0.02)

        threading.Thread(target=run, daemon=True).start()

    try:
        with pytest.raises(JobFailed) as failed:
            ping_graph().run(spark=spark, tasks=2, snapshot_interval=0.05,
                             heartbeat_timeout=3.0, timeout=120, on_start=freeze)
    finally:
        for pid in stopped:  # a stopped worker holds its Spark slot: end it
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert stopped, "the host was never stopped"
    message = str(failed.value)
    assert "lost host 1: the host went silent: nothing heard for " in message, message
    assert "(heartbeat_timeout=3)" in message
