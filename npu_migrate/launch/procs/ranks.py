"""This node's ranks of one attempt: start them, watch them, stop them, and read how each ended.

Usage (the supervisor's :class:`~.supervisor.Job` holds one as ``job.ranks``)::

    cfg, specs = torchrun_logs(cfg)       # torchrun's log layout, where its flags ask for it
    ranks = RankProcesses(cfg, target, start_method, signals, run_dir, watch, specs)
    procs = ranks.start(attempt, cfg)     # torch.multiprocessing.start_processes over the fork server
    watched, detail = ranks.wait(procs, board)   # Watched.OK / FAILED / EVENT / SIGNAL / HANG, and its detail
    ranks.stop(procs)                     # SIGTERM to every worker's group, SIGKILL after the grace period
    failure = ranks.failure_of(local, proc)   # what the rank's error record (or its exit) says

Each worker runs in its own process group; the launcher signals the group, so whatever a rank
started goes with it. A rank's Python error is its record in the run directory
(:func:`.rundir.error_record`, written by :mod:`.worker`); a death without one is named by its
signal, with the Python stack a fatal signal left (:mod:`..hangs.stacks`).
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import time
from dataclasses import replace
from enum import Enum
from typing import Any

from npu_migrate.launch.hangs import stacks

from npu_migrate.launch.nodes import timing

from npu_migrate.launch.procs import rundir

from npu_migrate.launch.torchrun import events as elastic_events, logs as logs_layout
from npu_migrate.launch.setup.config import LaunchConfig
from npu_migrate.launch.setup.target import Target
from npu_migrate.launch.errors import say
from npu_migrate.launch.nodes.records import Failure, order
from npu_migrate.launch.procs.failure import exit_signal
from npu_migrate.launch.hangs.watchdog import HangWatch
from npu_migrate.launch.procs.output import Relay
from npu_migrate.launch.setup.output_settings import log_path
from npu_migrate.launch.signals import REAP_AFTER_KILL_S, STOP_GRACE_S, Signals
from npu_migrate.launch.procs.worker import worker_main

logger = logging.getLogger(__name__)


class Watched(Enum):
    """How watching one attempt's ranks ended (:meth:`RankProcesses.wait`)."""

    OK = "ok"
    """Every rank exited with 0."""
    FAILED = "failed"
    """A rank of this node failed (the detail is its :class:`.failure.Failure`)."""
    EVENT = "event"
    """The board spoke (the detail is its :class:`.records.Event`)."""
    SIGNAL = "signal"
    """SIGINT/SIGTERM to the launcher."""
    HANG = "hang"
    """A hang with ``--hang-action end`` (the detail is the :class:`.watchdog.Hang`)."""


def torchrun_logs(cfg: LaunchConfig) -> tuple[LaunchConfig, Any]:
    """torchrun's layout, where its flags ask for it (:mod:`..torchrun.logs`): ``cfg`` with the layout's
    root as its log dir, and the layout's specs (None: no layout)."""
    if not cfg.output.logs.active:
        return cfg, None
    specs = logs_layout.make_specs(cfg.output.logs, cfg.log_dir, cfg.output.ranks_filter)
    return replace(cfg, log_dir=specs.root_log_dir), specs


class RankProcesses:
    """This node's worker processes, attempt after attempt (held by :class:`~.supervisor.Job` as ``job.ranks``).

    Args:
        cfg: the job's settings (each :meth:`start` passes the current ones: the rendezvous may
            assign the node rank after this is made).
        target: what each worker runs.
        start_method: ``forkserver`` or ``spawn`` (:func:`.forkserver.start_fork_server`).
        signals: the launcher's signal state (a second signal ends a stop's grace period).
        error_dir: the run directory (:mod:`.rundir`).
        watch: this node's hang watch, started over each attempt's ranks.
        logs_specs: torchrun's log layout (:func:`torchrun_logs`), or None.
    """

    def __init__(self, cfg: LaunchConfig, target: Target, start_method: str, signals: Signals, error_dir: str,
                 watch: HangWatch, logs_specs: Any = None) -> None:
        self.cfg = cfg
        self.target = target
        self.start_method = start_method
        self.signals = signals
        self.error_dir = error_dir
        self.watch = watch
        self.logs_specs = logs_specs
        self.procs: list[Any] = []
        self.relay: Relay | None = None
        self.attempt = 0
        self._context: Any = None
        self._exit_seen: dict[int, float] = {}
        self.last_procs: list[Any] = []  # the last attempt's workers, for the report
        self.stopped: set[int] = set()  # local ranks the launcher stopped in the last attempt
        self._dest: logs_layout.Destinations | None = None
        self.events: elastic_events.Recorder | None = None
        self._began = time.monotonic()

    def grace(self, default: float) -> float:
        """Seconds between the stop signal and SIGKILL: ``--shutdown-timeout``, else ``default``."""
        timeout = self.cfg.torchrun.shutdown_timeout
        return default if timeout is None else timeout

    def record_end(self, code: int) -> None:
        """``--event-log-handler``: each rank's end state, then the job's (:mod:`..torchrun.events`)."""
        if self.events is None:
            return
        try:
            self.events.ended(self.last_procs, code, self.attempt, int(time.monotonic() - self._began), self.stopped)
        except Exception:  # noqa: BLE001 - a handler's failure must not hide why the job ended
            logger.exception("could not record the torchelastic events")

    def _attempt_files(self, attempt: int) -> tuple[str, ...]:
        """This attempt's TORCHELASTIC_ERROR_FILE of each local rank; torchrun's layout is made here."""
        cfg = self.cfg
        if self.logs_specs is None:
            self._dest = None
            return tuple(os.path.join(self.error_dir, f"torchelastic-error-rank{cfg.rank(local)}.json")
                         for local in range(cfg.nproc))
        first = self._dest is None
        self._dest = logs_layout.destinations(self.logs_specs, {local: cfg.worker_env(local, attempt)
                                                                for local in range(cfg.nproc)})
        if first:
            say(f"ranks' logs in {self._dest.run_dir} (torchrun's layout: attempt_<restart>/<local rank>/"
                "stdout.log, stderr.log, error.json)")
        return self._dest.error_files

    def start(self, attempt: int, cfg: LaunchConfig) -> list[Any]:
        """Start this attempt's workers with the job's current settings ``cfg``; return them."""
        import torch.multiprocessing as mp

        self.cfg = cfg
        self.drain()
        rundir.new_attempt(self.error_dir)
        self._exit_seen = {}
        self.stopped = set()
        self.attempt = attempt
        cfg = replace(self.cfg, error_files=self._attempt_files(attempt))
        if self.cfg.output.relay:
            self.relay = Relay(self.cfg.output, self.cfg, self.error_dir, attempt, self._dest)
            self.relay.start()
        # Keep the context for the whole attempt. On torch < 2.2 it holds one SimpleQueue per
        # worker, whose semaphore a forked worker opens by name while unpickling its arguments;
        # dropping the context unlinks them first, and the worker dies in SemLock.__setstate__
        # with FileNotFoundError.
        self._context = mp.start_processes(
            worker_main,
            args=(cfg, self.target, attempt, os.getpid(), self.error_dir),
            nprocs=self.cfg.nproc,
            join=False,
            start_method=self.start_method,
        )
        self.procs = list(self._context.processes)
        self.last_procs = self.procs
        self.watch.start(self.procs)
        if self.events is None:
            self.events = elastic_events.Recorder(self.cfg)
        self.events.started(self.procs, attempt)
        return self.procs

    def stop(self, procs: list[Any], sig: int = signal.SIGTERM, grace: float | None = None) -> None:
        """Signal every live worker's group, then SIGKILL what is left after the grace period.

        ``grace``: seconds (None: ``--shutdown-timeout``, else :data:`.signals.STOP_GRACE_S`).

        The wait is on the workers' sentinels, in slices: a second signal to the launcher (which
        no descriptor reports) ends the grace period early.
        """
        def send(s: int) -> None:
            for proc in procs:
                if proc.exitcode is None and proc.pid:
                    try:
                        os.killpg(proc.pid, s)
                    except OSError:
                        try:
                            os.kill(proc.pid, s)
                        except OSError:
                            pass

        if grace is None:
            grace = self.grace(STOP_GRACE_S)
        self.stopped.update(i for i, p in enumerate(procs) if p.exitcode is None)
        send(sig)
        deadline = time.monotonic() + grace
        seen = self.signals.count
        while any(p.exitcode is None for p in procs) and time.monotonic() < deadline:
            if self.signals.count > seen:
                break  # asked (again) while stopping: stop waiting
            multiprocessing.connection.wait([p.sentinel for p in procs if p.exitcode is None],
                                            timeout=timing.WORKER_POLL_S)
        send(signal.SIGKILL)
        reap_deadline = time.monotonic() + REAP_AFTER_KILL_S
        for proc in procs:
            proc.join(max(0.0, reap_deadline - time.monotonic()))
            if proc.exitcode is None:
                logger.warning("worker pid %s is still there %.0f s after SIGKILL (stuck in the kernel?); "
                               "going on without it", proc.pid, REAP_AFTER_KILL_S)
            # A worker leaves its group behind only if something it started is still there.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
        self._context = None

    def drain(self) -> None:
        """Every worker is gone: relay the rest of their output before the launcher says more."""
        if self.relay is not None:
            relay, self.relay = self.relay, None
            relay.drain()

    def failure_of(self, local: int, proc: Any) -> Failure:
        rank = self.cfg.rank(local)
        if self._dest is not None:  # torchrun's layout: the stream files that hold the rank's output
            log = self._dest.log_of(local)
        else:
            log = log_path(self.cfg.log_dir, rank, self.attempt) if self.cfg.log_dir else None
        path = rundir.error_record(self.error_dir, rank)
        if os.path.exists(path):
            with open(path, encoding="utf-8") as fh:
                rec = json.load(fh)
            return Failure(rank, local, self.cfg.node_rank, rec["host"], exit_code=proc.exitcode,
                           exc_type=rec["type"], message=rec["message"], traceback=rec["traceback"],
                           log=log, time=rec["time"], own_hint=rec.get("hint"))
        code = proc.exitcode
        return Failure(rank, local, self.cfg.node_rank, socket.gethostname(), exit_code=code,
                       signal_name=exit_signal(code), log=log,
                       traceback=stacks.fatal_stack(self.error_dir, rank) or None,
                       time=self._exit_seen.get(local, time.time()))

    def wait(self, procs: list[Any], board: Any = None) -> tuple[Watched, Any]:
        """Wait for the workers; return how it ended, and its detail (see :class:`Watched`).

        ``board``: the multi-node job's board (:mod:`..nodes.board`), whose events end the wait; None on one node.

        This stays a loop: it waits on the workers' sentinels, but a signal, SIGUSR1, the flight
        records and the board have no descriptor to wait on beside them, so they are looked at
        every :data:`.timing.WORKER_POLL_S`.
        """
        while True:
            if self.signals.received is not None:
                return Watched.SIGNAL, None
            live = [p.sentinel for p in procs if p.exitcode is None]
            if live:
                interval = self.cfg.torchrun.monitor_interval  # --monitor-interval
                multiprocessing.connection.wait(live, timeout=timing.WORKER_POLL_S if interval is None else interval)
            now = time.time()
            for i, p in enumerate(procs):
                if p.exitcode is not None and i not in self._exit_seen:
                    self._exit_seen[i] = now
            failed = [(i, p) for i, p in enumerate(procs) if p.exitcode not in (None, 0)]
            if failed:
                # The first failure: causes before consequences (a peer's closed connection), then
                # by when it happened (a Python error's time is the rank's own, a death's is when
                # the launcher saw it).
                candidates = [self.failure_of(i, p) for i, p in failed]
                return Watched.FAILED, min(candidates, key=lambda f: (*order(f), f.rank))
            if all(p.exitcode == 0 for p in procs):
                return Watched.OK, None
            hang = self.watch.poll()
            if hang is not None and self.cfg.hang_action == "end":
                return Watched.HANG, hang
            if board is not None:
                event = board.event()
                if event is not None:
                    return Watched.EVENT, event
