"""The command layer every npu_migrate entry point shares: one-line usage errors, one exit-code rule.

Usage::

    from npu_migrate.argparsing import OneLineParser, run_command

    parser = OneLineParser(prog="npu-migrate")   # sub-parsers inherit the class
    def main(argv=None) -> int:
        args = parser.parse_args(argv)        # a usage error: argparse's one line, SystemExit(2)
        return run_command("npu-migrate compare", lambda: run(args))

:func:`run_command` runs a command's body and turns whatever it raises into one line on stderr
and the exit code :func:`npu_migrate.errors.exit_code` gives: ``npu-migrate SUBCOMMAND``,
``python -m npu_migrate.launch`` and ``python -m npu_migrate.compare`` all end through it, so a
closed pipe, Ctrl-C, a usage error and a failure end every command the same way. An exception
that is not meant for the user (a bug, or the user's own script's error) keeps its traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable

from npu_migrate.errors import NpuMigrateError, exit_code, is_closed_pipe

Explain = Callable[[BaseException], "str | None"]
"""Turns an exception that is no :class:`NpuMigrateError` into the user's one line, or None."""

LINE_LIMIT = 4000
"""Characters of one error line: a long message with its value and its fix, not a log."""


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line: what was wrong, and where to look."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _closed_pipe() -> None:
    """The reader of our output went away (``| head``): send what is still buffered nowhere."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is no file (captured): nothing to redirect
        pass


def _line(exc: BaseException, explain: Explain | None) -> str | None:
    """The one line the user sees for ``exc``, or None where it is not meant for the user."""
    if isinstance(exc, NpuMigrateError):
        return f"error: {exc}"
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    explained = explain(exc) if explain is not None and isinstance(exc, Exception) else None
    return None if explained is None else f"error: {explained}"


def run_command(prog: str, body: Callable[[], int | None], explain: Explain | None = None) -> int:
    """Run ``body`` and return its exit code; what it raises becomes one line on stderr and a code.

    Args:
        prog: the prefix of the line, e.g. ``npu-migrate`` or ``npu-migrate launch``.
        body: the command; its return value (None: 0) is the exit code when it raises nothing.
        explain: the one line for an exception that is no :class:`NpuMigrateError`, or None to
            keep its traceback; the commands that import torch pass
            :func:`npu_migrate.autoload.explain` (an ``import torch`` that failed in its
            device-extension autoload, exit 1).

    Returns:
        0 or what ``body`` returned; else :func:`npu_migrate.errors.exit_code` of what it
        raised: 141 a closed pipe (nothing printed), 130 Ctrl-C, 2 usage or input errors, 1 failure.

    Raises:
        Whatever ``body`` raised that is not meant for the user (a bug, the user script's own
        exception), with its traceback; and ``SystemExit``, unchanged.
    """
    try:
        return int(body() or 0)
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001 - mapped below, or raised again
        closed = is_closed_pipe(exc)
        line = None if closed else _line(exc, explain)
        if not closed and line is None:
            raise
        if closed:
            _closed_pipe()
        else:
            from npu_migrate.textsafe import printable  # messages may carry text from files and peers

            try:
                print(f"{prog}: {printable(line, LINE_LIMIT)}", file=sys.stderr, flush=True)
            except (OSError, ValueError):  # stderr is gone too: the code still says it
                pass
        return exit_code(exc)
