"""Node 0's launcher store as this launcher uses it: its connections, the ways of calling it, its waits.

Usage (by :mod:`.membership`, :mod:`.assignment` and :mod:`.board`)::

    js = JobStore(cfg, signals)
    js.open()                                   # node 0 serves the store; everyone connects twice
    js.key("abort")                             # "npu_migrate/<job id>/abort"
    value = js.call(lambda: js.store.get(k), "read")   # interruptible by signals and board events
    js.quietly(lambda: js.store.set(k, v))      # gives up after a few seconds (node 0 may be gone)
    js.await_keys([k], "finish")                # a blocking wait on a connection of its own

    records = synchronize(store, b"mine", rank, world, "npu_migrate/j/round/r/member/", 30)
    n = arrive(store, "npu_migrate/j/done/0")        # the n-th node to arrive sets done/0/<n>
    wait_keys(client, ["npu_migrate/j/done/0/2"], 60)  # True, False on a timeout, raises if gone
    arrived(store, "npu_migrate/j/done/0", 2)         # the signed count confirms the key
    peek(store, "npu_migrate/j/abort")                # a value, or None, without blocking

**Connections.** Node 0's launcher serves a ``TCPStore`` on ``--port + 1`` (:mod:`.servers`, on
``--addr`` only). Each launcher holds two clients of it: :attr:`JobStore.store` for the main thread
(and torch's rendezvous handler), :attr:`JobStore.watch` for the heartbeat thread, so a slow call
on one never delays the other. Each blocking wait opens a third, for that wait only: a
``TCPStore`` client holds one lock for a whole request, so a blocking wait on a shared client would
stall every other call of the launcher; and a wait that timed out leaves no answer to trust on
that client. Every client is padded and, with a job secret, signed (:mod:`.values`).

**Interruptible calls.** What can block for long runs in a daemon thread
(:func:`.signals.run_interruptibly`): the main thread answers SIGINT/SIGTERM and gives up when
the board reports an event (:meth:`Listener.raise_event`: the :class:`.board.Board` that made this
:class:`JobStore`). A store error is first given to the board to explain
(:meth:`Listener.explain_error`): node 0 closes its store soon
after it told every node why the job ends, and that reason is the better message.

**torch's primitives.** ``torch.distributed.elastic.utils.store`` has blocking ``synchronize``
and ``barrier`` on every torch the launcher supports, with other signatures: torch 2.1 has
``synchronize(store, data, rank, world_size, key_prefix, barrier_timeout)`` and
``barrier(store, rank, world_size, key_prefix, barrier_timeout)``; newer torch renamed the first
timeout to ``timeout`` and made ``barrier(store, world_size, key_prefix, barrier_timeout, rank=None,
...)``. :func:`synchronize` and :func:`barrier` here call the running torch's with keywords.
``synchronize`` reads every node's value with ``get`` (torch 2.1) or ``multi_get`` (newer); both
go through :class:`.values.PaddedStore` and :class:`.values.AuthStore`, so the values
come back unpadded and checked against the job secret.

**Counted arrivals** are the scheme of torch's ``barrier`` (``_barrier_nonblocking``: add one
to a counter, the last member sets a key everybody waits on) with two changes the board needs:
the n-th arrival sets ``<key>/<n>``, so a waiter can wait for *any* count (node 0 waits for the
nodes that are still in the job, a number it only knows when it waits); and the count itself is
a counter of the launcher store, signed under a job secret. ``store.wait`` checks that a key
exists, never its value: a process without the secret could set ``<key>/<n>`` itself, so where
the arrival decides something (every node finished), :func:`arrived` confirms it with the
signed count. torch's ``barrier`` waits on an unsigned key and cannot be entered again after a
timeout, which is why the board's own waits use arrivals and ``barrier`` is here for callers that
need neither.
"""

from __future__ import annotations

import inspect
import logging
import socket
import threading
import time
import uuid
from concurrent import futures
from dataclasses import replace
from datetime import timedelta
from typing import Any, Callable, Protocol, Sequence, TypeVar

from npu_migrate.launch.nodes import secret, servers, timing, values
from npu_migrate.launch import cpplog
from npu_migrate.launch.setup import cluster, software
from npu_migrate.launch.setup.config import LaunchConfig
from npu_migrate.launch.setup.ports import CONTROL_PORT_OFFSET
from npu_migrate.launch.errors import LaunchError, first_line
from npu_migrate.launch.nodes.records import JobEvent
from npu_migrate.launch.signals import Interrupted, Signals, in_daemon_thread, run_interruptibly

logger = logging.getLogger(__name__)

# --------------------------------------------------------------------------- blocking waits


def _torch_store_utils() -> Any:
    from torch.distributed.elastic.utils import store as utils

    return utils


def synchronize(store: Any, data: bytes, rank: int, world_size: int, key_prefix: str,
                timeout: float) -> list[bytes]:
    """torch's ``synchronize``: publish ``data`` as ``rank``, return every rank's (blocking, ``timeout`` s).

    Raises:
        RuntimeError: (torch's store error) a rank did not publish within ``timeout``, or the store is gone.
    """
    utils = _torch_store_utils()
    params = inspect.signature(utils.synchronize).parameters
    name = "timeout" if "timeout" in params else "barrier_timeout"  # torch 2.1: barrier_timeout
    return list(utils.synchronize(store, data, rank=rank, world_size=world_size, key_prefix=key_prefix,
                                  **{name: timeout}))


def barrier(store: Any, rank: int, world_size: int, key_prefix: str, timeout: float) -> None:
    """torch's ``barrier``: block until ``world_size`` ranks called it with ``key_prefix`` (once per prefix).

    torch 2.1 takes ``rank`` second and exchanges every rank's key; newer torch takes it as a
    keyword and only counts arrivals.
    """
    utils = _torch_store_utils()
    params = inspect.signature(utils.barrier).parameters
    if list(params)[1] == "rank":  # torch 2.1: barrier(store, rank, world_size, key_prefix, barrier_timeout)
        utils.barrier(store, rank, world_size, key_prefix, barrier_timeout=timeout)
    else:
        utils.barrier(store, world_size, key_prefix, barrier_timeout=timeout, rank=rank)


def arrival_key(key: str, n: int) -> str:
    """The key the ``n``-th arrival at ``key`` sets."""
    return f"{key}/{n}"


def arrive(store: Any, key: str) -> int:
    """Count this arrival at ``key``; return n, this one's number (``<key>/<n>`` is set)."""
    n = int(store.add(key, 1))
    store.set(arrival_key(key, n), "1")
    return n


def arrived(store: Any, key: str, n: int) -> bool:
    """Whether at least ``n`` arrivals are counted at ``key`` (a signed read under a job secret)."""
    return int(store.add(key, 0)) >= n


ABSENT = "\0npu_migrate:absent"
"""The value :func:`peek` compares with: never stored."""


def peek(store: Any, key: str) -> str | None:
    """A key's value, or None if unset, without blocking.

    torch 2.1's TCPStore has no ``check`` in Python; ``compare_set`` with an expected value that
    is never stored returns that value when the key is missing (the c10d rendezvous backend
    reads its state the same way). ``store`` is a :class:`~.values.PaddedStore` (or an
    :class:`~.values.AuthStore` over one), so this is safe beside the launcher's other threads
    on torch < 2.4 too, and a forged value under a job secret reads as absent.
    """
    value = store.compare_set(key, ABSENT, ABSENT).decode()
    return None if value == ABSENT else value


def present(store: Any, keys: Sequence[str]) -> bool:
    """Whether every key exists (without blocking; a forged value under a secret reads as absent)."""
    return all(peek(store, k) is not None for k in keys)


def exists(store: Any, keys: Sequence[str]) -> bool:
    """Whether every key is set, whatever its value (a wait sees keys, never values), without
    waking anyone: one ``check`` request where torch's store has it (torch 2.1's has not; the libuv
    server of torch 2.4 and later wakes every waiter of a missing key that a :func:`peek`
    compare-and-sets), else a :func:`peek` of each key below the signing."""
    raw = getattr(store, "raw", store)
    if hasattr(raw, "check"):
        return bool(raw.check(list(keys)))
    return present(getattr(store, "inner", store), keys)


def wait_keys(client: Any, keys: Sequence[str], seconds: float, check: Any = None) -> bool:
    """Block until every key exists: True; False when ``seconds`` passed first.

    Args:
        client: a store client used for this wait only (see the module docstring).
        keys: the keys to wait for.
        seconds: the longest wait.
        check: the store a timed-out wait is checked on (the keys may have come just then);
            ``client`` when None.

    Raises:
        Exception: (torch's store error) the store is gone.
    """
    reader = client if check is None else check
    deadline = time.monotonic() + seconds
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return present(reader, keys)
        try:
            client.wait(list(keys), timedelta(seconds=left))
        except Exception as exc:  # noqa: BLE001 - a timeout, or the store went away: the next read tells which
            logger.debug("wait for %s: %s", keys, exc)
            return present(reader, keys)
        # torch's libuv store server (the default from torch 2.4) also ends a wait when another
        # client compare-and-sets a missing key (what peek() does) without setting it; a get()
        # then returns b"" for the missing key. Measured on torch 2.14: 15 threads, each peeking
        # at a key and waiting for it, 9 to 13 read b"" before it was set; none with the classic
        # server or without the peek. So the keys are checked once more (exists(): a check
        # wakes nobody), and a wait ended early waits again.
        if exists(reader, keys):
            return True


# --------------------------------------------------------------------------- this launcher's connections

T = TypeVar("T")


class Listener(Protocol):
    """What interrupts this launcher's store calls and explains their errors: the board (:class:`.board.Board`)."""

    def raise_event(self) -> None:
        """Raise :class:`.records.JobEvent` if the board says something (never blocks)."""

    def explain_error(self) -> None:
        """After a store error: raise the board's event if the board explains the error (waits a few beats)."""


class _Unheard:
    """The listener of a :class:`JobStore` that no board listens to: nothing interrupts or explains its calls."""

    def raise_event(self) -> None:
        return None

    def explain_error(self) -> None:
        return None


class JobStore:
    """Node 0's launcher store as this launcher uses it (see the module docstring).

    Attributes:
        prefix: ``npu_migrate/<job id>``, the job's keys' prefix.
        owner: this launcher's id (a new one for every launcher process).
        host: host name and the address it reaches node 0 from, e.g. ``gpu7 (10.0.0.7)``.
        local_ip: that address (``--local-addr``, else the one that routes to ``--addr``, if any).
        board: what interrupts its calls and explains their errors (given at construction).
    """

    def __init__(self, cfg: LaunchConfig, signals: Signals, board: Listener | None = None) -> None:
        self.cfg = cfg
        self.signals = signals
        self.prefix = f"npu_migrate/{cfg.job_id}"
        self.owner = uuid.uuid4().hex
        found = cluster.interface_for(cfg.addr)
        self.local_ip = cfg.torchrun.local_addr or (found[1] if found else None)  # --local-addr wins, as torchrun
        self.host = f"{socket.gethostname()} ({self.local_ip})" if self.local_ip else socket.gethostname()
        self.secret = secret.job_secret()  # None: values are not signed
        self.where = f"{cfg.addr}:{cfg.port + CONTROL_PORT_OFFSET}"
        self.server: Any = None  # node 0: the store server itself (see :mod:`.servers`)
        self.store: Any = None
        self.watch: Any = None
        self.board: Listener = _Unheard() if board is None else board

    def key(self, name: str) -> str:
        return f"{self.prefix}/{name}"

    # -- connections

    def make(self, master: bool, timeout: float) -> Any:
        """Node 0's store server (on ``--addr`` only) or a client of it: padded, and signed with a secret."""
        port = self.cfg.port + CONTROL_PORT_OFFSET
        if master:
            self.server = servers.serve(self.cfg.addr, port, timeout)
        return values.wrap(servers.client(self.cfg.addr, port, timeout), self.secret)

    def client(self, seconds: float) -> Any:
        """Another client of node 0's store, for one blocking wait (:func:`wait_keys`, :mod:`.liveness`)."""
        return self.make(False, seconds)

    def open(self) -> None:
        """Serve the store (node 0) and connect :attr:`store` and :attr:`watch`, within ``--join-timeout``.

        Raises:
            LaunchError: the store cannot be served here, or node 0 cannot be reached.
            Interrupted: SIGINT/SIGTERM meanwhile.
        """
        cfg = self.cfg
        cpplog.quiet_launcher()  # a failed connect is reported below, in one line, not as C++ frames
        if cfg.rdzv.assign:
            self._serve_if_host()
        master = self.server is not None if cfg.rdzv.assign else cfg.node_rank == 0
        # Where node 0 listens already, its store answers this torch's client at once, or never.
        first = min(cfg.join_timeout, timing.STORE_ANSWER_S) if not master and self._answers() else cfg.join_timeout
        try:
            # Bounded here too: torch's client waits for good on a listener that never answers.
            if self.store is None:
                self.store = self.call(lambda: self.make(master, first), "connect", within=first)
            # Node 0 answered just now: a second connection that does not come means it went away.
            second = min(cfg.join_timeout, timing.STORE_ANSWER_S)
            self.watch = self.call(lambda: self.make(False, second), "connect", within=second)
        except (RuntimeError, ValueError, TimeoutError, OSError) as exc:
            logger.debug("store: %s", exc)
            if self.store is not None and not master:
                raise LaunchError(
                    f"node 0's launcher at {self.where} stopped answering while this node was connecting "
                    f"({first_line(exc, 120)}): the job ended there (it finished before this node came, or "
                    "failed), or node 0 failed."
                ) from exc
            if master:
                raise LaunchError(
                    f"cannot serve the launcher store on {self.where} ({first_line(exc, 120)}): is another "
                    "launcher with --node-rank 0 running? Pick another --port on every node."
                ) from exc
            if self.store is None and self._answers():
                raise LaunchError(
                    f"node 0's launcher at {self.where} accepts connections but does not answer as a store of "
                    f"this node's torch {software.torch_release()}: node 0 runs "
                    "another torch release (torch's store protocol differs between releases: every node must "
                    "run the same torch), or another program holds that port."
                ) from exc
            raise LaunchError(
                f"could not reach node 0's launcher at {self.where} within {cfg.join_timeout:g} s: start the "
                "launcher with --node-rank 0 on that host, with the same --port (and check that this "
                "host can reach it)."
            ) from exc

    def _serve_if_host(self) -> None:
        """Node ranks from the rendezvous: serve the store (becoming node 0) where this launcher may host it.

        As torch's c10d backend decides who hosts its store: ``is_host`` in ``--rdzv-conf`` where
        given, else whether the endpoint is one of this host's addresses; of several launchers on that
        host, the first to bind the port serves and the others join it (unless ``is_host`` was given).
        """
        cfg = self.cfg
        if not (cfg.rdzv.is_host if cfg.rdzv.is_host is not None else cluster.is_local_address(cfg.addr)):
            return
        try:
            self.store = self.call(lambda: self.make(True, cfg.join_timeout), "connect", within=cfg.join_timeout)
            self.cfg = replace(cfg, node_rank=0)  # the launcher that serves is node 0
        except (RuntimeError, ValueError, TimeoutError, OSError) as exc:
            logger.debug("store: %s", exc)
            if self.server is not None or cfg.rdzv.is_host:
                raise LaunchError(
                    f"cannot serve the launcher store on {self.where} ({first_line(exc, 120)})"
                    + (" as --rdzv-conf is_host=true asks: is another launcher of this job serving there?"
                       if cfg.rdzv.is_host else "")
                    + " Pick another port (the same on every node).") from exc
            logger.info("another launcher serves %s: joining it", self.where)

    def _answers(self) -> bool:
        """Whether something accepts a plain TCP connection at node 0's store address now."""
        try:
            with socket.create_connection((self.cfg.addr, self.cfg.port + CONTROL_PORT_OFFSET), timeout=5):
                return True
        except OSError:
            return False

    # -- calls

    def call(self, fn: Callable[[], T], name: str, within: float | None = None) -> T:
        """Run a blocking store call in a thread; signals and board events interrupt the wait.

        A store error that comes with (or right after) an event is reported as the event. With
        ``within``, a call still blocked :data:`.timing.CALL_SLACK_S` after that many seconds raises
        TimeoutError (its thread is left behind).
        """
        also = self.board.raise_event
        if within is not None:
            deadline = time.monotonic() + within + timing.CALL_SLACK_S

            def also() -> None:
                self.board.raise_event()
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{name}: no answer within {within:g} s")
        try:
            return run_interruptibly(fn, self.signals, f"npu_migrate-{name}", also=also)
        except (JobEvent, LaunchError, Interrupted):
            raise
        except Exception as exc:  # noqa: BLE001 - store and rendezvous errors from torch
            logger.debug("%s: %s", name, exc)
            self.board.raise_event()
            self.board.explain_error()
            raise

    def quietly(self, fn: Callable[[], T], seconds: float = timing.QUIET_CALL_S) -> T | None:
        """A store call that gives up after ``seconds`` (node 0 may be unreachable); None then."""
        future = in_daemon_thread(fn, "npu_migrate-store")
        if not futures.wait((future,), seconds).done:
            return None  # its thread is left behind
        error = future.exception()
        if error is not None:  # nobody left to tell
            logger.debug("store: %s", error)
            return None
        return future.result()

    def peek(self, name: str) -> str | None:
        """The job key ``name``'s value, or None, without blocking (on :attr:`store`)."""
        return peek(self.store, self.key(name))

    # -- blocking waits, each on a connection of its own

    def wait_keys(self, keys: Sequence[str], seconds: float) -> bool:
        """Block (at most ``seconds``) until every key exists; False when they did not come.

        Raises:
            Exception: (torch's store error) node 0's store is gone.
        """
        if exists(self.store, keys):  # there already: no connection of its own (N at once cost node 0)
            return True
        if seconds <= 0:
            return False
        return wait_keys(self.client(seconds), keys, seconds, check=self.store)

    def await_keys(self, keys: Sequence[str], name: str, seconds: float | None = None) -> bool:
        """:meth:`wait_keys` from the main thread: interruptible, and without end when ``seconds`` is None.

        An endless wait runs in slices (:data:`.timing.FINISH_WAIT_SLICE_S`), each on a new
        connection, and stops after the slice under way when the main thread gave up on it.

        Raises:
            JobEvent: the board spoke meanwhile.
            Interrupted: SIGINT/SIGTERM meanwhile.
        """
        cancel = threading.Event()
        deadline = None if seconds is None else time.monotonic() + seconds

        def wait() -> bool:
            while not cancel.is_set():
                left = timing.FINISH_WAIT_SLICE_S if deadline is None else deadline - time.monotonic()
                if deadline is not None and left <= 0:
                    return present(self.store, keys)
                if self.wait_keys(keys, min(left, timing.FINISH_WAIT_SLICE_S)):
                    return True
            return False

        try:
            return self.call(wait, name)
        finally:
            cancel.set()
