"""torch's C++ log level in the launcher's own process, where every store failure is reported in one line.

Usage (by :mod:`.jobstore`, before the launcher's multi-node store clients connect)::

    cpplog.quiet_launcher()   # c10's level FATAL in this process, unless the user set TORCH_CPP_LOG_LEVEL

A TCPStore client that cannot reach node 0 (nothing listens yet, a firewall, another torch
release's store) logs its error at ERROR with the C++ stack trace before it raises, about 30
lines on the console above the launcher's own one-line error; so does every failed retry. The
launcher reports every store failure itself, so in its own process only fatal C++ messages are
shown. The fork server and the workers keep the level they started with. A level below ERROR the
user set in ``TORCH_CPP_LOG_LEVEL`` (read when this module is imported, before the launcher sets
its own default), INFO or WARNING, is kept everywhere.
"""

from __future__ import annotations

import os

ENV = "TORCH_CPP_LOG_LEVEL"
USER_LEVEL = os.environ.get(ENV)
"""The user's own setting, read before the launcher sets a default for its fork server."""
ERROR, FATAL = 2, 3
"""c10's levels for ``TORCH_CPP_LOG_LEVEL=ERROR`` and ``FATAL`` (INFO 0, WARNING 1, ERROR 2, FATAL 3)."""
_NO_MORE_THAN_ERRORS = frozenset({"ERROR", "FATAL", "2", "3"})
"""Settings that ask for errors at most (the launcher's own default for its fork server is ERROR,
and a process it started, a test's worker among them, may pass that on): the launcher reports its
own errors, so its process shows fatal ones only."""


def set_level(level: int) -> bool:
    """Set c10's log level in this process (torch imported); False where this build of torch hides it."""
    import ctypes

    import torch

    try:
        c10 = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so"))
        ctypes.c_int.in_dll(c10, "FLAGS_caffe2_log_level").value = level
    except (OSError, ValueError):  # another build of torch: its messages stay visible
        return False
    return True


def quiet_launcher() -> None:
    """Only fatal C++ messages in this process, unless the user asked for more than errors (module docstring)."""
    if (USER_LEVEL or "ERROR").strip().upper() in _NO_MORE_THAN_ERRORS:
        set_level(FATAL)
