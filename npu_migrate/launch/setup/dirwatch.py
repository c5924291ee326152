"""Waiting for a directory to change: inotify where Linux has it, a short poll elsewhere.

Usage::

    watch = DirectoryWatch("/user/serverid/devindex/config")   # before the first read of a file there
    try:
        while not ready():
            watch.wait(seconds_left)        # returns on a change, or after the time (at most POLL_S without inotify)
    finally:
        watch.close()

inotify is called through ``ctypes`` (libc's ``inotify_init1``/``inotify_add_watch``): no extra
dependency. It watches the directory rather than the file, so a ConfigMap mount that swaps a
symlink and a writer that replaces the file are both seen. Used by
:func:`npu_migrate.launch.setup.ranktable.wait_for_table`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import select
import time

POLL_S = 1.0
"""Re-read interval where inotify is missing: the operator writes once, so a second costs nothing."""


class DirectoryWatch:
    """Blocks until something in a directory changes (inotify), or a timeout passes."""

    _MASK = 0x2 | 0x4 | 0x8 | 0x80 | 0x100 | 0x200 | 0x400 | 0x800  # modify attrib close_write moved create delete

    def __init__(self, directory: str) -> None:
        self.fd = -1
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
            if fd >= 0 and libc.inotify_add_watch(fd, os.fsencode(directory), self._MASK) >= 0:
                self.fd = fd
            elif fd >= 0:
                os.close(fd)
        except (OSError, AttributeError):
            self.fd = -1

    def wait(self, seconds: float) -> None:
        if self.fd < 0:
            time.sleep(min(seconds, POLL_S))
            return
        ready, _, _ = select.select([self.fd], [], [], max(0.0, seconds))
        if ready:
            try:
                os.read(self.fd, 65536)
            except BlockingIOError:
                pass

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
