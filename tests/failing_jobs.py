"""Jobs that fail, as a user's script would run them: ``python failing_jobs.py CASE ENGINE DIR``.

tests/driver/test_failures.py runs each in a subprocess and reads what the user would see.
CASES: the failure each one meets.  ``interrupt`` runs long (the test sends Ctrl-C).
"""

from __future__ import annotations

import sys
import threading

from cutline import CheckpointConfig, Pipeline
from cutline.connectors import CollectSink, GeneratorSource


def lock(i: int) -> object:
    return threading.Lock() if i == 37 else i


def hold_a_lock(ctx, r):
    yield (r, threading.Lock()) if r == 37 else r


CASES = {
    "user": "map operator 'divide' failed on record 50: ZeroDivisionError",
    "sink_pickle": "cannot pickle record (37, <unlocked _thread.lock object",
    "keyby_pickle": "cannot pickle record (1, <unlocked _thread.lock object",
    "config": "aligned_timeout applies to mode 'aligned' only",
    "unhashable": "key_by returned the unhashable key [",
    # a sink whose path lies under a regular file: found when it opens
    "sink_not_a_dir": "NotADirectoryError: [Errno 20] Not a directory",
    # a sink refused by its storage while it writes (S3's AccessDenied, a read-only mount)
    "sink_denied": "PermissionError: [Errno 13] Permission denied: 's3://bucket/out'",
    "interrupt": "",
}


class DeniedSink(CollectSink):
    """A sink whose storage refuses every write (what S3's AccessDenied is in fsspec)."""

    def create_writer(self):
        writer = super().create_writer()

        def write(batch):
            raise PermissionError(13, "Permission denied", "s3://bucket/out")

        writer.write = write
        return writer


def build(case: str, d: str) -> Pipeline:
    # a long checkpoint timeout: a failure must never wait for it
    cfg = CheckpointConfig(interval=0.3, timeout=600, storage=f"file://{d}/checkpoints")
    p = Pipeline(f"failing-{case.replace('_', '-')}", parallelism=2, checkpoint=cfg)
    sink = CollectSink(f"{d}/out")
    rate = 2_000 if case in ("sink_pickle", "interrupt") else None
    count = 1_000_000 if case == "interrupt" else 4_000
    s = p.source(GeneratorSource(count=count, rate=rate), uid="numbers")
    if case == "user":
        s.map(lambda i: 1 / (i - 50), uid="divide").sink(sink, uid="out")
    elif case == "sink_pickle":
        # the sink runs after an exchange: the source subtasks of its slots keep running
        s.key_by(lambda i: i % 7).process(hold_a_lock, uid="hold").sink(sink, uid="out")
    elif case == "keyby_pickle":
        s.map(lambda i: (i % 3, threading.Lock()) if i == 37 else (i % 3, i), uid="pair") \
         .key_by(lambda r: r[0]).count(uid="count").sink(sink, uid="out")
    elif case == "config":
        # what CheckpointConfig refuses up front, as a task meets it (an older or a
        # hand-made configuration): unaligned with an aligned timeout
        object.__setattr__(cfg, "unaligned", True)
        object.__setattr__(cfg, "aligned_timeout", 0.1)
        s.sink(sink, uid="out")
    elif case == "sink_not_a_dir":
        from cutline.connectors.parquet_sink import ParquetSink

        open(f"{d}/a-file", "w").close()
        s.map(lambda i: {"i": i}, uid="row").sink(ParquetSink(f"{d}/a-file/out"), uid="out")
    elif case == "sink_denied":
        s.map(lambda i: i * 2, uid="double").sink(DeniedSink(f"{d}/out"), uid="out")
    elif case == "unhashable":
        s.map(lambda i: [i % 5], uid="listify").key_by(lambda r: r).count(uid="count") \
         .sink(sink, uid="out")
    else:
        s.key_by(lambda i: i % 7).count(uid="count").sink(sink, uid="out")
    return p


if __name__ == "__main__":
    case, engine, d = sys.argv[1:4]
    result = build(case, d).run(engine=engine)
    print(f"finished after {result.attempts} attempt(s)")
