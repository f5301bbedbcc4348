"""Process graphs on Spark: each Spark task hosts a group of processes.

The stage is ``parallelize(hosts).barrier().mapPartitions(host).map(..).partitionBy(1)``:
as for pipelines, ending the barrier stage in a shuffle makes Spark resubmit it as a whole
when a task fails, and the rows it returns prove nothing (the
:class:`~cutline.spark.graph_driver.GraphDriver` knows what completed).  ``engine="threads"``
runs the same hosts on threads of this process, for tests and debugging.
"""

from __future__ import annotations

import copy
import logging
import os
import sys
import sysconfig
import tempfile
import threading
import time
from typing import Any

from ..graph.host import GraphSpec, Host
from ..graph.result import RunResult
from .driver import JobFailed
from .graph_driver import GraphDriver, RunOptions
from .launcher import JobCancelled, embedded_session

log = logging.getLogger("cutline.graph")

__all__ = ["GraphDriver", "JobFailed", "RunOptions", "run_graph"]


def _placement(names: list[str], hosts: int) -> dict[str, int]:
    """Contiguous blocks in graph order: neighbours in a ring mostly share a host."""
    per, extra = divmod(len(names), hosts)
    out, i = {}, 0
    for k in range(hosts):
        for _ in range(per + (k < extra)):
            out[names[i]] = k
            i += 1
    return out


def _ship_user_code(graph: Any) -> None:
    """Pickle the modules of the user's process classes by value (Spark workers need not
    import them), as the pipeline launcher does for user functions."""
    from pyspark import cloudpickle

    installed = {sysconfig.get_paths()[k] for k in ("purelib", "platlib", "stdlib")}
    seen: set[str] = set()
    for proc in graph.processes.values():
        for cls in type(proc).__mro__:
            name = cls.__module__
            if name in seen:
                continue
            seen.add(name)
            mod = sys.modules.get(name)
            path = getattr(mod, "__file__", None) or ""
            if (mod is not None and path and name.split(".")[0] not in ("cutline", "__main__")
                    and not any(path.startswith(d) for d in installed)):
                cloudpickle.register_pickle_by_value(mod)


def _host_main(spec: GraphSpec):
    def run(_: Any):
        from pyspark import BarrierTaskContext

        ctx = BarrierTaskContext.get()
        yield Host(spec, ctx.partitionId()).run()

    return run


def run_graph(graph: Any, opts: RunOptions, *, spark: Any = None, on_start: Any = None,
              on_snapshot: Any = None) -> RunResult:
    """Run ``graph`` (see :meth:`cutline.graph.ProcessGraph.run`)."""
    graph.validate()
    names = list(graph.processes)
    opts.validate(names)
    hosts = min(opts.tasks or 2, len(names))
    storage = opts.storage or "file://" + tempfile.mkdtemp(prefix=f"cutline-{graph.name}-")
    placement = _placement(names, hosts)
    sc = None
    host_addr = "127.0.0.1"
    if opts.engine == "spark":
        if spark is None:
            spark = embedded_session(hosts)
        sc = spark.sparkContext
        if sc.defaultParallelism < hosts:
            raise ValueError(f"graph {graph.name!r} needs {hosts} task slots for its barrier "
                             f"stage, the Spark session offers {sc.defaultParallelism}")
        if not sc.master.startswith("local"):
            host_addr = spark.conf.get("spark.driver.host")
        _ship_user_code(graph)
    driver = GraphDriver(graph, opts, placement, hosts, storage,
                         host="127.0.0.1" if opts.engine == "threads" else host_addr,
                         on_snapshot=on_snapshot)
    processes = graph.processes if opts.engine == "spark" else copy.deepcopy(graph.processes)
    spec = GraphSpec(job=graph.name, names=names, processes=processes, edges=list(graph.edges),
                     placement=placement, hosts=hosts, secret=driver.secret,
                     coordinator=tuple(driver.address), trace=opts.trace, seed=opts.seed,
                     host_addr="127.0.0.1" if sc is None or sc.master.startswith("local")
                     else "")
    driver.start()
    t0 = time.monotonic()
    errors: list[BaseException] = []
    group = f"cutline-graph-{graph.name}-{os.getpid()}"
    try:
        if sc is None:
            threads = [threading.Thread(target=_thread_host, args=(spec, k, errors),
                                        name=f"cutline-host-{k}", daemon=True)
                       for k in range(hosts)]
            for t in threads:
                t.start()
        else:
            threads = [threading.Thread(target=_stage, args=(sc, spec, hosts, driver, errors,
                                                             group),
                                        name="cutline-graph-stage", daemon=True)]
            threads[0].start()
        if on_start is not None:
            on_start(driver)
        while not driver.done.wait(0.05):
            if errors and sc is None:
                raise JobFailed(f"graph {graph.name!r} failed: {errors[0]}") from errors[0]
            if opts.timeout is not None and time.monotonic() - t0 > opts.timeout:
                raise JobCancelled(f"graph {graph.name!r} cancelled: not finished within "
                                   f"{opts.timeout}s")
        if driver.error:
            raise JobFailed(f"graph {graph.name!r} failed: {driver.error}")
        for t in threads:
            t.join(timeout=30)
    finally:
        if not driver.done.is_set():  # cancelled: let the hosts end cleanly if they can
            driver.events.put((None, {"op": "_cancel"}))
            driver.done.wait(5.0)
        if sc is not None and (not driver.done.is_set() or driver.error):
            sc.cancelJobGroup(group)
        driver.close()
    return driver.result(time.monotonic() - t0)


def _thread_host(spec: GraphSpec, k: int, errors: list) -> None:
    try:
        Host(spec, k).run()
    except BaseException as exc:  # noqa: BLE001 - reported by run_graph
        log.debug("host %d failed", k, exc_info=True)
        errors.append(exc)


def _stage(sc: Any, spec: GraphSpec, hosts: int, driver: GraphDriver, errors: list,
           group: str) -> None:
    try:
        sc.setJobGroup(group, f"cutline process graph {spec.job}")
        (sc.parallelize(range(hosts), hosts).barrier().mapPartitions(_host_main(spec))
         .map(lambda r: (0, r)).partitionBy(1).collect())
    except BaseException as exc:  # noqa: BLE001 - the driver decides what happened
        errors.append(exc)
        if driver.error is None and not driver.done.is_set():
            driver.error = f"Spark gave up on the stage: {str(exc).strip().splitlines()[0]}"
    finally:
        driver.events.put((None, {"op": "_stage_ended"}))
