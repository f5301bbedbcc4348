"""One event-time job for the Spark kill and rescale tests (:mod:`test_event_time_spark`;
a module, shipped by value): tumbling windows with a late side output, merging session
windows with theirs, and event-time timers, all from one source.

The source is one unthrottled split: it reads batches of exactly ``JobSpec.batch_size``
records and its assigner emits a watermark after each, so every downstream subtask gets
the same items (records and watermarks) in the same order in every run, with or without
failures, at any parallelism of the keyed operators.  The output is therefore one fixed
sequence per key: a window that fires early shows a smaller count, one that fires late
(at a later watermark) moves past the re-emits of the late records that follow it, one
fired twice or lost shows in the counts.  ``slow`` makes the timers' operator sleep 10 ms
every 50 records: the job then takes seconds (a ``kill -9`` lands mid-stream), the source
is backpressured and checkpoints find data in flight; the output is the same.

* windows: ``windows_pipelines.event`` (out of order within the watermark's delay,
  with ``late`` records that re-emit a fired window and ``drop`` ones that go to
  ``.late()``), ``tumbling(SIZE)``, ``allowed_lateness=LATENESS``;
* sessions: the records of every other burst of 300 indices (``in_burst``), ``session(GAP)``
  (records of a key are ~5 s apart but out of order by up to 40 s: sessions merge), with
  the same lateness (late records merge into fired sessions and re-emit them);
* alerts: ``test_timers_pipelines.watch`` / ``ring`` (timers only: every row comes from
  ``on_timer``), on the same records.
"""

from __future__ import annotations

import collections
import os
import pickle
import time
from typing import Any

from cutline import CheckpointConfig, Pipeline, WindowResult, session, tumbling
from cutline.connectors import CollectSink, GeneratorSource
from cutline.connectors.generator import GeneratorReader
from cutline.connectors.base import get_fs

from test_timers_pipelines import ring, watch
from windows_pipelines import DISORDER, GAP, LATENESS, SIZE, event, key_of, ts_of

MODES = ("aligned", "unaligned", "aligned_timeout")
SINKS = ("windows", "late", "sessions", "sessions-late", "alerts")


def in_burst(e: dict) -> bool:
    return (e["i"] // 300) % 2 == 0


def slow_watch(ctx: Any, e: dict) -> Any:
    if e["i"] % 50 == 0:
        time.sleep(0.01)
    return watch(ctx, e)


class HeldSource(GeneratorSource):
    """A :class:`GeneratorSource` that holds before each index in ``hold``: it reads
    nothing (and has not ended) until the file ``<release>-<index>`` exists, and says it is
    there with the file ``<release>-<index>.held``.  With holds at multiples of the batch
    size, its batches are the plain source's."""

    def __init__(self, count: int, fn: Any, hold: tuple[int, ...], release: str) -> None:
        super().__init__(count=count, fn=fn)
        self.hold, self.release = hold, release

    def create_reader(self) -> "HeldReader":
        return HeldReader(self)


class HeldReader(GeneratorReader):
    def read_batch(self, max_records: int) -> list | None:
        src: Any = self._src
        nxt = self._splits[0][0] if len(self._splits) == 1 else None
        for at in src.hold if nxt is not None else ():
            if nxt < at:
                max_records = min(max_records, at - nxt)
                break
            if nxt == at and not os.path.exists(f"{src.release}-{at}"):
                open(f"{src.release}-{at}.held", "w").close()
                time.sleep(0.005)
                return []
        return super().read_batch(max_records)


def job(tmp: Any, records: int, mode: str = "aligned", *, backend: str = "memory",
        parallelism: int = 2, slow: bool = False, interval: float = 0.3,
        hold: tuple[int, ...] = (), name: str = "event-time"
        ) -> tuple[Pipeline, dict[str, CollectSink]]:
    """The job and its sinks by name (:data:`SINKS`).  ``parallelism``: of the keyed
    operators; the source stays at 1.  ``mode``: one of :data:`MODES` (``aligned_timeout``:
    aligned checkpoints that switch to unaligned after 50 ms of alignment).  ``hold``: the
    source holds before these indices until released (:class:`HeldSource`, files
    ``tmp/release-<index>``)."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is not one of {MODES}")
    cfg = CheckpointConfig(interval=interval, storage=f"file://{tmp}/checkpoints",
                           unaligned=mode == "unaligned",
                           aligned_timeout=0.05 if mode == "aligned_timeout" else None,
                           state_backend=backend)
    p = Pipeline(name, parallelism=parallelism, checkpoint=cfg)
    sinks = {s: CollectSink(str(tmp / "out" / s)) for s in SINKS}
    source = (HeldSource(records, event, hold, str(tmp / "release")) if hold
              else GeneratorSource(count=records, fn=event))
    stamped = (p.source(source, uid="events", parallelism=1)
               .assign_timestamps(ts_of, max_delay=DISORDER, uid="stamps", parallelism=1))
    windows = (stamped.key_by(key_of).window(tumbling(SIZE), allowed_lateness=LATENESS)
               .count(uid="windows"))
    windows.sink(sinks["windows"], uid="windows-out")
    windows.late(uid="late").sink(sinks["late"], uid="late-out")
    sessions = (stamped.filter(in_burst, uid="bursts", parallelism=1).key_by(key_of)
                .window(session(GAP), allowed_lateness=LATENESS).count(uid="sessions"))
    sessions.sink(sinks["sessions"], uid="sessions-out")
    sessions.late(uid="sessions-late").sink(sinks["sessions-late"], uid="sessions-late-out")
    (stamped.key_by(key_of)
     .process(slow_watch if slow else watch, on_timer=ring, uid="alerts")
     .sink(sinks["alerts"], uid="alerts-out"))
    return p, sinks


def key_of_row(row: Any) -> Any:
    if isinstance(row, WindowResult):
        return row.key
    if isinstance(row, dict):
        return row["k"]
    return row[1]  # an alert: ("seen" | "silent", key, ...)


def committed(sink: CollectSink) -> list[tuple[int, list]]:
    """(checkpoint id, records) of every committed part, in checkpoint order (a key's rows
    are in the order they were emitted, also across restores that moved it to another
    subtask: checkpoint ids only grow)."""
    fs, parts = get_fs(sink.path, sink.storage_options)[0], []
    for (subtask, cid, _job), path in sink._parts():
        with fs.open(path, "rb") as f:
            parts.append(((cid, subtask), pickle.load(f)["records"]))
    return [(cid, records) for (cid, _), records in sorted(parts, key=lambda p: p[0])]


def sequences(sinks: dict[str, CollectSink]) -> dict[tuple[str, Any], list]:
    """(sink, key) -> the key's rows in the order they were emitted."""
    out: dict[tuple[str, Any], list] = collections.defaultdict(list)
    for name, sink in sinks.items():
        for _, records in committed(sink):
            for r in records:
                out[(name, key_of_row(r))].append(r)
    return dict(out)


def first_after(sinks: dict[str, CollectSink], name: str,
                after: int) -> dict[Any, tuple[int, Any]]:
    """key -> (how many of its rows came before, its first row) of the rows of ``name``
    committed by a checkpoint > ``after``: where each key's output resumed after a restore
    (or a rescale) from checkpoint ``after``."""
    seen: collections.Counter = collections.Counter()
    out: dict[Any, tuple[int, Any]] = {}
    for cid, records in committed(sinks[name]):
        for r in records:
            k = key_of_row(r)
            if cid > after and k not in out:
                out[k] = (seen[k], r)
            seen[k] += 1
    return out
