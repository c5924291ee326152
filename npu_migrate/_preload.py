"""What the launcher's fork server imports once, so that every worker forked from it starts with torch.

Usage::

    multiprocessing.forkserver.set_forkserver_preload(["npu_migrate._preload"])   # the launcher
    npu_migrate._preload.start_worker()                                           # each forked worker

The fork server imports torch, and nothing that starts a device runtime: real accelerators
refuse to re-initialise in a forked child ("Cannot re-initialize CUDA in forked subprocess",
torch_npu alike), so the runtime must start in each worker, not in the process they are forked
from. Two things would start it during ``import torch``, and both wait for
:func:`start_worker`, which each forked worker calls before the user's code:

* torch >= 2.5's device-extension autoload (``import torch`` imports torch_npu): turned off for
  the fork server's import, then done in the worker with torch's own loader;
* the start-up hooks armed at ``import torch`` (runtime migration asks the device for its
  count; the ``--probe`` recording): held (:func:`npu_migrate._torch_hook.hold`), then run.

multiprocessing ignores only ImportError in a preload; anything else would kill the fork server
with a traceback on the console. Here every failure is left to the launcher, which imports torch
itself and reports the cause in one line before any worker is forked.
"""

from __future__ import annotations

import sys

from npu_migrate import _torch_hook
from npu_migrate.launch.procs.forkserver import PRELOADED

try:
    _torch_hook.import_held(PRELOADED)
except Exception:  # noqa: BLE001, S110 - reported by the launcher, see above
    pass


def start_worker() -> None:
    """In a worker forked from the fork server: what ``import torch`` would have started, now.

    Imports the device extensions torch would have auto-loaded, then runs the held start-up
    hooks (runtime migration, the probe). Does nothing in a process this module was not
    preloaded into (a spawned worker imported torch itself, hooks and all).
    """
    if not _torch_hook.held():
        return
    _torch_hook.resume()
    state = sys.modules.get("npu_migrate.migrate.state")
    if state is not None and state.is_installed():
        # Installed inside this worker's multiprocessing bootstrap, which its patch of
        # BaseProcess._bootstrap cannot wrap any more; workers leave through os._exit (no atexit),
        # after multiprocessing's finalizers.
        import multiprocessing.util

        from npu_migrate.migrate.report import REPORT

        multiprocessing.util.Finalize(None, REPORT.dump, exitpriority=0)
