"""Timers in ``process`` end to end on the threads engine (the Spark tests in
``test_timers_spark.py`` use the pipeline built here; Spark ships this module by value).

The job: "alert when a key saw nothing for GAP seconds of event time".  Records arrive out
of order (by at most DISORDER seconds; ``max_delay=DISORDER``, so none is late).  ``watch``
files each record under its timestamp and registers an event-time timer there; ``ring``
(``on_timer``) then sees each key's records in timestamp order: it emits ``("seen", key,
ts, count so far)``, moves the key's alarm timer to ``ts + GAP`` (deleting the old one),
and when an alarm fires with no record at its time, emits ``("silent", key, since)``.  At
the end of input the watermark goes to infinity and every key's last alarm fires.  So every
output row depends on timers and the output is known in advance (:func:`expected`):
a timer fired twice, lost, or early shows as a wrong, missing or doubled row.
"""

from __future__ import annotations

import collections
import time

import pytest

from cutline import CheckpointConfig, Pipeline
from cutline.connectors import CollectSink, GeneratorSource
from cutline.spark.launcher import JobCancelled
from cutline.storage.checkpoints import CheckpointStorage

KEYS = 11
GAP = 30
DISORDER = 20


def event(i: int) -> dict:
    return {"k": f"k{(i * 2654435761 >> 7) % KEYS}", "ts": i - (i * 7919) % DISORDER, "i": i}


def event_ts(e: dict) -> int:
    return e["ts"]


def watch(ctx, e):
    t = ctx.timestamp
    seen = ctx.map_state("seen")
    seen[t] = seen.get(t, 0) + 1
    ctx.timers.register_event_time(t)
    return ()


def ring(ctx, key, when):
    out = []
    alarm, seen = ctx.value_state("alarm"), ctx.map_state("seen")
    if alarm.value == when and when not in seen:
        out.append(("silent", key, when - GAP))
        alarm.clear()
    if when in seen:
        total = ctx.value_state("total", 0)
        total.update(total.value + seen.pop(when))
        out.append(("seen", key, when, total.value))
        if alarm.value is not None and alarm.value not in seen:
            # (one timer per key and time: a record filed at the alarm's time keeps it)
            ctx.timers.delete_event_time(alarm.value)
        alarm.update(when + GAP)
        ctx.timers.register_event_time(when + GAP)
    return out


def expected(records: int) -> collections.Counter:
    per_key: dict = collections.defaultdict(collections.Counter)
    for i in range(records):
        e = event(i)
        per_key[e["k"]][e["ts"]] += 1
    want: collections.Counter = collections.Counter()
    for k, times in per_key.items():
        total, last = 0, None
        for t in sorted(times):
            if last is not None and t - last > GAP:
                want[("silent", k, last)] += 1
            total += times[t]
            want[("seen", k, t, total)] += 1
            last = t
        want[("silent", k, last)] += 1
    return want


def silences(records: int, *, tmp, mode: str = "aligned", rate=None, parallelism: int = 2,
             interval: float = 0.3, backend: str = "memory", name: str = "silences",
             source_parallelism: int | None = 2):
    """``parallelism``: of the pipeline; the source keeps ``source_parallelism`` (by
    default 2, so a rescale moves the timers' key groups, not the source's splits)."""
    cfg = CheckpointConfig(
        interval=interval, storage=f"file://{tmp}/checkpoints", state_backend=backend,
        mode="at_least_once" if mode == "at_least_once" else "exactly_once",
        unaligned=mode == "unaligned")
    p = Pipeline(name, parallelism=parallelism, checkpoint=cfg)
    sink = CollectSink(str(tmp / "out"))
    (p.source(GeneratorSource(count=records, fn=event, rate=rate), uid="events",
              parallelism=source_parallelism)
       .assign_timestamps(event_ts, max_delay=DISORDER, uid="stamps",
                          parallelism=source_parallelism)  # chained: a watermark per split
       .key_by(lambda e: e["k"])
       .process(watch, on_timer=ring, uid="watch")
       .sink(sink, uid="out"))
    return p, sink


def test_the_model_has_silences():
    want = expected(5000)
    assert sum(n for r, n in want.items() if r[0] == "silent") > 3 * KEYS


N = 6000


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
def test_timers_drive_the_output_exactly(tmp_path, backend):
    p, sink = silences(N, tmp=tmp_path, backend=backend)
    result = p.run(engine="threads", timeout=120)
    assert result.checkpoints and result.checkpoints[-1].final
    assert collections.Counter(sink.results()) == expected(N)


@pytest.mark.parametrize("mode, scales, backend, source", [
    ("aligned", (2, 2), "memory", 2),
    ("unaligned", (2, 1), "rocksdb", 2),
    ("aligned", (1, 3, 2), "rocksdb", 2),
    ("unaligned", (3, 2), "memory", 2),
    ("aligned", (2, 1, 2), "memory", None),  # the source (its splits' watermarks) too
    ("unaligned", (2, 1, 2), "rocksdb", None),
])
def test_cancelled_runs_resume_exactly_also_rescaled(tmp_path, mode, scales, backend, source):
    """``source=2``: only the timers' operator rescales; ``None``: the whole job does."""
    *steps, last = scales
    for par in steps:  # each step runs a while at its parallelism, then is cancelled
        p, _ = silences(N, tmp=tmp_path, mode=mode, rate=2500, parallelism=par, interval=0.2,
                        backend=backend, source_parallelism=source)
        with pytest.raises(JobCancelled):
            p.run(engine="threads", timeout=0.8)
        assert CheckpointStorage(p.checkpoint.storage, p.name).completed()
    p, sink = silences(N, tmp=tmp_path, mode=mode, parallelism=last, interval=0.2,
                       backend=backend, source_parallelism=source)
    result = p.run(engine="threads", timeout=120)
    assert result.restored_from is not None
    assert collections.Counter(sink.results()) == expected(N)


def test_a_checkpoint_shows_the_pending_timers(tmp_path):
    from cutline.state.reader import keyed_rows, summary
    from cutline.storage.checkpoints import open_checkpoint

    p, _ = silences(N, tmp=tmp_path, rate=3000, interval=0.2)
    with pytest.raises(JobCancelled):
        p.run(engine="threads", timeout=1.0)
    latest = CheckpointStorage(p.checkpoint.storage, p.name).latest()
    handle = open_checkpoint(latest.path)
    rows = list(keyed_rows(handle, "watch"))
    assert rows and all(isinstance(r["key"], str) for r in rows)
    pending = sum(len(r.get("timers.event", ())) for r in rows)
    assert pending >= KEYS // 2  # alarms at least
    for r in rows:  # a key's record timers are the times of its records not yet in order
        assert set(r.get("m:seen", r.get("seen", {}))) <= set(r.get("timers.event", ()))
    op = next(o for o in summary(handle)["operators"] if o["uid"] == "watch")
    assert op["timers"] == pending and op["keys"] == len(rows)


# ---------------------------------------------------------------- processing time


def remind(ctx, e):
    ctx.timers.register_processing_time(ctx.timers.current_processing_time() + 0.05)
    n = ctx.value_state("n", 0)
    n.update(n.value + 1)
    return ()


def reminded(ctx, key, when):
    assert ctx.time_domain == "processing_time"
    return [("reminder", key, ctx.value_state("n").value, time.time() >= when)]


def test_processing_time_timers_fire_from_the_task_loop(tmp_path):
    cfg = CheckpointConfig(interval=0.2, storage=f"file://{tmp_path}/checkpoints")
    p = Pipeline("reminders", parallelism=2, checkpoint=cfg)
    sink = CollectSink(str(tmp_path / "out"))
    (p.source(GeneratorSource(count=3000, fn=event, rate=2000), uid="events")
       .key_by(lambda e: e["k"])
       .process(remind, on_timer=reminded, uid="remind")
       .sink(sink, uid="out"))
    p.run(engine="threads", timeout=60)
    rows = sink.results()
    assert len(rows) > 20  # the job ran ~1.5 s: many timers fired while it did
    assert all(r[3] for r in rows), "a processing-time timer fired early"
    per_key = collections.defaultdict(list)
    for _, k, n, _ in rows:
        per_key[k].append(n)
    assert all(ns == sorted(ns) for ns in per_key.values())
