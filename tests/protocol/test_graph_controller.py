"""The process-graph controller as data: events in, commands out; no sockets or Spark."""

from __future__ import annotations

import random

from hypothesis import given, settings, strategies as st

from cutline.protocol import messages as m
from cutline.protocol.graphjob import ID_POOL, GraphController, RestorePoint, StoreSnapshot
from cutline.protocol.job import Done, DoneCause, Send

# a -> b -> c, and d alone; a and b on host 0, c and d on host 1
NAMES = ("a", "b", "c", "d")
EDGES = (("a", "b"), ("b", "c"))
PLACEMENT = {"a": 0, "b": 0, "c": 1, "d": 1}


def controller(interval: float | None = 1.0, **kw) -> GraphController:
    kw.setdefault("rng", random.Random(7))
    return GraphController(NAMES, EDGES, PLACEMENT, 2, interval=interval, **kw)


def register(c: GraphController, attempt: int, now: float = 0.0) -> list:
    cmds = []
    for slot in (0, 1):
        cmds += c.on_register(f"a{attempt}h{slot}",
                              m.Register(slot, 100 + slot, {str(slot): ["h", slot]}), now)
    return cmds


def sent(cmds, kind=None) -> list[tuple]:
    return [(c.conn, c.msg) for c in cmds if type(c) is Send
            and (kind is None or type(c.msg) is kind)]


def parts(c: GraphController, n: int, now: float, attempt: int = 0, names=NAMES) -> list:
    cmds = []
    for name in names:
        cmds += c.on_message(f"a{attempt}h{PLACEMENT[name]}",
                             m.Parts(PLACEMENT[name], [[n, name, {"state": name}]]), now)
    return cmds


def test_a_run_starts_when_every_host_registered_and_restores_the_given_snapshot():
    c = controller(restore=RestorePoint(4, "/s/snap-4", in_transit=3), first_id=5)
    assert c.on_register("a0h0", m.Register(0, 1, {"0": ["h", 0]}), 10.0) == []
    cmds = c.on_register("a0h1", m.Register(1, 2, {"1": None}), 10.0)
    assert sent(cmds) == [(f"a0h{s}", m.Start(0, {"0": ["h", 0], "1": None}, "/s/snap-4", 10.0))
                          for s in (0, 1)]
    assert [(a.number, a.restored_id, a.redelivered) for a in c.attempts] == [(0, 4, 3)]


def test_a_snapshot_starts_at_the_initiator_and_where_no_marker_reaches():
    c = controller(initiators=("b",), first_id=5)
    register(c, 0, now=0.0)
    assert c.tick(0.5) == []
    cmds = c.tick(1.0)
    # b reaches c; a and d are reachable from nobody chosen: triggered too
    assert sent(cmds) == [("a0h0", m.TriggerProcesses(5, ["b", "a"])),
                          ("a0h1", m.TriggerProcesses(5, ["d"]))]
    assert parts(c, 5, 1.1, names=NAMES[:3]) == []
    [store] = parts(c, 5, 1.2, names=("d",))
    assert store == StoreSnapshot(5, {n: {"state": n} for n in NAMES}, ("b",), True, 0)
    assert c.in_flight() == []


def test_max_concurrent_counts_only_the_driver_s_snapshots():
    c = controller(interval=1.0, max_concurrent=2, first_id=1)
    register(c, 0)
    assert sent(c.tick(1.0), m.TriggerProcesses)
    assert sent(c.tick(2.0), m.TriggerProcesses)
    assert c.tick(3.0) == []  # two in flight
    # a process starts its own: more in flight, but the driver's limit is unchanged
    ids = sent(c.on_message("a0h0", m.IdsWanted(0), 3.1))[0][1].ids
    assert ids == list(range(3, 3 + ID_POOL))
    c.on_message("a0h0", m.Initiated(3, "a"), 3.2)
    assert c.tick(4.0) == []
    store = parts(c, 1, 4.1)
    assert [x.snapshot_id for x in store] == [1]
    assert sent(c.tick(4.2), m.TriggerProcesses)[0][1].checkpoint == 3 + ID_POOL


def test_a_process_initiated_snapshot_is_covered_and_named():
    c = controller(interval=None)
    register(c, 0)
    assert c.tick(100.0) == []  # no interval: the driver starts none
    cmds = c.on_message("a0h1", m.Initiated(9, "c"), 1.0)
    assert sent(cmds) == [("a0h0", m.TriggerProcesses(9, ["a"])),
                          ("a0h1", m.TriggerProcesses(9, ["d"]))]
    [store] = parts(c, 9, 2.0)
    assert store.initiators == ("c",) and not store.by_driver


def test_a_lost_host_stops_triggers_and_the_next_attempt_restores_the_last_kept():
    c = controller(interval=1.0, first_id=1)
    register(c, 0)
    c.tick(1.0)
    assert parts(c, 1, 1.1)
    c.stored(1, path="/s/1", in_transit=0, kept=[1], stop=None, now=1.2)
    c.tick(2.0)
    assert parts(c, 2, 2.1)
    c.stored(2, path="/s/2", in_transit=2, kept=[1, 2], stop=None, now=2.2)
    c.tick(3.0)  # snapshot 3 in flight when host 1 goes
    assert c.on_closed("a0h1", 3.5) == []
    assert c.tick(10.0) == [] and c.attempts[0].lost_at == 3.5
    cmds = register(c, 1, now=11.0)
    assert sent(cmds, m.Stop) == [("a0h0", m.Stop()), ("a0h1", m.Stop())]
    starts = sent(cmds, m.Start)
    assert [s.restore for _, s in starts] == ["/s/2", "/s/2"] and starts[0][1].attempt == 1
    assert c.in_flight() == []  # snapshot 3's markers will never arrive
    assert parts(c, 3, 11.5) == []  # parts of the old attempt are dropped
    assert sent(c.tick(12.0), m.TriggerProcesses)[0][1].checkpoint == 4  # ids never repeat


def test_retention_removed_the_last_snapshot_so_an_earlier_kept_one_restores():
    c = controller(interval=None, restore=RestorePoint(None, "/s/start"))
    register(c, 0)
    c.stored(7, path="/s/7", in_transit=0, kept=[7], stop=None, now=1.0)
    c.stored(3, path="/s/3", in_transit=0, kept=[7], stop=None, now=1.1)  # 3 was retained away
    c.on_closed("a0h0", 2.0)
    cmds = register(c, 1)
    assert {s.restore for _, s in sent(cmds, m.Start)} == {"/s/7"}


def test_a_stopping_predicate_stops_the_hosts_and_the_run_ends_with_their_final_states():
    c = controller(interval=1.0)
    register(c, 0)
    cmds = c.stored(1, path="/s/1", in_transit=0, kept=[1], stop="terminated", now=1.0)
    assert sent(cmds) == [("a0h0", m.Stop()), ("a0h1", m.Stop())]
    assert c.stopping == "terminated" and c.tick(2.0) == []  # no triggers while stopping
    assert c.on_message("a0h0", m.FinalStates(0, {"a": b""}), 2.0) == []
    assert c.on_closed("a0h0", 2.1) == []  # a host that said goodbye is not lost
    assert c.on_message("a0h1", m.FinalStates(1, {"c": b""}), 2.2) == [
        Done(DoneCause.FINISHED)]
    assert c.on_register("late", m.Register(0, 1, {}), 3.0) == [Send("late", m.Stop())]


def test_stop_gives_up_waiting_for_final_states_after_the_grace():
    c = controller(interval=None, duration=5.0)
    register(c, 0, now=100.0)
    assert c.tick(104.0) == []
    assert sent(c.tick(105.0), m.Stop) and c.stopping == "duration"
    assert c.tick(120.0) == []
    assert c.tick(136.0) == [Done(DoneCause.FINISHED)]


def test_a_fatal_failure_ends_the_run_with_its_error():
    c = controller()
    register(c, 0)
    assert c.on_message("a0h0", m.Failed("host-0", False, "flaky"), 1.0) == []
    assert c.on_message("a0h0", m.Failed("host-0", True, "boom"), 1.0) == [
        Done(DoneCause.TASK_FAILED, "boom")]
    assert c.on_stage_ended(2.0) == []  # Done at most once


# ---------------------------------------------------------------- property

EVENTS = st.lists(st.one_of(
    st.tuples(st.just("tick"), st.floats(0.1, 2.0)),
    st.tuples(st.just("part"), st.integers(0, 3)),       # next part of the oldest in flight
    st.tuples(st.just("initiate"), st.sampled_from(NAMES)),
    st.tuples(st.just("lose"), st.integers(0, 1)),
    st.tuples(st.just("stored"), st.booleans()),           # driver stores the oldest ready
    st.tuples(st.just("final"), st.integers(0, 1)),
), max_size=60)


@settings(max_examples=300, deadline=None)
@given(EVENTS, st.integers(1, 3), st.integers(0, 2**16))
def test_any_event_order_keeps_the_controller_s_promises(events, max_concurrent, seed):
    """Messages go only to the current attempt's hosts (Stop to the one it replaced);
    snapshot ids are never reused; a snapshot is stored once, with every process's part,
    all from one attempt; the driver never has more than ``max_concurrent`` of its own in
    flight; Done comes at most once."""
    c = controller(interval=1.0, max_concurrent=max_concurrent, rng=random.Random(seed),
                   initiators=2)
    now, attempt = 0.0, 0
    register(c, attempt, now)
    stored: list[int] = []
    ready: list[StoreSnapshot] = []
    triggered: set[int] = set()
    sent_parts: dict[int, set[str]] = {}
    dones = 0

    def run(cmds: list) -> None:
        nonlocal dones
        for cmd in cmds:
            if type(cmd) is Send:
                # only Stop goes to an earlier attempt's hosts (Spark restarted the stage)
                assert cmd.conn in (f"a{attempt}h0", f"a{attempt}h1") or (
                    type(cmd.msg) is m.Stop and cmd.conn in (f"a{attempt - 1}h0",
                                                             f"a{attempt - 1}h1"))
                if type(cmd.msg) is m.TriggerProcesses and cmd.msg.checkpoint not in triggered:
                    triggered.add(cmd.msg.checkpoint)
            elif type(cmd) is StoreSnapshot:
                assert cmd.snapshot_id not in stored
                assert set(cmd.parts) == set(NAMES) and cmd.attempt == c.attempt.number
                stored.append(cmd.snapshot_id)
                ready.append(cmd)
            elif type(cmd) is Done:
                dones += 1
        ours = [n for n in c.in_flight() if c.snaps[n].by_driver]
        assert len(ours) <= max_concurrent

    for kind, arg in events:
        if kind == "tick":
            now += arg
            run(c.tick(now))
        elif kind == "part" and c.in_flight():
            n = c.in_flight()[0]
            name = [x for x in NAMES if x not in sent_parts.setdefault(n, set())][0]
            sent_parts[n].add(name)
            run(c.on_message(f"a{attempt}h{PLACEMENT[name]}",
                             m.Parts(PLACEMENT[name], [[n, name, {}]]), now))
        elif kind == "initiate":
            [(_, ids)] = sent(c.on_message(f"a{attempt}h0", m.IdsWanted(0), now))
            for n in ids.ids:
                assert n not in triggered and n not in stored
            triggered.update(ids.ids)
            run(c.on_message(f"a{attempt}h{PLACEMENT[arg]}", m.Initiated(ids.ids[0], arg), now))
        elif kind == "lose":
            run(c.on_closed(f"a{attempt}h{arg}", now))
            if c.lost:
                attempt += 1
                run(register(c, attempt, now))
                sent_parts.clear()
        elif kind == "stored" and ready:
            snap = ready.pop(0)
            run(c.stored(snap.snapshot_id, path=f"/s/{snap.snapshot_id}", in_transit=0,
                         kept=stored, stop="terminated" if arg else None, now=now))
        elif kind == "final" and c.stopping is not None:
            run(c.on_message(f"a{attempt}h{arg}", m.FinalStates(arg, {}), now))
    run(c.on_stage_ended(now))
    assert dones <= 1 and (dones == 1) == c.done
    assert len(set(stored)) == len(stored)


# ---------------------------------------------------------------- next_due: the shell sleeps


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["wait", "parts", "stop", "lost", "register"]),
                          st.floats(0.0, 3.0)), max_size=30),
       st.sampled_from([None, 0.5, 1.0]), st.sampled_from([None, 4.0]))
def test_nothing_is_due_before_next_due(events, interval, duration):
    """The driver shell sleeps until ``next_due`` (or an event): a tick any earlier must
    have nothing to do (no trigger, no end of ``duration``, no stop deadline) late."""
    import copy

    c = controller(interval=interval, duration=duration)
    now, attempt = 0.0, 0
    register(c, attempt, now)
    for kind, x in events:
        if kind == "wait":
            now += x
        elif kind == "register":
            attempt += 1
            register(c, attempt, now)
        elif kind == "lost":
            c.on_closed(f"a{attempt}h1", now)
        elif kind == "stop":
            c.cancel(now)
        elif kind == "parts":
            for n in list(c.pending):
                parts(c, n, now, attempt)
        due = c.next_due(now)
        assert due is None or due >= now
        probe = copy.deepcopy(c)
        before = now + (x if due is None else min(x, (due - now) * 0.99))
        if due is None or before < due:
            assert probe.tick(before) == [], (now, due, before)
        c.tick(now)


def test_a_silent_host_fails_the_run_naming_it_and_stops_the_others():
    c = controller()
    register(c, 0)
    assert not c.failure_reported
    c.on_message("a0h0", m.Failed("host-0", False, "channel h1->h0 broke"), 1.0)
    assert c.failure_reported and c.last_failure == "host 0: channel h1->h0 broke"
    cmds = c.on_closed("a0h1", 2.0, "the host went silent: nothing heard for 3.1 s")
    assert cmds == [Send("a0h0", m.Stop(abandoned="host 1: the host went silent: nothing "
                                                  "heard for 3.1 s")),
                    Done(DoneCause.TASK_SILENT, "attempt 0 lost host 1: the host went "
                                                "silent: nothing heard for 3.1 s")]
    assert c.next_due(2.0) is None and c.tick(100.0) == []
    # a host that simply closes waits for Spark to restart the stage, as before
    c = controller()
    register(c, 0)
    assert c.on_closed("a0h1", 2.0) == [] and c.lost and not c.done
    assert c.last_failure == "host 1: its connection closed"
