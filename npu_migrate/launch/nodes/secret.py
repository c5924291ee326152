"""Where the launcher's job secret comes from, which one it uses, and how it stays out of every environment.

Usage (by :mod:`..cli`, before anything starts)::

    job = secret.load_secret(args.secret_file)   # --secret-file, else NPU_MIGRATE_JOB_SECRET_FD, else ..._SECRET
    secret.use_secret(job)                       # this launcher's job secret, for every job it runs
    secret.job_secret()                          # (.store) the chosen one, else the environment's
    secret.run_again_without(job, initial)       # a secret in the environment: exec this command again
                                                 # without it, the secret on a pipe (returns where it cannot)

A secret in :data:`SECRET_ENV` is removed from the environment the fork server and the workers
inherit, but a process's ``/proc/PID/environ`` (what ``ps e`` shows, to the same user) is the block
it started with, whatever it removes later, and so is that of a process forked from it. So a
launcher started from the command line with the secret in its environment runs its own command
line again in the same process (``execve``, same PID), with the secret on a pipe named by
:data:`FD_ENV` (none with ``--secret-file``, which the command reads again) and the rest of the
environment it started with: the secret is then in no process's environment, and the launcher can
fork its fork server from itself (one ``import torch`` per node, :mod:`..procs.forkserver`) instead
of starting it as a new interpreter. ``spawn()`` callers and Pythons before 3.10 (no
``sys.orig_argv``) keep the secret in their environment.
"""

from __future__ import annotations

import os
import stat
import sys

from npu_migrate.launch.errors import LaunchUsageError

SECRET_ENV = "NPU_MIGRATE_JOB_SECRET"
"""The variable that holds the job secret (the same value on every node)."""
FD_ENV = "NPU_MIGRATE_JOB_SECRET_FD"
"""A file descriptor to read the job secret from (to its end); the launcher closes it once read."""
MIN_SECRET_BYTES = 16
"""Shorter secrets are refused: a guessable secret protects nothing (``openssl rand -hex 32``)."""
_PIPE_BYTES = 65536
"""What a pipe holds before a write blocks (Linux's default): a longer secret is not sent through one."""

_chosen: bytes | None = None


def use_secret(secret: bytes | None) -> None:
    """Make ``secret`` this launcher's job secret (the command line calls it once, before anything starts)."""
    global _chosen
    _chosen = secret


def job_secret() -> bytes | None:
    """The secret :func:`use_secret` chose, else the environment's (for ``spawn()``): a descriptor
    in :data:`FD_ENV` is read once, and its secret kept for the next jobs."""
    if _chosen is None and os.environ.get(FD_ENV):
        use_secret(load_secret())
        os.environ.pop(FD_ENV, None)
    return _chosen if _chosen is not None else load_secret()


def _check_file(path: str) -> bytes:
    try:
        info = os.stat(path)
    except OSError as exc:
        raise LaunchUsageError(f"--secret-file {path!r} cannot be read ({exc.strerror}): expected a file only "
                               "you can read, e.g. made with `umask 077; openssl rand -hex 32 > FILE`.") from exc
    if not stat.S_ISREG(info.st_mode):
        raise LaunchUsageError(f"--secret-file {path!r} is not a regular file: expected a file holding the job secret.")
    if info.st_mode & 0o077:
        raise LaunchUsageError(f"--secret-file {path!r} has mode {stat.S_IMODE(info.st_mode):04o}, readable by "
                               f"others: expected 0600 or stricter. Run `chmod 600 {path}`.")
    if info.st_uid != os.getuid():
        raise LaunchUsageError(f"--secret-file {path!r} belongs to another user (uid {info.st_uid}): expected "
                               "a file of your own with mode 0600.")
    try:
        with open(path, "rb") as fh:
            return fh.read().strip()
    except OSError as exc:
        raise LaunchUsageError(f"--secret-file {path!r} cannot be read ({exc.strerror}).") from exc


def _read_fd(value: str) -> bytes:
    """The secret on descriptor ``value``, read to its end; the descriptor is closed."""
    try:
        fd = int(value)
    except ValueError:
        raise LaunchUsageError(f"{FD_ENV}={value!r} is not a file descriptor: expected a number such as 3 "
                               f"(`{FD_ENV}=3 ... 3<FILE`).") from None
    try:
        with os.fdopen(fd, "rb", closefd=True) as fh:
            return fh.read().strip()
    except OSError as exc:
        raise LaunchUsageError(f"{FD_ENV}={fd} cannot be read ({exc.strerror}): expected an open descriptor "
                               "holding the job secret.") from exc


def load_secret(secret_file: str | None = None, environ: dict[str, str] | None = None) -> bytes | None:
    """The job secret: ``secret_file``'s content (mode checked), else what :data:`FD_ENV`'s descriptor
    holds, else :data:`SECRET_ENV`, else None.

    Raises:
        LaunchUsageError: a file others can read, a descriptor that cannot be read, or a secret
            shorter than :data:`MIN_SECRET_BYTES` (the message never contains the secret).
    """
    environ = os.environ if environ is None else environ
    if secret_file is not None and environ.get(FD_ENV):
        raise LaunchUsageError(f"--secret-file and {FD_ENV} both give the job secret: use one of them.")
    if secret_file is not None:
        secret, where = _check_file(secret_file), f"--secret-file {secret_file!r}"
    elif environ.get(FD_ENV):
        secret, where = _read_fd(environ[FD_ENV]), FD_ENV
    elif environ.get(SECRET_ENV):
        secret, where = environ[SECRET_ENV].strip().encode(), SECRET_ENV
    else:
        return None
    if len(secret) < MIN_SECRET_BYTES:
        raise LaunchUsageError(f"the job secret in {where} has {len(secret)} byte(s): expected at least "
                               f"{MIN_SECRET_BYTES}, the same on every node, e.g. from `openssl rand -hex 32`.")
    return secret


def run_again_without(secret: bytes | None, initial: dict[str, str] | None) -> None:
    """Run this process's command line again in this process, without :data:`SECRET_ENV` (module docstring).

    Args:
        secret: the job secret read from :data:`SECRET_ENV`, passed on through a pipe; None where
            the command line gives it another way (``--secret-file``).
        initial: the environment this process started with (``/proc/self/environ``), which the
            command runs in again, :data:`SECRET_ENV` taken out; None where it cannot be read.

    Returns only where the command cannot run again that way (not Linux, no ``sys.orig_argv``, an
    unreadable environment, a secret too long for a pipe, an ``execve`` that fails); the caller
    then goes on with the secret in its environment, as before.
    """
    argv = getattr(sys, "orig_argv", None)
    if (not sys.platform.startswith("linux") or not argv or not sys.executable or initial is None
            or len(secret or b"") > _PIPE_BYTES):
        return
    env = {k: v for k, v in initial.items() if k not in (SECRET_ENV, FD_ENV)}
    reader = None
    if secret is not None:
        reader, writer = os.pipe()
        try:
            os.write(writer, secret)  # fits the pipe: nothing reads it before the exec
        finally:
            os.close(writer)
        env[FD_ENV] = str(reader)
        os.set_inheritable(reader, True)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(sys.executable, [sys.executable, *argv[1:]], env)
    except OSError:
        if reader is not None:
            os.close(reader)
