"""Reports of child processes: a forked child counts only its own calls; every child writes its report.

Usage::

    from npu_migrate.migrate.patches import processes

    processes.install()   # at-fork reset, atexit dump, and a dump when a multiprocessing child ends
"""

from __future__ import annotations

import atexit
import multiprocessing.process as mpp
import os
from typing import Any

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
        try:
            return bootstrap(self, *args, **kwargs)
        finally:
            REPORT.dump()  # multiprocessing children leave with os._exit: no atexit

    patch(mpp.BaseProcess, "_bootstrap", _bootstrap)
