"""Installation state: the target, the simulated devices, and every patched attribute to put back.

Usage::

    from npu_migrate.migrate.state import STATE, patch, rollback

    patch(torch, "zeros", wrapped)   # remembered, so rollback() puts the original back
    STATE.target                     # the DeviceSpec CUDA calls go to, or None when migration is off
    rollback()                       # every patched attribute and variable gets its original back

:mod:`npu_migrate.migrate.install` applies the patches and calls :func:`rollback` to undo them.
"""

from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass, field
from types import FunctionType, ModuleType
from typing import TYPE_CHECKING, Any, Iterator

from npu_migrate.errors import MigrationError

if TYPE_CHECKING:
    from npu_migrate.registry import DeviceSpec


class _PerThread(threading.local):
    """The current device, per thread as CUDA keeps it: a new thread starts on device 0."""

    current = 0


@dataclass
class State:
    """What migration changed in this process, and what the script sees.

    Attributes:
        target: the family CUDA calls go to; ``None`` while migration is off.
        count: how many CUDA devices the script sees.
        current: the current (simulated) device index on the CPU target, of the calling thread.
        patches: ``(owner, name, had_own_attribute, old_value)`` in the order they were applied.
        env_before: environment variables changed, with their previous values (``None``: unset).
        originals: torch objects a patch needs after replacing them (``"amp.GradScaler"``).
        mapped: CUDA device strings already mapped for this target (``"cuda:1"``), emptied with it, so
            the hot wrappers (``x.to("cuda")``) look them up with no call (:mod:`.mapping`).
        lock: serialises install and uninstall.
    """

    target: DeviceSpec | None = None
    count: int = 1
    per_thread: _PerThread = field(default_factory=_PerThread)
    patches: list[tuple[Any, str, bool, Any]] = field(default_factory=list)
    env_before: dict[str, str | None] = field(default_factory=dict)
    originals: dict[str, Any] = field(default_factory=dict)
    mapped: dict[str, Any] = field(default_factory=dict)
    lock: threading.RLock = field(default_factory=threading.RLock)

    def require_target(self, what: str) -> DeviceSpec:
        """The target family; raises :class:`~npu_migrate.errors.MigrationError` while migration is off.

        An explicit check, not an ``assert``: ``python -O`` drops those.
        """
        spec = self.target
        if spec is None:
            raise MigrationError(
                f"{what} needs runtime migration, which is not installed in this process: call "
                "npu_migrate.migrate.install() first, or start the script with `npu-migrate run`."
            )
        return spec

    @property
    def current(self) -> int:
        return self.per_thread.current

    @current.setter
    def current(self, index: int) -> None:
        self.per_thread.current = index


STATE = State()


def is_installed() -> bool:
    """Whether runtime migration is active in this process."""
    return STATE.target is not None


def target() -> str | None:
    """The family CUDA calls are sent to, or None when migration is off."""
    return None if STATE.target is None else STATE.target.name


def on_cpu() -> bool:
    """Whether migration is on and sends CUDA calls to the CPU."""
    return STATE.target is not None and not STATE.target.is_accelerator


def patch(owner: Any, name: str, new: Any) -> None:
    """Set ``owner.name = new`` and remember the old value for :func:`rollback`.

    A function or class put there is named after the place (``torch.zeros``, ``torch.Tensor.to``),
    so pickle stores it by that name and any process, migrated or not, loads its own.
    """
    had = name in vars(owner)
    old = vars(owner)[name] if had else getattr(owner, name, None)
    if isinstance(new, (FunctionType, type)):
        new.__module__ = owner.__name__ if isinstance(owner, ModuleType) else owner.__module__
        new.__qualname__ = name if isinstance(owner, ModuleType) else f"{owner.__qualname__}.{name}"
    setattr(owner, name, new)
    STATE.patches.append((owner, name, had, old))  # only once applied: rollback undoes what happened


def set_env(key: str, value: str) -> None:
    """Set an environment variable and remember its old value for :func:`rollback`."""
    STATE.env_before.setdefault(key, os.environ.get(key))
    os.environ[key] = value


@contextlib.contextmanager
def all_or_nothing() -> Iterator[None]:
    """Install inside: on any failure every patch and variable is put back and one clear error raised.

    Raises:
        NpuMigrateError: the failure's own one-line error (a bad setting), or a
            :class:`~npu_migrate.errors.MigrationError` naming the failure.
    """
    from npu_migrate.errors import MigrationError, NpuMigrateError

    try:
        yield
    except BaseException as exc:
        rollback()
        if isinstance(exc, NpuMigrateError) or not isinstance(exc, Exception):
            raise
        raise MigrationError(
            f"runtime migration could not be installed: {type(exc).__name__}: {exc}; nothing was changed "
            "(every patch was rolled back)."
        ) from exc


def rollback() -> None:
    """Put back every patched attribute and environment variable; migration is off afterwards."""
    with STATE.lock:
        while STATE.patches:
            owner, name, had, old = STATE.patches.pop()
            if had:
                setattr(owner, name, old)
            else:
                try:
                    delattr(owner, name)
                except AttributeError:
                    pass
        for key, value in STATE.env_before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        STATE.env_before.clear()
        STATE.target = None
        STATE.originals.clear()
        STATE.mapped.clear()
        STATE.per_thread = _PerThread()  # every thread starts on device 0 at the next install
