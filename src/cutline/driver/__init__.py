"""The driver side of a job, engine-agnostic: one driver class
(:class:`cutline.driver.shell.Driver`) that moves bytes between the tasks' connections and
the sans-IO decisions in :mod:`cutline.protocol.job` (dataflow jobs) and
:mod:`cutline.protocol.graphjob` (process graphs), and what each kind of run adds to it by
composition (:mod:`cutline.driver.dataflow`: write checkpoints, savepoints, report;
:mod:`cutline.driver.graph`: store snapshots, evaluate predicates).

Nothing here imports pyspark: :mod:`cutline.spark` submits the barrier stage that hosts the
tasks, and :mod:`cutline.driver.threads` runs the same tasks on threads instead.
"""
