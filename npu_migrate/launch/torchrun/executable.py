"""``--no-python``: a rank that runs an executable, as torchrun's workers run a non-Python target.

Usage::

    path = find("./train.sh")       # the executable's path, or a one-line LaunchUsageError
    Target(fn=run, args=(path, "--epochs", "3"), shown="./train.sh --epochs 3")   # each rank runs it

torchrun starts the executable itself as each worker. Here ranks are forked from the launcher's
fork server, so each rank starts the executable as its child: with the rank's environment (RANK,
LOCAL_RANK, MASTER_ADDR...), its stdout and stderr (the launcher's relay), stdin and process
group, and the rank ends with the executable's exit code, or dies by the signal that ended it.
The signals that stop the job reach the executable directly (the launcher signals the rank's
whole process group); the rank waits for it to end.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys

from npu_migrate.launch.errors import LaunchUsageError


def find(name: str) -> str:
    """The executable ``name`` names: a path, or a command on PATH (as ``execvp`` finds it).

    Raises:
        LaunchUsageError: nothing executable there, in one line.
    """
    found = shutil.which(name)
    if found is not None:
        return name if os.sep in name else found
    if os.path.isfile(name):
        raise LaunchUsageError(f"--no-python: {name!r} is not executable: `chmod +x {name}`, or drop --no-python "
                               "to run it as a Python script.")
    raise LaunchUsageError(f"--no-python: {name!r} is neither an executable file nor a command on PATH "
                           f"(working directory {os.getcwd()}).")


def _ignore(signum: int, frame: object) -> None:
    """The rank's handler while its executable runs: the executable decides how to end."""


def run(local_rank: int, path: str, *args: str) -> None:
    """In a rank: run ``path`` with ``args`` and end as it ended (exit code, or its signal)."""
    for stream in (sys.stdout, sys.stderr):  # what the rank printed before goes first
        try:
            stream.flush()
        except (AttributeError, ValueError, OSError):
            pass
    # The launcher signals the rank's process group, so the executable gets each signal itself;
    # the rank outlives it to report how it ended. Handlers (not SIG_IGN) are reset at exec: the
    # executable starts with the default ones.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR2):
        signal.signal(sig, _ignore)
    code = subprocess.Popen([path, *args]).wait()
    if code < 0:  # ended by a signal: the rank ends by it too
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        code = 128 - code
    raise SystemExit(code)
