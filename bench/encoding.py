"""Record-batch encodings for channels: pickle protocol 5 vs Arrow IPC, and one real channel.

Run ``python bench/encoding.py`` (``--quick`` for a short run).  Part 1 encodes and decodes
1,000-record batches (``--batch-size``) of

* ``dicts``: ``{"user": str, "n": int, "t": float}``; Arrow infers the schema per batch;
* ``dicts, schema given``: the same, Arrow is handed the schema (its best case);
* ``tuples``: ``(str, int, float)``; Arrow builds one column per field;

with ``pickle.dumps(batch, protocol=5)`` / ``pickle.loads`` against Arrow IPC stream
(``RecordBatch.from_pylist`` / ``from_arrays`` -> IPC bytes -> ``to_pylist``), both ending
with the same Python objects.  MB/s is encoded bytes per second; records/s is for the
encode+decode round trip.  Cases are interleaved over several rounds (the order rotates)
and the median is reported.

Part 2 pushes the same dict batches through one ``cutline.runtime.channels`` channel on
loopback (credits 8), sender in a child process (as between Spark tasks) and, for
comparison, in a thread of the receiving process (sharing its GIL).  Exit code is always 0.
"""

from __future__ import annotations

import gc
import multiprocessing
import pickle
import platform
import secrets
import statistics
import sys
import threading
import time

import pyarrow as pa
from _common import (
    bench_parser,
    console,
    drain_channel,
    parse_bench_args,
    rotated,
    write_results,
)

from cutline.runtime.channels import InputGate, OutputChannel

SCHEMA = pa.schema([("user", pa.string()), ("n", pa.int64()), ("t", pa.float64())])


def make_dicts(bs: int, k: int) -> list[dict]:
    return [{"user": f"user-{(k * bs + i) % 997}", "n": k * bs + i, "t": (k * bs + i) * 0.25}
            for i in range(bs)]


def make_tuples(bs: int, k: int) -> list[tuple]:
    return [(d["user"], d["n"], d["t"]) for d in make_dicts(bs, k)]


# --------------------------------------------------------------------------- codecs


def pickle_enc(batch):
    return pickle.dumps(batch, protocol=5)


def pickle_dec(buf):
    return pickle.loads(buf)


def _ipc(rb: pa.RecordBatch) -> pa.Buffer:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, rb.schema) as w:
        w.write_batch(rb)
    return sink.getvalue()


def arrow_dicts_enc(batch):
    return _ipc(pa.RecordBatch.from_pylist(batch))


def arrow_dicts_schema_enc(batch):
    return _ipc(pa.RecordBatch.from_pylist(batch, schema=SCHEMA))


def arrow_dicts_dec(buf):
    return pa.ipc.open_stream(buf).read_next_batch().to_pylist()


def arrow_tuples_enc(batch):
    cols = list(zip(*batch))
    return _ipc(pa.RecordBatch.from_arrays([pa.array(c) for c in cols],
                                           names=[f"f{i}" for i in range(len(cols))]))


def arrow_tuples_dec(buf):
    rb = pa.ipc.open_stream(buf).read_next_batch()
    return list(zip(*(c.to_pylist() for c in rb.columns)))


WORKLOADS = {  # name -> (make, {codec: (enc, dec)})
    "dicts {user, n, t}": (make_dicts, {"pickle-5": (pickle_enc, pickle_dec),
                                        "arrow-ipc": (arrow_dicts_enc, arrow_dicts_dec)}),
    "dicts, arrow schema given": (make_dicts, {
        "pickle-5": (pickle_enc, pickle_dec),
        "arrow-ipc": (arrow_dicts_schema_enc, arrow_dicts_dec)}),
    "tuples (str, int, float)": (make_tuples, {"pickle-5": (pickle_enc, pickle_dec),
                                               "arrow-ipc": (arrow_tuples_enc, arrow_tuples_dec)}),
}


def check_codec(enc, dec, batches) -> None:
    for b in batches:
        if dec(enc(b)) != b:
            raise AssertionError("codec did not round-trip")


def measure_codec(enc, dec, batches) -> dict:
    gc.collect()
    t0 = time.perf_counter()
    bufs = [enc(b) for b in batches]
    t1 = time.perf_counter()
    for b in bufs:  # decoded batches are dropped at once, as a consumer would
        dec(b)
    t2 = time.perf_counter()
    nbytes = sum(len(b) if isinstance(b, bytes) else b.size for b in bufs)
    records = sum(len(b) for b in batches)
    return {"enc_mb_s": nbytes / (t1 - t0) / 1e6, "dec_mb_s": nbytes / (t2 - t1) / 1e6,
            "records_s": records / (t2 - t0), "bytes_per_batch": nbytes / len(batches)}


# --------------------------------------------------------------------------- one channel


def _send_all(address, secret, bs, nbatches) -> None:
    pool = [make_dicts(bs, k) for k in range(16)]
    with OutputChannel("bench", address, secret) as ch:
        for i in range(nbatches):
            ch.send_records(pool[i % 16])
        ch.send_eof()


def measure_channel(bs: int, nbatches: int, in_process: bool) -> float:
    secret = secrets.token_bytes(32)
    with InputGate("bench-task", ["bench"], secret, credits=8) as gate:
        if in_process:
            worker = threading.Thread(target=_send_all, args=(gate.address, secret, bs, nbatches))
        else:
            worker = multiprocessing.get_context("spawn").Process(
                target=_send_all, args=(gate.address, secret, bs, nbatches))
        worker.start()
        gate.wait_connected(60)
        records, dt = drain_channel(gate)
        worker.join(30)
    return records / dt


def main(argv: list[str] | None = None) -> int:
    p = bench_parser(__doc__, None, (5, 3))
    p.add_argument("--batch-size", type=int, default=1000, help="records per batch")
    args = parse_bench_args(p, argv)
    bs, rounds = args.batch_size, args.rounds
    nb = 20 if args.quick else 200  # batches per codec measurement
    nb_channel = 100 if args.quick else 2000
    print(f"cutline encoding benchmark: {bs:,}-record batches, {nb} batches per case, "
          f"{rounds} rounds, median; Python {platform.python_version()}, pyarrow {pa.__version__}")

    data = {name: [make(bs, k) for k in range(nb)] for name, (make, _) in WORKLOADS.items()}
    cases = [(w, c) for w, (_, codecs) in WORKLOADS.items() for c in codecs]
    runs: dict[tuple[str, str], list[dict]] = {c: [] for c in cases}
    for w, c in cases:  # warm-up and correctness
        check_codec(*WORKLOADS[w][1][c], data[w][:3])
    for r in range(rounds):
        for w, c in rotated(cases, r):
            runs[(w, c)].append(measure_codec(*WORKLOADS[w][1][c], data[w]))
    med = {key: {m: statistics.median(x[m] for x in v) for m in v[0]} for key, v in runs.items()}

    # paired: this codec's records/s over pickle's in the same round, median over rounds
    paired = {(w, c): statistics.median(x["records_s"] / p["records_s"]
                                        for x, p in zip(runs[(w, c)], runs[(w, "pickle-5")]))
              for w, c in cases}
    print(f"\n{'records':<28}{'codec':<11}{'encode MB/s':>12}{'decode MB/s':>12}"
          f"{'records/s':>13}{'bytes/batch':>13}{'vs pickle':>11}")
    for w, c in cases:
        m = med[(w, c)]
        print(f"{w:<28}{c:<11}{m['enc_mb_s']:>12.1f}{m['dec_mb_s']:>12.1f}"
              f"{m['records_s']:>13,.0f}{m['bytes_per_batch']:>13,.0f}"
              f"{paired[(w, c)]:>10.2f}x")
    print("(MB/s of encoded bytes; records/s for encode+decode; 'vs pickle' is the paired "
          "ratio of records/s)")

    chan = {"child process": [], "thread": []}
    for r in range(rounds):
        for where in chan:
            chan[where].append(measure_channel(bs, nb_channel, where == "thread"))
    print(f"\none channel on loopback, credits 8, dict batches of {bs:,}, "
          f"{nb_channel:,} batches, median of {rounds}:")
    for where, v in chan.items():
        print(f"  sender in a {where:<14}{statistics.median(v):>12,.0f} records/s   "
              f"(rounds: {', '.join(f'{x:,.0f}' for x in v)})")

    if args.out:
        result = {"batch_size": bs, "rounds": rounds,
                  "codecs": [{"records": w, "codec": c, **med[(w, c)], "vs_pickle": paired[(w, c)]}
                             for w, c in cases],
                  "channel_records_s": {k: statistics.median(v) for k, v in chan.items()}}
        write_results(args.out, result, console())
    return 0


if __name__ == "__main__":
    sys.exit(main())
