"""torch's C++ log level (c10's ``TORCH_CPP_LOG_LEVEL``) in the launcher, its fork server and its workers.

Usage::

    cpplog.default_for_later()      # fork server started as a new interpreter: ERROR once torch loads here
    cpplog.quiet_loaded()           # fork server forked from here, torch loaded: ERROR here and for children
    cpplog.quiet_launcher()         # (.store) c10's level FATAL in this process before store clients connect
    with cpplog.kept(): ...         # (.api) the caller's process gets its variable and level back afterwards

A TCPStore client that cannot reach node 0 (nothing listens yet, a firewall, another torch
release's store) logs its error at ERROR with the C++ stack trace before it raises, about 30
lines on the console above the launcher's own one-line error; so does every failed retry. The
launcher reports every store failure itself, so in its own process only fatal C++ messages are
shown. A fork server forked from the launcher, and so its workers, get ERROR (TCPStore's reverse
look-ups and other warnings stay off the job's console). A level below ERROR the user set in
``TORCH_CPP_LOG_LEVEL`` (read when this module is imported, before the launcher sets its own
default), INFO or WARNING, is kept everywhere. The launcher's API (:func:`npu_migrate.launch.spawn`) runs in a process that goes on
after the job: :func:`kept` gives it back the variable and c10's level it had.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

ENV = "TORCH_CPP_LOG_LEVEL"
USER_LEVEL = os.environ.get(ENV)
"""The user's own setting, read before the launcher sets a default for its fork server."""
ERROR, FATAL = 2, 3
"""c10's levels for ``TORCH_CPP_LOG_LEVEL=ERROR`` and ``FATAL`` (INFO 0, WARNING 1, ERROR 2, FATAL 3)."""
_NO_MORE_THAN_ERRORS = frozenset({"ERROR", "FATAL", "2", "3"})
"""Settings that ask for errors at most (the launcher's own default for its fork server is ERROR,
and a process it started, a test's worker among them, may pass that on): the launcher reports its
own errors, so its process shows fatal ones only."""
_before: list[int] = []
"""c10's level before this module first changed it in this process (empty: not changed)."""


def _flag():  # -> ctypes.c_int | None
    """c10's ``FLAGS_caffe2_log_level`` in this process (torch loaded); None where this build hides it."""
    import ctypes

    import torch

    try:
        c10 = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so"))
        return ctypes.c_int.in_dll(c10, "FLAGS_caffe2_log_level")
    except (OSError, ValueError):  # another build of torch: its messages stay visible
        return None


def level() -> int | None:
    """c10's log level in this process (torch imported); None where this build of torch hides it."""
    flag = _flag()
    return None if flag is None else flag.value


def set_level(level: int) -> bool:
    """Set c10's log level in this process (torch imported); False where this build of torch hides it."""
    flag = _flag()
    if flag is None:
        return False
    if not _before:
        _before.append(flag.value)
    flag.value = level
    return True


def default_for_later() -> None:
    """ERROR in this process once it imports torch (c10 reads the variable then), and in the
    processes it starts from now on, unless the user set a level."""
    os.environ.setdefault(ENV, "ERROR")


def quiet_loaded() -> None:
    """ERROR in this process, whose torch is loaded already, and for what it starts later.

    c10 read ``TORCH_CPP_LOG_LEVEL`` when torch loaded here, with the user's setting, which a fork
    server forked from this process and its workers keep. Unless the user set one, c10's level
    becomes ERROR through its exported flag (the variable the setting is read into), and the
    variable too, for the processes started later.
    """
    if ENV in os.environ:
        return
    os.environ[ENV] = "ERROR"
    set_level(ERROR)


def quiet_launcher() -> None:
    """Only fatal C++ messages in this process, unless the user asked for more than errors (module docstring)."""
    if (USER_LEVEL or "ERROR").strip().upper() in _NO_MORE_THAN_ERRORS:
        set_level(FATAL)


@contextmanager
def kept() -> Iterator[None]:
    """Give this process back its ``TORCH_CPP_LOG_LEVEL`` and c10's level when the block ends."""
    variable = os.environ.get(ENV)
    try:
        yield
    finally:
        if variable is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = variable
        if _before and "torch" in sys.modules:
            flag = _flag()
            if flag is not None:
                flag.value = _before.pop()
