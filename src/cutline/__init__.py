"""cutline: stream processing with consistent distributed snapshots, on Apache Spark."""

from typing import TYPE_CHECKING, Any

from .api import CheckpointConfig, IterativeStream, KeyedStream, Pipeline, Stream
from .protocol.windows import TimeWindow, WindowResult, session, sliding, tumbling

if TYPE_CHECKING:
    from .connectors.discard import DiscardSink

__version__ = "0.1.0"

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
