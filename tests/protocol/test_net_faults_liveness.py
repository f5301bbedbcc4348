"""Heartbeat decisions as data (cutline.protocol.liveness): no sockets, threads or clocks.

Two endpoints paired over simulated links (h11's style) show that idle but live peers are
never declared silent, and that a peer that stops (frozen, or a link that dies one way) is
declared silent once, within the timeout plus one tick."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings, strategies as st

from cutline.protocol.liveness import (
    HEARTBEAT_TIMEOUT,
    Liveness,
    PeerSilent,
    SendHeartbeat,
    check_timeout,
)


def test_heartbeats_on_idle_connections_then_silence_once():
    lv = Liveness(timeout=10.0)
    assert (lv.interval, lv.period) == (2.0, 1.0)
    lv.watch("a", 0.0)
    lv.watch("b", 0.0)
    assert lv.tick(1.0) == []
    lv.sent("b", 1.5)  # a record went to b: no heartbeat needed yet
    assert lv.tick(2.0) == [SendHeartbeat("a")]
    assert lv.tick(3.0) == [SendHeartbeat("a")]  # again: it was not sent
    assert lv.tick(3.5) == [SendHeartbeat("a"), SendHeartbeat("b")]
    lv.sent("a", 3.5)
    lv.sent("b", 3.5)
    assert lv.tick(4.0) == []
    for t in (5.0, 6.0, 7.0, 8.0, 9.0):  # on time: every period
        lv.sent("a", t)
        lv.sent("b", t)
        assert lv.tick(t) == []
    lv.received("a", 9.5)
    assert lv.tick(10.0) == [PeerSilent("b", 10.0)]  # nothing from b since watching began
    assert lv.tick(11.0) == [SendHeartbeat("a")] and lv.peers == ["a"]  # b: said once
    lv.forget("a")
    assert lv.tick(100.0) == []


def test_a_late_tick_means_we_were_stopped_not_them():
    lv = Liveness(timeout=10.0)
    lv.watch("a", 0.0)
    assert lv.tick(0.0) == []
    lv.sent("a", 30.0)
    # 30 s without a tick: this process was frozen; the peer's heartbeats wait unread
    assert lv.tick(30.0) == []
    lv.received("a", 30.5)  # the reader thread caught up
    assert lv.tick(31.0) == []
    lv.sent("a", 31.0)
    assert lv.tick(32.0) == []
    # without anything from it, it is silent once the grace is over
    lv2 = Liveness(timeout=10.0)
    lv2.watch("a", 0.0)
    lv2.tick(0.0)
    assert lv2.tick(30.0) == [SendHeartbeat("a")]
    assert lv2.tick(31.0) == [SendHeartbeat("a")]
    assert lv2.tick(32.0) == [PeerSilent("a", 32.0)]


def test_timeouts_are_checked():
    assert HEARTBEAT_TIMEOUT == 30.0 and check_timeout(2) == 2.0
    for bad in (0, -1, float("nan"), float("inf"), True, "5", None):
        with pytest.raises(ValueError, match="heartbeat_timeout must be a positive, finite"):
            check_timeout(bad)
    with pytest.raises(ValueError, match="shorter than the timeout"):
        Liveness(5.0, interval=5.0)


@pytest.mark.parametrize("option", ["heartbeat_timeout", "start_timeout", "restart_timeout"])
def test_a_run_refuses_a_bad_timeout_naming_it(tmp_path, option):
    from cutline import Pipeline
    from cutline.connectors import CollectSink, GeneratorSource

    p = Pipeline("timeouts")
    p.source(GeneratorSource(3)).sink(CollectSink(str(tmp_path / "out")))
    for bad in (0, float("nan"), True):
        with pytest.raises(ValueError, match=f"^{option} must be a positive, finite"):
            p.run(engine="threads", **{option: bad})


class Link:
    """One direction between two endpoints: bytes sent arrive ``delay`` later, or never
    once it died (a half-open connection, or a frozen sender: nothing leaves it)."""

    def __init__(self, delay: float) -> None:
        self.delay, self.dead_from = delay, float("inf")
        self.in_flight: list[float] = []  # arrival times

    def send(self, now: float) -> None:
        if now < self.dead_from:
            self.in_flight.append(now + self.delay)

    def arrived(self, now: float) -> list[float]:
        got = [t for t in self.in_flight if t <= now]
        self.in_flight = [t for t in self.in_flight if t > now]
        return got


def simulate(timeout, delay_ab, delay_ba, steps, dies=None):
    """Endpoints A and B, idle but for heartbeats, ticking at their own (jittered) times;
    ``dies``: (link name, when) after which that direction delivers nothing.  Returns the
    first declaration, [(who, peer, when, silent_for)], or [] (the declaring end closes
    the connection: what follows is a closed connection, no longer a silent one)."""
    lv = {"A": Liveness(timeout), "B": Liveness(timeout)}
    links = {"AB": Link(delay_ab), "BA": Link(delay_ba)}
    if dies is not None:
        links[dies[0]].dead_from = dies[1]
    for who in lv:
        lv[who].watch("B" if who == "A" else "A", 0.0)
    for now, who in steps:
        me, peer = who, "B" if who == "A" else "A"
        inbound = links[peer + me]
        for t in inbound.arrived(now):
            lv[me].received(peer, t)
        for action in lv[me].tick(now):
            if type(action) is SendHeartbeat:
                links[me + peer].send(now)
                lv[me].sent(peer, now)
            else:
                return [(me, action.peer, now, action.silent_for)]
    return []


def schedule(rnd, period: float, jitter: float, end: float) -> list[tuple[float, str]]:
    """Each endpoint ticks every ``period`` seconds, each tick up to ``jitter`` late."""
    steps = []
    for who in "AB":
        t = rnd.uniform(0.0, period)
        while t < end:
            steps.append((t, who))
            t += period + rnd.uniform(0.0, jitter)
    return sorted(steps)


TIMEOUTS = st.sampled_from([1.0, 2.0, 10.0, 30.0, 60.0])  # short ones: the 1 s tick cap
RANDOM = st.integers(0, 2**32).map(random.Random)  # a seed: cheap, and shown on failure


@settings(max_examples=150, deadline=None)
@given(timeout=TIMEOUTS, delays=st.tuples(st.floats(0, 0.3), st.floats(0, 0.3)), rnd=RANDOM)
def test_idle_but_alive_peers_are_never_declared_silent(timeout, delays, rnd):
    """Heartbeats every fifth of the timeout: a link up to 30% of the timeout slow and
    ticks up to 10% late (a loaded host) never make a live peer look dead."""
    period = Liveness(timeout).period
    steps = schedule(rnd, period, 0.1 * timeout, 8 * timeout)
    assert simulate(timeout, delays[0] * timeout, delays[1] * timeout, steps) == []


@settings(max_examples=150, deadline=None)
@given(timeout=TIMEOUTS, link=st.sampled_from(["AB", "BA"]), dies=st.floats(0.0, 3.0),
       rnd=RANDOM)
def test_a_dead_direction_is_declared_once_within_the_timeout_and_a_tick(timeout, link,
                                                                        dies, rnd):
    """One direction dies (half-open, or its sender froze): only the endpoint that stopped
    hearing declares its peer silent, once, at most timeout + one (late) tick after the
    last heartbeat that got through."""
    period = Liveness(timeout).period
    jitter = 0.05 * timeout
    steps = schedule(rnd, period, jitter, dies * timeout + 2 * timeout)
    declared = simulate(timeout, 0.0, 0.0, steps, dies=(link, dies * timeout))
    deaf = link[1]
    assert [(who, peer) for who, peer, _, _ in declared] == [(deaf, link[0])]
    (_, _, when, silent_for) = declared[0]
    assert silent_for >= timeout
    assert when <= dies * timeout + timeout + period + jitter + 1e-6
