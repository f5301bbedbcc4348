"""The consoles the ``cutline`` command prints with.

In a terminal, rich fits output to the window.  Anywhere else (a pipe, a file, CI) rich
assumes 80 columns and cuts table cells to fit (``oper…``): there the console is
:data:`PIPE_WIDTH` wide, so a table keeps its natural width and a line is never wrapped
into two (``cutline checkpoints list ... | grep chk-3`` finds the whole row).
"""

from __future__ import annotations

import sys

from rich.console import Console

__all__ = ["PIPE_WIDTH", "console"]

PIPE_WIDTH = 1000
"""Columns of a console that is not a terminal: wider than any table the CLI prints."""


def console(*, stderr: bool = False) -> Console:
    """A rich console on stdout (stderr): the terminal's width in a terminal, else
    :data:`PIPE_WIDTH`."""
    stream = sys.stderr if stderr else sys.stdout
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):  # replaced or closed streams
        tty = False
    return Console(stderr=stderr) if tty else Console(stderr=stderr, width=PIPE_WIDTH)
