"""Process graphs on Spark: each Spark task hosts a group of processes.

The hosts run as one barrier stage (:mod:`cutline.spark.stage`), resubmitted as a whole when
a task fails; the rows it returns prove nothing (the
:class:`~cutline.driver.graph.GraphRun` of the driver knows what completed).  ``engine="threads"``
runs the same hosts on threads of this process, for tests and debugging.
"""

from __future__ import annotations

import copy
import logging
import shutil
import tempfile
import time
from contextlib import nullcontext
from typing import Any

from ..driver.dataflow import JobFailed
from ..driver.graph import RunOptions, graph_driver
from ..driver.run import drive
from ..driver.threads import ThreadsEngine
from ..graph.host import GraphSpec, Host
from ..graph.result import RunResult
from ..storage.checkpoints import CheckpointStorage
from ..storage.lease import JobLease
from .launcher import embedded_context
from .quiet import progress_bar_muted
from .stage import SparkStage, ship_user_code

log = logging.getLogger("cutline.graph")

__all__ = ["JobFailed", "RunOptions", "run_graph"]


def _placement(names: list[str], hosts: int) -> dict[str, int]:
    """Contiguous blocks in graph order: neighbours in a ring mostly share a host."""
    per, extra = divmod(len(names), hosts)
    out, i = {}, 0
    for k in range(hosts):
        for _ in range(per + (k < extra)):
            out[names[i]] = k
            i += 1
    return out


def _host_main(spec: GraphSpec, k: int) -> dict:
    return Host(spec, k).run()


def run_graph(graph: Any, opts: RunOptions, *, spark: Any = None, on_start: Any = None,
              on_snapshot: Any = None) -> RunResult:
    """Run ``graph`` (see :meth:`cutline.graph.ProcessGraph.run`)."""
    graph.validate()
    names = list(graph.processes)
    opts.validate(names)
    hosts = min(opts.tasks or 2, len(names))
    # no storage given: snapshots go to a temporary directory, deleted when the run ends
    # (the result holds every snapshot in memory; pass storage= to keep them on disk)
    temp = None if opts.storage else tempfile.mkdtemp(prefix=f"cutline-{graph.name}-")
    storage = opts.storage or f"file://{temp}"
    placement = _placement(names, hosts)
    # one run per storage, as for pipelines (storage.lease): taken before Spark starts, so
    # that of two runs started at once the loser starts no Spark session
    lease: JobLease | None = None
    try:
        lease = JobLease(CheckpointStorage(storage, graph.name))
        lease.acquire()
        return _run(graph, opts, lease, spark=spark, on_start=on_start,
                    on_snapshot=on_snapshot, names=names, hosts=hosts, temp=temp,
                    storage=storage, placement=placement)
    finally:  # (after a run: released and deleted already, nothing left to do)
        if lease is not None:
            lease.release()
        if temp is not None:
            shutil.rmtree(temp, ignore_errors=True)


def _run(graph: Any, opts: RunOptions, lease: JobLease, *, spark: Any, on_start: Any,
         on_snapshot: Any, names: list[str], hosts: int, temp: str | None, storage: str,
         placement: dict[str, int]) -> RunResult:
    engine: SparkStage | ThreadsEngine
    if opts.engine == "spark":
        from . import launcher

        engine = SparkStage(spark if spark is not None else embedded_context(hosts), hosts,
                            f"graph {graph.name!r}", f"cutline-graph-{graph.name}",
                            log_path=launcher.SPARK_LOG if spark is None else None)
        ship_user_code(graph.processes.values())
        processes = graph.processes
    else:
        engine = ThreadsEngine(hosts)
        processes = copy.deepcopy(graph.processes)
    tls = bool(engine.tls if opts.tls is None else opts.tls)
    driver = graph_driver(graph, opts, placement, hosts, storage, host=engine.driver_host,
                          on_snapshot=on_snapshot, tls=tls)
    lease.on_lost = driver.lease_lost
    if lease.lost is not None:  # taken over while the engine started: this run stops
        driver.stop("the run ended")
        raise JobFailed(lease.lost)
    spec = GraphSpec(job=graph.name, names=names, processes=processes, edges=list(graph.edges),
                     placement=placement, hosts=hosts, secret=driver.secret,
                     coordinator=driver.address, trace=opts.trace, seed=opts.seed,
                     host_addr=engine.task_host, heartbeat_timeout=opts.heartbeat_timeout)
    # a user's session draws Spark's progress bar on the console: silent while the graph runs
    quiet = progress_bar_muted(engine.sc) if isinstance(engine, SparkStage) else nullcontext()
    t0 = time.monotonic()
    try:
        with quiet:
            t0 = drive(driver, engine, _host_main, spec, f"graph {graph.name!r}",
                       timeout=opts.timeout, on_start=on_start)
            engine.join(30)
    finally:
        if not driver.done.is_set():  # cancelled: let the hosts end cleanly if they can
            driver.cancel()
            driver.done.wait(5.0)
        if not driver.done.is_set() or driver.error:
            engine.cancel()
        driver.stop("the run ended")
        lease.release()
        if temp is not None:
            engine.join(5)
            shutil.rmtree(temp, ignore_errors=True)
    result = driver.run.result(time.monotonic() - t0)
    if temp is not None:  # nothing on disk to point at
        result.storage = ""
        for snap in result.snapshots:
            snap.path = None
    return result
