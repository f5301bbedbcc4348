"""cutline: stream processing with consistent distributed snapshots, on Apache Spark."""

import warnings
from typing import TYPE_CHECKING, Any

from .api import CheckpointConfig, IterativeStream, KeyedStream, Pipeline, Stream
from .protocol.windows import TimeWindow, WindowResult, session, sliding, tumbling

if TYPE_CHECKING:
    from .connectors.discard import DiscardSink
    from .driver.dataflow import FinishedJobError, JobFailed, SavepointError
    from .driver.run import JobCancelled
    from .runtime.restore import IncompatibleCheckpointError
    from .storage.checkpoints import CheckpointStorageError
    from .storage.lease import JobAlreadyRunningError

__version__ = "0.1.0"

# PySpark 4 warns, once per process and as soon as a session starts (the user's own too),
# that it "does not yet fully support pandas >= 3.0.0".  cutline's records never meet pandas
# and it uses none of PySpark's pandas features: a warning on every run that says nothing
# about the run.  Only this one message is filtered (issue 29).
warnings.filterwarnings("ignore", message=r"PySpark does not yet fully support pandas",
                        category=FutureWarning)

__all__ = ["CheckpointConfig", "CheckpointStorageError", "DiscardSink", "FinishedJobError",
           "IncompatibleCheckpointError", "IterativeStream", "JobAlreadyRunningError",
           "JobCancelled", "JobFailed", "KeyedStream", "Pipeline", "SavepointError", "Stream",
           "TimeWindow", "WindowResult", "__version__", "session", "sliding", "tumbling"]

# The errors a user catches (``except cutline.JobFailed``), by the module that defines them:
# imported on first use, as DiscardSink is, so that ``import cutline`` stays light.
_ERRORS = {
    "JobFailed": "driver.dataflow",            # the job failed: its message is the cause
    "FinishedJobError": "driver.dataflow",     # a JobFailed: the job's run already finished
    "SavepointError": "driver.dataflow",       # RunningJob.savepoint() could not take one
    "JobCancelled": "driver.run",              # a JobFailed: timeout, cancel() or Ctrl-C
    "IncompatibleCheckpointError": "runtime.restore",  # the checkpoint does not fit the plan
    "JobAlreadyRunningError": "storage.lease",  # another driver runs the job on its storage
    "CheckpointStorageError": "storage.checkpoints",  # storage unusable, checkpoint missing
}


def __getattr__(name: str) -> Any:
    # Sinks live in cutline.connectors (fsspec and friends): imported on first use, so that
    # ``import cutline`` stays light.
    if name == "DiscardSink":
        from .connectors.discard import DiscardSink

        return DiscardSink
    module = _ERRORS.get(name)
    if module is not None:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{module}"), name)
    raise AttributeError(f"module 'cutline' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
