"""Exceptions whose message is a complete, one-line answer for the user.

The CLI prints ``str(error)`` of these without a traceback, so every message says
what was wrong (with the value), what was expected, and how to fix it.
"""

from __future__ import annotations


class NpuMigrateError(Exception):
    """Base class for errors that are shown to the user as one line (exit code 1)."""

    exit_code = 1


class UsageError(NpuMigrateError, ValueError):
    """The command line or its values are wrong; nothing was started (exit code 2, as argparse)."""

    exit_code = 2


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


def exit_code(exc: BaseException) -> int:
    """The process exit code for ``exc``: 2 for usage errors, 1 for every other failure."""
    return int(getattr(exc, "exit_code", 1))


class MigrationError(NpuMigrateError, RuntimeError):
    """A CUDA API that runtime migration cannot map to the target device (:mod:`npu_migrate.migrate`)."""
