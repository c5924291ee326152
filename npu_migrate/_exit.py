"""A safe interpreter exit for every process that imports npu_migrate: no process group left to finalize.

Usage::

    import npu_migrate          # installs the hook (nothing else happens until exit)

On torch 2.14 with Python 3.11, a gloo process group still alive when the interpreter finalizes
(never destroyed, or destroyed while a DDP model still holds it) can abort the process after the
work is done and written: "terminate called without an active exception", SIGABRT, a
``pt_gloo_runloop`` thread unwound during ``Py_FinalizeEx``. mp.spawn then reports "process 0
terminated with signal SIGABRT" and a finished job exits 1. At ``atexit`` time Python can still run
the threads' callbacks, so the hook destroys the groups that are left (safely on torch < 2.8, see
:mod:`npu_migrate.distributed`) and collects garbage there, before finalization starts.

A group the script destroyed itself is not always gone either: building a DDP model imports
torch._dynamo, and with it torch functions whose ``group=group.WORLD`` default, evaluated at that
import, is the default group; nothing frees it afterwards, and its gloo threads ran through every
exit of such a script (the mp.spawn workers of a ported script, torchrun-style ranks alike). The hook
gives those defaults back the None they have before any group exists
(:func:`npu_migrate.distributed.release_group_defaults`), so the group is freed here too. A group
the script's own objects still hold (a DDP model in a module global) stays theirs.

The hook imports nothing: where ``torch.distributed`` was never imported it returns at once, and it
never changes the exit status (an error in it is swallowed: the user's work is already done).
"""

from __future__ import annotations

import atexit
import sys

_installed = False


def _teardown() -> None:
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return
    try:
        from npu_migrate import distributed

        distributed.teardown_at_exit()
    except Exception:  # noqa: BLE001 - exiting: the script's own result stands
        pass


def install() -> None:
    """Register the exit hook once per process (idempotent, cheap, imports nothing)."""
    global _installed
    if not _installed:
        _installed = True
        atexit.register(_teardown)
