"""Arms the probe in a new interpreter when ``NPU_MIGRATE_PROBE`` is set, without importing torch first.

Imported by ``npu_migrate/_bootstrap/sitecustomize.py``. Like :mod:`npu_migrate._migrate_hook`,
it puts a finder on ``sys.meta_path`` that lets torch import as usual and starts
:func:`npu_migrate.compare.probe.install_from_env` once ``torch/__init__.py`` has run. A
launcher's fork server imports torch before it forks workers, so every worker starts with the
hooks in place; processes that never import torch pay nothing.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any

from npu_migrate.compare.settings import ENV_DIR


def _activate() -> None:
    try:
        from npu_migrate.compare.probe import install_from_env

        install_from_env()
    except Exception as exc:  # noqa: BLE001 - never break the user's `import torch`
        print(f"npu_migrate: the --probe recording could not be started: {exc}", file=sys.stderr)


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

        def exec_then_probe(module: Any) -> None:
            exec_module(module)
            _activate()

        spec.loader.exec_module = exec_then_probe  # type: ignore[method-assign]
        return spec


def arm() -> None:
    """Start the probe when torch is imported (now, if it already is)."""
    if not os.environ.get(ENV_DIR):
        return
    if "torch" in sys.modules:
        _activate()
    elif not any(isinstance(f, _TorchFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _TorchFinder())
