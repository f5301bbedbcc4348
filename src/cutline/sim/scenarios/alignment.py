"""One DAG pipeline under every checkpoint mode, with a failure, a restore and a replay.

``sources --hash(key)--> counters --> sink``, with a slow sink so that queues build up.
Each mode runs the same input with the same failure time: the job checkpoints every
``interval``, dies, restores the latest completed checkpoint into a fresh world (states,
then recorded in-flight data), replays the sources from their offsets and runs to the end.
The output is compared with a failure-free run: aligned and unaligned are exact;
at-least-once loses nothing but counts some records twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import mean

from ..dataflow import build_pipeline, compare_output
from ..world import Simulation

MODES = {
    "aligned": ("aligned", None),
    "aligned+timeout": ("aligned", 0.3),
    "unaligned": ("unaligned", None),
    "at_least_once": ("at_least_once", None),
}
SERVICE = {"sink": 0.03, "count0": 0.008, "count1": 0.008}


@dataclass
class ModeRun:
    mode: str
    checkpoints: int
    restored_from: int | None
    mean_duration: float
    channel_state_records: int
    records: int
    duplicates: int
    lost: int
    exact: bool


@dataclass
class AlignmentResult:
    failure_at: float
    reference_records: int
    runs: list[ModeRun] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"failure_at": self.failure_at, "reference_records": self.reference_records,
                "modes": [r.__dict__ for r in self.runs]}


def _world(mode: str, timeout: float | None, seed: int, records: int) -> Simulation:
    sim = Simulation(mode, seed=seed, delay=(0.1, 0.6), service_time=SERVICE,
                     aligned_timeout=timeout)
    build_pipeline(sim, records=records)
    return sim


def run_mode(
    name: str, *, seed: int = 0, records: int = 300, interval: float = 1.5,
    failure_at: float | None = 9.0, horizon: float = 400.0,
) -> tuple[ModeRun, list]:
    mode, timeout = MODES[name]
    sim = _world(mode, timeout, seed, records)
    sim.snapshot_every(interval, until=horizon)
    if failure_at is None:
        sim.run()
        out = sim.procs["sink"].logic.state
        snaps = sim.completed
        restored = None
    else:
        sim.run(until=failure_at)  # ... and the job dies here
        snaps = sim.completed
        last = sim.latest_completed()
        sim2 = _world(mode, timeout, seed + 1000, records)
        restored = None
        if last is not None:
            sim2.restore(last)
            restored = last.id
        sim2.snapshot_every(interval, start=failure_at + interval, until=horizon,
                            first_id=(restored or 0) + 1)
        sim2.run()
        out = sim2.procs["sink"].logic.state
    durations = [s.duration for s in snaps if s.duration is not None]
    in_flight = sum(len(ms) for s in snaps for ms in s.channels.values())
    return ModeRun(name, len(snaps), restored, round(mean(durations), 3) if durations else 0.0,
                   in_flight, len(out), 0, 0, False), out


def run(seed: int = 0, records: int = 300, failure_at: float = 9.0,
        interval: float = 1.5) -> AlignmentResult:
    _, reference = run_mode("aligned", seed=seed, records=records, failure_at=None,
                            interval=interval)
    result = AlignmentResult(failure_at, len(reference))
    for name in MODES:
        row, out = run_mode(name, seed=seed, records=records, failure_at=failure_at,
                            interval=interval)
        cmp = compare_output(reference, out)
        row.duplicates, row.lost, row.exact = cmp["duplicates"], cmp["lost"], cmp["exact"]
        result.runs.append(row)
    return result
