"""The fork server that has torch imported before the launcher does, so a worker costs one fork.

Usage::

    method = start_fork_server()   # before anything imports torch in the launcher
    ...                            # torch.multiprocessing.start_processes(..., start_method=method)
    stop_fork_server()             # once every worker is reaped

The fork server imports :mod:`npu_migrate._preload` (torch, quietly) once. Importing this module
inside the fork server registers :func:`kill_worker_groups` to run at its exit (:func:`arm_exit`), so killing the
launcher (even with SIGKILL) takes every worker's process group with it.

**Forked from the launcher: one ``import torch`` per job, not two.** multiprocessing starts its
fork server as a new interpreter (``python -c "from multiprocessing.forkserver import main;
main(...)"``) that imports the preload, torch included, while the launcher imports torch too.
Where this process is still in the state a new interpreter would start in, :func:`start_forked`
does both with one import. Measured (7 alternating pairs of ``python -m npu_migrate.launch --device
cpu --device-num 2`` on a script that only reports its start, against
``NPU_MIGRATE_START_METHOD=forkserver-fresh``; 2 shared cores, torch 2.14, Python 3.11): rank 0 runs
the script 1.49 s after the launcher starts instead of 2.84 s (median; the pairs differ by 0.07 to
1.70 s, the least when the two imports find a core each), the whole process tree uses 1.68 s of CPU
instead of 3.08 s, and the job's processes hold 387 MB (PSS, at the script's start) instead of
686 MB. How:

1. it imports here what :mod:`npu_migrate._preload` imports in a fork server (torch without
   device extensions, the start-up hooks held: :func:`npu_migrate._torch_hook.import_held`);
2. it lets multiprocessing start its fork server as usual, but the one call that would start the
   interpreter forks this process instead; the child gives up what a new interpreter would not
   have (file descriptors, Python signal handlers, the fault handler, the job secret) and runs
   multiprocessing's own ``main`` with the arguments multiprocessing wrote for it. The exit handlers
   the imports registered (logging's, multiprocessing's, ``weakref.finalize``'s, torch's DataLoader
   flag, :mod:`npu_migrate._exit`) stay: a new interpreter's fork server registers the same ones
   importing the same modules, and each rank runs them at its end as Python would (:mod:`.worker`);
3. this process then loads the device extensions and runs the held hooks
   (:func:`npu_migrate._torch_hook.resume`), as each worker does, and keeps torch's C++ warnings off
   the launcher's console (:func:`npu_migrate.launch.cpplog.quiet_loaded`).

"Still in that state" means: Linux, one thread, torch not imported yet, and the environment it
started with (``/proc/self/environ``), ``TORCH_DEVICE_BACKEND_AUTOLOAD`` aside (the preload sets
it itself), ``NPU_MIGRATE_JOB_SECRET_FD`` (a descriptor's number, which the launcher reads and
takes out) and what the launcher's features export for the workers where each of them says what
to arm in the fork server instead (``--migrate`` and ``--probe`` export a start-up hook that a new
interpreter's ``sitecustomize`` arms; the forked fork server arms it itself, and it waits for each
worker's ``resume`` there). Anything else keeps multiprocessing's new interpreter: an API caller
that imported torch; a feature that exports variables and does not say what they arm; a job
secret still in ``NPU_MIGRATE_JOB_SECRET``, which the launcher takes out of the environment (a
forked child's ``/proc/PID/environ``, what ``ps e`` shows, would still hold it; a launcher started
from the command line runs itself again without it first, :mod:`..nodes.secret`); another Python whose
fork server command this module cannot read; ``NPU_MIGRATE_START_METHOD=forkserver-fresh``.
"""

from __future__ import annotations

import ast
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from npu_migrate import autoload
from npu_migrate.launch.nodes import secret
from npu_migrate.launch import cpplog

PRELOAD = ["npu_migrate._preload"]
"""Imported once by the fork server; every worker forked from it starts with torch loaded. The
module imports torch quietly: if torch cannot be imported (a broken torch_npu auto-loaded), the
launcher's own import says so in one line, and nothing is forked."""
PRELOADED = ("torch", "torch.distributed", "torch.multiprocessing", "npu_migrate.device", "npu_migrate.distributed",
             "npu_migrate.launch.procs.forkserver", "npu_migrate.launch.procs.worker")
"""What the preload imports (:func:`npu_migrate._torch_hook.import_held`): torch and what a worker uses
first; this module registers the workers' cleanup at the fork server's exit."""


START_METHOD_ENV = "NPU_MIGRATE_START_METHOD"
FRESH = "forkserver-fresh"
"""``NPU_MIGRATE_START_METHOD``'s value that keeps multiprocessing's own fork server start."""
_SET_BY_PRELOAD = frozenset({autoload.ENV_AUTOLOAD})
_TAKEN_OUT = frozenset({secret.FD_ENV})
"""Variables the launcher takes out of its environment that a forked child may still show: a
descriptor's number, nothing secret."""


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
    (:func:`start_forked`), else multiprocessing starts the fork server as a new interpreter.

    Args:
        exported: variables the launcher's features set for the workers since it started.
        arm: what a fork server forked from here runs for them before its first worker (what a new
            interpreter's start-up would arm); None: with ``exported``, a new interpreter it is.
    """
    method = os.environ.get(START_METHOD_ENV, "forkserver")
    if method in ("forkserver", FRESH) and "forkserver" in multiprocessing.get_all_start_methods():
        from multiprocessing import forkserver

        _short_socket_dir()
        forkserver.set_forkserver_preload(PRELOAD)
        if not start_forked(PRELOADED, arm_exit, exported, arm):  # one import of torch, where it can
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


# -- the fork server forked from the launcher

class _Unreadable(Exception):
    """multiprocessing's fork server command is not the one this module knows how to run."""


def initial_environ() -> dict[str, str] | None:
    """The environment this process started with (None where /proc cannot say)."""
    try:
        with open("/proc/self/environ", "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    return {os.fsdecode(key): os.fsdecode(value) for key, sep, value in
            (item.partition(b"=") for item in raw.split(b"\0")) if sep}


def _as_if_new(exported: Collection[str] = ()) -> bool:
    """Whether a child forked now would start like a new interpreter (the module docstring says when),
    the variables in ``exported`` aside (the caller arms what they would arm at start-up)."""
    if not sys.platform.startswith("linux") or "torch" in sys.modules:
        return False
    if os.environ.get(START_METHOD_ENV, "forkserver") != "forkserver":  # FRESH, or spawn
        return False
    try:
        if threading.active_count() != 1 or len(os.listdir("/proc/self/task")) != 1:
            return False
    except OSError:
        return False
    initial = initial_environ()
    if initial is None:
        return False
    # Removed variables count too: a forked child's /proc/PID/environ (what `ps e` shows) is still
    # the block this process started with, so a job secret read from there would reach every worker.
    aside = _SET_BY_PRELOAD | frozenset(exported)
    return ({k: v for k, v in initial.items() if k not in aside | _TAKEN_OUT}
            == {k: v for k, v in os.environ.items() if k not in aside})


def _server_call(args: list[str]) -> tuple[list[Any], dict[str, Any]]:
    """The positional and keyword arguments of ``main(...)`` in multiprocessing's ``-c`` command.

    Read with :func:`ast.literal_eval`, never executed; anything but ``from
    multiprocessing.forkserver import main; main(<literals>, **<literal dict>)`` is refused.
    """
    try:
        tree = ast.parse(args[args.index("-c") + 1])
        imported, called = tree.body
        call = called.value  # type: ignore[attr-defined]
        if not (isinstance(imported, ast.ImportFrom) and imported.module == "multiprocessing.forkserver"
                and [(a.name, a.asname) for a in imported.names] == [("main", None)]
                and isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "main"):
            raise _Unreadable(args)
        positional = [ast.literal_eval(arg) for arg in call.args]
        keywords: dict[str, Any] = {}
        for keyword in call.keywords:
            value = ast.literal_eval(keyword.value)
            if keyword.arg is None:
                if not isinstance(value, dict):
                    raise _Unreadable(args)
                keywords.update(value)
            else:
                keywords[keyword.arg] = value
    except (ValueError, SyntaxError, TypeError, AttributeError, IndexError) as exc:
        raise _Unreadable(args) from exc
    return positional, keywords


def _drop_what_a_new_interpreter_lacks(keep: set[int], arm_exit: Callable[[], None]) -> None:
    """In the forked child: undo what this launcher set up that a new interpreter would not have.

    Exit handlers stay: those registered so far are the imports' own (a launcher started from the
    command line registers none of its own before it starts the fork server), which a new
    interpreter's fork server registers too.
    """
    import faulthandler
    from multiprocessing import resource_tracker

    for signum in signal.valid_signals():
        try:
            handler = signal.getsignal(signum)
        except (OSError, ValueError):
            continue
        if callable(handler) and handler is not signal.default_int_handler:  # exec resets handled signals
            signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)
    signal.set_wakeup_fd(-1)
    if not (os.environ.get("PYTHONFAULTHANDLER") or "faulthandler" in getattr(sys, "_xoptions", {})):
        faulthandler.disable()
    secret.use_secret(None)  # read before the fork; the fork server and workers never held it
    tracker = getattr(resource_tracker, "_resource_tracker", None)
    for attr in ("_fd", "_pid"):  # the launcher's tracker; the workers get theirs from the launcher
        if hasattr(tracker, attr):
            setattr(tracker, attr, None)
    arm_exit()
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass


def _fork_server(args: list[str], passfds: list[int], arm_exit: Callable[[], None],
                 arm: Callable[[], None] | None, spawnv_passfds: Callable[..., int]) -> int:
    """Fork this process and run multiprocessing's fork server ``main`` in the child (after ``arm``);
    return its pid. The child gets multiprocessing's own ``spawnv_passfds`` back: a rank's own fork
    server (a DataLoader's ``forkserver`` context) is a new interpreter, as under torchrun."""
    positional, keywords = _server_call(args)
    from multiprocessing import forkserver, util

    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        util.spawnv_passfds = spawnv_passfds
        _drop_what_a_new_interpreter_lacks(set(passfds), arm_exit)
        if arm is not None:
            arm()  # what the features' variables arm at a new interpreter's start-up
        forkserver.main(*positional, **keywords)
        code = 0
    except SystemExit as exc:  # main's way out: every launcher end of the alive pipe closed
        code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    except BaseException:  # noqa: BLE001 - as a new interpreter would print it
        sys.excepthook(*sys.exc_info())
    finally:
        try:
            import atexit

            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)
    return 0  # not reached


@contextmanager
def _forking_spawn(arm_exit: Callable[[], None], arm: Callable[[], None] | None) -> Iterator[None]:
    """While inside: multiprocessing's ``spawnv_passfds`` forks this process for the fork server.

    Where multiprocessing's command is not one :func:`_server_call` reads, the call starts the new
    interpreter as usual.
    """
    from multiprocessing import util

    spawn = util.spawnv_passfds

    def fork_or_spawn(path: str, args: list[str], passfds: Any) -> int:
        try:
            return _fork_server(list(args), list(passfds), arm_exit, arm, spawn)
        except _Unreadable:
            return spawn(path, args, passfds)

    util.spawnv_passfds = fork_or_spawn
    try:
        yield
    finally:
        util.spawnv_passfds = spawn


def start_forked(preloaded: Sequence[str], arm_exit: Callable[[], None], exported: Collection[str] = (),
          arm: Callable[[], None] | None = None) -> bool:
    """Start multiprocessing's fork server as a fork of this process, after one ``import torch``.

    Args:
        preloaded: what the fork server's preload imports, imported here instead.
        arm_exit: registers the fork server's own exit handler, called in the fork server.
        exported: variables the launcher's features set since this process started.
        arm: run in the fork server before its first worker, for those variables: what a new
            interpreter's start-up hook would arm (migration, the probe, waiting for the workers'
            ``resume``). None: with ``exported``, the fork server starts as a new interpreter.

    Call with the fork server's preload set (:data:`PRELOAD`) and
    before this process imports torch. When the preload is imported again in the fork server,
    it finds everything imported already. Returns False, having done nothing, where a forked child
    would not start as a new interpreter does (the module docstring says when); True once the fork
    server runs and this process has torch with its device extensions and hooks.

    Raises:
        Exception: what ``import torch`` raises here (the launcher explains it in one line); the
            fork server is not started then.
        RuntimeError: torch's "Failed to load the backend extension" after the fork server started.
    """
    if not _as_if_new(exported if arm is not None else ()):
        return False
    from multiprocessing import forkserver

    from npu_migrate import _torch_hook

    _torch_hook.import_held(preloaded)  # what the preload imports; an error here is the launcher's
    with _forking_spawn(arm_exit, arm):
        forkserver.ensure_running()
    cpplog.quiet_loaded()
    _torch_hook.resume()
    return True
