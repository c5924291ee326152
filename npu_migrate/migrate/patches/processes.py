"""Reports of child processes: a forked child counts only its own calls; every child writes its report.

Usage::

    from npu_migrate.migrate.patches import processes

    processes.install()   # at-fork reset, atexit dump, and a dump when a multiprocessing child ends

Children of ``mp.spawn`` under ``npu-migrate run`` also write whole lines with a rank prefix
(:mod:`npu_migrate.migrate.lines`); ``mp.spawn`` passes its ``nprocs`` on for the prefix rule.
"""

from __future__ import annotations

import atexit
import functools
import multiprocessing.process as mpp
import os
from typing import Any

from npu_migrate.migrate import lines
from npu_migrate.migrate.environment import ENV_SPAWN_NPROCS, ENV_WHOLE_LINES
from npu_migrate.migrate.report import REPORT
from npu_migrate.migrate.state import patch

_REGISTERED: list[bool] = []


def install() -> None:
    """Register the fork and exit hooks once per process; patch ``BaseProcess._bootstrap``."""
    # A forked child (a DataLoader worker, a launcher worker) reports only its own calls.
    if not _REGISTERED:
        os.register_at_fork(after_in_child=REPORT.reset)
        atexit.register(REPORT.dump)
        _REGISTERED.append(True)
    bootstrap = mpp.BaseProcess._bootstrap  # type: ignore[attr-defined]

    def _bootstrap(self: Any, *args: Any, **kwargs: Any) -> Any:
        relay = lines.start_for_spawn_child(self)
        try:
            return bootstrap(self, *args, **kwargs)
        finally:
            REPORT.dump()  # multiprocessing children leave with os._exit: no atexit
            if relay is not None:
                relay.close()

    patch(mpp.BaseProcess, "_bootstrap", _bootstrap)
    if os.environ.get(ENV_WHOLE_LINES) == "1":
        _install_spawn_nprocs()


def _install_spawn_nprocs() -> None:
    """``mp.spawn(nprocs=N)``/``start_processes``: the children learn N (the prefix is for N > 1)."""
    import importlib

    # By module: the attribute torch.multiprocessing.spawn is the function, which hides the module.
    spawn_module = importlib.import_module("torch.multiprocessing.spawn")

    start = spawn_module.start_processes

    def start_processes(fn: Any, args: Any = (), nprocs: int = 1, *rest: Any, **kwargs: Any) -> Any:
        before = os.environ.get(ENV_SPAWN_NPROCS)
        os.environ[ENV_SPAWN_NPROCS] = str(nprocs)  # spawn copies the environment when it starts each child
        try:
            return start(fn, args, nprocs, *rest, **kwargs)
        finally:
            if before is None:
                os.environ.pop(ENV_SPAWN_NPROCS, None)
            else:
                os.environ[ENV_SPAWN_NPROCS] = before

    functools.update_wrapper(start_processes, start)
    patch(spawn_module, "start_processes", start_processes)
