"""cutline: stream processing with consistent distributed snapshots, on Apache Spark."""

import warnings
from typing import TYPE_CHECKING, Any

from .api import CheckpointConfig, IterativeStream, KeyedStream, Pipeline, Stream
from .protocol.windows import TimeWindow, WindowResult, session, sliding, tumbling

if TYPE_CHECKING:
    from .connectors.discard import DiscardSink

__version__ = "0.1.0"

# PySpark 4 warns, once per process and as soon as a session starts (the user's own too),
# that it "does not yet fully support pandas >= 3.0.0".  cutline's records never meet pandas
# and it uses none of PySpark's pandas features: a warning on every run that says nothing
# about the run.  Only this one message is filtered (issue 29).
warnings.filterwarnings("ignore", message=r"PySpark does not yet fully support pandas",
                        category=FutureWarning)

__all__ = ["CheckpointConfig", "DiscardSink", "IterativeStream", "KeyedStream", "Pipeline",
           "Stream", "TimeWindow", "WindowResult", "__version__", "session", "sliding",
           "tumbling"]


def __getattr__(name: str) -> Any:
    # Sinks live in cutline.connectors (fsspec and friends): imported on first use, so that
    # ``import cutline`` stays light.
    if name == "DiscardSink":
        from .connectors.discard import DiscardSink

        return DiscardSink
    raise AttributeError(f"module 'cutline' has no attribute {name!r}")
