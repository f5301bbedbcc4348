"""The streaming runtime: task executor, channels, operators. Knows nothing of Spark."""
