"""The dataflow job's kind of run: :class:`DataflowRun`, the
:class:`~cutline.driver.shell.RunKind` that the one :class:`~cutline.driver.shell.Driver`
carries out for a :class:`~cutline.protocol.job.JobController` (:func:`job_driver` builds
both).

Tasks connect (per-job secret) and talk typed messages (:mod:`cutline.protocol.messages`).
The driver's thread takes what arrives, hands it to the controller, and carries out the
commands it returns; the dataflow's own go to :class:`DataflowRun`: write a checkpoint's
``_metadata`` (the commit point) and apply retention, resolve a savepoint's waiter,
resubmit the stage.  It also holds the job's lease and admin port, warns of late records on
the console, and is what callers read of the job (``driver.run.checkpoints``,
``.attempt``, ``.watermark()``, ``.late_records()``, ``.source_lag()``...).  Every decision
(attempts, triggers, the final checkpoint, iteration probes, savepoints) is the
controller's, tested as data.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future
from typing import Any

from collections.abc import Callable

from ..api import CheckpointConfig
from ..plan import PhysicalPlan
from ..protocol import messages as m
from ..protocol.coordinator import CheckpointPolicy
from ..protocol.job import (
    Attempt,
    CheckpointRecord,
    CommitCheckpoint,
    JobController,
    JobShape,
    Resubmit,
    SavepointFailed,
    SavepointReady,
)
from ..protocol.liveness import HEARTBEAT_TIMEOUT
from ..runtime.restore import check_compatible, plan_summary, read_states
from ..storage.checkpoints import CheckpointStorage
from ..storage.lease import JobLease
from .late import LateWarnings, late_totals, lateness_of
from .shell import Driver

log = logging.getLogger("cutline.driver")

__all__ = ["CheckpointRecord", "DataflowRun", "FinishedJobError", "JobFailed", "SavepointError",
           "job_driver", "refuse_finished"]

ROUTE: Callable[[str, tuple[str, int]], tuple[str, int] | None] | None = None
"""Test-only: where tasks connect.  Called with what a connection is for (``"control"``,
or a channel id such as ``"files.0->per-key.1"``) and the real address, it returns the
address to use instead (a fault-injecting proxy, ``tests/netfaults.py``) or None."""


class JobFailed(RuntimeError):
    """The job failed; its message is the cause.  ``log_path``: the log file holding the
    long story (the task's traceback; Spark's and its workers' output), when there is one."""

    log_path: str | None = None


class FinishedJobError(JobFailed):
    """The job's storage holds the final checkpoint of a run that read all its input: a new
    run would resume from it and output nothing.  Raised before anything runs."""


def refuse_finished(storage: CheckpointStorage, handle: Any = False) -> None:
    """Raise :class:`FinishedJobError` when ``handle`` (by default: the latest checkpoint
    in ``storage``) is the final checkpoint of a run that read all its input: resuming it
    by default would silently output nothing.  Cheap enough to ask before Spark starts."""
    if handle is False:
        handle = storage.latest()
    if handle is None or not handle.metadata.get("final"):
        return
    when = handle.metadata.get("time")
    at = time.strftime(" on %Y-%m-%d at %H:%M", time.localtime(when)) if when else ""
    job_dir = storage.fs.unstrip_protocol(storage.dir)
    raise FinishedJobError(
        f"job {storage.job!r} already finished{at}: {job_dir} holds the final "
        f"checkpoint {handle.path.rsplit('/', 1)[-1]} of a run that read all its "
        "input, and a new run would resume from it with nothing left to read. To "
        f"start over, delete {job_dir} (or give the pipeline another name or "
        "CheckpointConfig(storage=...)); to continue from its final state with new input "
        f"(files added to its input, say), run it with restore_from={handle.path!r}: "
        "event time goes on from the last watermark before the end of input, and a record "
        "for a window that end of input fired is late (within allowed_lateness it updates "
        "the window, which is emitted again)")


class SavepointError(RuntimeError):
    """A savepoint could not be taken (job not running, finishing, restarted, or aborted)."""


def job_driver(plan: PhysicalPlan, config: CheckpointConfig, job: str,
               restore_from: str | None = None, host: str = "127.0.0.1",
               restart_timeout: float | None = None,
               start_timeout: float | None = None, tls: bool = False,
               heartbeat_timeout: float = HEARTBEAT_TIMEOUT,
               lease: JobLease | None = None) -> Driver[DataflowRun]:
    """The driver of dataflow job ``job``: a :class:`~cutline.driver.shell.Driver` whose
    run is a :class:`DataflowRun` (see there for ``lease``).  Nothing is left behind when
    this raises: no listener, the lease released."""
    run = DataflowRun(plan, config, job, restore_from, restart_timeout=restart_timeout,
                      start_timeout=start_timeout, lease=lease)
    try:
        return Driver(run, host=host, tls=tls, heartbeat_timeout=heartbeat_timeout,
                      name="cutline-driver")
    except BaseException:
        run.lease.release()
        raise


class DataflowRun:
    """What a dataflow job adds to the driver (a :class:`~cutline.driver.shell.RunKind`):
    its checkpoint storage, lease, controller and admin port, the commands of a
    :class:`~cutline.protocol.job.JobController` of its own, and what callers read."""

    def __init__(self, plan: PhysicalPlan, config: CheckpointConfig, job: str,
                 restore_from: str | None = None, *, restart_timeout: float | None = None,
                 start_timeout: float | None = None, lease: JobLease | None = None) -> None:
        """``lease``: the job's lease, already held (``run_pipeline`` takes it before Spark
        starts, so that of two drivers started at once the loser starts no Spark); the
        run owns it from here and releases it when its driver stops, or when this fails.
        None: acquired here (raising ``JobAlreadyRunningError``)."""
        self.plan, self.config, self.job = plan, config, job
        self.dashboard_url: str | None = None  # the live dashboard's, with its token
        self._driver: Driver[DataflowRun] | None = None  # the driver, once attached
        self.admin: Any = None  # the admin port (driver.admin.AdminServer), while running
        try:
            self.storage = CheckpointStorage(config.storage, job, config.storage_options)
        except BaseException:
            if lease is not None:
                lease.release()
            raise
        # one job per storage: held from here to stop(); refused when another driver runs it
        try:
            if lease is None:
                lease = JobLease(self.storage)
                lease.acquire()
            self.lease = lease
            lease.dashboard = lambda: self.dashboard_url
            if lease.lost is not None:  # taken over while Spark started: this run stops
                raise JobFailed(lease.lost)
        except BaseException:
            if lease is not None:
                lease.release()
            raise
        try:
            self._setup(plan, config, job, restore_from, restart_timeout, start_timeout)
        except BaseException:
            self.lease.release()
            raise

    def _setup(self, plan: PhysicalPlan, config: CheckpointConfig, job: str,
               restore_from: str | None, restart_timeout: float | None,
               start_timeout: float | None) -> None:
        first_id = 1
        if restore_from is not None:
            handle = self.storage.open(restore_from)
            first_id = handle.id + 1
            restore_from = handle.path
        shape = JobShape(
            tasks=tuple(c.task_id(i) for c, i in plan.tasks()),
            sources=frozenset(c.task_id(i) for c, i in plan.tasks() if c.is_source),
            slot_of={c.task_id(i): i for c, i in plan.tasks()},  # slot k hosts subtask k
            slots=plan.slots,
            loop_heads=frozenset(c.task_id(i) for c in plan.loop_heads
                                 for i in range(c.parallelism)),
            align_groups=align_groups(plan))
        policy = CheckpointPolicy(
            interval=config.interval, timeout=config.timeout, min_pause=config.min_pause,
            max_concurrent=config.max_concurrent,
            tolerable_failures=config.tolerable_failures)
        self.controller = JobController(shape, policy, job=job, restore=restore_from,
                                        first_id=max(first_id, self.storage.next_id()),
                                        metadata=self._metadata,
                                        restart_timeout=restart_timeout,
                                        start_timeout=start_timeout)
        # the engine's resubmit (cancel the stage, submit it again): the watchdog's remedy
        self.on_resubmit: Any = None
        self._restore_checked = restore_from is not None
        self._restore_from = restore_from
        self._routes_of: tuple[int, dict] = (-1, {})  # an attempt's Start addresses, routed
        self.late = LateWarnings(lateness_of(plan))  # the console's word on late records
        from .dashboard import operator_names

        self._names = operator_names(plan)  # in each checkpoint's plan: show names them
        self._late_tick = 0.0

    # ------------------------------------------------------------------ what callers read

    @property
    def attempt(self) -> Attempt:
        return self.controller.attempt

    @property
    def attempts(self) -> int:
        return self.controller.started_attempts

    @property
    def checkpoints(self) -> list[CheckpointRecord]:
        return self.controller.checkpoints

    @property
    def restored_from(self) -> str | None:
        """The checkpoint attempt 0 restored (or will restore, given ``restore_from``)."""
        return self.controller.restored_from or self._restore_from

    @property
    def stopped_with_savepoint(self) -> str | None:
        return self.controller.stopped_with_savepoint

    @property
    def source_records_before(self) -> int:
        return self.controller.source_records_before

    def source_records(self) -> int:
        """Records read by the sources in the current attempt."""
        return self.controller.source_records()

    def watermark(self) -> float | None:
        """The job's event time (lowest timed task's output watermark), or None."""
        return self.controller.watermark()

    def late_records(self) -> dict[str, int]:
        """Late records dropped per window operator (uid), by the current attempt's tasks
        (counts restored from a checkpoint included); every such operator, 0 too."""
        return late_totals(list(self.controller.metrics.values()))

    def source_lag(self) -> dict[str, int]:
        """Records the sources are behind the end of their input, per source (uid), from
        the readers that tell it (KafkaSource: the partitions' high watermarks)."""
        out: dict[str, int] = {}
        for task, x in list(self.controller.metrics.items()):
            if x.lag is not None:
                uid = task.rsplit(".", 1)[0]
                out[uid] = out.get(uid, 0) + sum(x.lag.values())
        return out

    def stalled_sources(self) -> dict[str, str]:
        """Source subtasks that cannot read now (task id -> why: a broker not answering)."""
        return {task: x.stalled for task, x in list(self.controller.metrics.items())
                if x.stalled}

    @property
    def cpu_seconds(self) -> dict[int, float]:
        """CPU seconds each slot's process spent in the current attempt (all its threads)."""
        return dict(self.attempt.cpu)

    @property
    def task_pids(self) -> dict[int, int]:
        return dict(self.attempt.pids)

    # ------------------------------------------------------------------ running

    @property
    def driver(self) -> Driver[DataflowRun]:
        """The driver that carries this run out."""
        if self._driver is None:
            raise RuntimeError(f"job {self.job!r}: no driver carries this run out yet")
        return self._driver

    def savepoint(self, stop: bool = False) -> Future:
        """Trigger a savepoint; the future's result is its path.  With ``stop``, the job stops
        once the savepoint is complete and its sink transactions are committed (Flink's
        stop-with-savepoint): a run restored from it continues exactly once."""
        future: Future = Future()
        self.driver.call(lambda now: self.controller.request_savepoint(future, stop, now))
        return future

    # ------------------------------------------------------------------ the driver's hooks

    def attach(self, driver: Driver[Any]) -> None:
        self._driver = driver
        self.lease.on_lost = driver.lease_lost
        if self.lease.lost is not None:  # taken over since __init__ looked: the run fails
            driver.lease_lost(self.lease.lost)

    def before_start(self) -> None:
        from .admin import AdminServer

        if not self._restore_checked:  # no check_restore(): resume from the latest, if any
            latest = self.storage.latest()
            self.controller.restore = latest.path if latest is not None else None
        driver = self.driver
        # cutline savepoint from outside
        self.admin = AdminServer(self, driver.address[0], driver.secret)
        self.admin.start()

    def before_stop(self) -> None:
        if self.admin is not None:
            self.admin.stop()

    def after_stop(self) -> None:
        self.lease.release()

    def observe(self, conn: Any, msg: Any, now: float) -> None:
        if type(msg) is m.Metrics and msg.first_late:
            self._say(self.late.on_metrics(msg, self.late_records(), now))

    def idle(self, now: float) -> float | None:
        if not self.late.reported:
            return None
        if now >= self._late_tick:  # once a second
            self._late_tick = now + 1.0
            self._say(self.late.tick(self.late_records(), now))
        return self._late_tick

    def outgoing(self, msg: Any) -> Any:
        if ROUTE is not None and type(msg) is m.Start:
            return self._routed(msg)
        return msg

    def effect(self, cmd: Any) -> list[Any]:
        t = type(cmd)
        if t is CommitCheckpoint:
            return self._commit(cmd)
        if t is SavepointReady:
            if not cmd.token.done():
                cmd.token.set_result(cmd.path)
        elif t is SavepointFailed:
            if not cmd.token.done():
                cmd.token.set_exception(SavepointError(cmd.reason))
        elif t is Resubmit:
            if self.on_resubmit is not None:
                self.on_resubmit()
        else:
            raise TypeError(f"{type(self).__name__} cannot carry out {cmd!r}")
        return []

    @staticmethod
    def _say(lines: list[str]) -> None:
        for line in lines:
            log.warning("%s", line)

    def say_late_summary(self) -> None:
        """At the end of the run: the late records not reported on the console yet."""
        self._say(self.late.summary(self.late_records()))

    def route(self, what: str, address: tuple[str, int]) -> tuple[str, int]:
        """Where tasks connect for ``what`` (:data:`ROUTE`, tests only)."""
        return (ROUTE(what, address) if ROUTE is not None else None) or address

    def _routed(self, start: m.Start) -> m.Start:
        """``start`` with each channel that :data:`ROUTE` reroutes under its own key (asked
        once per attempt: every slot gets the same routes)."""
        if self._routes_of[0] != start.attempt:
            addresses = dict(start.addresses)
            for chain, i in self.plan.tasks():
                for ch in self.plan.inputs(chain, i):
                    real = start.addresses.get(ch.dst_task)
                    if real:
                        routed = self.route(str(ch), (real[0], real[1]))
                        if routed != tuple(real):
                            addresses[str(ch)] = list(routed)
            self._routes_of = (start.attempt, addresses)
        return m.Start(start.attempt, self._routes_of[1], start.restore, start.t0)

    def _commit(self, cmd: CommitCheckpoint) -> list:
        n = cmd.checkpoint_id
        try:
            path = self.storage.commit(n, cmd.metadata, savepoint=cmd.savepoint,
                                       states=cmd.states)
        except Exception as exc:  # noqa: BLE001 - the coordinator counts it
            return self.controller.commit_failed(n, str(exc), time.monotonic())
        commands = self.controller.committed(n, path, time.monotonic())
        try:
            self.storage.retain(self.config.retained)
        except Exception as exc:  # noqa: BLE001 - the next commit retries; nothing is lost
            log.warning("job %r: retention after checkpoint %d failed, old checkpoints are "
                        "kept until the next one (%s: %s)", self.job, n,
                        type(exc).__name__, exc)
        return commands

    def _metadata(self, n: int, attempt: int, stats: dict) -> dict:
        return {
            "job": self.job, "checkpoint": n, "attempt": attempt,
            "mode": self.config.protocol_mode.value,
            "tasks": {t: {k: s.get(k) for k in ("path", "size", "sha256", "chain")}
                      for t, s in stats.items()},
            "chains": {c.uid: c.parallelism for c in self.plan.chains},
            "max_parallelism": self.plan.max_parallelism, "time": time.time(),
            # the last checkpoint of a bounded run (its input read to the end)
            "final": n == self.controller.final,
            "plan": self._plan_summary(),
        }

    def _plan_summary(self) -> dict:
        """The plan as a checkpoint records it (:func:`plan_summary`), each operator that
        cutline named with the name the dashboard shows (``per_sensor: results`` for the
        results of window ``per_sensor``, uid ``window_results-3``)."""
        out = plan_summary(self.plan)
        for uid, op in out["operators"].items():
            if uid in self._names:
                op["name"] = self._names[uid]
        return out

    def check_restore(self, allow_non_restored_state: bool = False) -> str | None:
        """Before the run: the checkpoint attempt 0 will restore (``restore_from``, else the
        latest under the job's storage) must fit the pipeline; raises
        :class:`~cutline.runtime.restore.IncompatibleCheckpointError` naming what changed,
        and :class:`FinishedJobError` when the latest one ended a finished run (resume it
        with ``restore_from``).  The caller stops the driver when this raises."""
        chosen = self.controller.restore
        handle = (self.storage.open(chosen) if chosen is not None
                  else self.storage.latest())
        self._restore_checked = True
        self.controller.restore = handle.path if handle is not None else None
        if handle is None:
            return None
        for warning in check_compatible(handle.metadata, read_states(handle), self.plan,
                                        handle.path, allow_non_restored_state):
            log.warning("%s", warning)
        if chosen is None:
            refuse_finished(self.storage, handle)
        return handle.path


def align_groups(plan: Any) -> dict[str, tuple[str, ...]]:
    """Watermark alignment across source subtasks: for each source chain whose
    ``assign_timestamps`` (right after the source) has ``max_drift``, its uid -> the
    chain's tasks."""
    groups: dict[str, tuple[str, ...]] = {}
    for chain in plan.chains:
        nodes = chain.nodes
        if chain.is_source and len(nodes) > 1 and nodes[1].kind == "assign_timestamps" \
                and getattr(nodes[1].fn, "max_drift", None) is not None:
            groups[nodes[1].uid] = tuple(chain.task_id(i) for i in range(chain.parallelism))
    return groups
