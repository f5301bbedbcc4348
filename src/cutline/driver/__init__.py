"""The driver side of a job, engine-agnostic: thin shells that move bytes between the tasks'
connections and the sans-IO decisions in :mod:`cutline.protocol.job` (dataflow jobs) and
:mod:`cutline.graph.controller` (process graphs), write checkpoints, and report.

Nothing here imports pyspark: :mod:`cutline.spark` submits the barrier stage that hosts the
tasks, and :mod:`cutline.driver.threads` runs the same tasks on threads instead.
"""
