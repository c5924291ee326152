"""What the launcher's fork server imports once, so that every worker forked from it starts with torch.

Usage: ``multiprocessing.forkserver.set_forkserver_preload(["npu_migrate._preload"])``.

multiprocessing ignores only ImportError in a preload; anything else (torch >= 2.5 raises
RuntimeError when an auto-loaded torch_npu fails) would kill the fork server with a traceback on
the console. Here every failure is left to the launcher, which imports torch itself and reports
the cause in one line before any worker is forked.
"""

from __future__ import annotations

try:
    import torch  # noqa: F401
    import torch.distributed  # noqa: F401
    import torch.multiprocessing  # noqa: F401

    import npu_migrate.device  # noqa: F401
    import npu_migrate.distributed  # noqa: F401
    import npu_migrate.launch.forkserver  # noqa: F401 - registers the workers' cleanup at exit
    import npu_migrate.launch.worker  # noqa: F401
except Exception:  # noqa: BLE001, S110 - reported by the launcher, see above
    pass
