"""Jobs of the cluster-scale fault tests and of the soak (a module of its own, so Spark
ships it by value)."""

from __future__ import annotations

import collections
import time

from cutline import CheckpointConfig, Pipeline
from cutline.connectors import CollectSink, FileSource, GeneratorSource

SLOW = 0.002  # seconds of work per record: a little backpressure, and a kill lands mid-run

MODES = ("aligned", "unaligned", "aligned_timeout", "at_least_once")


def checkpoints(tmp, mode: str, interval: float) -> CheckpointConfig:
    """Checkpoints every ``interval`` s under ``tmp``, in one of :data:`MODES`."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    return CheckpointConfig(
        interval=interval, storage=f"file://{tmp}/checkpoints",
        mode="at_least_once" if mode == "at_least_once" else "exactly_once",
        unaligned=mode == "unaligned",
        aligned_timeout=0.05 if mode == "aligned_timeout" else None)


def count_slowly(ctx, e):
    time.sleep(SLOW)
    n = ctx.value_state("n", 0)
    n.update(n.value + 1)
    return ((e["user"], n.value),)


def per_user(tmp, mode: str = "aligned", parallelism: int = 3, name: str = "per-user"):
    """Files -> keyed exchange by user -> a slow keyed count -> an exactly-once sink."""
    p = Pipeline(name, parallelism=parallelism, checkpoint=checkpoints(tmp, mode, 0.3))
    sink = CollectSink(str(tmp / "out"))
    (p.source(FileSource(str(tmp / "in"), format="jsonl"), uid="files")
       .key_by(lambda e: e["user"])
       .process(count_slowly, uid="per-key")
       .sink(sink, uid="out"))
    return p, sink


def per_user_expected(events: list[dict]) -> collections.Counter:
    n = collections.Counter(e["user"] for e in events)
    return collections.Counter((u, k) for u, c in n.items() for k in range(1, c + 1))


# ---------------------------------------------------------------- the soak (bench/soak.py)

USERS = 23


def soak_event(i: int) -> dict:
    return {"user": f"u{i % USERS}", "i": i}


def count_with_index(ctx, e):
    """Each record's user, its count so far and its index: the output names every record."""
    n = ctx.value_state("n", 0)
    n.update(n.value + 1)
    return ((e["user"], n.value, e["i"]),)


def soak_job(tmp, mode: str, rate: float | None, count: int | None = None,
             parallelism: int = 2, interval: float = 1.0):
    """Generated events (``rate`` records/s, unbounded unless ``count``) -> keyed exchange
    by user -> a keyed count -> an exactly-once sink of ``(user, n, index)``."""
    p = Pipeline("soak", parallelism=parallelism, checkpoint=checkpoints(tmp, mode, interval))
    sink = CollectSink(str(tmp / "out"))
    (p.source(GeneratorSource(count=count, rate=rate, fn=soak_event), uid="events")
       .key_by(lambda e: e["user"])
       .process(count_with_index, uid="per-key")
       .sink(sink, uid="out"))
    return p, sink


def soak_check(rows, count: int) -> dict:
    """Compare a soak's committed rows with what a failure-free run of ``count`` records
    commits: every index below ``count`` once, and each user's counts 1, 2, ... with no gap
    or repeat.  ``lost`` / ``duplicated``: records missing / committed more than once."""
    seen = collections.Counter(i for _, _, i in rows)
    lost = sum(1 for i in range(count) if i not in seen)
    duplicated = sum(n - 1 for n in seen.values() if n > 1) + sum(
        n for i, n in seen.items() if not 0 <= i < count)
    per_user = collections.Counter((u, n) for u, n, _ in rows)
    users = {f"u{u}": count // USERS + (u < count % USERS) for u in range(USERS)}
    want = collections.Counter((u, k) for u, c in users.items() for k in range(1, c + 1))
    return {"expected": count, "committed": len(rows), "lost": lost,
            "duplicated": duplicated, "counts_exact": per_user == want,
            "exact": lost == 0 and duplicated == 0 and per_user == want}
