"""What a task process imports (issue 28: a job's fixed cost): not the connectors its job does
not use, not the terminal UI; every connector name still there when asked for."""

import subprocess
import sys

import cutline.connectors


def test_a_task_process_imports_neither_rich_nor_unused_connectors():
    code = ("import sys, cutline.driver.run, cutline.runtime.task, cutline.connectors.files, "
            "cutline.connectors.discard\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'rich' or m in ("
            "'cutline.connectors.kafka', 'cutline.connectors.kafka_sink', "
            "'cutline.connectors.delta', 'cutline.connectors.upsert')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120).stdout.strip()
    assert out == "[]"


def test_every_connector_name_resolves_to_its_class():
    import importlib

    for name in cutline.connectors.__all__:
        value = getattr(cutline.connectors, name)
        assert value.__name__ == name
        assert name in dir(cutline.connectors)
    fs = importlib.import_module("cutline.connectors.files").FileSource
    from cutline.connectors import FileSource
    assert FileSource is fs


def test_an_unknown_connector_name_is_an_attribute_error():
    import pytest

    with pytest.raises(AttributeError, match="no attribute 'NoSuchSink'"):
        cutline.connectors.NoSuchSink  # noqa: B018
    with pytest.raises(ImportError):
        from cutline.connectors import NoSuchSink  # noqa: F401


def test_the_errors_users_catch_are_exported_from_cutline():
    """``from cutline import JobFailed`` (issue 29: an ImportError; it lived in
    cutline.driver.dataflow only), each the class the run raises."""
    import cutline
    from cutline import (  # noqa: F401 - the import users write
        CheckpointStorageError,
        FinishedJobError,
        IncompatibleCheckpointError,
        JobAlreadyRunningError,
        JobCancelled,
        JobFailed,
        SavepointError,
    )
    from cutline.driver.dataflow import JobFailed as defined
    from cutline.driver.run import JobCancelled as cancelled
    from cutline.storage.lease import JobAlreadyRunningError as refused

    assert JobFailed is defined and JobCancelled is cancelled
    assert JobAlreadyRunningError is refused
    assert issubclass(FinishedJobError, JobFailed) and issubclass(JobCancelled, JobFailed)
    assert issubclass(JobAlreadyRunningError, CheckpointStorageError)
    for name in ("JobFailed", "FinishedJobError", "JobAlreadyRunningError",
                 "IncompatibleCheckpointError", "JobCancelled", "SavepointError",
                 "CheckpointStorageError"):
        assert name in cutline.__all__ and name in dir(cutline)
        assert getattr(cutline, name).__name__ == name
    # ``import cutline`` stays light: the driver loads when an error is asked for
    code = ("import sys, cutline; assert not [m for m in sys.modules if m.startswith("
            "('cutline.driver', 'cutline.storage', 'cutline.runtime'))], sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
