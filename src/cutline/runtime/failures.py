"""Which task failures repeat, and telling the driver about one that happens before a task
has registered.

A failure that will happen again on every retry (a user function raising on a record, a
malformed input, a record that cannot be pickled or that a sink cannot convert, a sink
refusing a commit, a pipeline or configuration the task cannot even be built from) is
*fatal*: the driver fails the job at once, naming it, and Spark does not retry the stage.
Anything else (a peer or the network went away, a storage hiccup) fails the Spark task, and
Spark restarts the stage from the latest checkpoint.
"""

from __future__ import annotations

import logging
import os
import traceback

from ..connectors.base import (
    CommitError,
    RecordError,
    SchemaMismatchError,
    UnavailableError,
    UnpicklableRecordError,
    UnsupportedRecordError,
)
from ..protocol import messages as m
from .channels import ChannelError
from .control import connect
from .operators import UserFunctionError
from .tls import JobSecret

log = logging.getLogger("cutline.task")

__all__ = ["REPEATING_OS_ERRORS", "SetupError", "describe", "repeats", "report_setup_failure"]


class SetupError(RuntimeError):
    """A task could not be built, restored or opened for a reason that will not go away on
    a retry (not an I/O error): its pipeline, configuration or checkpoint is at fault."""


# What a retry meets again, by its type: a path that cannot be a directory (a file sits where
# one is needed), a directory where a file is needed, or no permission to use it (S3's
# AccessDenied reaches fsspec users as PermissionError too).  Other OSErrors (a connection
# reset, a timeout, an I/O error, a full disk) may pass: Spark restarts the stage.
REPEATING_OS_ERRORS = (NotADirectoryError, IsADirectoryError, PermissionError)


def repeats(exc: BaseException) -> bool:
    """Will ``exc`` happen again when the stage is retried?"""
    return isinstance(exc, (UserFunctionError, RecordError, CommitError,
                            UnpicklableRecordError, SetupError, SchemaMismatchError,
                            UnsupportedRecordError, UnavailableError, *REPEATING_OS_ERRORS))


def describe(exc: BaseException) -> str:
    """How a task's failure reads to the user: cutline's own errors say what they mean; any
    other (an OSError's ``[Errno 20] Not a directory: ...``) gets its type in front."""
    if repeats(exc) and not isinstance(exc, OSError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def setup_error(what: str, exc: BaseException) -> BaseException:
    """``exc``, raised while a task was being set up, as it should be reported: a
    :class:`SetupError` unless it is an I/O error or a broken channel (a peer died while
    the stage restarts: worth a retry), or already fatal."""
    if isinstance(exc, REPEATING_OS_ERRORS):  # say what was being opened, and the type
        err = SetupError(f"{what}: {type(exc).__name__}: {exc}")
        err.__cause__ = exc
        return err
    if repeats(exc) or isinstance(exc, (OSError, ChannelError)):
        return exc
    err = SetupError(f"{what}: {type(exc).__name__}: {exc}")
    err.__cause__ = exc
    return err


def report_setup_failure(coordinator: tuple[str, int], secret: JobSecret | bytes, slot: int,
                         exc: BaseException, wait: float = 5.0) -> None:
    """Tell the driver that slot ``slot`` failed fatally before it registered, then wait
    (up to ``wait`` s) for the driver to end the job and close the connection, so that
    the Spark task ends quietly rather than in a stage retry."""
    try:
        conn = connect(coordinator, secret, timeout=10.0)
    except Exception:  # noqa: BLE001 - no driver to tell: fail the Spark task instead
        raise exc from None
    try:
        conn.send(m.Failed(f"slot {slot} (pid {os.getpid()})", True, str(exc),
                           "".join(traceback.format_exception(exc))[-4000:]))
        conn.settimeout(wait)
        while True:
            conn.recv()  # until the driver closes the connection (or the wait ends)
    except Exception:  # noqa: BLE001, S110 - closed, timed out or refused: done waiting
        pass
    finally:
        conn.close()
