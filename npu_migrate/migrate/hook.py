"""The start-up hook: arms runtime migration in a new interpreter, without importing torch first.

Usage::

    from npu_migrate.migrate import hook

    hook.arm()   # in a process started by a migrated job: install when torch is imported

``npu_migrate/_bootstrap/sitecustomize.py`` (first on ``PYTHONPATH`` while migration propagates,
see :func:`npu_migrate.migrate.environment.export_environment`) calls :func:`arm` when
``NPU_MIGRATE_MIGRATE=1``. It installs the migration the moment ``torch/__init__.py`` has finished
(:mod:`npu_migrate._torch_hook`). Processes that never import torch pay nothing. This module imports
neither torch nor the rest of :mod:`npu_migrate.migrate` until then.
"""

from __future__ import annotations

import os
import sys

from npu_migrate.migrate.environment import ENV_MIGRATE


def _activate() -> None:
    try:
        from npu_migrate.migrate.install import install_from_env

        install_from_env()
    except Exception as exc:  # noqa: BLE001 - never break the user's `import torch`
        print(f"npu_migrate: runtime migration could not be installed: {exc}", file=sys.stderr)


def arm() -> None:
    """Install migration when torch is imported (now, if it already is)."""
    if os.environ.get(ENV_MIGRATE) != "1":
        return
    from npu_migrate._torch_hook import after_torch_import

    after_torch_import(_activate)
