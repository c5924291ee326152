"""Exceptions whose message is a complete, one-line answer for the user.

The CLI prints ``str(error)`` of these without a traceback, so every message says
what was wrong (with the value), what was expected, and how to fix it.
"""

from __future__ import annotations


class NpuMigrateError(Exception):
    """Base class for errors that are shown to the user as one line."""


class UnknownDeviceError(NpuMigrateError, ValueError):
    """A device name that is not a family in :data:`npu_migrate.device.DEVICES`."""


class DeviceUnavailableError(NpuMigrateError, RuntimeError):
    """A device family was requested but cannot be used on this machine."""


class DistributedConfigError(NpuMigrateError, ValueError):
    """The torchrun-style environment of a process is missing or inconsistent."""
