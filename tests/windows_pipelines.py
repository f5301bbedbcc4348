"""Windowed pipelines the window tests share (threads and Spark; a module, shipped by value).

``event(i)`` has a key, a timestamp and a kind:

* ``on``: out of order by less than ``DISORDER`` seconds: never late with
  ``max_delay=DISORDER`` (the watermark is at most the largest earlier timestamp minus
  ``DISORDER``);
* ``late`` (``late=True``): 3000 s behind: its windows have fired when it arrives (the
  source reads at most ``SKEW`` records ahead of the watermark) but are within
  ``LATENESS``: each updates its window and re-emits the result;
* ``drop`` (``late=True``): 20000 s behind: later than ``LATENESS`` for all its windows: it
  goes to the late output.

With one source split (``source_parallelism=1``) records reach the window subtasks in
order, so :func:`expected` knows the exact output multiset of a failure-free run.
"""

from __future__ import annotations

import collections
from typing import Any

from cutline import CheckpointConfig, Pipeline, WindowResult, session, sliding, tumbling
from cutline.connectors import CollectSink, GeneratorSource

KEYS = 5
DISORDER = 40
SIZE = 100
LATENESS = 5000
GAP = 30


def event(i: int) -> dict:
    k = f"k{i % KEYS}"
    if i >= 20_000 and i % 97 == 0:
        return {"k": k, "ts": i - 20_000, "i": i, "kind": "drop"}
    if i >= 3_000 and i % 31 == 0:
        return {"k": k, "ts": i - 3_000, "i": i, "kind": "late"}
    return {"k": k, "ts": i - (i * 7919) % DISORDER, "i": i, "kind": "on"}


def on_time_event(i: int) -> dict:
    return {"k": f"k{i % KEYS}", "ts": i - (i * 7919) % DISORDER, "i": i, "kind": "on"}


def session_event(i: int) -> dict:
    """Bursts of 300 records, 200 s apart; even timestamps (the watermark, with
    ``max_delay=DISORDER + 1``, is odd: a record never lands exactly on a session's end as
    the session fires)."""
    ts = 2 * (i + 100 * (i // 300)) - 2 * ((i * 7919) % (DISORDER // 2))
    return {"k": f"k{i % KEYS}", "ts": ts, "i": i, "kind": "on"}


def ts_of(e: dict) -> int:
    return e["ts"]


def key_of(e: dict) -> str:
    return e["k"]


ASSIGNERS = {"tumbling": lambda: tumbling(SIZE), "sliding": lambda: sliding(SIZE, SIZE // 2),
             "session": lambda: session(GAP)}


def windowed(tmp, records: int, kind: str = "tumbling", mode: str = "aligned", *,
             rate: float | None = None, parallelism: int = 2, source_parallelism: int = 1,
             late: bool = True, interval: float = 0.3, state_backend: str = "memory",
             name: str = "windows") -> tuple[Pipeline, CollectSink, CollectSink]:
    """events -> assign_timestamps -> key_by -> window(kind).count() -> sink, and
    .late() -> a second sink."""
    cfg = CheckpointConfig(interval=interval, storage=f"file://{tmp}/checkpoints",
                           unaligned=mode == "unaligned", state_backend=state_backend)
    p = Pipeline(name, parallelism=parallelism, checkpoint=cfg)
    out, late_out = CollectSink(str(tmp / "out")), CollectSink(str(tmp / "late"))
    fn = session_event if kind == "session" else (event if late else on_time_event)
    delay = DISORDER + 1 if kind == "session" else DISORDER
    counts = (p.source(GeneratorSource(count=records, fn=fn, rate=rate), uid="events",
                       parallelism=source_parallelism)
              .assign_timestamps(ts_of, max_delay=delay, uid="stamps",
                                 parallelism=source_parallelism)
              .key_by(key_of)
              .window(ASSIGNERS[kind](), allowed_lateness=LATENESS if late else 0)
              .count(uid="counts"))
    counts.sink(out, uid="out")
    counts.late(uid="late").sink(late_out, uid="late-out")
    return p, out, late_out


def expected(records: int, kind: str = "tumbling",
             late: bool = True) -> tuple[collections.Counter, collections.Counter]:
    """(results, late records) of a failure-free run, as multisets."""
    if kind == "session":
        return expected_sessions(records), collections.Counter()
    assigner = ASSIGNERS[kind]()
    fn = event if late else on_time_event
    events = [fn(i) for i in range(records)]
    counts: collections.Counter = collections.Counter()
    for e in events:
        if e["kind"] == "on":
            for w in assigner.assign(e["ts"]):
                counts[(e["k"], w)] += 1
    results = collections.Counter(WindowResult(k, w.start, w.end, n)
                                  for (k, w), n in counts.items())
    for e in events:  # late ones, in order: each emits its window again, one more
        if e["kind"] == "late":
            for w in assigner.assign(e["ts"]):
                counts[(e["k"], w)] += 1
                results[WindowResult(e["k"], w.start, w.end, counts[(e["k"], w)])] += 1
    dropped = collections.Counter(_hashable(e) for e in events if e["kind"] == "drop")
    return results, dropped


def expected_sessions(records: int) -> collections.Counter:
    from cutline.protocol.windows import merge_windows

    by_key: dict[str, list] = collections.defaultdict(list)
    for i in range(records):
        e = session_event(i)
        by_key[e["k"]].append(e["ts"])
    out: collections.Counter = collections.Counter()
    for k, stamps in by_key.items():
        for w, _ in merge_windows((t, t + GAP) for t in stamps):
            n = sum(w.start <= t < w.end for t in stamps)
            out[WindowResult(k, w.start, w.end, n)] += 1
    return out


def _hashable(e: dict) -> Any:
    return tuple(sorted(e.items()))


def late_rows(sink: CollectSink) -> collections.Counter:
    return collections.Counter(_hashable(e) for e in sink.results())
