"""Runs callbacks the moment ``import torch`` finishes, in a process that has not imported torch yet.

Usage::

    from npu_migrate._torch_hook import after_torch_import, export_bootstrap

    after_torch_import(install_migration)   # now, if torch is already imported
    export_bootstrap()                      # every Python process started from now on runs the bootstrap

Runtime migration (:mod:`npu_migrate.migrate.hook`) and the ``--probe`` recording
(:mod:`npu_migrate.compare._hook`) both arm themselves this way from the bootstrap
``sitecustomize``. One finder on ``sys.meta_path`` watches for ``torch`` only, lets it import as
usual, runs the callbacks in the order they were added once ``torch/__init__.py`` has run, and
steps aside. Processes that never import torch pay nothing.

A launcher's fork server imports torch for its workers but must not start a device runtime
before it forks (real accelerators refuse to re-initialise in a forked child). It calls
:func:`hold` first: the callbacks then wait, and each forked worker runs them with
:func:`release`, in its own process, before the user's code.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any, Callable

BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bootstrap")
"""The folder of the bootstrap ``sitecustomize`` that arms migration and recording in child processes."""


def export_bootstrap(set_env: Callable[[str, str], None] | None = None) -> None:
    """Put :data:`BOOTSTRAP_DIR` first on ``PYTHONPATH`` (once) for every process started from now on.

    Args:
        set_env: how to set a variable (default: ``os.environ``), so a caller can undo it.
    """
    put = set_env or os.environ.__setitem__
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
