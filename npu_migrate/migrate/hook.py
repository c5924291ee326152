"""The start-up hook: arms runtime migration in a new interpreter, without importing torch first.

Usage::

    from npu_migrate.migrate import hook

    hook.arm()   # in a process started by a migrated job: install when torch is imported

``npu_migrate/_bootstrap/sitecustomize.py`` (first on ``PYTHONPATH`` while migration propagates,
see :func:`npu_migrate.migrate.environment.export_environment`) calls :func:`arm` when
``NPU_MIGRATE_MIGRATE=1``. It installs the migration the moment ``torch/__init__.py`` has finished
(:mod:`npu_migrate._torch_hook`). Processes that never import torch pay nothing. This module imports
neither torch nor the rest of :mod:`npu_migrate.migrate` until then. A process whose install fails
(a bad ``NPU_MIGRATE_SIM_DEVICES``...) stops there with one line on stderr, exit code 2 for a bad
setting and 1 otherwise, rather than run its CUDA code unmigrated.
"""

from __future__ import annotations

import os
import sys

from npu_migrate.migrate.environment import ENV_MIGRATE


def _activate() -> None:
    """Install, or end the process with one line: a job's process must not run unmigrated unnoticed.

    ``install()`` rolls back what it did before it raises, and its errors are one line already
    (a bad ``NPU_MIGRATE_SIM_DEVICES`` names the value and the fix). This runs inside the
    script's ``import torch``, where a traceback would point at the wrong line.
    """
    try:
        from npu_migrate.migrate.install import install_from_env

        install_from_env()
    except Exception as exc:  # noqa: BLE001 - any failure: say it in one line, then stop
        prefix = "npu_migrate: runtime migration could not be installed: "
        message = str(exc)
        if message.startswith("runtime migration could not be installed: "):
            message = message[len("runtime migration could not be installed: "):]
        sys.stderr.write(f"{prefix}{message}\n")
        sys.stderr.flush()
        raise SystemExit(getattr(exc, "exit_code", 1)) from None


def arm() -> None:
    """Install migration when torch is imported (now, if it already is)."""
    if os.environ.get(ENV_MIGRATE) != "1":
        return
    from npu_migrate._torch_hook import after_torch_import
    from npu_migrate.migrate.libraries import libs_hook

    libs_hook.register()  # a script may import flash_attn before torch; the finder arms the migration then

    after_torch_import(_activate)
