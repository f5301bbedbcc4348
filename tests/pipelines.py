"""Pipelines shared by the runtime tests (a module, so Spark ships it by value)."""

from __future__ import annotations

import collections

from cutline import CheckpointConfig, Pipeline
from cutline.connectors import CollectSink, GeneratorSource

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


def sentence(i: int) -> str:
    return " ".join(WORDS[(i * 5 + k * 7) % len(WORDS)] for k in range(1 + i % 4))


def wordcount(tmp, records: int, mode: str = "aligned", *, rate=None, parallelism: int = 2,
              interval: float = 0.5, aligned_timeout=None, updates="record"):
    cfg = CheckpointConfig(
        interval=interval, storage=f"file://{tmp}/checkpoints",
        mode="at_least_once" if mode == "at_least_once" else "exactly_once",
        unaligned=mode == "unaligned", aligned_timeout=aligned_timeout)
    p = Pipeline("wordcount", parallelism=parallelism, checkpoint=cfg)
    sink = CollectSink(str(tmp / "out"))
    (p.source(GeneratorSource(count=records, fn=sentence, rate=rate), uid="sentences")
       .flat_map(str.split, uid="split")
       .key_by(lambda w: w)
       .count(uid="count", updates=updates)
       .sink(sink, uid="out"))
    return p, sink


def expected_rows(records: int) -> collections.Counter:
    """The exact output multiset of a failure-free run: (word, 1..n) for every word."""
    totals = collections.Counter(w for i in range(records) for w in sentence(i).split())
    return collections.Counter((w, k) for w, n in totals.items() for k in range(1, n + 1))


def check_time_sized_counts(rows: list, records: int) -> None:
    """The output of ``wordcount(updates="checkpoint")`` (a count sized by time): each
    word's latest count is its total, and no row comes twice (a row of a replayed epoch
    committed again) nor a word's counts out of order."""
    totals = collections.Counter(w for i in range(records) for w in sentence(i).split())
    per: dict[str, list[int]] = collections.defaultdict(list)
    for w, n in rows:  # CollectSink.results(): by subtask, then checkpoint: a word's in order
        per[w].append(n)
    assert {w: ns[-1] for w, ns in per.items()} == dict(totals)
    bad = {w: ns for w, ns in per.items() if ns != sorted(set(ns))}
    assert not bad, f"counts repeated or out of order: {sorted(bad.items())[:3]}"


def write_events(directory, files: int = 4, per_file: int = 3000) -> list[dict]:
    """JSON-lines input: ``files`` files of click events."""
    import json

    directory.mkdir(parents=True, exist_ok=True)
    events = []
    for f in range(files):
        with open(directory / f"events-{f:03d}.jsonl", "w") as out:
            for i in range(per_file):
                e = {"user": f"u{(i * 7 + f) % 23}", "page": f"/p{i % 11}", "ms": i % 500,
                     "id": f"{f}-{i}"}
                events.append(e)
                out.write(json.dumps(e) + "\n")
    return events


def slow_parse(e: dict) -> dict:
    import time

    time.sleep(0.0002)  # a little work per record, so a kill lands mid-run
    return {"user": e["user"], "ms": int(e["ms"]), "id": e["id"]}


def running_total(ctx, e):
    total = ctx.value_state("total", 0)
    total.update(total.value + e["ms"])
    seen = ctx.list_state("ids")
    seen.append(e["id"])
    return ({"user": e["user"], "id": e["id"], "total": total.value, "n": len(seen)},)


def clicks(tmp, *, mode: str = "aligned", interval: float = 0.3):
    from cutline.connectors import FileSource, ParquetSink

    cfg = CheckpointConfig(interval=interval, storage=f"file://{tmp}/checkpoints",
                           unaligned=mode == "unaligned")
    p = Pipeline("clicks", parallelism=2, checkpoint=cfg)
    sink = ParquetSink(str(tmp / "parquet"))
    (p.source(FileSource(str(tmp / "in"), format="jsonl"), uid="files")
       .map(slow_parse, uid="parse")
       .filter(lambda e: e["ms"] >= 10, uid="fast-enough")
       .key_by(lambda e: e["user"])
       .process(running_total, uid="totals")
       .sink(sink, uid="parquet"))
    return p, sink


def expected_clicks(events: list[dict]) -> collections.Counter:
    """Per user, in file order per source file, the totals depend on interleaving across
    files; what is fixed is the multiset of (user, n) and each id exactly once."""
    kept = [e for e in events if e["ms"] >= 10]
    per_user = collections.Counter(e["user"] for e in kept)
    return collections.Counter((u, k) for u, n in per_user.items() for k in range(1, n + 1))


# ---------------------------------------------------------------- an iteration (a cycle)


def collatz(x: int) -> int:
    return x // 2 if x % 2 == 0 else 3 * x + 1


def collatz_step(r: tuple) -> tuple:
    i, x, n = r
    return (i, collatz(x), n + 1)


def collatz_start(i: int) -> tuple:
    return (i, i + 1, 0)


def collatz_pipeline(tmp, records: int, mode: str = "aligned", *, rate=None,
                     parallelism: int = 2, interval: float = 0.3):
    """Each number goes round a loop, one Collatz step per round, until it reaches 1; the
    loop's tail feeds back by key, a keyed count in the loop counts rounds per residue."""
    cfg = CheckpointConfig(interval=interval, storage=f"file://{tmp}/checkpoints",
                           unaligned=mode == "unaligned")
    p = Pipeline("collatz", parallelism=parallelism, checkpoint=cfg)
    loop = p.source(GeneratorSource(count=records, fn=collatz_start, rate=rate),
                    uid="numbers").iterate(uid="loop")
    stepped = loop.map(collatz_step, uid="step")
    loop.close_with(stepped.filter(lambda r: r[1] != 1, uid="again").key_by(lambda r: r[0]))
    sink = CollectSink(str(tmp / "out"))
    stepped.filter(lambda r: r[1] == 1, uid="done").sink(sink, uid="out")
    return p, sink


def collatz_expected(records: int) -> collections.Counter:
    def rounds(x: int) -> int:
        n = 0
        while True:
            x, n = collatz(x), n + 1
            if x == 1:
                return n
    return collections.Counter((i, 1, rounds(i + 1)) for i in range(records))
