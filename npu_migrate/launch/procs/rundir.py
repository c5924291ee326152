"""The launcher's run directory: made private, locked while its launcher lives, removed by the next one if left.

Usage::

    path = create()      # $TMPDIR/npu_migrate_launch_<pid>_XXXX, mode 0700; stale ones removed first
    new_attempt(path)    # before each start of the ranks: only the launcher's own files stay
    error_record(path, 3)   # path/rank3.json, what rank 3 raised (written by :mod:`.worker`)
    remove(path)         # at the end of the job

**Files** (one run directory per launcher; the modules named write and read them):

======================== ================================================================
``.lock``                held (``flock``) by the launcher while it lives (below)
``launcher.json``        the launcher's pid and start time (:mod:`..hangs.stacks`, ``npu-migrate stacks``)
``rank<N>.json``         what rank N raised: type, message, traceback, time (:mod:`.worker`)
``flight-rank<N>.bin``   rank N's flight record (:mod:`..hangs.flight`)
``stacks-rank<N>.txt``,
``fatal-rank<N>.txt``    rank N's stacks on request and at a fatal signal (:mod:`..hangs.stacks`)
``stacks.txt``           the launcher's latest dump of every stack (:mod:`..hangs.stacks`)
others                   the ranks' output FIFOs (:mod:`.output`), pre-flight results (:mod:`.preflight`)
======================== ================================================================

Everything but ``.lock`` and ``launcher.json`` belongs to one attempt of the ranks and goes
before the next one (:func:`new_attempt`).

**Who is alive.** The launcher holds an exclusive ``flock`` on ``.lock`` in its directory for as
long as it runs; the kernel drops the lock when the process dies, SIGKILL included, so a lock
another launcher can take means the owner is gone. The lock file is made under a temporary name,
locked, then renamed to ``.lock``: a ``.lock`` that exists is locked from the start. A directory
without ``.lock`` (its launcher died between making it and locking it, or predates the lock) is
stale when no process has the pid in its name. Only directories of this user, not symbolic links,
are considered, and they are removed with :func:`shutil.rmtree`, which does not follow links.
"""

from __future__ import annotations

import fcntl
import glob
import logging
import os
import shutil
import stat
import tempfile

logger = logging.getLogger(__name__)

PREFIX = "npu_migrate_launch_"
"""Run directories are ``<tempdir>/npu_migrate_launch_<pid>_<random>``."""

LOCK = ".lock"
"""The lock file: held by the launcher for as long as it runs."""

LAUNCHER = "launcher.json"
"""The launcher's pid and start time (:func:`.stacks.mark_launcher`)."""

_KEPT = (LOCK, LAUNCHER)
"""What stays from one attempt of the ranks to the next."""

_held: dict[str, int] = {}  # run directory -> the descriptor holding its lock


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _is_stale(path: str) -> bool:
    lock = os.path.join(path, LOCK)
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        pid = os.path.basename(path)[len(PREFIX):].split("_", 1)[0]
        return pid.isdigit() and not _pid_alive(int(pid))
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False  # its launcher holds it
    finally:
        os.close(fd)  # closing drops a lock we took
    return True


def remove_stale(tmp: str | None = None) -> list[str]:
    """Remove run directories of this user whose launcher is gone; return them."""
    removed = []
    for path in glob.glob(os.path.join(tmp or tempfile.gettempdir(), PREFIX + "*")):
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or path in _held:
            continue
        if _is_stale(path):
            shutil.rmtree(path, ignore_errors=True)
            logger.info("removed %s, left by a launcher that is gone", path)
            removed.append(path)
    return removed


def create() -> str:
    """A new private run directory, locked by this process (stale ones of this user removed first)."""
    remove_stale()
    path = tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}_")
    fd, tmp = tempfile.mkstemp(dir=path, prefix=".lock-")
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.rename(tmp, os.path.join(path, LOCK))
    _held[path] = fd
    return path


def error_record(path: str, rank: int) -> str:
    """Where rank ``rank`` records what it raised (:mod:`.worker` writes it, the launcher reads it)."""
    return os.path.join(path, f"rank{rank}.json")


def new_attempt(path: str) -> None:
    """Remove every file of the last attempt of the ranks (records, dumps, FIFOs): the next starts clean."""
    for name in os.listdir(path):
        if name not in _KEPT:
            os.unlink(os.path.join(path, name))


def remove(path: str) -> None:
    """Remove the run directory and drop its lock (the end of the job)."""
    shutil.rmtree(path, ignore_errors=True)
    fd = _held.pop(path, None)
    if fd is not None:
        os.close(fd)
