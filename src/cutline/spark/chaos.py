"""Chaos: kill Spark Python workers with ``kill -9`` many times during one job, then check
that the committed output is exactly the failure-free output (``cutline chaos``).

A seeded :class:`Chaos` killer waits for each attempt's tasks, sleeps a random time and
kills a random task's worker process; one kill in four comes within 50 ms of the attempt's
start, while the tasks restore (recovery itself is hit).  Spark restarts the barrier stage,
the job restores its latest checkpoint, the killer waits for the next attempt, and so on.
On a cluster a share of the kills (``executors``) hits the executor JVM above the worker
instead, with every Python process it runs (the soak, ``bench/soak.py``).
"""

from __future__ import annotations

import collections
import importlib.util
import os
import random
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..driver.dataflow import DataflowRun
from ..driver.shell import Driver
from .faults import executor_of

__all__ = ["Chaos", "ChaosReport", "load_example", "run_chaos"]


@dataclass
class Chaos:
    """Kill a random task ``kills`` times (or until ``stop`` is set), each after a random
    delay (seeded): its Python worker, or with probability ``executors`` the executor JVM
    above it (on a cluster; on embedded Spark the worker)."""

    kills: int
    seed: int = 0
    mean_delay: float = 1.0
    early: float = 0.25  # share of kills that come while the new attempt restores
    executors: float = 0.0
    # count the delay from the attempt's start (every task registered), not from its first
    # registered task: on a cluster an executor JVM starts slowly, and a kill before the
    # attempt runs would keep a job from ever making progress (the soak)
    after_start: bool = False
    # attempt, slot, pid, target ("worker" / "executor"), delay, started, time
    killed: list[dict] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def __call__(self, driver: Driver[DataflowRun]) -> None:
        threading.Thread(target=self._run, args=(driver,), name="cutline-chaos",
                         daemon=True).start()

    def _run(self, driver: Driver[DataflowRun]) -> None:
        rng = random.Random(self.seed)
        attempt = -1

        def over() -> bool:
            return driver.done.is_set() or self.stop.is_set()

        while len(self.killed) < self.kills and not over():
            # the next attempt, with at least one task registered (pids known)
            run = driver.run
            while not over() and (run.attempt.number <= attempt or not run.task_pids
                                  or (self.after_start and not run.attempt.started)):
                time.sleep(0.005)
            if over():
                return
            attempt = driver.run.attempt.number
            delay = (rng.uniform(0.0, 0.05) if rng.random() < self.early
                     else rng.uniform(0.05, 2 * self.mean_delay))
            # (no draw without executor kills: a seed kills as it always did)
            executor = self.executors > 0 and rng.random() < self.executors
            if self.stop.wait(delay):
                return
            pids = driver.run.task_pids
            if driver.done.is_set() or driver.run.attempt.number != attempt or not pids:
                continue
            slot = rng.choice(sorted(pids))
            target, pid = "worker", pids[slot]
            if executor and (jvm := executor_of(pid)) is not None:
                target, pid = "executor", jvm
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            self.killed.append({"attempt": attempt, "slot": slot, "pid": pid,
                                "target": target, "delay": delay,
                                "started": driver.run.attempt.started, "time": time.time()})


@dataclass
class ChaosReport:
    kills: int
    attempts: int
    checkpoints: int
    expected: int
    committed: int
    lost: int
    duplicated: int
    seconds: float
    mode: str
    during_recovery: int
    retained: list[str] = field(default_factory=list)  # checkpoint/savepoint dirs left
    orphans: list[str] = field(default_factory=list)  # files nothing retained references

    @property
    def exact(self) -> bool:
        return self.lost == 0 and self.duplicated == 0


def storage_orphans(storage: Any, output_dirs: tuple[str, ...] = ()) -> tuple[list, list]:
    """``(retained, orphans)`` of a job's checkpoint storage after its run: every file must
    belong to a completed checkpoint or savepoint, or be a shared file one of them
    references; a sink's output directories must hold no staging left behind."""
    fs, job_dir = storage.fs, storage.dir.rstrip("/")
    retained: list[str] = []
    allowed_dirs: list[str] = []
    shared: set[str] = set()
    for name in sorted(storage._entries()):
        if not (name.startswith("chk-") or name.startswith("savepoint-")):
            continue
        try:
            handle = storage.open(name)
        except Exception:  # noqa: BLE001 - partial or corrupt: its files are orphans
            continue
        retained.append(name)
        allowed_dirs.append(f"{job_dir}/{name}/")
        shared.update(f"{job_dir}/{rel}" for rel in getattr(handle, "shared", {}) or {})
    # the job's own records beside its checkpoints: its run logs, history and report (a
    # lease left behind is an orphan: a run releases it)
    allowed_dirs.append(f"{job_dir}/logs/")
    shared.update((f"{job_dir}/history.jsonl", f"{job_dir}/report.html"))
    orphans = []
    for path in sorted(fs.find(job_dir)):
        if any(path.startswith(d) for d in allowed_dirs) or path in shared:
            continue
        orphans.append(path)
    for out in output_dirs:
        ofs, root = fs, out
        staging = f"{root.rstrip('/')}/_staging"
        if ofs.exists(staging):
            orphans += [p for p in ofs.find(staging)]
    return retained, orphans


def load_example(path: str) -> Any:
    """Import an example program by path (``examples/wordcount.py``); it must define
    ``chaos_job(workdir, mode, records)``."""
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"no example program at {path}")
    spec = importlib.util.spec_from_file_location(f"cutline_example_{file.stem}", file)
    if spec is None or spec.loader is None:
        raise ValueError(f"{path} cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    if not hasattr(module, "chaos_job"):
        raise ValueError(f"{path} has no chaos_job(workdir, mode, records) function: "
                         "cutline chaos needs one to build the pipeline and know its output")
    return module


def run_chaos(example: str, kills: int, seed: int = 0, mode: str = "aligned",
              records: int | None = None, spark: Any = None, workdir: str | None = None,
              mean_delay: float = 1.0, progress: Any = False,
              early: float = 0.25) -> ChaosReport:
    module = load_example(example)
    if workdir is None:  # ours: deleted once the report is made
        with tempfile.TemporaryDirectory(prefix="cutline-chaos-") as tmp:
            return run_chaos(example, kills, seed, mode, records, spark, tmp, mean_delay,
                             progress, early)
    pipeline, committed, expected = module.chaos_job(workdir, mode, records)
    if spark is None:
        from .launcher import embedded_context

        # every kill fails the barrier stage once: allow that many resubmissions
        spark = embedded_context(pipeline.parallelism, max_failures=kills + 8,
                                 stage_attempts=kills + 8)
    chaos = Chaos(kills, seed, mean_delay, early)
    t0 = time.monotonic()
    result = pipeline.run(spark=spark, on_start=chaos, progress=progress,
                          timeout=max(600.0, kills * 30.0))
    got = collections.Counter(committed())
    want = collections.Counter(expected)
    from ..storage.checkpoints import CheckpointStorage

    retained, orphans = storage_orphans(
        CheckpointStorage(pipeline.checkpoint.storage, pipeline.name,
                          pipeline.checkpoint.storage_options),
        tuple(n.fn.path for n in pipeline.nodes
              if n.kind == "sink" and isinstance(getattr(n.fn, "path", None), str)))
    return ChaosReport(
        kills=len(chaos.killed), attempts=result.attempts,
        checkpoints=result.checkpoints_completed, expected=sum(want.values()),
        committed=sum(got.values()), lost=sum((want - got).values()),
        duplicated=sum((got - want).values()), seconds=time.monotonic() - t0, mode=mode,
        during_recovery=sum(1 for k in chaos.killed if k["delay"] < 0.05),
        retained=retained, orphans=orphans)
