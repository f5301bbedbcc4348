"""The cumulative kill counter: every soak (``bench/soak.py``) and recorded chaos run
(``bench/chaos.py``) adds its kills to ``bench/results/kills.json``, so the docs can say how
many ``kill -9`` cutline has survived in all, by mode and by what was killed.

A kill counts as survived when its run committed exactly the failure-free output (for
``at_least_once``: nothing lost).  Runs that did not are kept in the file, and counted apart.
"""

from __future__ import annotations

import collections
import fcntl
import json
import os
import time
from pathlib import Path
from typing import Any

TALLY = Path(__file__).resolve().parent / "results" / "kills.json"


def survived(run: dict[str, Any]) -> bool:
    if run["mode"] == "at_least_once":
        return run["lost"] == 0
    return run["lost"] == 0 and run["duplicated"] == 0


def totals(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in runs if survived(r)]
    by_mode: collections.Counter = collections.Counter()
    by_kind: collections.Counter = collections.Counter()
    by_target: collections.Counter = collections.Counter()
    for r in ok:
        by_mode[r["mode"]] += r["kills"]
        by_kind[r["kind"]] += r["kills"]
        by_target.update(r.get("targets") or {"worker": r["kills"]})
    return {"kills_survived": sum(r["kills"] for r in ok), "runs": len(runs),
            "runs_not_exact": len(runs) - len(ok), "by_mode": dict(sorted(by_mode.items())),
            "by_kind": dict(sorted(by_kind.items())),
            "by_target": dict(sorted(by_target.items()))}


def record(run: dict[str, Any], path: Path = TALLY) -> dict[str, Any]:
    """Add one run (``kind``, ``mode``, ``kills``, ``lost``, ``duplicated``, ``targets``,
    ``seconds``, ...) to the tally file; returns the new totals."""
    # soak and chaos runs may finish at the same moment: one writer at a time
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = json.loads(path.read_text()) if path.exists() else {"runs": []}
        run = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **run}
        data["runs"].append(run)
        data["totals"] = totals(data["runs"])
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"totals": data["totals"], "runs": data["runs"]}, indent=1)
                       + "\n")
        os.replace(tmp, path)
    return data["totals"]


def load(path: Path = TALLY) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {"runs": [], "totals": totals([])}
