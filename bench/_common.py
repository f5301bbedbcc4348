"""What the benchmarks share: arguments, statistics, rounds, progress, tables, results files,
temporary directories, the Spark session, plots, and versions of the code to compare.

Import it first (``from _common import ...``): it makes ``cutline`` importable from a
checkout that has not installed it.  Nothing here runs on a Spark worker except
``LegacyDiscardSink`` (shipped by value when an older cutline is measured).
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"

try:
    import cutline  # noqa: F401 - installed, or run from a checkout
except ImportError:  # running from a checkout without an installed package
    sys.path.insert(0, str(ROOT / "src"))

from rich.console import Console  # noqa: E402 - after the sys.path fix above
from rich.table import Table  # noqa: E402

# --------------------------------------------------------------------------- arguments


def positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def _number(text: str, allow_zero: bool) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(v) or v < 0 or (v == 0 and not allow_zero):
        raise argparse.ArgumentTypeError(
            f"must be a finite number {'>= 0' if allow_zero else '> 0'}, got {text}")
    return v


def positive_float(text: str) -> float:
    return _number(text, allow_zero=False)


def non_negative_float(text: str) -> float:
    return _number(text, allow_zero=True)


def bench_parser(doc: str, out: Path | None, rounds: tuple[int, int], *,
                 quick: str = "short run (smoke test)", rounds_help: str = "rounds",
                 out_help: str | None = None) -> argparse.ArgumentParser:
    """A parser with the options every benchmark has: ``--quick``, ``--rounds`` (``rounds``
    is (full, quick) default) and ``--out``; add the rest, then call :func:`parse_bench_args`."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help=quick)
    ap.add_argument("--rounds", type=positive_int, default=None,
                    help=f"{rounds_help} (default {rounds[0]}, quick {rounds[1]})")
    ap.add_argument("--out", type=Path, default=out,
                    help=out_help or ("JSON results file" if out is not None
                                      else "also write JSON results here"))
    ap.set_defaults(default_rounds=rounds)
    return ap


def parse_bench_args(ap: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """``ap.parse_args(argv)`` with ``rounds`` filled in from ``--quick``."""
    args = ap.parse_args(argv)
    full, quick = args.default_rounds
    args.rounds = args.rounds or (quick if args.quick else full)
    return args


# --------------------------------------------------------------------------- statistics


def median(xs: Sequence[float | None]) -> float | None:
    ys = [x for x in xs if x is not None]
    return statistics.median(ys) if ys else None


def percentile(xs: Sequence[float | None], p: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default)."""
    ys = sorted(x for x in xs if x is not None)
    if not ys:
        return None
    k = (len(ys) - 1) * p / 100
    lo = int(k)
    hi = min(lo + 1, len(ys) - 1)
    return ys[lo] + (ys[hi] - ys[lo]) * (k - lo)


def noise_of(per_round: Sequence[float | None]) -> float | None:
    """Half the spread of per-round ratios; None when there is one round (not measured)."""
    ys = [x for x in per_round if x is not None]
    if len(ys) < 2:
        return None
    return (max(ys) - min(ys)) / 2


def verdict(value: float | None, target: float, at_least: bool, noise: float | None,
            paired: float | None = None) -> str:
    """PASS / FAIL; "undecided" when ``value`` is within ``noise`` of the target, or when the
    median of the per-round (paired) ratios lands on the other side of the target."""
    if value is None:
        return "n/a"

    def ok(x: float) -> bool:
        return x >= target if at_least else x <= target

    if noise is not None and abs(value - target) <= noise:
        return "undecided"
    if paired is not None and ok(paired) != ok(value):
        return "undecided"
    return "PASS" if ok(value) else "FAIL"


STYLE = {"PASS": "green", "FAIL": "red", "undecided": "yellow", "n/a": "dim", "-": "dim",
         "within noise": "green", "better": "green", "worse": "red",
         "noise not measured": "yellow"}


def fmt(x: float | None, spec: str = ".3f", suffix: str = "") -> str:
    return "-" if x is None else f"{x:{spec}}{suffix}"


def ms(x: float | None, spec: str = ",.0f") -> str:
    return "-" if x is None else f"{x * 1000:{spec}} ms"


def styled(word: str) -> str:
    style = STYLE.get(word, "")
    return f"[{style}]{word}[/]" if style else word


def before_after(before: Sequence[float | None], after: Sequence[float | None], *,
                 higher_is_better: bool = True) -> dict:
    """After against before, measured side by side in the same rounds: ``ratio`` of the
    medians, ``per_round`` after/before ratios (rounds where both ran), ``paired`` their
    median, ``noise`` half their spread, and a ``verdict``: "within noise" when the paired
    ratio is within the noise of 1, else "better" or "worse" (by ``higher_is_better``);
    "noise not measured" with fewer than two rounds."""
    b, a = median(before), median(after)
    per = [y / x for x, y in zip(before, after) if x and y is not None]
    paired, noise = median(per), noise_of(per)
    if paired is None:
        word = "n/a"
    elif noise is None:
        word = "noise not measured"
    elif abs(paired - 1) <= noise:
        word = "within noise"
    else:
        word = "better" if (paired > 1) == higher_is_better else "worse"
    return {"before": b, "after": a, "ratio": a / b if a is not None and b else None,
            "per_round": per, "paired": paired, "noise": noise,
            "spread": [min(per), max(per)] if per else None,
            "higher_is_better": higher_is_better, "verdict": word}


# --------------------------------------------------------------------------- rounds


def drain_channel(gate: Any) -> tuple[int, float]:
    """Read one benchmark channel of ``gate`` to EOF: (records after the first batch, seconds
    from the first batch on), so process start-up is not timed."""
    records, t0, first = 0, None, 0
    while True:
        item = gate.poll(frozenset(), 60)
        if item is None:
            raise TimeoutError("channel benchmark stalled")
        if t0 is None:
            t0 = time.perf_counter()  # the first batch starts the clock
            first = len(item[2]) if item[1] != "eof" else 0
        if item[1] == "eof":
            break
        records += len(item[2])
    return records - first, time.perf_counter() - t0


def rotated(cases: Sequence[Any], shift: int) -> list[Any]:
    """``cases`` starting at ``shift`` (mod their number): rotate each round, so that no case
    always runs first or last."""
    k = shift % len(cases) if cases else 0
    return list(cases[k:]) + list(cases[:k])


def side_by_side(versions: Sequence[str], r: int) -> list[str]:
    """The order of the versions in round ``r``: reversed every other round, so that neither
    always runs first (warmer caches, a quieter machine)."""
    return list(versions) if r % 2 == 0 else list(reversed(versions))


class Runner:
    """Runs cases, records their results per case name (``None`` for a failure, which is
    logged in ``errors`` and does not stop the benchmark) and prints a progress line."""

    def __init__(self, console: Console, width: int = 26,
                 runs: dict[str, list] | None = None) -> None:
        self.console, self.width = console, width
        self.runs: dict[str, list] = runs if runs is not None else {}
        self.errors: list[dict] = []

    def run(self, name: str, fn: Callable[[], Any], r: int | None = None,
            rounds: int | None = None, describe: Callable[[Any], str] | None = None,
            sample_load: bool = True) -> Any:
        """``sample_load``: sample the load while ``fn`` runs, this process's tree being the
        run's; False for a run that brings its own sample (a fresh process's, from
        :func:`run_child`, as its result's ``load``)."""
        t0 = time.monotonic()
        load = RunLoad() if sample_load else None
        if load is not None:  # the run is this process's tree (its Spark JVM, its workers)
            load.root = os.getpid()
            load.start()
        try:
            out = fn()
        except Exception as exc:  # noqa: BLE001 - a benchmark reports and goes on
            error = {"case": name, "error": repr(exc), "trace": traceback.format_exc()[-3000:]}
            if r is not None:
                error["round"] = r + 1
            self.errors.append(error)
            where = f"round {r + 1}: " if r is not None else ""
            self.console.print(f"  {where}{name} FAILED: {exc}", style="red")
            if r is not None:
                self.runs.setdefault(name, []).append(None)
            return None
        finally:
            sample = load.stop() if load is not None else None
        dt = time.monotonic() - t0
        if r is None:
            self.console.print(f"  {name:<{self.width}} {dt:6.1f} s", style="dim")
            return out
        out["round"] = r + 1
        if isinstance(out, dict) and sample is not None:  # the 1-minute load as the run
            # began, its highest, as it ended, and the runnable threads outside this
            # process's tree (is_loaded)
            out["load"] = {**sample, "after": os.getloadavg()[0]}
        self.runs.setdefault(name, []).append(out)
        extra = describe(out) if describe is not None else ""
        self.console.print(f"  round {r + 1}/{rounds}: {name:<{self.width}} {dt:5.1f} s  "
                           f"{extra}", style="dim")
        return out


# --------------------------------------------------------------------------- output


def console(width: int = 150) -> Console:
    """Rich console; piped output (CI logs, subprocess) gets a width that fits the tables."""
    return Console() if sys.stdout.isatty() else Console(width=width)


def table(title: str, columns: Sequence[str], left: Sequence[str] = ("case",),
          no_wrap: bool | Sequence[str] = True) -> Table:
    """A table whose ``left`` columns are left-justified and the rest (numbers) right;
    ``no_wrap`` for every column, or only the columns named."""
    t = Table(title=title)
    for col in columns:
        nw = no_wrap if isinstance(no_wrap, bool) else col in no_wrap
        t.add_column(col, justify="left" if col in left else "right", no_wrap=nw)
    return t


def stamp() -> dict:
    """When and on what a benchmark ran."""
    return {"when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "python": platform.python_version(), "machine": platform.machine()}


def git_state() -> dict:
    """Which code was measured: HEAD and any uncommitted changes under src/; ``cutline``,
    the package this process imports (``bench/ab.py`` points it at another checkout)."""
    import cutline as _cutline

    def git(*a: str) -> str:
        try:
            return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True,
                                  timeout=10).stdout.rstrip("\n")
        except (OSError, subprocess.SubprocessError):
            return ""

    dirty = [line[3:] for line in git("status", "--porcelain", "--", "src").splitlines()]
    return {"commit": git("rev-parse", "HEAD") or None, "src_uncommitted": dirty,
            "cutline": str(Path(_cutline.__file__).parent)}


def write_results(path: Path, result: dict, console: Console, indent: int = 2,
                  note: str = "") -> bool:
    """Write ``result`` as JSON; a benchmark reports a failure to write, it does not raise."""
    import json

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=indent, default=str) + "\n")
        console.print(f"results written to {path}{note}", style="dim")
        return True
    except OSError as exc:
        console.print(f"could not write {path}: {exc}", style="yellow")
        return False


def pyplot() -> Any:
    """matplotlib's pyplot on the file-only Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


class Workdir:
    """A fresh temporary directory per run, removed after: a job resumes from checkpoints
    left under its storage, so no two runs may share one."""

    def __init__(self, prefix: str = "cutline-bench-") -> None:
        self.prefix = prefix

    def __enter__(self) -> Path:
        self.path = Path(tempfile.mkdtemp(prefix=self.prefix))
        return self.path

    def __exit__(self, *exc: object) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


# --------------------------------------------------------------------------- Spark


def spark_session(slots: int, shuffle_partitions: int | None = None,
                  driver_memory: str | None = None) -> Any:
    """cutline's embedded ``local[slots,8]`` session; ``shuffle_partitions`` gives Spark's
    own stateful queries as many partitions as cutline has subtasks; ``driver_memory``:
    the JVM's heap (local mode runs Spark's tasks and their state stores in it)."""
    from pyspark import cloudpickle

    from cutline.spark.launcher import embedded_session

    # Spark workers cannot import this module (bench/ is not on their path): what of it
    # travels to them (LegacyDiscardSink, the cutline.__file__ probe) goes by value.
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    spark = embedded_session(slots=slots, quick_start=False,  # Spark's engine at full speed
                             conf={"spark.driver.memory": driver_memory}
                             if driver_memory else None)
    if shuffle_partitions is not None:
        spark.conf.set("spark.sql.shuffle.partitions", str(shuffle_partitions))
        spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "1000")
    return spark


def _epoch(timestamp: str) -> float:
    return datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%S.%fZ").replace(
        tzinfo=timezone.utc).timestamp()


def spark_batches(progress: list[dict], with_empty: bool = False) -> list[dict]:
    """A streaming query's micro-batches with input (``with_empty``: all of them) from its
    ``recentProgress``: batch id, start (epoch s), input rows, ``durationMs``."""
    return [{"batch": p["batchId"], "start": _epoch(p["timestamp"]),
             "rows": p["numInputRows"], "ms": dict(p["durationMs"])}
            for p in progress if with_empty or p["numInputRows"] > 0]


def spark_processing(progress: list[dict]) -> float:
    """Seconds from the first micro-batch with input's trigger to the end of the last
    micro-batch (with or without input: a stateful query with a watermark emits what the
    last input's watermark closed in a batch without input)."""
    batches, every = spark_batches(progress), spark_batches(progress, with_empty=True)
    if not batches:
        raise RuntimeError("Spark reported no micro-batch with input")
    return max(b["start"] + b["ms"].get("triggerExecution", 0) / 1000 for b in every
               if b["batch"] >= batches[0]["batch"]) - batches[0]["start"]


def stop_quietly(spark: Any) -> None:
    try:
        spark.stop()
    except Exception:  # noqa: BLE001 - the results are written; nothing left to save
        pass


def _cutline_file(_: Any) -> list[str]:
    import cutline as _cutline

    return [_cutline.__file__]


def cutline_in_spark_task(spark: Any) -> str:
    """``cutline.__file__`` as a Spark task's Python worker imports it: the code the
    benchmark's jobs run (``bench/ab.py`` checks it is the version it meant to measure)."""
    return spark.sparkContext.parallelize([0], 1).mapPartitions(_cutline_file).collect()[0]


def job_of(driver: Any) -> Any:
    """What a driver given to ``on_start`` tells of its job (attempts, task pids,
    checkpoints): its ``run`` since issue 26 made the driver one class, the driver itself in
    older versions (``bench/ab.py`` runs this code against both)."""
    return getattr(driver, "run", driver)


class AttemptWatcher:
    """``on_start`` hook: polls the driver every 5 ms and stamps (``time.monotonic()``) when
    each attempt started; ``then(driver)`` runs once, when the first one has."""

    def __init__(self, then: Callable[[Any], None] | None = None) -> None:
        self.starts: dict[int, float] = {}
        self.then = then

    @property
    def started(self) -> float | None:
        """When the first attempt started."""
        return min(self.starts.values()) if self.starts else None

    def __call__(self, driver: Any) -> None:
        threading.Thread(target=self._run, args=(driver,), daemon=True).start()

    def _run(self, driver: Any) -> None:
        while not driver.done.is_set():
            a = job_of(driver).attempt
            if a.started and a.number not in self.starts:
                self.starts[a.number] = time.monotonic()
                if self.then is not None and len(self.starts) == 1:
                    self.then(driver)
            time.sleep(0.005)


def discard_sink() -> Any:
    """``cutline.DiscardSink``, or, measuring a revision from before it, the same thing."""
    try:
        from cutline.connectors import DiscardSink
    except ImportError:
        return LegacyDiscardSink()
    return DiscardSink()


class LegacyDiscardSink:
    """Counts and drops records, commits nothing: ``DiscardSink`` for a cutline that has none
    (``bench/ab.py --before`` an older revision).  Shipped to Spark by value."""

    name = "discard"

    def create_writer(self) -> LegacyDiscardWriter:
        return LegacyDiscardWriter()


class LegacyDiscardWriter:
    def open(self, subtask: int, parallelism: int, job: str) -> None:
        self.records = 0

    def write(self, batch: list) -> None:
        self.records += len(batch)

    def pre_commit(self, checkpoint_id: int) -> dict:
        return {"records": self.records}

    def commit(self, handles: list) -> None:
        pass

    abort = recover = commit

    def close(self) -> None:
        pass


# --------------------------------------------------------------------------- versions


def git_show(rev: str, path: str) -> str:
    """The text of ``path`` at revision ``rev`` of this checkout."""
    try:
        return subprocess.run(["git", "show", f"{rev}:{path}"], cwd=ROOT, capture_output=True,
                              text=True, check=True, timeout=30).stdout
    except subprocess.CalledProcessError as exc:
        raise SystemExit(
            f"cannot read {path} at revision {rev!r}: {exc.stderr.strip()}") from None


def resolve(rev: str) -> str:
    """The commit ``rev`` names, or SystemExit naming it."""
    try:
        return subprocess.run(["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], cwd=ROOT,
                              capture_output=True, text=True, check=True,
                              timeout=30).stdout.strip()
    except subprocess.CalledProcessError:
        raise SystemExit(f"{rev!r} is not a commit of {ROOT}") from None


def checkout_src(rev: str, dest: Path) -> Path:
    """Revision ``rev``'s ``src/`` (the cutline package) extracted under ``dest``; put the
    returned directory first on ``PYTHONPATH`` to run that version."""
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "archive", "--format=tar", resolve(rev), "src"], cwd=ROOT,
                             capture_output=True, check=True, timeout=120).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True, timeout=120)
    return dest / "src"


class LoadSampler(threading.Thread):
    """The 1-minute load average every 10 s during the run (the machine is shared)."""

    def __init__(self) -> None:
        super().__init__(daemon=True, name="load")
        self.samples: list[float] = []
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            self.samples.append(os.getloadavg()[0])
            self._halt.wait(10.0)

    def stop(self) -> None:
        self._halt.set()

    def summary(self) -> dict:
        return {"min": min(self.samples, default=None), "p50": median(self.samples),
                "max": max(self.samples, default=None), "samples": self.samples}


# --------------------------------------------------------------------------- one run, one process
# Issue 30's rules, shared by the benchmarks that follow them (bench/scale.py, bench/nexmark.py,
# bench/vs_spark.py's throughput runs): every measured run is a fresh process whose clock the
# parent starts before it spawns it and stops when it exits (end to end, the headline), with
# the run's own processing time beside it; warm-up runs until run times settle; rounds with
# confidence intervals; the machine's load and the versions recorded with every result;
# outputs checked by the parent after the run.

LOADED_PER_CORE = 1.5  # a run at a higher 1-minute load per core is marked, not a headline
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def proc_stat(pid: int) -> tuple[int, float] | None:
    """``(parent pid, CPU seconds)`` of a live process from ``/proc``: its own and that of
    its children it has waited for (a Python worker the PySpark daemon reaped counts)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), sum(int(x) for x in fields[11:15]) / _CLK_TCK


def tree_cpu(root: int | None = None) -> float | None:
    """CPU seconds of process ``root`` (default: this one) and every live process under it,
    each with the children it has reaped (Linux ``/proc``; ``None`` elsewhere).  Read by a
    run just before it exits: a Spark driver's JVM, its PySpark daemon and the Python workers
    (cutline's tasks, Spark's UDF workers) or a process pool's workers, all counted."""
    root = os.getpid() if root is None else root
    if not os.path.exists(f"/proc/{root}/stat"):
        return None
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            got = proc_stat(int(name))
            if got is not None:
                parents[int(name)], cpu[int(name)] = got
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    tree, todo = {root}, [root]
    while todo:
        for c in children.get(todo.pop(), ()):
            if c not in tree:
                tree.add(c)
                todo.append(c)
    return sum(cpu.get(p, 0.0) for p in tree)


def versions() -> dict:
    """Python, PySpark (Spark), pyarrow and Java versions, and the code measured."""
    import importlib.metadata as md

    out: dict[str, Any] = {"python": platform.python_version()}
    for name in ("pyspark", "pyarrow", "pandas", "orjson"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    try:
        java = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=30)
        out["java"] = (java.stderr or java.stdout).splitlines()[0] if java.returncode == 0 \
            else None
    except (OSError, subprocess.SubprocessError, IndexError):
        out["java"] = None
    return out | {"git": git_state()}


def input_files(directory: Path) -> dict:
    """How many input files, how big (bytes: total, smallest, largest)."""
    sizes = [f.stat().st_size for f in Path(directory).iterdir()
             if f.is_file() and not f.name.startswith((".", "_"))]
    return {"directory": str(directory), "files": len(sizes), "bytes": sum(sizes),
            "smallest": min(sizes, default=0), "largest": max(sizes, default=0)}


def cores() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def conditions() -> dict:
    """The machine now: cores, the load averages, versions."""
    return {"cores": cores(), "load_before": list(os.getloadavg()),
            "loaded_above_per_core": LOADED_PER_CORE, "versions": versions(), **stamp()}


def running_threads(root: int | None = None) -> tuple[int, int]:
    """``(runnable threads on the machine, of them in process ``root``'s tree)`` now, from
    ``/proc`` (each thread's state ``R``).  The caller's own thread is running as it reads:
    it is left out of both figures (``root`` may be this process: a run in it)."""
    parents: dict[int, int] = {}
    running: dict[int, int] = {}
    me, my_tid = os.getpid(), str(threading.get_native_id())
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                parents[pid] = int(f.read().rsplit(b")", 1)[1].split()[1])
            n = 0
            for tid in os.listdir(f"/proc/{pid}/task"):
                if pid == me and tid == my_tid:
                    continue
                with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
                    n += f.read().rsplit(b")", 1)[1].split()[0] == b"R"
        except (OSError, IndexError, ValueError):
            continue
        if n:
            running[pid] = n
    total = sum(running.values())
    if root is None:
        return total, 0
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    tree, todo = {root}, [root]
    while todo:
        for c in children.get(todo.pop(), ()):
            if c not in tree:
                tree.add(c)
                todo.append(c)
    return total, sum(running.get(p, 0) for p in tree)


class RunLoad(threading.Thread):
    """While one run lasts, once a second: the 1-minute load average, and the runnable
    threads *outside* the run's process tree (``root``, set once it is spawned): what else
    the machine does.  A run's own threads raise the load average (a Spark query keeps it
    near 3 on 2 cores by itself), so a run is judged by the others' threads
    (:func:`is_loaded`), sampled from ``/proc``."""

    def __init__(self) -> None:
        super().__init__(daemon=True, name="run-load")
        self.samples: list[float] = [os.getloadavg()[0]]
        self.others: list[int] = []
        self.root: int | None = None
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(1.0):
            self.samples.append(os.getloadavg()[0])
            if self.root is not None:
                total, mine = running_threads(self.root)
                self.others.append(max(0, total - mine))

    def stop(self) -> dict:
        self._halt.set()
        self.samples.append(os.getloadavg()[0])
        others = self.others
        return {"before": self.samples[0], "max": max(self.samples),
                "mean": sum(self.samples) / len(self.samples),
                "others_mean": sum(others) / len(others) if others else None,
                "others_max": max(others) if others else None}


LOADED_OTHERS_PER_CORE = 0.25  # others' runnable threads, mean over a run, per core


def is_loaded(load: dict, ncores: int | None = None) -> bool:
    """Whether a run (``RunLoad.stop()``) shared the machine: on average more than
    ``LOADED_OTHERS_PER_CORE`` runnable threads per core outside its own processes (where
    that was sampled), else its 1-minute load above ``LOADED_PER_CORE`` per core."""
    n = ncores or cores()
    if load.get("others_mean") is not None:
        return load["others_mean"] > LOADED_OTHERS_PER_CORE * n
    return load["max"] > LOADED_PER_CORE * n


class RunFailed(RuntimeError):
    """A measured run that exited non-zero, timed out or wrote a wrong output."""


def run_child(argv: Sequence[str], result_file: Path, timeout: float,
              env: dict | None = None) -> dict:
    """Run ``argv`` (a Python program's arguments, ``sys.executable`` prepended) as a fresh
    process and time it from just before the spawn to its exit: ``end_to_end``; the run
    writes its own figures (its processing time, CPU, ...) as JSON to ``result_file``,
    merged into what is returned with ``load`` (:class:`RunLoad`).  A non-zero exit or a
    timeout raises :class:`RunFailed` with the end of its stderr."""
    import json
    import signal

    errors = Path(result_file).with_suffix(".stderr")
    load = RunLoad()
    load.start()
    with open(errors, "wb") as err_file:
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, *argv], stdout=subprocess.DEVNULL,
                                stderr=err_file, env=env, start_new_session=True)
        load.root = proc.pid
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
        end_to_end = time.perf_counter() - t0
    # What the run left behind (Spark's JVM ending after the program, the first run of an
    # installation writing its class-data archive: cutline.spark.cds) ends on its own, as
    # after a user's program, untimed (the user has the prompt back); waited for so that it
    # neither loads the next run nor is killed before it writes the archive later runs map
    # (killed, every run was a writer: the JVM started 1-1.5 s slower, and never mapped it).
    lingered = wait_group(proc.pid, LINGER) if proc.returncode is not None else 0.0
    try:  # what is left after that: its own process group only
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    run_load = load.stop()
    err = errors.read_text(errors="replace")
    if proc.returncode is None:
        proc.wait()
        raise RunFailed(f"no exit within {timeout:.0f} s: killed; {err[-2000:]}")
    if proc.returncode != 0:
        raise RunFailed(f"exit code {proc.returncode}: {err[-2000:]}")
    try:
        out = json.loads(Path(result_file).read_text())
    except (OSError, ValueError) as exc:
        raise RunFailed(f"no result from the run ({exc}): {err[-2000:]}") from None
    return out | {"end_to_end": end_to_end, "load": run_load, "lingered": round(lingered, 3)}


LINGER = 120.0
"""Seconds ``run_child`` waits, untimed, for what a run left behind to end on its own."""


def group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs (a zombie does not: in a container
    nobody may reap it)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
            return True
    return False


def wait_group(pgid: int, limit: float) -> float:
    """Wait until no process of group ``pgid`` runs, ``limit`` seconds at most; the seconds
    waited."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit and group_alive(pgid):
        time.sleep(0.1)
    return time.monotonic() - t0


def settled(times: Sequence[float], tolerance: float) -> bool:
    """The last two run times within ``tolerance`` (relative to the smaller) of each other."""
    if len(times) < 2:
        return False
    a, b = times[-2], times[-1]
    return abs(a - b) <= tolerance * min(a, b)


def bootstrap_ci(xs: Sequence[float], level: float = 0.95, resamples: int = 4000,
                 seed: int = 1) -> tuple[float, float] | None:
    """A percentile bootstrap confidence interval of the median of ``xs``; None for fewer
    than 3 values (nothing to resample)."""
    import random

    ys = [x for x in xs if x is not None]
    if len(ys) < 3:
        return None
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(ys, k=len(ys))) for _ in range(resamples))
    lo = meds[int((1 - level) / 2 * resamples)]
    hi = meds[min(resamples - 1, int((1 + level) / 2 * resamples))]
    return lo, hi
