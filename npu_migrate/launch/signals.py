"""SIGINT, SIGTERM, SIGHUP and SIGQUIT for the launcher: a flag the main thread reads in every phase, never a traceback.

Usage::

    with Signals() as signals:
        while work_to_do():
            if signals.received is not None:
                return 128 + signals.received      # 130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP
            wait_a_little()

The launcher's main thread never blocks for long: what can block (connecting to node 0, waiting
in the rendezvous) runs in a daemon thread (:func:`run_interruptibly`), and the main thread polls
this flag, so every phase answers a signal within a fraction of a second.

SIGHUP (the terminal or the SSH session the launcher runs in closed) stops the job like SIGTERM, as
torchrun's agent does: by default it would end the launcher without stopping the ranks, leaving
what the ranks started running. SIGQUIT does too (torchrun's default set); ``--signals-to-handle``
names another set (:class:`Signals`' ``stop``).
"""

from __future__ import annotations

import os
import signal
import threading
from concurrent.futures import Future, wait
from typing import Any, Callable, TypeVar

T = TypeVar("T")

POLL_S = 0.1
"""How often a waiting main thread looks at the flag."""

STOP_GRACE_S = float(os.environ.get("NPU_MIGRATE_STOP_GRACE_S", "5"))
"""Seconds between the signal forwarded to workers and SIGKILL after a failure
(``NPU_MIGRATE_STOP_GRACE_S`` changes it, for ranks that need long to save their state)."""

REAP_AFTER_KILL_S = 10.0
"""How long the launcher waits for workers to be reaped after SIGKILL. SIGKILL ends a process
unless it sits in an uninterruptible wait in the kernel (a hung device driver, a dead NFS mount);
the launcher then says so and goes on instead of hanging with it."""

SIGNAL_GRACE_S = min(3.0, STOP_GRACE_S)
"""The same after the launcher itself was signalled: the launcher must end within 5 s."""


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
"""The signals that stop the job by default (exit 128 + the signal's number; torchrun's set)."""


def answer_sigint() -> None:
    """Let SIGINT interrupt the phases before the job (the rank table's wait...) even where it came in ignored.

    A background job of a non-interactive shell (``cmd &`` in a script, a CI step) starts with
    SIGINT ignored, and Python then leaves it ignored: the launcher would sit out a Ctrl-C or a
    ``kill -INT`` while it waits for the rank table, yet stop the job on it once ranks run
    (:class:`Signals` takes the signal in that phase). Taking it here makes both phases answer.
    Call from the launcher's main thread, first thing.
    """
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


class Interrupted(Exception):
    """The launcher received SIGINT or SIGTERM while waiting (raised by :func:`run_interruptibly`)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class Signals:
    """Turns the stop signals into a flag the launcher reads, and restores the handlers after.

    ``stop``: the signals that stop the job (``--signals-to-handle``; default :data:`STOP_SIGNALS`).
    SIGUSR1 only counts (:attr:`dumps`): a request for every rank's stack, served while ranks run,
    unless it is one of ``stop``.
    """

    def __init__(self, stop: tuple[int, ...] = STOP_SIGNALS) -> None:
        self.received: int | None = None
        self.count = 0
        self.dumps = 0
        self.stop = tuple(stop)
        self._old: dict[int, Any] = {}

    @property
    def serves_dumps(self) -> bool:
        """Whether SIGUSR1 asks for the ranks' stacks (it stops the job where it is a stop signal)."""
        return signal.SIGUSR1 not in self.stop

    def __enter__(self) -> Signals:
        if threading.current_thread() is threading.main_thread():
            for sig in self.stop:
                self._old[sig] = signal.signal(sig, self._handle)
            if self.serves_dumps:
                self._old[signal.SIGUSR1] = signal.signal(signal.SIGUSR1, self._dump)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        self.received = self.received or signum
        self.count += 1

    def _dump(self, signum: int, frame: Any) -> None:
        self.dumps += 1

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)

    def check(self) -> None:
        """Raise :class:`Interrupted` if a signal came."""
        if self.received is not None:
            raise Interrupted(self.received)


def in_daemon_thread(fn: Callable[[], T], name: str) -> Future[T]:
    """Start ``fn`` in a daemon thread of its own; the :class:`~concurrent.futures.Future` it returns
    holds its result or the exception it raised.

    Not a ``ThreadPoolExecutor``: since Python 3.9 an executor's workers are not daemon threads
    and the interpreter joins them at exit, so a store call left blocked (node 0 gone, a listener
    that never answers) would keep the launcher from exiting. A daemon thread is left behind
    at exit instead, as a blocked call that nobody waits for should be.
    """
    future: Future[T] = Future()

    def call() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            result = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            future.set_exception(exc)
        else:
            future.set_result(result)

    threading.Thread(target=call, name=name, daemon=True).start()
    return future


def run_interruptibly(fn: Callable[[], T], signals: Signals, name: str,
                      also: Callable[[], None] = lambda: None) -> T:
    """Run ``fn`` in a daemon thread; return its result, raise its exception, or raise Interrupted.

    Args:
        fn: a call that may block for long (a store connection, ``next_rendezvous``).
        signals: checked every :data:`POLL_S` seconds.
        name: the thread's name.
        also: called as often; it may raise to give up waiting (the job was aborted).
    """
    future = in_daemon_thread(fn, name)
    # wait(), not result(timeout): from Python 3.11 a TimeoutError that fn raised and a wait that
    # timed out are the same class.
    while not wait((future,), POLL_S).done:
        signals.check()
        also()
    return future.result()
