"""The user's vocabulary for process graphs: :class:`Process`, :class:`Context`,
:class:`ProcessGraph`.

A process is a Python object with handlers; a graph is processes plus directed FIFO
channels between them, any topology, cycles included::

    class Account(Process):
        def __init__(self, balance):
            self.state = {"balance": balance}

        def on_message(self, ctx, sender, amount):
            self.state["balance"] += amount

    g = ProcessGraph("bank")
    g.add("A", Account(100))
    g.add("B", Account(100))
    g.connect("A", "B")
    g.connect("B", "A")
    g.check(conserved(200, value=lambda s: s["balance"]))
    result = g.run(engine="threads", snapshot_interval=0.5)

A process acts only inside its handlers (``on_start``, ``on_message``, ``on_timer``).  Between
handlers it can be woken by a message or by a timer it set, nothing else: so a process with
no pending timer is *passive*, which is what termination detection reads from a snapshot.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from ..protocol.liveness import HEARTBEAT_TIMEOUT

if TYPE_CHECKING:
    from .predicates import Predicate
    from .result import RunResult

__all__ = ["Context", "Process", "ProcessGraph"]

_NAME = re.compile(r"[A-Za-z0-9_.:@+=-]{1,100}\Z")


class Process:
    """Base class of user processes.  Keep everything a snapshot must capture in ``state``.

    ``state`` is pickled when the process takes its local snapshot (so later changes do
    not leak into the snapshot) and given back by :meth:`restore_state` after a restore.
    Override :meth:`snapshot_state` / :meth:`restore_state` to store something else.
    (Processes of the deterministic simulator are :class:`cutline.sim.SimProcess`, whose
    handler works on channels: ``on_receive(ctx, channel, payload)``.)
    """

    state: Any = None

    def on_start(self, ctx: Context) -> None:
        """Called once when a run starts fresh (not after a restore)."""

    def on_restore(self, ctx: Context) -> None:
        """Called once when a run starts from a snapshot, after the state was restored.
        Pending timers and messages in transit are restored by the runtime."""

    def on_message(self, ctx: Context, sender: str, msg: Any) -> None:
        """A message from ``sender`` arrived on channel ``sender -> ctx.name``."""

    def on_timer(self, ctx: Context, tag: Any) -> None:
        """A timer set with :meth:`Context.schedule` fired."""

    def snapshot_state(self) -> Any:
        return self.state

    def restore_state(self, state: Any) -> None:
        self.state = state


class Context:
    """What a process may do; the only door to the running graph.

    The runtime gives each process one context; this class documents the interface and
    is what the runtime implements.
    """

    name: str
    #: processes this one has a channel to (``ctx.send`` targets), in graph order
    outputs: tuple[str, ...]
    #: processes with a channel to this one
    inputs: tuple[str, ...]
    rng: random.Random

    @property
    def now(self) -> float:
        """Seconds since this run (attempt) started."""
        raise NotImplementedError

    def send(self, dst: str, msg: Any) -> None:
        """Send ``msg`` on the channel ``ctx.name -> dst`` (FIFO, reliable)."""
        raise NotImplementedError

    def schedule(self, delay: float, tag: Any = None) -> None:
        """Call ``on_timer(ctx, tag)`` after ``delay`` seconds.  Pending timers are part of
        the process's snapshot; a process with a pending timer is not passive."""
        raise NotImplementedError

    def initiate_snapshot(self) -> int:
        """Start a new Chandy-Lamport snapshot here; returns its id.  This process records
        its state as soon as the running handler returns (states are recorded between
        events, never inside one), then sends a marker on every output channel."""
        raise NotImplementedError


class ProcessGraph:
    """Processes and the directed channels between them; :meth:`run` runs it."""

    def __init__(self, name: str) -> None:
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(f"graph name must be 1-100 characters of letters, digits and "
                             f"_.:@+=-, got {name!r}")
        self.name = name
        self.processes: dict[str, Process] = {}
        self.edges: list[tuple[str, str]] = []
        self._edge_set: set[tuple[str, str]] = set()
        self.predicates: list[Predicate] = []

    def __repr__(self) -> str:
        return (f"ProcessGraph({self.name!r}, {len(self.processes)} processes, "
                f"{len(self.edges)} channels)")

    # ------------------------------------------------------------------ building

    def add(self, name: str, process: Process) -> str:
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(f"process name must be 1-100 characters of letters, digits and "
                             f"_.:@+=-, got {name!r}")
        if name in self.processes:
            raise ValueError(f"duplicate process name {name!r}")
        if not isinstance(process, Process):
            raise TypeError(f"process {name!r} must be a cutline.graph.Process, got "
                            f"{type(process).__name__}")
        self.processes[name] = process
        return name

    def connect(self, src: str, dst: str) -> None:
        """A FIFO channel from ``src`` to ``dst`` (at most one per ordered pair)."""
        for p in (src, dst):
            if p not in self.processes:
                raise ValueError(f"unknown process {p!r} in channel {src}->{dst}")
        if src == dst:
            raise ValueError(f"a process cannot have a channel to itself ({src})")
        if (src, dst) in self._edge_set:
            raise ValueError(f"duplicate channel {src}->{dst}")
        self._edge_set.add((src, dst))
        self.edges.append((src, dst))

    def connect_both(self, a: str, b: str) -> None:
        self.connect(a, b)
        self.connect(b, a)

    def ring(self, names: Iterable[str] | None = None, *, both: bool = False) -> None:
        """Channels ``n0 -> n1 -> ... -> n0`` (and back, with ``both``)."""
        names = list(self.processes if names is None else names)
        for i, a in enumerate(names):
            b = names[(i + 1) % len(names)]
            if a != b and (a, b) not in self._edge_set:
                self.connect(a, b)
            if both and a != b and (b, a) not in self._edge_set:
                self.connect(b, a)

    def complete(self, names: Iterable[str] | None = None) -> None:
        """A channel between every ordered pair."""
        names = list(self.processes if names is None else names)
        for a in names:
            for b in names:
                if a != b and (a, b) not in self._edge_set:
                    self.connect(a, b)

    def check(self, *predicates: Predicate | Callable) -> ProcessGraph:
        """Evaluate these predicates on every completed snapshot of every run."""
        from .predicates import as_predicate

        self.predicates.extend(as_predicate(p) for p in predicates)
        return self

    # ------------------------------------------------------------------ queries

    def outputs(self, name: str) -> list[str]:
        return [d for s, d in self.edges if s == name]

    def inputs(self, name: str) -> list[str]:
        return [s for s, d in self.edges if d == name]

    def validate(self) -> None:
        if not self.processes:
            raise ValueError(f"graph {self.name!r} has no processes")

    # ------------------------------------------------------------------ running

    def run(
        self,
        *,
        engine: str = "spark",
        spark: Any = None,
        tasks: int | None = None,
        snapshot_interval: float | None = 1.0,
        initiators: int | Iterable[str] = 1,
        max_concurrent: int = 4,
        storage: str | None = None,
        retained: int = 20,
        restore_from: str | None = None,
        stop_on_termination: bool = True,
        stop_on_violation: bool = False,
        duration: float | None = None,
        timeout: float | None = None,
        trace: bool = False,
        seed: int | None = None,
        heartbeat_timeout: float = HEARTBEAT_TIMEOUT,
        tls: bool | None = None,
        on_start: Callable | None = None,
        on_snapshot: Callable | None = None,
    ) -> RunResult:
        """Run the graph until it terminates (a snapshot shows every process passive and
        every channel empty), a stopping predicate fires, or ``duration`` elapses.

        ``engine="spark"`` runs every group of processes as a task of one Spark barrier
        stage (``tasks`` of them; embedded ``local[N,F]`` session unless ``spark`` is
        given); ``engine="threads"`` runs the same hosts on threads of this process.
        ``snapshot_interval``: the driver starts a snapshot this often (``None``: only
        processes do, with ``ctx.initiate_snapshot()``), at ``initiators`` random processes
        (a count) or at the named ones.  Completed snapshots go to ``storage`` (an fsspec
        URL; default a temporary directory), keeping the newest ``retained``.
        ``restore_from``: a snapshot path to start from (in-transit messages re-delivered).
        ``trace``: record every message, marker and local snapshot (for
        :meth:`RunResult.diagram` and the consistent-cut checker).
        ``heartbeat_timeout``: a host (or the driver) that sends nothing for this many
        seconds, heartbeats included, is failed: a frozen host fails the run, naming it.
        ``tls``: the driver's and the hosts' connections speak TLS 1.3 (None: when Spark
        encrypts its own traffic).
        """
        from ..spark.graph import RunOptions, run_graph

        opts = RunOptions(
            engine=engine, tasks=tasks, snapshot_interval=snapshot_interval,
            initiators=initiators if isinstance(initiators, int) else tuple(initiators),
            max_concurrent=max_concurrent, storage=storage, retained=retained,
            restore_from=restore_from, stop_on_termination=stop_on_termination,
            stop_on_violation=stop_on_violation, duration=duration, timeout=timeout,
            trace=trace, seed=seed, heartbeat_timeout=heartbeat_timeout, tls=tls)
        return run_graph(self, opts, spark=spark, on_start=on_start, on_snapshot=on_snapshot)
