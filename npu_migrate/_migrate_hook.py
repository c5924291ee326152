"""Arms runtime migration in a new interpreter, without importing torch before the script does.

Imported by ``npu_migrate/_bootstrap/sitecustomize.py`` when ``NPU_MIGRATE_MIGRATE=1``. It
installs the migration the moment ``torch/__init__.py`` has finished
(:mod:`npu_migrate._torch_hook`). Processes that never import torch pay nothing.
"""

from __future__ import annotations

import os
import sys
from typing import Any

ENV_MIGRATE = "NPU_MIGRATE_MIGRATE"
ENV_SIM_DEVICES = "NPU_MIGRATE_SIM_DEVICES"
ENV_REPORT_DIR = "NPU_MIGRATE_REPORT_DIR"
BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bootstrap")


def export_environment(device: str | None = None, device_count: int | None = None,
                       report_dir: str | None = None, set_env: Any = None) -> None:
    """Make every Python process started from now on migrate too (no torch import needed).

    Sets NPU_MIGRATE_MIGRATE=1, puts npu_migrate/_bootstrap (a sitecustomize that arms the
    migration when torch is imported) first on PYTHONPATH, and passes the target family, the
    simulated device count and the report directory on.
    """
    put = set_env or os.environ.__setitem__
    put(ENV_MIGRATE, "1")
    path = os.environ.get("PYTHONPATH", "")
    if BOOTSTRAP_DIR not in path.split(os.pathsep):
        put("PYTHONPATH", os.pathsep.join(p for p in (BOOTSTRAP_DIR, path) if p))
    if device and device != "auto":
        put("NPU_MIGRATE_DEVICE", device)
    if device_count is not None:
        put(ENV_SIM_DEVICES, str(device_count))
    if report_dir:
        put(ENV_REPORT_DIR, report_dir)


def _activate() -> None:
    try:
        from npu_migrate.migrate import install_from_env

        install_from_env()
    except Exception as exc:  # noqa: BLE001 - never break the user's `import torch`
        print(f"npu_migrate: runtime migration could not be installed: {exc}", file=sys.stderr)


def arm() -> None:
    """Install migration when torch is imported (now, if it already is)."""
    if os.environ.get(ENV_MIGRATE) != "1":
        return
    from npu_migrate._torch_hook import after_torch_import

    after_torch_import(_activate)
