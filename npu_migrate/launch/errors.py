"""The launcher's exceptions and its one-line console messages.

Usage::

    from npu_migrate.launch.errors import LaunchError, say
    say("node 1 of 2: ...")          # "npu-migrate launch: node 1 of 2: ..." on stderr
    raise LaunchError("could not reach node 0's launcher at 10.0.0.1:29501 ...")

Every error the launcher shows is one line: what went wrong, with the value, and what to do.
Messages that come from torch's C++ side keep only their first line (:func:`first_line`); the
rest (C++ frames) goes to the launcher log in ``--log-dir`` when one is given
(:func:`quiet_torch_elastic`).
"""

from __future__ import annotations

import logging
import os
import sys

from npu_migrate.errors import NpuMigrateError, UsageError
from npu_migrate.textsafe import printable

SAY_LIMIT = 4000
"""Characters of one console line: a long error with its rank and host, not a log."""


class LaunchError(NpuMigrateError):
    """The launcher could not start or keep the job (exit code 1)."""


class LaunchUsageError(LaunchError, UsageError):
    """Bad launcher input: nothing was started (exit code 2)."""


class JobFailed(NpuMigrateError):
    """Raised by :func:`npu_migrate.launch.spawn` when the job did not finish cleanly.

    Attributes:
        exit_code: what the command-line launcher would exit with (1 failure, 128+N signal N).
    """

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def say(message: str) -> None:
    """One line on stderr, prefixed so it stands apart from the ranks' own output.

    Messages often carry text other processes wrote (a rank's error, another node's abort reason,
    a host name from the store): it is made printable here, the one place every line passes, so
    no message can move the cursor, recolour the console or span lines.
    """
    print(f"npu-migrate launch: {printable(message, SAY_LIMIT)}", file=sys.stderr, flush=True)


def first_line(exc: BaseException, limit: int = 200) -> str:
    """The first line of an exception's text: torch's C++ errors append frames after it."""
    text = str(exc).strip().splitlines()
    line = " ".join(text[0].split()) if text else type(exc).__name__
    return line[:limit]


def quiet_torch_elastic(log_file: str | None) -> None:
    """torch's rendezvous logs, and the launcher's own, go to the launcher log (with --log-dir), never to the console."""
    elastic = logging.getLogger("torch.distributed.elastic")
    elastic.propagate = False
    if not any(isinstance(h, logging.NullHandler) for h in elastic.handlers):
        elastic.addHandler(logging.NullHandler())
    if log_file:
        from npu_migrate import fileio  # private (0600), never through a planted symlink

        handler = logging.StreamHandler(os.fdopen(fileio.open_private_append(log_file), "a", encoding="utf-8"))
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        for name in ("torch.distributed.elastic", "npu_migrate.launch"):
            lg = logging.getLogger(name)
            lg.addHandler(handler)
            lg.setLevel(logging.DEBUG)
