"""Runs callbacks the moment ``import torch`` finishes, in a process that has not imported torch yet.

Usage::

    from npu_migrate._torch_hook import after_torch_import, export_bootstrap

    after_torch_import(install_migration)   # now, if torch is already imported
    export_bootstrap()                      # every Python process started from now on runs the bootstrap

Runtime migration (:mod:`npu_migrate.migrate.hook`) and the ``--probe`` recording
(:mod:`npu_migrate.compare.recording._hook`) both arm themselves this way from the bootstrap
``sitecustomize``. One finder on ``sys.meta_path`` watches for ``torch`` only, lets it import as
usual, runs the callbacks in the order they were added once ``torch/__init__.py`` has run, and
steps aside. Processes that never import torch pay nothing.

A launcher's fork server imports torch for its workers but must not start a device runtime
before it forks (real accelerators refuse to re-initialise in a forked child). It imports through
:func:`import_held`: the callbacks wait (:func:`hold`), torch's device extensions are not
auto-loaded, and each forked worker starts both with :func:`resume`, in its own process, before
the user's code.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any, Callable, Sequence

BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bootstrap")
"""The folder of the bootstrap ``sitecustomize`` that arms migration and recording in child processes."""


def export_bootstrap(set_env: Callable[[str, str], None] | None = None,
                     variables: dict[str, str] | None = None) -> None:
    """Put :data:`BOOTSTRAP_DIR` first on ``PYTHONPATH`` (once) for every process started from now on.

    Args:
        set_env: how to set a variable (default: ``os.environ``), so a caller can undo it.
        variables: the settings the bootstrap arms a hook with, exported first the same way.
    """
    put = set_env or os.environ.__setitem__
    for name, value in (variables or {}).items():
        put(name, value)
    path = os.environ.get("PYTHONPATH", "")
    if BOOTSTRAP_DIR not in path.split(os.pathsep):
        put("PYTHONPATH", os.pathsep.join(p for p in (BOOTSTRAP_DIR, path) if p))


_CALLBACKS: list[Callable[[], None]] = []
_HELD: list[bool] = []  # [True] while hold() is in force in this process image


def _run_callbacks() -> None:
    while _CALLBACKS and not _HELD:
        _CALLBACKS.pop(0)()


class _TorchFinder:
    """A meta-path finder that only watches for ``torch`` and then steps aside."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "torch":
            return None
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_run(module: Any) -> None:
            exec_module(module)
            _run_callbacks()

        spec.loader.exec_module = exec_then_run  # type: ignore[method-assign]
        return spec


def after_torch_import(callback: Callable[[], None]) -> None:
    """Call ``callback`` once torch is imported: now if it is, else right after ``import torch``.

    ``callback`` must not raise: it runs inside the user's ``import torch``.
    """
    if "torch" in sys.modules and not _HELD:
        callback()
        return
    _CALLBACKS.append(callback)
    if not any(isinstance(f, _TorchFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _TorchFinder())


def hold() -> None:
    """Keep the callbacks from running at ``import torch`` until :func:`release` (in a forked child)."""
    if not _HELD:
        _HELD.append(True)


def held() -> bool:
    """Whether :func:`hold` is in force: callbacks wait for :func:`release`."""
    return bool(_HELD)


def release() -> None:
    """Stop holding, and run the callbacks now if torch is imported (else at ``import torch``)."""
    _HELD.clear()
    if "torch" in sys.modules:
        _run_callbacks()


_AUTOLOAD = "TORCH_DEVICE_BACKEND_AUTOLOAD"
_AUTOLOAD_WANTED: list[bool] = []  # [wanted] once import_held() ran in this process image


def import_held(modules: Sequence[str]) -> None:
    """Import ``modules`` (torch first among them) with the callbacks held and torch's device-extension
    autoload off, for a process that will fork workers: what must start in each worker waits for
    :func:`resume` there. The environment is left as it was.

    Raises:
        Exception: what the imports raise (the callbacks stay held).
    """
    import importlib

    before = os.environ.get(_AUTOLOAD)
    _AUTOLOAD_WANTED[:] = [(before or "1") == "1"]
    hold()
    os.environ[_AUTOLOAD] = "0"
    try:
        for name in modules:
            importlib.import_module(name)
    finally:
        if before is None:
            del os.environ[_AUTOLOAD]
        else:
            os.environ[_AUTOLOAD] = before


def resume() -> None:
    """After :func:`import_held` (and a fork): what ``import torch`` would have started, now.

    Imports the device extensions torch would have auto-loaded (torch >= 2.5, unless
    ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` then or now), then runs the held callbacks.

    Raises:
        RuntimeError: torch's "Failed to load the backend extension: ..." for a broken extension.
    """
    import torch

    if all(_AUTOLOAD_WANTED) and os.environ.get(_AUTOLOAD, "1") == "1":
        load = getattr(torch, "_import_device_backends", None)  # torch >= 2.5
        if load is not None:
            load()
    release()
