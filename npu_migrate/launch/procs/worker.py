"""The worker's bootstrap: what runs in each forked process before and around the user's script.

Usage (by the supervisor, in the launcher)::

    torch.multiprocessing.start_processes(worker_main, args=(cfg, target, restart, os.getpid(), error_dir),
                                          nprocs=cfg.nproc, join=False, start_method="forkserver")

In order, :func:`worker_main`:

1. ties the worker to the launcher (own session and process group, PR_SET_PDEATHSIG, a watcher thread);
2. :func:`prepare`: sets the rank's environment, sends stdout/stderr to the launcher's relay
   (:mod:`.output`; FIFOs in ``error_dir``, the job's private run directory), binds the rank to
   its CPUs (``--cpu-binding``; on one CPU, gloo's transport thread gives way: :mod:`.gloo_io`), sets
   torch's threads and binds the device; new per-worker steps belong here;
3. arms the rank's flight record and stack dumps (:mod:`..hangs.flight`, :mod:`..hangs.stacks`) in the
   launcher's run directory (``error_dir``): no change to the user's script;
4. runs the script (``runpy``), module or function, in a process that multiprocessing sees as a
   main process (:func:`_as_a_new_process`: start method, fork server, resource tracker as a new
   interpreter has them);
5. on an exception, writes ``error_dir/rank{N}.json`` (type, message, traceback, time, and the hint
   of :mod:`npu_migrate.failure_hints`) for the launcher's report and exits 1;
6. waits for the script's non-daemon threads and runs its exit handlers, as Python does at exit.
"""

from __future__ import annotations

import ctypes
import json
import multiprocessing.process
import os
import signal
import socket
import sys
import threading
import time
import traceback
from typing import Any

from npu_migrate import failure_hints
from npu_migrate.launch.nodes import secret, servers
from npu_migrate.launch.procs import gloo_io, output, rundir
from npu_migrate.launch.setup.config import LaunchConfig
from npu_migrate.launch.setup.target import Target
from npu_migrate.log import ENV_RELAY_PREFIX

_PR_SET_PDEATHSIG = 1
_LAUNCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # launch/, all its wings


def _own_session() -> None:
    """Lead a new session (and process group), away from the terminal, as torchrun's workers do.

    - Signals typed on the terminal (Ctrl-C, Ctrl-\\, Ctrl-Z) go to its foreground job, the
      launcher, which stops the ranks in order; a rank never gets them half-way through a collective.
    - A rank has no controlling terminal, so reading or configuring it (a prompt, a pager, ``stty``
      in a subprocess) fails at once (ENXIO) instead of stopping the rank with SIGTTIN/SIGTTOU, as
      it would in a background process group of the launcher's session: a hang with no message.
      A terminal on stdin is swapped for ``/dev/null`` too: the user's keystrokes are the launcher's.
    - The rank leads its group (pgid == pid): the launcher kills it and everything it started with
      one ``killpg``.
    """
    try:
        os.setsid()
    except OSError:  # already a group leader (not the case when forked by the launcher): a group then
        try:
            os.setpgid(0, 0)
        except OSError:
            pass
    if os.isatty(0):
        devnull = os.open(os.devnull, os.O_RDONLY)
        try:
            os.dup2(devnull, 0)
        finally:
            os.close(devnull)


def _die_with_launcher(launcher_pid: int) -> None:
    """Make sure this worker, and what it started, cannot outlive the launcher."""
    _own_session()
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(0.5)
            try:
                os.kill(launcher_pid, 0)
                gone = os.getppid() != parent
            except ProcessLookupError:
                gone = True
            except PermissionError:
                gone = False
            if gone:
                try:
                    os.killpg(os.getpgrp(), signal.SIGKILL)
                finally:
                    os._exit(137)

    threading.Thread(target=watch, name="npu_migrate-launcher-watch", daemon=True).start()


class _MainProcess(multiprocessing.process.BaseProcess):
    """What ``multiprocessing.current_process()`` is in a new interpreter (multiprocessing deletes its
    own class once its one instance exists): ``MainProcess``, no parent, a new authentication key."""

    def __init__(self) -> None:  # noqa: D107 - as multiprocessing.process._MainProcess
        self._identity = ()
        self._name = "MainProcess"
        self._parent_pid = None
        self._popen = None
        self._closed = False
        self._config = {"authkey": multiprocessing.process.AuthenticationString(os.urandom(32)),
                        "semprefix": "/mp"}

    def close(self) -> None:
        pass


def _as_a_new_process() -> None:
    """Give the rank multiprocessing's state as ``python train.py`` (torchrun's rank) starts with it.

    A worker is forked from the launcher's fork server, and multiprocessing would tell the user's
    code so: the start method forced to ``forkserver`` (torchrun leaves Python's default, ``fork``
    on Linux before Python 3.14, and a script without a ``__main__`` guard relies on it), the fork
    server's address, alive descriptor and (in a fork server forked from the launcher) its lock
    still held, the launcher's resource tracker, a ``ForkServerProcess-N`` with a parent instead of
    the ``MainProcess``. Then a DataLoader with workers in a ``forkserver`` context waited for good
    on that lock, and its workers in the default context re-ran an unguarded script. Here the rank
    becomes a main process: its own start method, fork server and resource tracker when it first
    needs them, as a new interpreter gets them. The descriptors of the launcher's fork server and
    resource tracker are closed.
    """
    import itertools
    from multiprocessing import forkserver, process, resource_tracker

    server = forkserver._forkserver
    if server._forkserver_alive_fd is not None:  # the launcher's fork server's: not this rank's to keep open
        try:
            os.close(server._forkserver_alive_fd)
        except OSError:
            pass
    # Not the inherited descriptors: they are the rank's own arguments' pipes (torch < 2.2's error
    # queue), already unpickled and in use; only the record of them goes.
    server.__init__()  # type: ignore[misc]  # no address, no pid, a free lock, the default preload
    tracker = resource_tracker._resource_tracker
    if tracker._fd is not None:
        try:
            os.close(tracker._fd)
        except OSError:
            pass
    tracker.__init__()  # type: ignore[misc]
    process._current_process = _MainProcess()  # its own name, authentication key and temporary directory
    process._parent_process = None
    process._children = set()
    process._process_counter = itertools.count(1)
    multiprocessing.set_start_method(None, force=True)  # Python's default, decided at first use


def _exit_as_python_does() -> None:
    """After the user's code: wait for its non-daemon threads, then run its exit handlers.

    ``python train.py`` does both before it exits; a process multiprocessing forked ends with
    ``os._exit`` and runs neither, so an ``atexit`` handler, a ``weakref.finalize`` or a
    ``TemporaryDirectory`` of the script would be skipped in every rank.
    """
    import atexit

    # What Py_FinalizeEx does first: threading's own exit hooks (concurrent.futures' executors, which
    # an atexit handler may wait on: inductor's compile pool on torch 2.1), then the non-daemon threads.
    threading._shutdown()
    atexit._run_exitfuncs()


def _set_threads() -> None:
    """torch's intra-op threads from OMP_NUM_THREADS.

    The fork server imported torch before the launcher chose the value, so setting the variable
    alone has no effect on a forked worker: torch read it already.
    """
    value = os.environ.get("OMP_NUM_THREADS", "")
    if value.isdigit() and int(value) > 0:
        import torch

        if torch.get_num_threads() != int(value):
            torch.set_num_threads(int(value))


def _bind_cpus(cpus: tuple[int, ...]) -> None:
    """Run every thread of this rank on ``cpus`` (``--cpu-binding``, :mod:`..setup.binding`).

    ``sched_setaffinity(0)`` binds the calling thread only; the threads this worker has already
    (the launcher watch) are bound one by one, and every thread started later inherits the set.
    """
    if not cpus or not hasattr(os, "sched_setaffinity"):
        return
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cpus)
        except OSError:  # a thread that ended meanwhile
            pass


def _one_cpu() -> bool:
    """Whether this rank may run on one CPU only (its binding, or the launcher's own ``taskset``)."""
    try:
        return len(os.sched_getaffinity(0)) == 1
    except (AttributeError, OSError):
        return False


def prepare(local_rank: int, cfg: LaunchConfig, restart: int, run_dir: str | None = None) -> None:
    """Everything a worker needs before user code: environment, output, CPUs, threads, device."""
    os.environ.update(cfg.worker_env(local_rank, restart))
    cpus = cfg.binding.cpus[local_rank] if local_rank < len(cfg.binding.cpus) else ()
    _bind_cpus(cpus)
    # Node 0's launcher serves MASTER_PORT on the job's address; every rank is its client (:mod:`..nodes.servers`).
    os.environ[servers.AGENT_STORE_ENV] = "True"
    for name in (secret.SECRET_ENV, secret.FD_ENV):  # the launcher's alone: not the script's, nor its children's
        os.environ.pop(name, None)
    if cfg.output.relay and run_dir is not None:
        output.attach(run_dir, local_rank)  # stdout/stderr into the launcher's relay (:mod:`.output`)
        if cfg.output.prefix_template(cfg.world_size):
            os.environ[ENV_RELAY_PREFIX] = "1"  # the relay prefixes every line: setup_logging adds none
    _set_threads()
    if _one_cpu():
        gloo_io.install()  # on one CPU, gloo's transport thread would spin there until the next tick
    from npu_migrate import device as _device

    preload = sys.modules.get("npu_migrate._preload")  # present when forked from the fork server
    if preload is not None:
        preload.start_worker()  # the device extension and runtime migration start here, not in the fork server

    _device._clear_caches()  # the fork server may have detected with another environment
    if _device.device_spec().is_accelerator:
        _device.set_device(cfg.torchrun.device_index(local_rank))  # bound before any user code runs
    from npu_migrate.distributed import guard_destroy_process_group

    guard_destroy_process_group()  # before torch 2.8, freeing a destroyed group could deadlock


def _observe(run_dir: str, rank: int) -> None:
    """Stacks on SIGUSR1 (and at a fatal signal), then the flight record: the launcher watches both."""
    from npu_migrate.launch.hangs import flight, stacks

    stacks.arm(run_dir, rank)  # first: the launcher signals only ranks whose record exists
    flight.install(run_dir, rank)


def _run_target(local_rank: int, target: Target) -> None:
    import runpy

    if target.fn is not None:
        target.fn(local_rank, *target.args)
    elif target.module is not None:
        sys.argv = [target.module, *map(str, target.args)]
        sys.path.insert(0, os.getcwd())  # as `python -m` does
        runpy.run_module(target.module, run_name="__main__", alter_sys=True)
    else:
        script = os.path.abspath(str(target.script))
        sys.argv = [str(target.script), *map(str, target.args)]
        sys.path.insert(0, os.path.dirname(script))  # as `python script.py` does
        runpy.run_path(script, run_name="__main__")


def _user_frames(tb: Any) -> Any:
    """Skip the launcher's and runpy's frames at the top of a worker's traceback."""
    while tb is not None and (
        os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(_LAUNCH + os.sep)
        or "runpy" in tb.tb_frame.f_code.co_filename
    ):
        tb = tb.tb_next
    return tb


def worker_main(local_rank: int, cfg: LaunchConfig, target: Target, restart: int, launcher_pid: int,
                error_dir: str) -> None:
    """Entry point of every worker process (runs in the child)."""
    _die_with_launcher(launcher_pid)
    _as_a_new_process()
    rank = cfg.rank(local_rank)
    try:
        _run_rank(local_rank, cfg, target, restart, error_dir, rank)
    except SystemExit as exc:
        if exc.code is not None and not isinstance(exc.code, int):
            # Python prints a SystemExit's message before its exit handlers run (multiprocessing
            # would print it after): the line must be out before the launcher may stop this rank
            # because another one ended first.
            print(exc.code, file=sys.stderr, flush=True)
            raise SystemExit(1) from None
        raise
    finally:
        _exit_as_python_does()


def _run_rank(local_rank: int, cfg: LaunchConfig, target: Target, restart: int, error_dir: str, rank: int) -> None:
    """The rank's set-up and the user's code; a Python error becomes the rank's record and exit 1."""
    try:
        prepare(local_rank, cfg, restart, error_dir)
        _observe(error_dir, rank)
        _run_target(local_rank, target)
    except SystemExit:
        raise
    except KeyboardInterrupt:
        raise SystemExit(130) from None  # stopped by the launcher: no traceback
    except BaseException as exc:  # noqa: BLE001 - report anything, then exit 1 like Python
        record = {
            "rank": rank,
            "local_rank": local_rank,
            "node_rank": cfg.node_rank,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "time": time.time(),
            "type": type(exc).__name__,
            "message": " ".join(str(exc).split())[:500],
            "traceback": "".join(traceback.format_exception(type(exc), exc, _user_frames(exc.__traceback__))),
            "hint": failure_hints.hint(exc),  # what this process's machinery knows (runtime migration)
        }
        path = rundir.error_record(error_dir, rank)
        tmp = os.path.join(error_dir, f".{os.path.basename(path)}.tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(record, fh)
        os.replace(tmp, path)
        if cfg.log_dir:  # on the console the launcher's summary shows it once, not once per rank
            sys.stderr.write(record["traceback"])
        raise SystemExit(1) from None
