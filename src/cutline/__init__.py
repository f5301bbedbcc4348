"""cutline: stream processing with consistent distributed snapshots, on Apache Spark."""

from .api import CheckpointConfig, IterativeStream, KeyedStream, Pipeline, Stream

__version__ = "0.1.0"

__all__ = ["CheckpointConfig", "IterativeStream", "KeyedStream", "Pipeline", "Stream",
           "__version__"]
