"""Hints about a script's failure from the machinery running in the script's own process.

Usage::

    from npu_migrate import failure_hints

    failure_hints.hint(exc)   # the first registered hint for the script's uncaught ``exc``, or None

    # machinery in the process adds its hinter, hinter(exc) -> str | None, undone as the rest of it:
    patch(failure_hints, "HINTERS", (*failure_hints.HINTERS, hinter))   # npu_migrate.migrate.state.patch

Two things report a script's uncaught exception: ``npu-migrate run`` (the hint is the last line
of the traceback) and the launcher's worker (the rank's failure record, whose hint the launcher's
failure summary and ``--error-file`` show, :class:`npu_migrate.launch.procs.failure.Failure`). What only
the failing process knows, such as runtime migration's record of which library asked ``torch.cuda``
and got torch's own answer (:mod:`npu_migrate.migrate.libraries.library_failure`), reaches them through this
module, so the launcher imports no feature and no feature imports the launcher. It imports nothing.
"""

from __future__ import annotations

from typing import Callable, Optional

Hinter = Callable[[BaseException], Optional[str]]
"""Given the script's uncaught exception, one line on what to do about it, or None."""

HINTERS: tuple[Hinter, ...] = ()
"""The hinters in this process, asked in order (a tuple: replaced whole, so it can be put back)."""


def hint(exc: BaseException) -> str | None:
    """The first hint a registered hinter gives for ``exc``, or None.

    A hinter that raises gives no hint: the failure is reported all the same.
    """
    for hinter in HINTERS:
        try:
            line = hinter(exc)
        except Exception:  # noqa: BLE001 - a hint is never worth losing the failure's own report
            continue
        if line:
            return line
    return None
