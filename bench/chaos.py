"""Chaos runs for the kill counter: ``cutline chaos examples/wordcount.py`` in each mode asked,
on embedded Spark, each run's kills added to ``bench/results/kills.json`` (with the soak's).

    .venv/bin/python bench/chaos.py --kills 100 --modes all
    .venv/bin/python bench/chaos.py --kills 50 --modes unaligned --seed 3

Exit status 0: every run lost nothing and (exactly-once modes) duplicated nothing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _kills import record  # noqa: E402

MODES = ("aligned", "unaligned", "aligned_timeout", "at_least_once")
EXAMPLE = str(HERE.parent / "examples" / "wordcount.py")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=100)
    ap.add_argument("--modes", default="all", help="comma-separated, or all")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--records", type=int, default=None,
                    help="default: 4,000 per kill (the job outlasts its kills)")
    ap.add_argument("--no-tally", action="store_true")
    args = ap.parse_args(argv)
    modes = MODES if args.modes == "all" else tuple(args.modes.split(","))
    from cutline.spark.chaos import run_chaos

    ok = True
    for i, mode in enumerate(modes):
        r = run_chaos(EXAMPLE, args.kills, seed=args.seed + i, mode=mode,
                      records=args.records or max(40_000, 4_000 * args.kills))
        exact = r.lost == 0 and (mode == "at_least_once" or r.duplicated == 0)
        ok &= exact and not r.orphans
        print(f"chaos {mode}: {r.kills} kills ({r.during_recovery} while restoring), "
              f"{r.attempts} attempts, {r.seconds:.0f} s, {r.lost} lost, "
              f"{r.duplicated} duplicated, {len(r.orphans)} orphaned files", flush=True)
        if not args.no_tally:
            totals = record({"kind": "chaos", "mode": mode, "kills": r.kills, "lost": r.lost,
                             "duplicated": r.duplicated, "targets": {"worker": r.kills},
                             "attempts": r.attempts, "minutes": round(r.seconds / 60, 2),
                             "seed": args.seed + i, "ok": exact and not r.orphans})
            print(f"kills survived in all: {totals['kills_survived']:,}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
