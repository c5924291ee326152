"""The supervisor: starts this node's workers, watches them, and keeps the job whole across nodes.

Usage::

    code = run_job(cfg, target, start_method)   # the command line and spawn() (:mod:`..api`); the exit code

One job, in phases (:class:`Phase`, one method of :class:`Job` each), each answering SIGINT/SIGTERM/
SIGHUP within 5 s (exit 130/143/129):

1. *connecting* to node 0 and *waiting for nodes* (multi-node only, :mod:`..nodes.membership`);
2. *checking the backend* with ``--preflight`` (:mod:`.preflight`);
3. *running*: workers forked from the fork server (:mod:`.forkserver`, :mod:`.worker`); the
   first rank that fails, or a failure or lost node reported by the board (:mod:`..nodes.board`),
   ends this node's ranks (SIGTERM to each worker's process group, SIGKILL after a grace period);
   *finishing*: every node's ranks are done;
4. *stopping the ranks* and *restarting* with ``--max-restarts``: the whole job, every node,
   again from phase 1's round;
5. *tearing down*: every worker reaped, the fork server ended, the node rank given back, the run
   directory (:mod:`.rundir`) removed.

While ranks run, the supervisor reads their flight records for hangs (:mod:`..hangs.watchdog`,
``--hang-timeout``), serves SIGUSR1 with every rank's stack (:mod:`..hangs.stacks`), and at the end
writes the JSON report (:mod:`.report`, ``--error-file``).

Every error path prints one line per event on the console; with ``--log-dir`` the launcher's own
details (torch's messages included) go to ``launcher-node{K}.log`` there.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from enum import Enum
from typing import Any

from npu_migrate.errors import NpuMigrateError
from npu_migrate.launch import hints
from npu_migrate.launch.nodes import servers
from npu_migrate.launch.procs import report, rundir
from npu_migrate.launch.setup import ports
from npu_migrate.launch.setup.config import LaunchConfig
from npu_migrate.launch.setup.target import Target
from npu_migrate.launch.errors import LaunchError, first_line, quiet_torch_elastic, say
from npu_migrate.launch.procs.failure import exit_signal, explain
from npu_migrate.launch.procs.forkserver import stop_fork_server
from npu_migrate.launch.hangs.watchdog import HangWatch
from npu_migrate.launch.procs.ranks import RankProcesses, Watched, torchrun_logs
from npu_migrate.launch.nodes.records import (
    Ended,
    Event,
    EventKind,
    Failure,
    FailureKind,
    FailureRecord,
    HangFailure,
    JobEvent,
    WireEnum,
)
from npu_migrate.launch.signals import SIGNAL_GRACE_S, Interrupted, Signals
from npu_migrate.textsafe import printable

logger = logging.getLogger(__name__)


class Phase(Enum):
    """What the launcher is doing (the text completes "the launcher failed while ...")."""

    STARTING = "starting"
    CONNECTING = "connecting to node 0"
    JOINING = "waiting for nodes"
    PREFLIGHT = "checking the backend (--preflight)"
    RUNNING = "running"
    FINISHING = "finishing"
    STOPPING = "stopping the ranks"
    RESTARTING = "restarting"


class Outcome(WireEnum):
    """The report's ``outcome`` (:mod:`.report`); JSON values as named."""

    STARTING = "starting"
    OK = "ok"
    FAILED = "failed"
    HANG = "hang"
    ABORTED = "aborted"
    PREFLIGHT = "preflight"
    INTERRUPTED = "interrupted"


class _Ended(Exception):
    """A phase ended the job with this exit code (its message is already on the console)."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class Job:
    """One launcher's job: this node's workers (:attr:`ranks`) over every attempt, phase by phase."""

    def __init__(self, cfg: LaunchConfig, target: Target, start_method: str) -> None:
        cfg, logs_specs = torchrun_logs(cfg)  # --redirects, --tee VALUE: their root is the log dir
        self.cfg = cfg
        self.start_method = start_method
        self.signals = Signals(cfg.torchrun.stop_signals)
        self.membership: Any = None  # this launcher's membership in a multi-node job (:mod:`..nodes.membership`)
        self.board: Any = None  # its board (:mod:`..nodes.board`)
        self.phase = Phase.STARTING
        # The run directory: the ranks' error records, flight records and stack dumps (:mod:`.rundir`).
        self.error_dir = rundir.create()
        self.watch = HangWatch(cfg, self.error_dir, self.signals)
        self.ranks = RankProcesses(cfg, target, start_method, self.signals, self.error_dir, self.watch, logs_specs)
        self._first_record: FailureRecord | None = None
        self._outcome = Outcome.STARTING
        # Node 0 serves MASTER_PORT for every rank, on the job's address only (:mod:`..nodes.servers`).
        self.ranks_store = servers.RankStore(cfg.addr, cfg.port) if cfg.node_rank == 0 else None

    def _enter(self, phase: Phase) -> None:
        self.phase = phase
        logger.info("node %s: %s", self.cfg.node_rank, phase.value)

    # -- the job

    def run(self) -> int:
        cfg = self.cfg
        with self.signals:
            from npu_migrate.launch.hangs import stacks

            if self.signals.serves_dumps:  # not where --signals-to-handle makes SIGUSR1 stop the job
                stacks.mark_launcher(self.error_dir)  # SIGUSR1 is handled from here on
            code: int | None = None
            try:
                if cfg.log_dir:
                    os.makedirs(cfg.log_dir, exist_ok=True)
                log_file = os.path.join(cfg.log_dir, f"launcher-node{cfg.node_rank}.log") if cfg.log_dir else None
                quiet_torch_elastic(None if cfg.rdzv.assign else log_file)  # assigned: once the node rank is known
                if cfg.nnodes > 1:
                    from npu_migrate.launch.nodes.membership import Membership

                    self.membership = Membership(cfg, self.signals)
                    self.board = self.watch.board = self.membership.board
                code = self._attempts()
                return code
            except Interrupted as exc:
                self._outcome = Outcome.INTERRUPTED
                code = self._interrupted(exc.signum)
                return code
            except NpuMigrateError:
                raise
            except Exception as exc:  # noqa: BLE001 - one line on the console, details in the log
                logger.exception("launcher failure")
                raise LaunchError(f"the launcher failed while {self.phase.value}: {type(exc).__name__}: "
                                  f"{first_line(exc)}") from exc
            finally:
                self._tear_down(code)

    def _tear_down(self, code: int | None) -> None:
        """Every worker reaped, the report written, the node rank given back, the run directory removed."""
        if self.ranks.procs:
            self.ranks.stop(self.ranks.procs, signal.SIGKILL, 0)
        try:
            self._write_report(1 if code is None else code)
        except Exception:  # noqa: BLE001 - the report must not hide why the job ended
            logger.exception("could not write the report")
        self.ranks.record_end(1 if code is None else code)  # --event-log-handler
        self.ranks.drain()
        if self.membership is not None:
            self.membership.close()
        if self.ranks_store is not None:
            self.ranks_store.close()
        rundir.remove(self.error_dir)

    def _write_report(self, code: int) -> None:
        """--error-file and report-node{K}.json in --log-dir: every rank's exit, the first failure, the hang."""
        cfg = self.cfg
        targets = report.paths(cfg.error_file, cfg.log_dir if cfg.node_rank >= 0 else None, cfg.node_rank)  # -1: none
        if not targets:
            return
        first = self._first_record
        ranks = []
        for local, proc in enumerate(self.ranks.last_procs):
            rank = cfg.rank(local)
            failure = self.ranks.failure_of(local, proc) if proc.exitcode not in (None, 0) else None
            is_first = isinstance(first, Failure) and first.rank == rank
            stopped = local in self.ranks.stopped and not is_first
            ranks.append(report.RankExit(
                rank=rank, local_rank=local, node_rank=cfg.node_rank, pid=proc.pid, exit_code=proc.exitcode,
                signal=exit_signal(proc.exitcode), stopped_by_launcher=stopped, first_failure=is_first,
                exc_type=failure.exc_type if failure else None, message=failure.message if failure else None,
                traceback=failure.traceback if failure else None,
                hint=None if failure is None or stopped else (failure.hint() or hints.signal_hint(failure.signal_name)),
            ))
        outcome = Outcome.OK if code == 0 else self._outcome
        failed = report.write(report.build(cfg.node_rank, code, outcome, ranks, first, self.watch.hang), targets)
        for line in failed:
            say(f"could not write the report to {line}")

    def _interrupted(self, sig: int) -> int:
        name = signal.Signals(sig).name
        running = [p for p in self.ranks.procs if p.exitcode is None]
        if self.ranks.procs:
            say(f"received {name}: stopping {len(running)} running rank(s) on node {self.cfg.node_rank}.")
            if self.board is not None and self.phase in (Phase.RUNNING, Phase.FINISHING):
                self.board.abort(f"the launcher of node {self.cfg.node_rank} ({self.membership.js.host}) received {name}")
            self.ranks.stop(self.ranks.procs, sig, self.ranks.grace(SIGNAL_GRACE_S))
            self.ranks.drain()
        else:
            say(f"received {name} while {self.phase.value}: stopped; no rank is left running on node "
                f"{self.cfg.node_rank}.")
        return 128 + sig

    # -- the phases of one attempt

    def _attempts(self) -> int:
        """Every attempt of the job on this node, phase by phase; returns the exit code."""
        attempt = 0
        try:
            self._connect()
            while True:
                self._serve_ranks_store()
                attempt = self._join(attempt)
                self._preflight()
                watched, detail = self._run(attempt)
                if self._conclude(watched, detail, attempt):
                    attempt = self._restart(attempt)
        except _Ended as end:
            return end.code

    @staticmethod
    def _ended_by(exc: JobEvent) -> _Ended:
        """Another node ended the job while this one was getting ready (a duplicate rank, other flags)."""
        say(f"error: {exc.event.message}")
        return _Ended(1)

    def _connect(self) -> None:
        """Phase 1 (several nodes): reach node 0, check the token and flags, claim the node rank."""
        if self.membership is None:
            return
        self._enter(Phase.CONNECTING)
        try:
            self.membership.connect()
        except JobEvent as exc:
            raise self._ended_by(exc) from exc
        if self.cfg.rdzv.assign:  # this node's rank came from the rendezvous (:mod:`..nodes.assignment`)
            cfg = self.cfg = self.watch.cfg = self.membership.cfg
            if cfg.log_dir:
                quiet_torch_elastic(os.path.join(cfg.log_dir, f"launcher-node{cfg.node_rank}.log"))
            self.ranks_store = servers.RankStore(cfg.addr, cfg.port) if cfg.node_rank == 0 else None
            say(f"this is node {cfg.node_rank} of {cfg.nnodes} (node rank from the {cfg.rdzv.backend} rendezvous)")

    def _serve_ranks_store(self) -> None:
        """Node 0: a new store on MASTER_PORT before this attempt's ranks (or pre-flight) start."""
        if self.ranks_store is None:
            return
        try:
            self.ranks_store.restart()
        except (OSError, RuntimeError) as exc:
            raise LaunchError(f"cannot serve the ranks' store on {self.cfg.addr}:{self.cfg.port} "
                              f"({first_line(exc, 120)}): pick another --port, and an --addr of this host.") from exc

    def _join(self, attempt: int) -> int:
        """Phase 1 (several nodes): wait until every node is in; returns the attempt the round runs."""
        cfg, membership = self.cfg, self.membership
        if membership is None:
            return attempt
        self._enter(Phase.JOINING)
        try:
            rnd = membership.join()
        except JobEvent as exc:
            raise self._ended_by(exc) from exc
        if rnd.generation > cfg.max_restarts:
            message = f"the job already used its {cfg.max_restarts} restart(s) (--max-restarts)"
            self.board.abort(message)
            say(f"error: {message}.")
            raise _Ended(1)
        hosts = ", ".join(f"{k}: {m.host}" for k, m in sorted(rnd.members.items()))
        say(f"all {cfg.nnodes} nodes joined (nodes {hosts})" + (f"; restart {rnd.generation}" if rnd.generation else ""))
        return rnd.generation

    def _preflight(self) -> None:
        """Phase 2 (``--preflight``): one all-reduce over every rank before the script."""
        cfg, board = self.cfg, self.board
        if not cfg.preflight:
            return
        self._enter(Phase.PREFLIGHT)
        from npu_migrate.launch.procs.preflight import run_preflight

        try:
            problem = run_preflight(cfg, self.start_method, self.error_dir, self.signals,
                                    also=board.raise_event if board is not None else (lambda: None))
        except JobEvent as exc:
            raise self._ended_by(exc) from exc
        if problem is not None:
            self._outcome, self._first_record = Outcome.PREFLIGHT, Ended(FailureKind.PREFLIGHT, problem)
            if board is not None:
                board.abort(f"node {cfg.node_rank}: {problem}")
            say(f"error: {problem}")
            raise _Ended(1)

    def _run(self, attempt: int) -> tuple[Watched, Any]:
        """Phase 3: start the ranks, watch them; on success wait for every node's ranks (finishing)."""
        self._enter(Phase.RUNNING)
        procs = self.ranks.start(attempt, self.cfg)
        watched, detail = self.ranks.wait(procs, self.board)
        if watched is Watched.FAILED and self.board is not None:
            watched, detail = self._cause_of(detail)
        if watched is Watched.OK:
            self.ranks.drain()
            if self.board is not None:
                self._enter(Phase.FINISHING)
                try:
                    self.board.finish()
                except JobEvent as exc:
                    watched, detail = Watched.EVENT, exc.event
        return watched, detail

    def _conclude(self, watched: Watched, detail: Any, attempt: int) -> bool:
        """Phase 4: end the attempt; True when the job restarts, else :class:`_Ended` with its exit code."""
        cfg, board = self.cfg, self.board
        if watched is Watched.OK:
            self._outcome = Outcome.OK
            self.ranks.procs = []
            raise _Ended(0)
        if watched is Watched.SIGNAL:
            raise Interrupted(self.signals.received or signal.SIGTERM)
        procs = self.ranks.procs
        running = sum(p.exitcode is None for p in procs)
        if watched is Watched.EVENT and detail.kind is EventKind.ABORT:
            self._outcome = Outcome.ABORTED
            self._first_record = Ended(FailureKind.ABORT, detail.message)
            self.ranks.stop(procs)
            self.ranks.drain()
            say(f"error: {detail.message}")
            raise _Ended(1)
        if watched is Watched.HANG and board is not None:
            board.wait_hang_acks(self.watch.hangs_seen)  # the other nodes print their ranks' stacks first
        headline, lines, restartable = self._explain(watched, detail)
        self._outcome = Outcome.HANG if isinstance(self._first_record, HangFailure) else Outcome.FAILED
        self._enter(Phase.STOPPING)
        self.ranks.stop(procs)
        self.ranks.drain()
        self.ranks.procs = []
        if self.signals.received is not None:  # asked to stop while tearing down
            raise Interrupted(self.signals.received)
        say(headline)
        for line in lines:  # a rank's message and traceback: text from another process
            print(f"  {printable(line)}", file=sys.stderr)
        if restartable and attempt < cfg.max_restarts:
            return True
        if board is not None:
            board.abort(f"the job failed: {headline}")
        other = "" if self._outcome is Outcome.HANG else " other"
        say(f"job failed: stopped {running}{other} rank(s) on node {cfg.node_rank}; exit code 1.")
        raise _Ended(1)

    def _restart(self, attempt: int) -> int:
        """Phase 4: the next attempt (every node again, from the round)."""
        cfg = self.cfg
        attempt += 1
        self._enter(Phase.RESTARTING)
        say(f"restarting the job (restart {attempt} of {cfg.max_restarts})"
            + (f": waiting for all {cfg.nnodes} nodes." if self.board is not None else "."))
        if self.board is not None:
            self.board.next_generation()
        return attempt

    def _explain(self, watched: Watched, detail: Any) -> tuple[str, list[str], bool]:
        """Publish this node's failure (or a lost node), read the one that won; explain it (:func:`.failure.explain`)."""
        board = self.board
        if watched in (Watched.FAILED, Watched.HANG):  # one of ours
            record, publish = detail.failure() if watched is Watched.HANG else detail, board is not None
        else:
            record, publish = detail.record, detail.kind is EventKind.LOST
        if publish:
            board.publish_failure(record)
            record = board.first_failure() or record
        self._first_record = record
        return explain(record, self.cfg.node_rank)

    def _cause_of(self, failure: Failure) -> tuple[Watched, Any]:
        """A rank's failure, or what caused it: a lost node its connection error names, or an abort.

        Returns ``(FAILED, failure)`` or ``(EVENT, Event)``, as :meth:`.RankProcesses.wait` does
        (:meth:`.Board.lost_peer`).
        """
        try:
            lost = self.board.lost_peer(failure)
        except JobEvent as exc:
            if exc.event.kind in (EventKind.ABORT, EventKind.LOST):  # the board already knows why the job ends
                return Watched.EVENT, exc.event
            return Watched.FAILED, failure  # another node's failure: the earliest wins when ours is published
        if lost is not None:
            return Watched.EVENT, Event(EventKind.LOST, lost.message, lost)
        return Watched.FAILED, failure


def run_job(cfg: LaunchConfig, target: Target, start_method: str) -> int:
    """Run the job on this node; return the launcher's exit code."""
    try:
        return Job(cfg, target, start_method).run()
    finally:
        # Every worker has been reaped. The fork server would otherwise hold our stdout and stderr
        # while its own interpreter winds down (a second or more with torch loaded), and a
        # reader of our output (`| tee`, a CI log) would wait for it. Another launch in this
        # process starts a new one.
        stop_fork_server()
        ports.release(cfg.port)  # a picked MASTER_PORT was held until now (:mod:`..setup.ports`)
