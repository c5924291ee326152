"""This launcher's connections to node 0's launcher store, and the ways it calls it.

Usage (by :mod:`.membership` and :mod:`.board`)::

    js = JobStore(cfg, signals)
    js.open()                                   # node 0 serves the store; everyone connects twice
    js.key("abort")                             # "npu_migrate/<job id>/abort"
    value = js.call(lambda: js.store.get(k), "read")   # interruptible by signals and board events
    js.quietly(lambda: js.store.set(k, v))      # gives up after a few seconds (node 0 may be gone)
    js.await_keys([k], "finish")                # a blocking wait on a connection of its own

**Connections.** Node 0's launcher serves a ``TCPStore`` on ``--port + 1`` (:mod:`.stores`, on
``--addr`` only). Each launcher holds two clients of it: :attr:`store` for the main thread (and
torch's rendezvous handler), :attr:`watch` for the heartbeat thread, so a slow call on one never
delays the other. Each blocking wait opens a third, for that wait only (:mod:`.storewait`). Every
client is padded (:mod:`.padded_store`) and, with a job secret, signed (:mod:`.authstore`).

**Interruptible calls.** What can block for long runs in a daemon thread
(:func:`.signals.run_interruptibly`): the main thread answers SIGINT/SIGTERM and gives up when
the board reports an event (:attr:`events`, set by :class:`.board.Board`). A store error is
first given to the board to explain (:attr:`explain`): node 0 closes its store soon after it
told every node why the job ends, and that reason is the better message.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import uuid
from dataclasses import replace
from typing import Any, Callable, Sequence, TypeVar

from npu_migrate.launch.nodes import authstore, stores, storewait, timing

from npu_migrate.launch.procs import cpplog

from npu_migrate.launch.setup import cluster, software
from npu_migrate.launch.setup.config import CONTROL_PORT_OFFSET, LaunchConfig
from npu_migrate.launch.errors import LaunchError, first_line
from npu_migrate.launch.nodes.records import JobEvent
from npu_migrate.launch.signals import Interrupted, Signals, run_interruptibly

logger = logging.getLogger(__name__)

T = TypeVar("T")


def _nothing() -> None:
    return None


class JobStore:
    """Node 0's launcher store as this launcher uses it (see the module docstring).

    Attributes:
        prefix: ``npu_migrate/<job id>``, the job's keys' prefix.
        owner: this launcher's id (a new one for every launcher process).
        host: host name and the address it reaches node 0 from, e.g. ``gpu7 (10.0.0.7)``.
        local_ip: that address (``--local-addr``, else the one that routes to ``--addr``, if any).
        events: raises :class:`.board.JobEvent` when the board says something (set by the board).
        explain: called after a store error; raises the board's event if it explains the error.
    """

    def __init__(self, cfg: LaunchConfig, signals: Signals) -> None:
        self.cfg = cfg
        self.signals = signals
        self.prefix = f"npu_migrate/{cfg.job_id}"
        self.owner = uuid.uuid4().hex
        found = cluster.interface_for(cfg.addr)
        self.local_ip = cfg.torchrun.local_addr or (found[1] if found else None)  # --local-addr wins, as torchrun
        self.host = f"{socket.gethostname()} ({self.local_ip})" if self.local_ip else socket.gethostname()
        self.secret = authstore.job_secret()  # None: values are not signed
        self.where = f"{cfg.addr}:{cfg.port + CONTROL_PORT_OFFSET}"
        self.server: Any = None  # node 0: the store server itself (see :mod:`.stores`)
        self.store: Any = None
        self.watch: Any = None
        self.events: Callable[[], None] = _nothing
        self.explain: Callable[[], None] = _nothing

    def key(self, name: str) -> str:
        return f"{self.prefix}/{name}"

    # -- connections

    def make(self, master: bool, timeout: float) -> Any:
        """Node 0's store server (on ``--addr`` only) or a client of it: padded, and signed with a secret."""
        port = self.cfg.port + CONTROL_PORT_OFFSET
        if master:
            self.server = stores.serve(self.cfg.addr, port, timeout)
        return authstore.wrap(stores.client(self.cfg.addr, port, timeout), self.secret)

    def client(self, seconds: float) -> Any:
        """Another client of node 0's store, for one blocking wait (:mod:`.storewait`, :mod:`.liveness`)."""
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
            self.watch = self.call(lambda: self.make(False, cfg.join_timeout), "connect", within=cfg.join_timeout)
        except (RuntimeError, ValueError, TimeoutError, OSError) as exc:
            logger.debug("store: %s", exc)
            if master:
                raise LaunchError(
                    f"cannot serve the launcher store on {self.where} ({first_line(exc, 120)}): is another "
                    "launcher with --node-rank 0 running? Pick another --port on every node."
                ) from None
            if self.store is None and self._answers():
                raise LaunchError(
                    f"node 0's launcher at {self.where} accepts connections but does not answer as a store of "
                    f"this node's torch {software.torch_release()}: node 0 runs "
                    "another torch release (torch's store protocol differs between releases: every node must "
                    "run the same torch), or another program holds that port."
                ) from None
            raise LaunchError(
                f"could not reach node 0's launcher at {self.where} within {cfg.join_timeout:g} s: start the "
                "launcher with --node-rank 0 on that host, with the same --port (and check that this "
                "host can reach it)."
            ) from None

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
                    + " Pick another port (the same on every node).") from None
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
        also = self.events
        if within is not None:
            deadline = time.monotonic() + within + timing.CALL_SLACK_S

            def also() -> None:
                self.events()
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{name}: no answer within {within:g} s")
        try:
            return run_interruptibly(fn, self.signals, f"npu_migrate-{name}", also=also)
        except (JobEvent, LaunchError, Interrupted):
            raise
        except Exception as exc:  # noqa: BLE001 - store and rendezvous errors from torch
            logger.debug("%s: %s", name, exc)
            self.events()
            self.explain()
            raise

    def quietly(self, fn: Callable[[], T], seconds: float = timing.QUIET_CALL_S) -> T | None:
        """A store call that gives up after ``seconds`` (node 0 may be unreachable); None then."""
        box: dict[str, Any] = {}
        done = threading.Event()

        def run() -> None:
            try:
                box["value"] = fn()
            except Exception as exc:  # noqa: BLE001 - nobody left to tell
                logger.debug("store: %s", exc)
            finally:
                done.set()

        threading.Thread(target=run, name="npu_migrate-store", daemon=True).start()
        done.wait(seconds)
        return box.get("value")

    def peek(self, name: str) -> str | None:
        """The job key ``name``'s value, or None, without blocking (on :attr:`store`)."""
        return storewait.peek(self.store, self.key(name))

    # -- blocking waits, each on a connection of its own

    def wait_keys(self, keys: Sequence[str], seconds: float) -> bool:
        """Block (at most ``seconds``) until every key exists; False when they did not come.

        Raises:
            Exception: (torch's store error) node 0's store is gone.
        """
        if seconds <= 0:
            return storewait.present(self.store, keys)
        return storewait.wait_keys(self.client(seconds), keys, seconds, check=self.store)

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
                    return storewait.present(self.store, keys)
                if self.wait_keys(keys, min(left, timing.FINISH_WAIT_SLICE_S)):
                    return True
            return False

        try:
            return self.call(wait, name)
        finally:
            cancel.set()
