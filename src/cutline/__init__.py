"""cutline: stream processing with consistent distributed snapshots, on Apache Spark."""

__version__ = "0.1.0"
