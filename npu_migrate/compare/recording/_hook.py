"""Arms the probe in a new interpreter when ``NPU_MIGRATE_PROBE`` is set, without importing torch first.

Imported by ``npu_migrate/_bootstrap/sitecustomize.py``. Like :mod:`npu_migrate.migrate.hook`,
it starts :func:`npu_migrate.compare.recording.probe.install_from_env` once ``torch/__init__.py`` has run
(:mod:`npu_migrate._torch_hook`). A
launcher's fork server imports torch before it forks workers, so every worker starts with the
hooks in place; processes that never import torch pay nothing.
"""

from __future__ import annotations

import os
import sys

from npu_migrate.compare.recording.settings import ENV_DIR


def _activate() -> None:
    try:
        from npu_migrate.compare.recording.probe import install_from_env

        install_from_env()
    except Exception as exc:  # noqa: BLE001 - never break the user's `import torch`
        print(f"npu_migrate: the --probe recording could not be started: {exc}", file=sys.stderr)


def arm() -> None:
    """Start the probe when torch is imported (now, if it already is)."""
    if not os.environ.get(ENV_DIR):
        return
    from npu_migrate._torch_hook import after_torch_import

    after_torch_import(_activate)
