"""The fork server that has torch imported before the launcher does, so a worker costs one fork.

Usage::

    method = start_fork_server()   # before anything imports torch in the launcher
    ...                            # torch.multiprocessing.start_processes(..., start_method=method)
    stop_fork_server()             # once every worker is reaped

The fork server imports :mod:`npu_migrate._preload` (torch, quietly) once. Importing this module
inside the fork server registers :func:`kill_worker_groups` to run at its exit (:func:`arm_exit`), so killing the
launcher (even with SIGKILL) takes every worker's process group with it.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
from collections.abc import Callable, Collection

from npu_migrate.launch.procs import cpplog, forked_server

PRELOAD = ["npu_migrate._preload"]
"""Imported once by the fork server; every worker forked from it starts with torch loaded. The
module imports torch quietly: if torch cannot be imported (a broken torch_npu auto-loaded), the
launcher's own import says so in one line, and nothing is forked."""
PRELOADED = ("torch", "torch.distributed", "torch.multiprocessing", "npu_migrate.device", "npu_migrate.distributed",
             "npu_migrate.launch.procs.forkserver", "npu_migrate.launch.procs.worker")
"""What the preload imports (:func:`npu_migrate._torch_hook.import_held`): torch and what a worker uses
first; this module registers the workers' cleanup at the fork server's exit."""


def in_fork_server() -> bool:
    """True while multiprocessing's fork server imports this module as a preload."""
    frame = sys._getframe()
    suffix = os.path.join("multiprocessing", "forkserver.py")
    while frame is not None:
        if frame.f_code.co_name == "main" and frame.f_code.co_filename.endswith(suffix):
            return True
        frame = frame.f_back
    return False


_server_pid = 0
"""The fork server's pid, once :func:`arm_exit` ran there (0 elsewhere)."""


def arm_exit() -> None:
    """In the fork server: :func:`kill_worker_groups` at its exit.

    The workers it forks inherit the registration: there it does nothing, so a rank's exit handlers
    (which the worker runs as Python would, :mod:`.worker`) never kill what the rank started.
    """
    import atexit

    global _server_pid
    _server_pid = os.getpid()
    atexit.register(kill_worker_groups)


def kill_worker_groups() -> None:
    """Fork server exit: SIGKILL the process group of every worker it forked.

    The fork server exits when the launcher does, even by SIGKILL (its pipe to the launcher
    closes). PR_SET_PDEATHSIG then kills each worker, but not what a worker started; each
    worker leads its own session and process group, so killing the groups here takes those too.
    Anywhere but the fork server (a worker forked from it) it does nothing.
    """
    if os.getpid() != _server_pid:
        return
    children: set[int] = set()
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/children", encoding="ascii") as fh:
                children.update(int(pid) for pid in fh.read().split())
        except OSError:
            continue
    for pid in children:
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, signal.SIGKILL)
            except OSError:
                pass


if sys.platform.startswith("linux") and in_fork_server():
    arm_exit()


UNIX_PATH_MAX = 107
"""Bytes in an AF_UNIX socket path on Linux (108 with the NUL): the fork server listens on one."""
_LISTENER_SUFFIX = len("/pymp-xxxxxxxx/listener-xxxxxxxx")
"""What multiprocessing adds to the temporary directory for the fork server's socket."""
_SHORT_TEMP_DIRS = ("/tmp", "/var/tmp", "/dev/shm")


def _short_socket_dir() -> None:
    """Keep the fork server's socket path within AF_UNIX's limit under a long ``TMPDIR``.

    multiprocessing puts the socket in a ``pymp-*`` directory under the temporary directory, and
    Python before 3.12 fails with "AF_UNIX path too long" (a traceback, no job) when ``TMPDIR`` is
    long, as under a CI runner's or pytest's nested temporary directories. Then that one directory
    goes to the first short system temporary directory instead; everything else the launcher writes
    stays under ``TMPDIR``.
    """
    import tempfile
    from multiprocessing import util

    if len(os.fsencode(tempfile.gettempdir())) + _LISTENER_SUFFIX <= UNIX_PATH_MAX:
        return
    for candidate in _SHORT_TEMP_DIRS:
        if os.path.isdir(candidate) and os.access(candidate, os.W_OK | os.X_OK):
            saved, tempfile.tempdir = tempfile.tempdir, candidate
            try:
                util.get_temp_dir()  # made now, under candidate; multiprocessing keeps it for the process
            finally:
                tempfile.tempdir = saved
            return


def start_fork_server(exported: Collection[str] = (), arm: Callable[[], None] | None = None) -> str:
    """Start the fork server that preloads torch; return the method. Call before this process imports
    torch: where it can, this process imports torch here and forks itself into the fork server
    (:mod:`.forked_server`), else multiprocessing starts the fork server as a new interpreter.

    Args:
        exported: variables the launcher's features set for the workers since it started.
        arm: what a fork server forked from here runs for them before its first worker (what a new
            interpreter's start-up would arm); None: with ``exported``, a new interpreter it is.
    """
    method = os.environ.get(forked_server.START_METHOD_ENV, "forkserver")
    if method in ("forkserver", forked_server.FRESH) and "forkserver" in multiprocessing.get_all_start_methods():
        from multiprocessing import forkserver

        _short_socket_dir()
        forkserver.set_forkserver_preload(PRELOAD)
        if not forked_server.start(PRELOADED, arm_exit, exported, arm):  # one import of torch, where it can
            forkserver.ensure_running()
            cpplog.default_for_later()  # this process imports torch after this: c10 reads it then
        return "forkserver"
    return "spawn"


def stop_fork_server() -> None:
    """End the fork server at once: nothing more will be launched from it.

    It holds this process's stdout and stderr (while it imports torch, or winds down); a caller
    reading them (a pipe, `| tee`, a test) would otherwise wait seconds for it.
    """
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    pid = getattr(server, "_forkserver_pid", None)
    if pid:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except OSError:
            pass
        # Let multiprocessing start a fresh one if this process launches again.
        for attr, value in (("_forkserver_pid", None), ("_forkserver_address", None)):
            if hasattr(server, attr):
                setattr(server, attr, value)
        alive = getattr(server, "_forkserver_alive_fd", None)
        if alive is not None:
            try:
                os.close(alive)
            except OSError:
                pass
            server._forkserver_alive_fd = None
