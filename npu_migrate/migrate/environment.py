"""The environment that carries runtime migration into every Python process a job starts (torch-free).

Usage::

    from npu_migrate.migrate.environment import export_environment

    export_environment("cpu", 2, report_dir)   # every Python process started from now on migrates

Children read these variables: ``npu_migrate/_bootstrap/sitecustomize.py`` (first on
``PYTHONPATH``) arms :mod:`npu_migrate.migrate.hook` when ``NPU_MIGRATE_MIGRATE=1``, and
``install()`` reads the target, the simulated device count and the report directory.
"""

from __future__ import annotations

import os
import sys
from typing import Callable, Optional

from npu_migrate._torch_hook import BOOTSTRAP_DIR, export_bootstrap  # noqa: F401 (BOOTSTRAP_DIR: re-exported)

ENV_MIGRATE = "NPU_MIGRATE_MIGRATE"
ENV_SIM_DEVICES = "NPU_MIGRATE_SIM_DEVICES"
ENV_REPORT_DIR = "NPU_MIGRATE_REPORT_DIR"
ENV_WHOLE_LINES = "NPU_MIGRATE_WHOLE_LINES"
"""``1``: processes ``mp.spawn`` starts write whole lines with a rank prefix (``npu-migrate run``)."""
ENV_SPAWN_NPROCS = "NPU_MIGRATE_SPAWN_NPROCS"
"""How many processes the running ``mp.spawn`` starts (read by its children for the prefix rule)."""
ENV_PYTHON = "NPU_MIGRATE_PYTHON"
"""``sys.prefix`` of the exporting interpreter: the bootstrap arms nothing in another one."""


def export_environment(device: str | None = None, device_count: int | None = None,
                       report_dir: str | None = None,
                       set_env: Optional[Callable[[str, str], None]] = None) -> None:
    """Make every Python process started from now on migrate too (no torch import needed).

    Sets NPU_MIGRATE_MIGRATE=1, puts npu_migrate/_bootstrap (a sitecustomize that arms the
    migration when torch is imported) first on PYTHONPATH, and passes the target family, the
    simulated device count and the report directory on.

    Args:
        device: target family for the children (``None`` or ``"auto"``: their own detection).
        device_count: on the CPU target, how many CUDA devices the children see.
        report_dir: where each child writes its report when it ends.
        set_env: how to set a variable (default: ``os.environ``); lets ``uninstall`` undo it.
    """
    put = set_env or os.environ.__setitem__
    put(ENV_MIGRATE, "1")
    put(ENV_PYTHON, sys.prefix)  # the bootstrap stays inert in other interpreters and environments
    export_bootstrap(put)
    if device and device != "auto":
        put("NPU_MIGRATE_DEVICE", device)
    if device_count is not None:
        put(ENV_SIM_DEVICES, str(device_count))
    if report_dir:
        put(ENV_REPORT_DIR, report_dir)
