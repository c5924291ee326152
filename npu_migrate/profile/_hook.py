"""Arms ``--profile`` in a new interpreter when ``NPU_MIGRATE_PROFILE`` is set, without importing torch first.

Imported by ``npu_migrate/_bootstrap/sitecustomize.py`` (and by the launcher's fork server, through
:meth:`npu_migrate.profile.launch_feature.ProfileJob.in_fork_server`). Like the probe's
(:mod:`npu_migrate.compare.recording._hook`), it starts :func:`.recorder.install_from_env` once
``torch/__init__.py`` has run (:mod:`npu_migrate._torch_hook`); processes that never import torch
pay nothing.
"""

from __future__ import annotations

import os
import sys

from npu_migrate.profile.settings import ENV_DIR


def _activate() -> None:
    try:
        from npu_migrate.profile.recorder import install_from_env

        install_from_env()
    except Exception as exc:  # noqa: BLE001 - never break the user's `import torch`
        print(f"npu_migrate: --profile could not be started: {exc}", file=sys.stderr, flush=True)


def arm() -> None:
    """Start profiling when torch is imported (now, if it already is)."""
    if not os.environ.get(ENV_DIR):
        return
    from npu_migrate._torch_hook import after_torch_import

    after_torch_import(_activate)
