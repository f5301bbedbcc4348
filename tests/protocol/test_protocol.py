"""The handler as data: feed events, assert the exact actions (no threads, no I/O)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cutline.protocol import (
    AbortCheckpoint, AlignmentTimeout, Barrier, BarrierArrived, BlockChannel, ChannelClosed,
    DeclineSnapshot, Deliver, EmitBarrier, FinishSnapshot, Mode, ProtocolError,
    RecordChannelState, RecordsArrived, ScheduleTimeout, SnapshotHandler, TakeSnapshot,
    TriggerCheckpoint, UnblockChannel,
)

B = Barrier


def snap(n, unaligned=False):
    return [TakeSnapshot(n), EmitBarrier(Barrier(n, unaligned))]


def test_source_snapshots_on_trigger():
    h = SnapshotHandler([], "aligned")
    assert h.on_trigger(1) == snap(1) + [FinishSnapshot(1)]
    assert h.on_trigger(1) == []  # duplicate trigger is idempotent


def test_aligned_blocks_until_all_inputs_then_snapshots():
    h = SnapshotHandler(["a", "b"], "aligned")
    assert h.on_records("a", (1, 2)) == [Deliver("a", (1, 2))]
    assert h.on_barrier("a", B(1)) == [BlockChannel("a")]
    with pytest.raises(ProtocolError, match="blocked channel 'a'"):
        h.on_records("a", (3,))
    assert h.on_records("b", (4,)) == [Deliver("b", (4,))]
    assert h.on_barrier("b", B(1)) == snap(1) + [FinishSnapshot(1), UnblockChannel("a")]
    assert h.idle


def test_aligned_timeout_switches_to_unaligned_and_records_pending_channels():
    h = SnapshotHandler(["a", "b"], "aligned", aligned_timeout=0.5)
    assert h.on_barrier("a", B(7)) == [ScheduleTimeout(7, 0.5), BlockChannel("a")]
    assert h.handle(AlignmentTimeout(7)) == snap(7, True) + [UnblockChannel("a")]
    # post-barrier data of 'a' is not channel state; pre-barrier data of 'b' is.
    assert h.on_records("a", (1,)) == [Deliver("a", (1,))]
    assert h.on_records("b", (2,)) == [RecordChannelState(7, "b", (2,)), Deliver("b", (2,))]
    assert h.on_barrier("b", B(7)) == [FinishSnapshot(7)]
    assert h.on_timeout(7) == []  # stale timer


def test_unaligned_barrier_from_upstream_switches_at_once():
    h = SnapshotHandler(["a", "b"], "aligned", aligned_timeout=10)
    acts = h.on_barrier("a", B(2, unaligned=True), overtaken=("x",))
    assert acts == snap(2, True) + [RecordChannelState(2, "a", ("x",)), Deliver("a", ("x",))]
    assert h.recording == {2: ("b",)}


def test_unaligned_overtaken_records_are_channel_state_and_delivered_after_snapshot():
    h = SnapshotHandler(["a", "b"], "unaligned")
    acts = h.on_barrier("a", B(1, True), overtaken=(1, 2))
    assert acts == snap(1, True) + [RecordChannelState(1, "a", (1, 2)), Deliver("a", (1, 2))]
    assert h.on_records("a", (3,)) == [Deliver("a", (3,))]
    assert h.on_records("b", (9,)) == [RecordChannelState(1, "b", (9,)), Deliver("b", (9,))]
    assert h.on_barrier("b", B(1, True), overtaken=(10,)) == [
        RecordChannelState(1, "b", (10,)), Deliver("b", (10,)), FinishSnapshot(1)]


def test_aligned_barrier_may_not_overtake():
    h = SnapshotHandler(["a"], "aligned")
    with pytest.raises(ProtocolError, match="only an unaligned barrier"):
        h.on_barrier("a", B(1), overtaken=(1,))


def test_chandy_lamport_concurrent_snapshots_record_independently():
    h = SnapshotHandler(["a", "b"], "chandy_lamport")
    assert h.on_barrier("a", B(1)) == snap(1)
    assert h.on_barrier("a", B(2)) == snap(2)
    assert h.on_records("b", ("m",)) == [
        RecordChannelState(1, "b", ("m",)), RecordChannelState(2, "b", ("m",)),
        Deliver("b", ("m",))]
    assert h.on_barrier("b", B(1)) == [FinishSnapshot(1)]
    assert h.on_records("b", ("n",)) == [RecordChannelState(2, "b", ("n",)), Deliver("b", ("n",))]
    assert h.on_barrier("b", B(2)) == [FinishSnapshot(2)]


def test_chandy_lamport_several_initiators_of_one_snapshot():
    h = SnapshotHandler(["a"], "chandy_lamport")
    assert h.on_barrier("a", B(5)) == snap(5) + [FinishSnapshot(5)]
    assert h.on_trigger(5) == []  # own initiation after the marker: already recorded
    g = SnapshotHandler(["a"], "chandy_lamport")
    assert g.on_trigger(5) == snap(5)
    assert g.on_barrier("a", B(5)) == [FinishSnapshot(5)]


def test_abort_unblocks_and_late_barrier_is_ignored():
    h = SnapshotHandler(["a", "b"], "aligned")
    h.on_barrier("a", B(1))
    assert h.handle(AbortCheckpoint(1)) == [UnblockChannel("a")]
    assert h.on_barrier("b", B(1)) == []  # late barrier of the aborted checkpoint
    assert h.idle


def test_newer_barrier_subsumes_alignment():
    h = SnapshotHandler(["a", "b"], "aligned")
    h.on_barrier("a", B(1))
    acts = h.on_barrier("b", B(2))
    assert acts == [UnblockChannel("a"), DeclineSnapshot(1, "subsumed by checkpoint 2"),
                    BlockChannel("b")]
    assert h.on_barrier("a", B(1)) == []  # late
    assert h.on_barrier("a", B(2)) == snap(2) + [FinishSnapshot(2), UnblockChannel("b")]


def test_channel_closing_during_alignment_completes_it():
    h = SnapshotHandler(["a", "b"], "aligned")
    h.on_barrier("a", B(1))
    assert h.handle(ChannelClosed("b")) == snap(1) + [FinishSnapshot(1), UnblockChannel("a")]
    with pytest.raises(ProtocolError, match="not an open input"):
        h.on_records("b", (1,))


def test_channel_closing_while_recording_finalises_its_state():
    h = SnapshotHandler(["a", "b"], "chandy_lamport")
    h.on_barrier("a", B(1))
    assert h.on_close("b") == [FinishSnapshot(1)]


def test_back_edges_are_logged_not_aligned():
    h = SnapshotHandler(["fwd", "loop"], "aligned", back_edges=["loop"])
    # forward barrier alone completes alignment: never wait on the cycle
    assert h.on_barrier("fwd", B(1)) == snap(1)
    assert h.on_records("loop", (5,)) == [
        RecordChannelState(1, "loop", (5,)), Deliver("loop", (5,))]
    assert h.on_records("fwd", (6,)) == [Deliver("fwd", (6,))]
    assert h.on_barrier("loop", B(1)) == [FinishSnapshot(1)]


def test_at_least_once_never_blocks_and_snapshots_on_last_barrier():
    h = SnapshotHandler(["a", "b"], "at_least_once")
    assert h.on_barrier("a", B(1)) == []
    assert h.on_records("a", (1,)) == [Deliver("a", (1,))]  # post-barrier leaks into state
    assert h.on_barrier("b", B(1)) == snap(1) + [FinishSnapshot(1)]


def test_at_least_once_newer_checkpoint_subsumes_older():
    h = SnapshotHandler(["a", "b"], "at_least_once")
    h.on_barrier("a", B(1))
    h.on_barrier("a", B(2))
    assert h.on_barrier("b", B(2)) == (
        [DeclineSnapshot(1, "subsumed by checkpoint 2")] + snap(2) + [FinishSnapshot(2)])


def test_trigger_at_task_with_open_inputs_is_an_error_for_aligned():
    h = SnapshotHandler(["a"], "aligned")
    with pytest.raises(ProtocolError, match="only sources"):
        h.on_trigger(1)


def test_min_checkpoint_id_marks_restored_ids_stale():
    h = SnapshotHandler(["a"], "unaligned", min_checkpoint_id=5)
    assert h.on_barrier("a", B(4, True), overtaken=(1,)) == [Deliver("a", (1,))]


def test_bad_arguments_get_clear_errors():
    with pytest.raises(ValueError, match="unknown snapshot mode 'exactly'"):
        SnapshotHandler(["a"], "exactly")
    with pytest.raises(ValueError, match="back edges 'z' are not inputs"):
        SnapshotHandler(["a"], "aligned", back_edges=["z"])
    with pytest.raises(ValueError, match="aligned_timeout applies"):
        SnapshotHandler(["a"], "unaligned", aligned_timeout=1)
    with pytest.raises(ValueError, match="duplicate input"):
        SnapshotHandler(["a", "a"])
    with pytest.raises(TypeError, match="not a protocol event"):
        SnapshotHandler(["a"]).handle("boom")


def test_handle_dispatches_every_event_type():
    h = SnapshotHandler(["a"], Mode.CHANDY_LAMPORT)
    assert h.handle(TriggerCheckpoint(1)) == snap(1)
    assert h.handle(RecordsArrived("a", (1,))) == [
        RecordChannelState(1, "a", (1,)), Deliver("a", (1,))]
    assert h.handle(BarrierArrived("a", B(1))) == [FinishSnapshot(1)]


def test_unaligned_announced_barrier_is_prioritized():
    from cutline.protocol import PrioritizeBarrier
    h = SnapshotHandler(["a", "b"], "unaligned")
    assert h.on_announce("a", B(1, True)) == [PrioritizeBarrier("a", 1)]
    h.on_barrier("a", B(1, True), overtaken=(1,))
    # after the snapshot, a queued barrier on a recorded channel overtakes too
    assert h.on_announce("b", B(1, True)) == [PrioritizeBarrier("b", 1)]
    g = SnapshotHandler(["a"], "chandy_lamport")
    assert g.on_announce("a", B(1)) == []  # markers never overtake


def test_aligned_timeout_counts_time_queued_and_pulls_barriers_forward():
    from cutline.protocol import PrioritizeBarrier
    h = SnapshotHandler(["a", "b"], "aligned", aligned_timeout=1.0)
    # both barriers stuck behind data: the timer starts at the announcement
    assert h.on_announce("a", B(3)) == [ScheduleTimeout(3, 1.0)]
    assert h.on_announce("b", B(3)) == []
    acts = h.on_timeout(3)
    assert acts == snap(3, True) + [PrioritizeBarrier("a", 3), PrioritizeBarrier("b", 3)]
    assert h.on_barrier("a", B(3, True), overtaken=(1, 2)) == [
        RecordChannelState(3, "a", (1, 2)), Deliver("a", (1, 2))]
    assert h.on_barrier("b", B(3, True)) == [FinishSnapshot(3)]


def test_aligned_timeout_stale_timer_after_alignment_completes():
    h = SnapshotHandler(["a", "b"], "aligned", aligned_timeout=1.0)
    assert h.on_announce("a", B(1)) == [ScheduleTimeout(1, 1.0)]
    h.on_barrier("a", B(1))
    h.on_barrier("b", B(1))
    assert h.on_timeout(1) == []
    assert h.idle


def test_overtaken_records_left_in_the_drivers_queue_are_recorded_once_and_delivered_later():
    h = SnapshotHandler(["a", "b"], "unaligned")
    # the driver copied the records ahead of the barrier and left them queued
    acts = h.on_barrier("a", B(1, True), overtaken=(1, 2), deliver_overtaken=False)
    assert acts == snap(1, True) + [RecordChannelState(1, "a", (1, 2))]  # no Deliver
    # later they arrive in queue order as ordinary records: delivered, not recorded for 1
    assert h.on_records("a", (1, 2)) == [Deliver("a", (1, 2))]
    assert h.on_barrier("b", B(1, True)) == [FinishSnapshot(1)]
    # a newer snapshot recording channel 'a' records what is still queued ahead of its barrier
    h2 = SnapshotHandler(["a", "b"], "unaligned")
    h2.on_barrier("b", B(5, True))
    acts = h2.on_barrier("a", B(5, True), overtaken=(7,), deliver_overtaken=False)
    assert acts == [RecordChannelState(5, "a", (7,)), FinishSnapshot(5)]
    assert h2.on_records("a", (7,)) == [Deliver("a", (7,))]


def test_copied_overtaken_records_are_recorded_once_with_two_checkpoints_open():
    # a savepoint (4) triggered while checkpoint 3 is in flight: both barriers came on "b"
    # first, and on "a" both are queued behind record r, which the driver copies and
    # leaves queued each time a barrier overtakes it
    h = SnapshotHandler(["a", "b"], "unaligned")
    assert h.on_barrier("b", B(3, True)) == snap(3, True)
    assert h.on_barrier("b", B(4, True)) == snap(4, True)
    assert h.recording == {3: ("a",), 4: ("a",)}
    r = (("r", 1),)
    assert h.on_barrier("a", B(3, True), overtaken=r, deliver_overtaken=False) == [
        RecordChannelState(3, "a", r), FinishSnapshot(3)]  # not for 4: still queued
    assert h.on_barrier("a", B(4, True), overtaken=r, deliver_overtaken=False) == [
        RecordChannelState(4, "a", r), FinishSnapshot(4)]
    assert h.on_records("a", r) == [Deliver("a", r)]
    # r delivered between the two barriers: recorded for 4 then, not copied again
    h = SnapshotHandler(["a", "b"], "unaligned")
    h.on_barrier("b", B(3, True))
    h.on_barrier("b", B(4, True))
    assert h.on_barrier("a", B(3, True), overtaken=r, deliver_overtaken=False) == [
        RecordChannelState(3, "a", r), FinishSnapshot(3)]
    assert h.on_records("a", r) == [RecordChannelState(4, "a", r), Deliver("a", r)]
    assert h.on_barrier("a", B(4, True), deliver_overtaken=False) == [FinishSnapshot(4)]
    # taken out of the queue (delivered now), they are every open snapshot's channel state
    h = SnapshotHandler(["a", "b"], "unaligned")
    h.on_barrier("b", B(3, True))
    h.on_barrier("b", B(4, True))
    assert h.on_barrier("a", B(3, True), overtaken=r) == [
        RecordChannelState(3, "a", r), RecordChannelState(4, "a", r), Deliver("a", r),
        FinishSnapshot(3)]
    assert h.on_barrier("a", B(4, True)) == [FinishSnapshot(4)]


@settings(max_examples=150, deadline=None)
@given(mode=st.sampled_from(["aligned", "aligned_timeout", "unaligned", "chandy_lamport",
                             "at_least_once"]),
       events=st.lists(st.tuples(st.sampled_from(["rec", "bar", "ubar", "close", "trigger",
                                                  "abort", "timeout", "announce"]),
                                 st.integers(0, 2), st.integers(1, 3)), max_size=30),
       at=st.floats(0, 1))
def test_a_copied_handler_is_independent_and_behaves_the_same(mode, events, at):
    """The explorers copy a handler per step (``copy()``, not deepcopy): the copy must
    answer every later event as the original does, and not see the original's changes."""
    chans = ["a", "b", "c"]

    def step(h, ev):
        kind, c, n = ev
        ch = chans[c]
        try:
            if kind == "rec":
                return h.on_records(ch, (("r", n),))
            if kind in ("bar", "ubar"):
                u = kind == "ubar"
                return h.on_barrier(ch, Barrier(n, unaligned=u), (("r", 0),) if u else ())
            if kind == "close":
                return h.on_close(ch)
            if kind == "trigger":
                return h.on_trigger(n)
            if kind == "abort":
                return h.on_abort(n)
            if kind == "timeout":
                return h.on_timeout(n)
            return h.on_announce(ch, Barrier(n))
        except (ProtocolError, ValueError) as e:
            return type(e).__name__

    timeout = 0.0 if mode == "aligned_timeout" else None
    h = SnapshotHandler(chans, "aligned" if timeout is not None else mode,
                        aligned_timeout=timeout)
    at = int(at * len(events))
    for ev in events[:at]:
        step(h, ev)
    c = h.copy()
    frozen = c.state_key()
    d = SnapshotHandler(chans, "aligned" if timeout is not None else mode,
                        aligned_timeout=timeout)
    for ev in events[:at]:
        step(d, ev)                     # a third handler, fed the same prefix, as reference
    for ev in events[at:]:
        step(h, ev)                     # the original moves on; the copy must not notice
    assert c.state_key() == frozen
    for ev in events[at:]:
        assert step(c, ev) == step(d, ev)
    assert c.state_key() == d.state_key() == h.state_key()


def test_records_a_late_barrier_overtook_are_channel_state_of_the_snapshots_still_recording():
    # checkpoints 3 and 4 open, both recording "a"; 3 is aborted while its barrier, already
    # prioritized by the driver, is overtaking record r on "a" (r is ahead of 4's barrier too)
    r = (("r", 1),)
    h = SnapshotHandler(["a", "b"], "unaligned")
    h.on_barrier("b", B(3, True))
    h.on_barrier("b", B(4, True))
    h.on_abort(3)
    # taken out of the queue and delivered now: channel state of 4
    assert h.on_barrier("a", B(3, True), overtaken=r) == [
        RecordChannelState(4, "a", r), Deliver("a", r)]
    assert h.on_barrier("a", B(4, True)) == [FinishSnapshot(4)]
    # copied and left queued: recorded for 4 when delivered, not now
    h = SnapshotHandler(["a", "b"], "unaligned")
    h.on_barrier("b", B(3, True))
    h.on_barrier("b", B(4, True))
    h.on_abort(3)
    assert h.on_barrier("a", B(3, True), overtaken=r, deliver_overtaken=False) == []
    assert h.on_records("a", r) == [RecordChannelState(4, "a", r), Deliver("a", r)]
