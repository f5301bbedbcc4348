"""One driver class for every kind of run (issue 26): a dataflow job's driver and a process
graph's are both :class:`cutline.driver.shell.Driver`, nothing in ``cutline.driver``
subclasses it, and what differs per kind is the run object it was given
(:class:`~cutline.driver.dataflow.DataflowRun`, :class:`~cutline.driver.graph.GraphRun`),
whose hooks the driver calls.  No Spark: nothing here is started on an engine."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import time
from typing import Any

import pytest

import cutline.driver
from cutline.driver.dataflow import DataflowRun, job_driver
from cutline.driver.graph import GraphRun, RunOptions, graph_driver
from cutline.driver.shell import Driver, RunKind
from cutline.graph import Process, ProcessGraph
from cutline.plan import plan as make_plan
from cutline.protocol.controller import Done, DoneCause, Send
from cutline.protocol.graphjob import StoreSnapshot
from cutline.protocol.job import CommitCheckpoint
from cutline.runtime.control import Received
from pipelines import wordcount

# the hooks of RunKind, read from the Protocol itself (not a list kept by hand)
HOOKS = sorted(name for name, _ in inspect.getmembers(RunKind)
               if not name.startswith("_") and name != "controller")


class Idle(Process):
    def on_message(self, ctx, sender, msg) -> None:
        pass


def _graph() -> ProcessGraph:
    g = ProcessGraph("kinds")
    g.add("a", Idle())
    g.add("b", Idle())
    g.connect_both("a", "b")
    return g


@pytest.fixture
def drivers(tmp_path):
    """A dataflow job's driver and a process graph's, built as runs build them, not started."""
    p, _ = wordcount(tmp_path, 10)
    job = job_driver(make_plan(p), p.checkpoint, p.name)
    graph = graph_driver(_graph(), RunOptions(engine="threads"), {"a": 0, "b": 1}, 2,
                         f"file://{tmp_path}/graphs")
    try:
        yield job, graph
    finally:
        job.stop()
        graph.stop("the test is over")


def test_every_driver_is_the_one_driver_class(drivers):
    job, graph = drivers
    assert (type(job), type(graph)) == (Driver, Driver)
    assert (type(job.run), type(graph.run)) == (DataflowRun, GraphRun)
    assert job.controller is job.run.controller and graph.controller is graph.run.controller
    # each kind implements every hook of RunKind
    assert HOOKS == ["after_stop", "attach", "before_start", "before_stop", "effect", "idle",
                     "observe", "outgoing"]
    missing = {type(r).__name__: [h for h in HOOKS if not callable(getattr(r, h, None))]
               for r in (job.run, graph.run)}
    assert missing == {"DataflowRun": [], "GraphRun": []}
    # the dataflow run was attached to its driver (it takes savepoints through it)
    assert job.run.driver is job and job.run.lease.on_lost == job.lease_lost


def test_no_class_in_cutline_driver_subclasses_driver():
    modules = [importlib.import_module(f"cutline.driver.{m.name}")
               for m in pkgutil.iter_modules(cutline.driver.__path__)]
    assert {"cutline.driver.dataflow", "cutline.driver.graph", "cutline.driver.run",
            "cutline.driver.shell"} <= {m.__name__ for m in modules}
    subclasses = sorted(f"{m.__name__}.{name}" for m in modules
                        for name, obj in vars(m).items()
                        if isinstance(obj, type) and issubclass(obj, Driver) and obj is not Driver)
    assert subclasses == []
    assert Driver.__subclasses__() == []
    # the old subclasses are gone (job_driver and graph_driver build a Driver)
    assert [f"{m.__name__}.{name}" for m in modules for name in ("JobDriver", "GraphDriver")
            if hasattr(m, name)] == []


def test_each_command_goes_to_its_kind(drivers, monkeypatch):
    """The driver hands a command that is not its own (Send, Done) to its run: a
    CommitCheckpoint to the dataflow's, a StoreSnapshot to the graph's; a run refuses the
    other kind's commands, and any unknown one, naming it."""
    job, graph = drivers
    seen: list[tuple[str, Any]] = []
    monkeypatch.setattr(job.run, "_commit", lambda cmd: seen.append(("dataflow", cmd)) or [])
    monkeypatch.setattr(graph.run, "_store", lambda cmd: seen.append(("graph", cmd)) or [])
    commit = CommitCheckpoint(1, metadata={}, states={})
    store = StoreSnapshot(1, parts={}, initiators=("a",), by_driver=True, attempt=0)
    job._perform([commit])
    graph._perform([store])
    assert seen == [("dataflow", commit), ("graph", store)]

    with pytest.raises(TypeError, match="DataflowRun cannot carry out StoreSnapshot"):
        job._perform([store])
    with pytest.raises(TypeError, match="GraphRun cannot carry out CommitCheckpoint"):
        graph._perform([commit])

    class Unknown:
        def __repr__(self) -> str:
            return "Unknown()"

    for driver, kind in ((job, "DataflowRun"), (graph, "GraphRun")):
        with pytest.raises(TypeError, match=rf"{kind} cannot carry out Unknown\(\)"):
            driver._perform([Unknown()])
    assert seen == [("dataflow", commit), ("graph", store)]  # nothing more reached them


def test_a_commit_really_commits(drivers):
    """Not only routed: the dataflow run writes the checkpoint's ``_metadata``."""
    job, _ = drivers
    job._perform([CommitCheckpoint(1, metadata={"job": job.run.job, "checkpoint": 1},
                                   states={})])
    latest = job.run.storage.latest()
    assert latest is not None and latest.id == 1


# ---------------------------------------------------------------------------- the shell's hooks


class Conn:
    def __init__(self) -> None:
        self.sent: list[Any] = []

    def send(self, msg: Any) -> None:
        self.sent.append(msg)


class FakeController:
    """Echoes each message back to its connection; ends the run on "end"."""

    done = False
    last_failure = None
    trace = ""
    failure_reported = False

    def on_submitted(self, now: float) -> list[Any]:
        return []

    def on_message(self, conn: Any, msg: Any, now: float) -> list[Any]:
        if msg == "end":
            return [Done(DoneCause.FINISHED)]
        return [Send(conn, msg), ("own", msg)]

    def on_closed(self, conn: Any, now: float, cause: str | None = None) -> list[Any]:
        return []

    def on_stage_ended(self, now: float) -> list[Any]:
        return []

    def tick(self, now: float) -> list[Any]:
        return []

    def next_due(self, now: float) -> float | None:
        return None

    def cancel(self, now: float) -> list[Any]:
        return []

    def shutdown(self, why: str) -> list[Any]:
        return [("own", f"shutdown: {why}")]


class RecordingRun:
    """A third kind of run, for the test: records every hook the driver calls."""

    def __init__(self) -> None:
        self.controller = FakeController()
        self.calls: list[tuple[Any, ...]] = []

    def attach(self, driver: Driver[Any]) -> None:
        self.calls.append(("attach", type(driver).__name__))

    def effect(self, cmd: Any) -> list[Any]:
        self.calls.append(("effect", cmd))
        return []

    def observe(self, conn: Any, msg: Any, now: float) -> None:
        self.calls.append(("observe", msg))

    def idle(self, now: float) -> float | None:
        if not self.calls or self.calls[-1] != ("idle",):
            self.calls.append(("idle",))
        return None

    def outgoing(self, msg: Any) -> Any:
        return f"{msg}, as it goes out"

    def before_start(self) -> None:
        self.calls.append(("before_start",))

    def before_stop(self) -> None:
        self.calls.append(("before_stop",))

    def after_stop(self) -> None:
        self.calls.append(("after_stop",))


def test_the_driver_calls_its_runs_hooks_in_order():
    run = RecordingRun()
    driver = Driver(run, name="test-kinds")
    assert run.calls == [("attach", "Driver")]
    conn = Conn()
    driver.start()
    try:
        driver.events.put(Received(conn, "hello"))
        deadline = time.monotonic() + 10
        while ("observe", "hello") not in run.calls or ("idle",) not in run.calls[-1:]:
            assert time.monotonic() < deadline, run.calls
            time.sleep(0.01)
        driver.events.put(Received(conn, "end"))
        assert driver.done.wait(10)
    finally:
        driver.stop("the test is over")
    assert conn.sent == ["hello, as it goes out"]  # Send: the run's outgoing, then the conn
    assert driver.cause is DoneCause.FINISHED and driver.error is None
    calls = [c for c in run.calls if c != ("idle",)]
    assert calls == [
        ("attach", "Driver"), ("before_start",),
        ("effect", ("own", "hello")),  # the controller's own command: to the run
        ("observe", "hello"),  # after the controller heard it
        ("observe", "end"),
        ("before_stop",), ("effect", ("own", "shutdown: the test is over")), ("after_stop",)]
    assert ("idle",) in run.calls
