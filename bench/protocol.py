"""Throughput of the sans-IO snapshot handler against a bare loop over the same batches.

Run ``python bench/protocol.py`` (``--quick`` for a short run).  Cases, all feeding the
same pre-built batches (tuples of ints) to the same consumer:

* ``bare loop``: no protocol at all, the consumer is called on every batch;
* ``handler, no checkpoint``: ``SnapshotHandler(["a", "b"], mode).on_records`` per batch,
  then the returned actions are carried out as a driver would;
* ``handler, one checkpoint in flight``: as above, after a barrier on ``a`` put a
  checkpoint in flight, feeding only ``b`` (recorded *and* delivered in chandy_lamport and
  unaligned mode; ``a`` blocked in aligned mode).

The machine may be shared and noisy, so cases are interleaved across several rounds (the
order rotates each round) and the median per case is reported.  Exit code is always 0:
this is a benchmark, not a test.  Results also go to ``bench/results/protocol.json``.
"""

from __future__ import annotations

import gc
import platform
import statistics
import sys
import time

from _common import (
    RESULTS, bench_parser, parse_bench_args, rotated, stamp, table, write_results,
)
from _common import console as make_console

from cutline.protocol import (
    Barrier,
    Deliver,
    Mode,
    RecordChannelState,
    SnapshotHandler,
)

DEFAULT_OUT = RESULTS / "protocol.json"

MODES = (Mode.ALIGNED, Mode.CHANDY_LAMPORT, Mode.UNALIGNED)
TARGET = 0.9
POOL = 64  # distinct pre-built batches, cycled (keeps memory flat for long runs)

BARE = "bare loop"
NO_CP = "handler, no checkpoint"
IN_FLIGHT = "handler, one checkpoint in flight"
CONTROL = "bare loop again (noise control)"


# --------------------------------------------------------------------------- workload


def consume(batch) -> int:
    """The operator: honest per-record work, the same in every case."""
    acc = 0
    for r in batch:
        acc += r
    return acc


def make_pool(batch_size: int) -> list[tuple[int, ...]]:
    return [tuple(range(i * batch_size, (i + 1) * batch_size)) for i in range(POOL)]


def make_feed(pool, batches: int, channels: tuple[str, ...]) -> list[tuple[str, tuple]]:
    """``batches`` (channel, batch) pairs, channels round-robin, batches cycled from pool."""
    nch = len(channels)
    return [(channels[i % nch], pool[i % POOL]) for i in range(batches)]


# --------------------------------------------------------------------------- cases


def run_bare(feed, _mode=None) -> tuple[int, int]:
    total = 0
    for _channel, batch in feed:
        total += consume(batch)
    return total, 0


def _drive(handler: SnapshotHandler, feed) -> tuple[int, int]:
    """Feed every batch to ``handler`` and carry out its actions like a driver."""
    on_records = handler.on_records
    log: list = []  # the driver's in-flight log: references, no copies
    append = log.append
    total = 0
    for channel, batch in feed:
        for a in on_records(channel, batch):
            t = type(a)
            if t is Deliver:
                total += consume(a.records)
            elif t is RecordChannelState:
                append(a.records)
            else:  # pragma: no cover - not expected on the records path
                raise AssertionError(f"unexpected action on the records path: {a!r}")
    return total, len(log)


def run_no_checkpoint(feed, mode: Mode) -> tuple[int, int]:
    return _drive(SnapshotHandler(["a", "b"], mode), feed)


def in_flight_handler(mode: Mode) -> SnapshotHandler:
    h = SnapshotHandler(["a", "b"], mode)
    if mode is Mode.UNALIGNED:
        h.on_barrier("a", Barrier(1, unaligned=True))
        assert h.recording == {1: ("b",)}, h.recording
    elif mode is Mode.CHANDY_LAMPORT:
        h.on_barrier("a", Barrier(1))
        assert h.recording == {1: ("b",)}, h.recording
    elif mode is Mode.ALIGNED:
        h.on_barrier("a", Barrier(1))
        assert h.blocked == ("a",) and h.aligning == 1, (h.blocked, h.aligning)
    else:  # pragma: no cover
        raise ValueError(mode)
    return h


def run_in_flight(feed, mode: Mode) -> tuple[int, int]:
    return _drive(in_flight_handler(mode), feed)


# --------------------------------------------------------------------------- measuring


def measure(fn, feed, mode, records: int) -> tuple[float, int, int]:
    gc.collect()
    t0 = time.perf_counter()
    total, logged = fn(feed, mode)
    dt = time.perf_counter() - t0
    return records / dt, total, logged


def calibrate(pool, batch_size: int, target_s: float) -> int:
    """Number of batches that makes the bare loop take about ``target_s`` seconds."""
    n = max(1, 20_000 // batch_size)
    while True:
        feed = make_feed(pool, n, ("a", "b"))
        t0 = time.perf_counter()
        run_bare(feed)
        dt = time.perf_counter() - t0
        if dt >= 0.1 or n >= 50_000_000 // batch_size:
            break
        n *= 4
    return max(10, int(n * target_s / dt))


def main(argv: list[str] | None = None) -> int:
    p = bench_parser(__doc__, DEFAULT_OUT, (5, 3))
    p.add_argument("--batch-size", type=int, default=1000, help="records per batch")
    p.add_argument(
        "--batches",
        type=int,
        default=None,
        help="batches per measured case (default: calibrated so each case takes ~1.5 s)",
    )
    args = parse_bench_args(p, argv)

    console = make_console(150)
    bs = args.batch_size
    if bs < 1:
        p.error("--batch-size must be >= 1")
    rounds = args.rounds
    pool = make_pool(bs)
    if args.batches is not None:
        batches = args.batches
    elif args.quick:
        batches = max(10, 200_000 // bs)
    else:
        batches = calibrate(pool, bs, 1.5)
    batches += batches % 2  # even: both channels get the same number of batches
    records = batches * bs

    feed_two = make_feed(pool, batches, ("a", "b"))
    feed_b = make_feed(pool, batches, ("b",))

    cases: list[tuple[str, str, object, list]] = [(BARE, "-", run_bare, feed_two)]
    # The same bare loop measured twice: how far apart two identical cases land in this
    # run is the noise floor against which the handler's ratios should be read.
    cases.append((CONTROL, "-", run_bare, feed_two))
    for mode in MODES:
        cases.append((NO_CP, mode.value, run_no_checkpoint, feed_two))
    for mode in MODES:
        cases.append((IN_FLIGHT, mode.value, run_in_flight, feed_b))

    console.print(
        f"[bold]cutline protocol benchmark[/]  batch size {bs:,} records, "
        f"{batches:,} batches ({records:,} records) per case, {rounds} rounds, "
        f"Python {platform.python_version()}"
    )

    # Warm up every case once (small), and check they all see the same records.
    warm = make_feed(pool, min(batches, 20), ("a", "b"))
    warm_b = make_feed(pool, min(batches, 20), ("b",))
    for _name, mval, fn, feed in cases:
        fn(warm_b if feed is feed_b else warm, Mode(mval) if mval != "-" else None)

    rates: dict[tuple[str, str], list[float]] = {(c[0], c[1]): [] for c in cases}
    expected_total = None
    logged_counts: dict[tuple[str, str], int] = {}
    for r in range(rounds):
        for name, mval, fn, feed in rotated(cases, r):
            mode = Mode(mval) if mval != "-" else None
            rate, total, logged = measure(fn, feed, mode, records)
            if expected_total is None:
                expected_total = total
            elif total != expected_total:
                raise AssertionError(f"{name}/{mval} consumed a different total: {total}")
            rates[(name, mval)].append(rate)
            logged_counts[(name, mval)] = logged
        console.print(f"  round {r + 1}/{rounds} done", style="dim")

    med = {key: statistics.median(v) for key, v in rates.items()}
    bare = med[(BARE, "-")]
    # Paired ratio: case vs the bare loop of the same round, median over rounds.
    bare_rounds = rates[(BARE, "-")]
    paired = {
        key: statistics.median(x / b for x, b in zip(v, bare_rounds)) for key, v in rates.items()
    }

    t = table(f"records/s at {bs:,}-record batches (median of {rounds} rounds)",
              ("case", "mode", "records/s (median)", "ratio vs bare loop", "paired ratio",
               "spread", "overhead/batch", "batches logged"),
              left=("case", "mode"), no_wrap=("case", "mode"))
    for name, mval, _fn, _feed in cases:
        key = (name, mval)
        v = rates[key]
        spread = (max(v) - min(v)) / med[key] * 100 if med[key] else 0.0
        ratio = med[key] / bare
        # Extra wall time per batch vs the bare loop: constant per batch, not per record.
        overhead_us = (1 / med[key] - 1 / bare) * bs * 1e6
        style = "" if name in (BARE, CONTROL) else ("green" if ratio >= TARGET else "red")
        t.add_row(
            name,
            mval,
            f"{med[key]:,.0f}",
            f"[{style}]{ratio:.3f}x[/]" if style else f"{ratio:.3f}x",
            f"{paired[key]:.3f}x",
            f"±{spread / 2:.1f}%",
            "-" if name == BARE else f"{overhead_us:+.2f} µs",
            f"{logged_counts[key]:,}",
        )
    console.print(t)

    noise = abs(med[(CONTROL, "-")] / bare - 1)
    console.print(
        f"noise floor: the bare loop measured twice differs by {noise:.1%} in this run; "
        "read ratios within that of 0.9 as undecided",
        style="dim",
    )
    verdicts = {}
    for mode in MODES:
        r_no = med[(NO_CP, mode.value)] / bare
        r_in = med[(IN_FLIGHT, mode.value)] / bare
        ok = r_no >= TARGET and r_in >= TARGET
        verdicts[mode.value] = {"pass": ok, "no_checkpoint": r_no, "in_flight": r_in}
        word = "[green]PASS[/]" if ok else "[red]FAIL[/]"
        console.print(
            f"{mode.value:>15}: handler >= {TARGET}x bare loop at {bs:,}-record batches: "
            f"{word} (ratio {min(r_no, r_in):.3f}; no checkpoint {r_no:.3f}x, "
            f"in flight {r_in:.3f}x)"
        )

    result = {
        "benchmark": "cutline.protocol.SnapshotHandler vs bare loop",
        **stamp(),
        "implementation": platform.python_implementation(),
        "quick": args.quick,
        "batch_size": bs,
        "batches": batches,
        "records_per_case": records,
        "rounds": rounds,
        "target_ratio": TARGET,
        "cases": [
            {
                "case": name,
                "mode": None if mval == "-" else mval,
                "records_per_s_median": med[(name, mval)],
                "records_per_s_rounds": rates[(name, mval)],
                "ratio_vs_bare": med[(name, mval)] / bare,
                "paired_ratio_median": paired[(name, mval)],
                "overhead_us_per_batch": (1 / med[(name, mval)] - 1 / bare) * bs * 1e6,
                "batches_logged": logged_counts[(name, mval)],
            }
            for name, mval, _fn, _feed in cases
        ],
        "noise_floor": noise,
        "target": verdicts,
    }
    write_results(args.out, result, console)
    return 0


if __name__ == "__main__":
    sys.exit(main())
