"""Exceptions whose message is a complete, one-line answer for the user, and the one rule for exit codes.

Usage::

    raise UsageError("--steps 0 is not positive: expected 1 or more optimizer steps.")   # exit 2
    raise InputError(f"{path}: not a probe directory: ...")                               # exit 2
    exit_code(exc)          # what a command that raised ``exc`` exits with (:class:`ExitCode`)

The command layer (:func:`npu_migrate.argparsing.run_command`) prints ``str(error)`` of these
without a traceback, so every message says what was wrong (with the value), what was expected,
and how to fix it. :func:`exit_code` is the only place that turns an exception into an exit code.
"""

from __future__ import annotations

import errno
import signal
from enum import IntEnum


class ExitCode(IntEnum):
    """What every ``npu-migrate`` sub-command and ``python -m npu_migrate.launch`` exit with."""

    OK = 0
    FAILURE = 1
    """The command ran and failed, or found what it looks for (``check``, ``compare``, ``ops``)."""
    USAGE = 2
    """The command line is wrong, or a file it names is missing, unreadable or malformed; as argparse."""
    INTERRUPTED = 128 + signal.SIGINT
    """Ctrl-C (130), as a shell reports a process that SIGINT ended."""
    CLOSED_PIPE = 128 + signal.SIGPIPE
    """The reader of the output went away (``| head``): 141, as a shell reports SIGPIPE, and quietly."""


class NpuMigrateError(Exception):
    """Base class for errors that are shown to the user as one line (exit code 1)."""

    exit_code: int = ExitCode.FAILURE


class UsageError(NpuMigrateError, ValueError):
    """The command line or its values are wrong; nothing was started (exit code 2, as argparse)."""

    exit_code: int = ExitCode.USAGE


class InputError(UsageError):
    """A file or directory the command line names is missing, unreadable or malformed (exit code 2).

    The message names the path and what was expected there.
    """


class UnknownDeviceError(UsageError):
    """A device name that is not a family in :data:`npu_migrate.device.DEVICES`."""


class UnknownRuleError(UsageError, KeyError):
    """A port rule code that is not in :data:`npu_migrate.port.rules.RULES`.

    A ``KeyError`` too, for callers of ``rule_by_code`` written before it had a message.
    """

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0])


class DeviceUnavailableError(NpuMigrateError, RuntimeError):
    """A device family was requested but cannot be used on this machine."""


class DistributedConfigError(NpuMigrateError, ValueError):
    """The torchrun-style environment of a process is missing or inconsistent."""


class StorageError(NpuMigrateError, OSError):
    """Data or checkpoints could not be read or written (local disk, ``s3://``, ``oss://``).

    ``kind`` says which fix applies, so callers can act on it without parsing the message:
    ``missing_bucket``, ``missing_object``, ``access_denied``, ``no_credentials``,
    ``unreachable``, ``not_installed``, ``unsupported``, ``incomplete``, ``config``.
    The message names the URL and the fix, never a credential.
    """

    def __init__(self, message: str, *, kind: str, url: str = "") -> None:
        super().__init__(message)
        self.kind = kind
        self.url = url

    def __str__(self) -> str:
        return str(self.args[0])


def is_closed_pipe(exc: BaseException) -> bool:
    """True when ``exc`` says the reader of our output went away (``EPIPE``)."""
    return isinstance(exc, BrokenPipeError) or (isinstance(exc, OSError) and exc.errno == errno.EPIPE)


def exit_code(exc: BaseException) -> int:
    """The exit code of a command that raised ``exc``: the one rule (:class:`ExitCode`) for every command.

    141 for a closed pipe, 130 for Ctrl-C, an error's own ``exit_code`` (2 for :class:`UsageError`
    and :class:`InputError`, 128+N for a job a signal ended), 1 for every other failure.
    """
    if is_closed_pipe(exc):
        return int(ExitCode.CLOSED_PIPE)
    if isinstance(exc, KeyboardInterrupt):
        return int(ExitCode.INTERRUPTED)
    return int(getattr(exc, "exit_code", ExitCode.FAILURE))


class MigrationError(NpuMigrateError, RuntimeError):
    """A CUDA API that runtime migration cannot map to the target device (:mod:`npu_migrate.migrate`)."""
