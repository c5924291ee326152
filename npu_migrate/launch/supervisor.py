"""The supervisor: starts this node's workers, watches them, and keeps the job whole across nodes.

Usage::

    from npu_migrate.launch import spawn
    spawn(train, args=(opt,), nproc=8, nnodes=2, node_rank=0, addr="10.0.0.1")  # fn(local_rank, *args)

    code = run_job(cfg, target, start_method)   # what the command line does; returns the exit code

One job, in phases, each answering SIGINT/SIGTERM within 5 s (exit 130/143):

1. *connecting* to node 0 and *waiting for nodes* (multi-node only, :mod:`.rendezvous`);
2. *running*: workers forked from the fork server (:mod:`.forkserver`, :mod:`.worker`); the
   first rank that fails, or a failure or lost node reported by the rendezvous board, ends this
   node's ranks (SIGTERM to each worker's process group, SIGKILL after a grace period);
3. *restarting* with ``--max-restarts``: the whole job, every node, again from phase 1's round;
4. *tearing down*: every worker reaped, the fork server ended, the node rank given back.

While ranks run, the supervisor reads their flight records (:mod:`.flight`) twice a second for
hangs (:mod:`.watchdog`, ``--hang-timeout``), serves SIGUSR1 with every rank's stack
(:mod:`.stacks`), and at the end writes the JSON report (:mod:`.report`, ``--error-file``).
``--preflight`` all-reduces once before the script (:mod:`.preflight`).

Every error path prints one line per event on the console; with ``--log-dir`` the launcher's own
details (torch's messages included) go to ``launcher-node{K}.log`` there.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from npu_migrate.errors import NpuMigrateError
from npu_migrate.launch import flight, hints, report, rundir, stacks, stores
from npu_migrate.launch.config import DEFAULT_NODE_TIMEOUT, LaunchConfig, Target, make_config
from npu_migrate.launch.errors import JobFailed, LaunchError, first_line, say
from npu_migrate.launch.forkserver import start_fork_server, stop_fork_server
from npu_migrate.launch.output import OutputSettings, Relay, log_path
from npu_migrate.launch.signals import REAP_AFTER_KILL_S, SIGNAL_GRACE_S, STOP_GRACE_S, Interrupted, Signals
from npu_migrate.launch.watchdog import Hang, Watchdog, state_from_dict
from npu_migrate.launch.worker import worker_main
from npu_migrate.textsafe import printable

logger = logging.getLogger(__name__)

_POLL_S = 0.05
_ERROR_TAIL_LINES = 12
_WATCH_EVERY_S = 0.5
"""How often the launcher reads its ranks' flight records."""


@dataclass
class Failure:
    """Why the job is ending, as every launcher reports it."""

    rank: int
    local_rank: int
    node_rank: int
    host: str
    exit_code: int | None = None
    signal_name: str | None = None
    exc_type: str | None = None
    message: str | None = None
    traceback: str | None = None
    log: str | None = None
    time: float = field(default_factory=time.time)

    def headline(self) -> str:
        who = f"rank {self.rank} (local rank {self.local_rank} on node {self.node_rank}, host {self.host})"
        if self.exc_type is not None:
            return f"{who} failed: {self.exc_type}: {self.message}"
        if self.signal_name is not None:
            hint = hints.signal_hint(self.signal_name)
            return f"{who} was killed by {self.signal_name}" + (f" ({hint})" if hint else "")
        return f"{who} exited with code {self.exit_code} without a Python traceback"

    def hint(self) -> str | None:
        """What to check for a known backend error in the message or traceback."""
        if self.exc_type is None:
            return None
        return hints.error_hint(f"{self.message}\n{self.traceback or ''}")

    def details(self) -> list[str]:
        lines = []
        hint = self.hint()
        if hint:
            lines.append(f"hint: {hint}")
        if self.traceback:
            tail = self.traceback.rstrip().splitlines()[-_ERROR_TAIL_LINES:]
            title = "traceback (last lines):" if self.exc_type else "Python stack at the signal (last lines):"
            lines += [title] + [f"  {line}" for line in tail]
        if self.log:
            lines.append(f"full output: {self.log}")
        return lines

    def record(self) -> dict[str, Any]:
        return {"kind": "rank", **self.__dict__, "message_line": self.headline()}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Failure:
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in record.items() if k in names})


def _quiet_torch_elastic(log_file: str | None) -> None:
    """torch's rendezvous logs, and the launcher's own, go to the launcher log (with --log-dir), never to the console."""
    elastic = logging.getLogger("torch.distributed.elastic")
    elastic.propagate = False
    if not any(isinstance(h, logging.NullHandler) for h in elastic.handlers):
        elastic.addHandler(logging.NullHandler())
    if log_file:
        from npu_migrate import fileio  # private (0600), never through a planted symlink

        handler = logging.StreamHandler(os.fdopen(fileio.open_private_append(log_file), "a", encoding="utf-8"))
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        for name in ("torch.distributed.elastic", "npu_migrate.launch"):
            lg = logging.getLogger(name)
            lg.addHandler(handler)
            lg.setLevel(logging.DEBUG)


class Job:
    """One launcher's job: this node's workers over every attempt."""

    def __init__(self, cfg: LaunchConfig, target: Target, start_method: str) -> None:
        self.cfg = cfg
        self.target = target
        self.start_method = start_method
        self.signals = Signals()
        self.rdzv: Any = None
        self.procs: list[Any] = []
        self.phase = "starting"
        self._context: Any = None
        # The run directory: the ranks' error records, flight records and stack dumps (:mod:`.stacks`).
        self.error_dir = stacks.make_run_dir()
        self.watchdog: Watchdog | None = None
        self._next_watch = 0.0
        self._dumps_served = 0
        self._hangs_seen = 0  # hangs node 0 announced that this node has answered
        self._exit_seen: dict[int, float] = {}
        self._last_procs: list[Any] = []
        self._stopped: set[int] = set()
        self._first_record: dict[str, Any] | None = None
        self._hang: dict[str, Any] | None = None
        self._outcome = "starting"
        self.relay: Relay | None = None
        self.attempt = 0
        # Node 0 serves MASTER_PORT for every rank, on the job's address only (:mod:`.stores`).
        self.ranks_store = stores.RankStore(cfg.addr, cfg.port) if cfg.node_rank == 0 else None

    # -- process handling

    def _start(self, attempt: int) -> list[Any]:
        import torch.multiprocessing as mp

        self._drain()
        for name in os.listdir(self.error_dir):
            if name not in ("launcher.json", rundir.LOCK):
                os.unlink(os.path.join(self.error_dir, name))
        self._exit_seen = {}
        self._stopped = set()
        self._dumps_served = self.signals.dumps  # asked while no rank ran: nothing to show
        self.watchdog = Watchdog(self.cfg.hang_timeout,
                                 {self.cfg.rank(i): flight.record_path(self.error_dir, self.cfg.rank(i))
                                  for i in range(self.cfg.nproc)})
        if self.rdzv is not None and self.cfg.node_rank != 0:
            self.watchdog.timeout = 0  # node 0 decides, from every node's records
        self.attempt = attempt
        if self.cfg.output.relay:
            self.relay = Relay(self.cfg.output, self.cfg, self.error_dir, attempt)
            self.relay.start()
        # Keep the context for the whole attempt. On torch < 2.2 it holds one SimpleQueue per
        # worker, whose semaphore a forked worker opens by name while unpickling its arguments;
        # dropping the context unlinks them first, and the worker dies in SemLock.__setstate__
        # with FileNotFoundError.
        self._context = mp.start_processes(
            worker_main,
            args=(self.cfg, self.target, attempt, os.getpid(), self.error_dir),
            nprocs=self.cfg.nproc,
            join=False,
            start_method=self.start_method,
        )
        self.procs = list(self._context.processes)
        self._last_procs = self.procs
        return self.procs

    def _stop(self, procs: list[Any], sig: int = signal.SIGTERM, grace: float = STOP_GRACE_S) -> None:
        """Signal every live worker's group, then SIGKILL what is left after the grace period."""
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

        self._stopped.update(i for i, p in enumerate(procs) if p.exitcode is None)
        send(sig)
        deadline = time.monotonic() + grace
        seen = self.signals.count
        while any(p.exitcode is None for p in procs) and time.monotonic() < deadline:
            if self.signals.count > seen:
                break  # asked (again) while stopping: stop waiting
            multiprocessing.connection.wait([p.sentinel for p in procs if p.exitcode is None], timeout=_POLL_S)
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

    def _drain(self) -> None:
        """Every worker is gone: relay the rest of their output before the launcher says more."""
        if self.relay is not None:
            relay, self.relay = self.relay, None
            relay.drain()

    def _failure_of(self, local: int, proc: Any) -> Failure:
        rank = self.cfg.rank(local)
        log = log_path(self.cfg.log_dir, rank, self.attempt) if self.cfg.log_dir else None
        path = os.path.join(self.error_dir, f"rank{rank}.json")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as fh:
                rec = json.load(fh)
            return Failure(rank, local, self.cfg.node_rank, rec["host"], exit_code=proc.exitcode,
                           exc_type=rec["type"], message=rec["message"], traceback=rec["traceback"],
                           log=log, time=rec["time"])
        code = proc.exitcode
        signal_name = _signal_name(code)
        return Failure(rank, local, self.cfg.node_rank, socket.gethostname(), exit_code=code,
                       signal_name=signal_name, log=log, traceback=stacks.fatal_stack(self.error_dir, rank) or None,
                       time=self._exit_seen.get(local, time.time()))

    def _watch(self, procs: list[Any]) -> tuple[str, Any]:
        """Wait for the workers; return ("ok"|"failed"|"event"|"signal"|"hang", detail)."""
        while True:
            if self.signals.received is not None:
                return "signal", None
            live = [p.sentinel for p in procs if p.exitcode is None]
            if live:
                multiprocessing.connection.wait(live, timeout=_POLL_S)
            now = time.time()
            for i, p in enumerate(procs):
                if p.exitcode is not None and i not in self._exit_seen:
                    self._exit_seen[i] = now
            failed = [(i, p) for i, p in enumerate(procs) if p.exitcode not in (None, 0)]
            if failed:
                # The first failure by when it happened: a Python error's time is the rank's own,
                # a death's is when the launcher saw it. Ranks that died of its broken
                # collectives come later.
                candidates = [self._failure_of(i, p) for i, p in failed]
                candidates.sort(key=lambda f: (f.time, f.rank))
                return "failed", candidates[0]
            if all(p.exitcode == 0 for p in procs):
                return "ok", None
            if self.signals.dumps > self._dumps_served:
                self._dumps_served = self.signals.dumps
                self._dump_stacks("on request (SIGUSR1)")
            if time.monotonic() >= self._next_watch:
                self._next_watch = time.monotonic() + _WATCH_EVERY_S
                hang = self._watch_flight()
                if hang is not None and self.cfg.hang_action == "end":
                    return "hang", hang
            if self.rdzv is not None:
                event = self.rdzv.event()
                if event is not None:
                    return "event", event

    # -- flight records, hangs and stacks

    def _live_ranks(self) -> dict[int, int]:
        """{rank: pid} of this node's running ranks that have a flight record (their dumps are armed)."""
        return {self.cfg.rank(i): p.pid for i, p in enumerate(self.procs)
                if p.exitcode is None and p.pid and os.path.exists(flight.record_path(self.error_dir, self.cfg.rank(i)))}

    def _dump_stacks(self, why: str, states: dict[int, str] | None = None) -> dict[int, str]:
        """Print every running rank's stack on this node (all threads); also stacks.txt for `npu-migrate stacks`."""
        cfg = self.cfg
        texts = stacks.collect(self.error_dir, self._live_ranks())
        if states is None and self.watchdog is not None:
            states = {r: s.describe() for r, s in self.watchdog.read().items()}
        node = cfg.node_rank if cfg.nnodes > 1 else None
        where = f" on node {cfg.node_rank}" if cfg.nnodes > 1 else ""
        block = stacks.format_stacks(texts, states, node)
        head = f"stacks of {len(texts)} rank(s){where}, {why}, all threads, most recent call first:"
        say(head)
        if block:  # stacks the ranks dumped: strip what could drive the terminal, keep every line
            print(printable(block, max(len(block), 1), keep_newlines=True), file=sys.stderr, flush=True)
        stacks.write_dump(self.error_dir, self.signals.dumps, f"{head}\n{block}")
        return texts

    def _relay_hang(self, announced: dict[str, Any]) -> None:
        """Node 0 announced a hang (a record from the store): print this node's stacks once per hang."""
        try:
            hang_id = int(announced.get("id", 0))
            summary = printable(announced.get("summary"))
            states = {int(r): printable(v["state"], 200) for r, v in announced.get("states", {}).items()}
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            logger.debug("unreadable hang announcement: %s", exc)
            return
        if hang_id <= self._hangs_seen:
            return
        self._hangs_seen = hang_id
        say(f"node 0 reports a hang: {summary}")
        texts = self._dump_stacks("at the hang", states)
        self._hang = {**announced, "summary": summary, "stacks": {str(r): t for r, t in texts.items()}}
        self.rdzv.ack_hang(hang_id)

    def _watch_flight(self) -> Hang | None:
        """Read the flight records; report a hang (node 0 decides for every node). Returns the hang, if new."""
        dog, rdzv, cfg = self.watchdog, self.rdzv, self.cfg
        if dog is None:
            return None
        extra = None
        if rdzv is not None:
            extra = {}
            for node, record in rdzv.flight_in.items():
                try:
                    extra.update({int(r): state_from_dict(v) for r, v in json.loads(record).items()})
                except (ValueError, TypeError, KeyError, AttributeError) as exc:  # written by another process
                    logger.debug("node %s's flight records unreadable: %s", node, exc)
            announced = rdzv.hang_in
            if cfg.node_rank != 0 and announced is not None:
                self._relay_hang(announced)
        hang = dog.poll(extra)
        if rdzv is not None and cfg.node_rank != 0:
            rdzv.flight_out = json.dumps({str(r): s.as_dict() for r, s in dog.states.items() if r in dog.paths})
        if hang is None:
            return None
        say(f"hang: no rank made progress for {hang.stalled_s:.0f} s (--hang-timeout {dog.timeout:g}) while "
            f"rank(s) wait in a collective; every rank's stack follows.")
        texts = self._dump_stacks("at the hang", {r: v["state"] for r, v in hang.states.items()})
        self._hangs_seen += 1
        self._hang = {**hang.record(), "summary": hang.summary, "stacks": {str(r): t for r, t in texts.items()}}
        if rdzv is not None:
            rdzv.announce_hang({**hang.record(), "summary": hang.summary, "id": self._hangs_seen})
        if cfg.hang_action == "report":  # with "end", the job's failure report says it
            say(f"hang: {hang.summary}")
            say("hang: --hang-action report: the job keeps running; the next report comes after progress resumes.")
        return hang

    # -- the job

    def run(self) -> int:
        cfg = self.cfg
        with self.signals:
            stacks.mark_launcher(self.error_dir)  # SIGUSR1 is handled from here on
            code: int | None = None
            try:
                if cfg.log_dir:
                    os.makedirs(cfg.log_dir, exist_ok=True)
                log_file = os.path.join(cfg.log_dir, f"launcher-node{cfg.node_rank}.log") if cfg.log_dir else None
                _quiet_torch_elastic(log_file)
                if cfg.nnodes > 1:
                    from npu_migrate.launch.rendezvous import Rendezvous

                    self.rdzv = Rendezvous(cfg, self.signals)
                code = self._attempts()
                return code
            except Interrupted as exc:
                self._outcome = "interrupted"
                code = self._interrupted(exc.signum)
                return code
            except NpuMigrateError:
                raise
            except Exception as exc:  # noqa: BLE001 - one line on the console, details in the log
                logger.exception("launcher failure")
                raise LaunchError(f"the launcher failed while {self.phase}: {type(exc).__name__}: "
                                  f"{first_line(exc)}") from None
            finally:
                if self.procs:
                    self._stop(self.procs, signal.SIGKILL, 0)
                try:
                    self._write_report(1 if code is None else code)
                except Exception:  # noqa: BLE001 - the report must not hide why the job ended
                    logger.exception("could not write the report")
                self._drain()
                if self.rdzv is not None:
                    self.rdzv.close()
                if self.ranks_store is not None:
                    self.ranks_store.close()
                rundir.remove(self.error_dir)

    def _write_report(self, code: int) -> None:
        """--error-file and report-node{K}.json in --log-dir: every rank's exit, the first failure, the hang."""
        cfg = self.cfg
        targets = report.paths(cfg.error_file, cfg.log_dir, cfg.node_rank)
        if not targets:
            return
        first = self._first_record
        ranks = []
        for local, proc in enumerate(self._last_procs):
            rank = cfg.rank(local)
            failure = self._failure_of(local, proc) if proc.exitcode not in (None, 0) else None
            is_first = bool(first and first.get("kind", "rank") == "rank" and first.get("rank") == rank)
            stopped = local in self._stopped and not is_first
            ranks.append(report.RankExit(
                rank=rank, local_rank=local, node_rank=cfg.node_rank, pid=proc.pid, exit_code=proc.exitcode,
                signal=_signal_name(proc.exitcode), stopped_by_launcher=stopped, first_failure=is_first,
                exc_type=failure.exc_type if failure else None, message=failure.message if failure else None,
                traceback=failure.traceback if failure else None,
                hint=None if failure is None or stopped else (failure.hint() or hints.signal_hint(failure.signal_name)),
            ))
        outcome = "ok" if code == 0 else self._outcome
        failed = report.write(report.build(cfg.node_rank, code, outcome, ranks, first, self._hang), targets)
        for line in failed:
            say(f"could not write the report to {line}")

    def _interrupted(self, sig: int) -> int:
        name = signal.Signals(sig).name
        running = [p for p in self.procs if p.exitcode is None]
        if self.procs:
            say(f"received {name}: stopping {len(running)} running rank(s) on node {self.cfg.node_rank}.")
            if self.rdzv is not None and self.phase in ("running", "finishing"):
                self.rdzv.abort(f"the launcher of node {self.cfg.node_rank} ({self.rdzv.host}) received {name}")
            self._stop(self.procs, sig, SIGNAL_GRACE_S)
            self._drain()
        else:
            say(f"received {name} while {self.phase}: stopped; no rank is left running on node {self.cfg.node_rank}.")
        return 128 + sig

    def _attempts(self) -> int:
        cfg, rdzv = self.cfg, self.rdzv
        from npu_migrate.launch.rendezvous import JobEvent

        attempt = 0
        if rdzv is not None:
            self.phase = "connecting to node 0"
            logger.info("node %s: %s", cfg.node_rank, self.phase)
            try:
                rdzv.connect()
            except JobEvent as exc:  # another node ended the forming job (a duplicate rank, other flags)
                say(f"error: {exc.event.message}")
                return 1
        while True:
            self._serve_ranks_store()
            if rdzv is not None:
                self.phase = "waiting for nodes"
                logger.info("node %s: %s", cfg.node_rank, self.phase)
                try:
                    rnd = rdzv.join()
                except JobEvent as exc:
                    say(f"error: {exc.event.message}")
                    return 1
                attempt = rnd.generation
                if attempt > cfg.max_restarts:
                    message = f"the job already used its {cfg.max_restarts} restart(s) (--max-restarts)"
                    rdzv.abort(message)
                    say(f"error: {message}.")
                    return 1
                hosts = ", ".join(f"{k}: {m.host}" for k, m in sorted(rnd.members.items()))
                say(f"all {cfg.nnodes} nodes joined (nodes {hosts})" + (f"; restart {attempt}" if attempt else ""))
            if cfg.preflight:
                self.phase = "checking the backend (--preflight)"
                logger.info("node %s: %s", cfg.node_rank, self.phase)
                from npu_migrate.launch.preflight import run_preflight

                try:
                    problem = run_preflight(cfg, self.start_method, self.error_dir, self.signals,
                                            also=rdzv._raise_event if rdzv is not None else (lambda: None))
                except JobEvent as exc:
                    say(f"error: {exc.event.message}")
                    return 1
                if problem is not None:
                    self._outcome, self._first_record = "preflight", {"kind": "preflight", "message": problem}
                    if rdzv is not None:
                        rdzv.abort(f"node {cfg.node_rank}: {problem}")
                    say(f"error: {problem}")
                    return 1
            self.phase = "running"
            logger.info("node %s: %s", cfg.node_rank, self.phase)
            procs = self._start(attempt)
            outcome, detail = self._watch(procs)
            if outcome == "failed" and rdzv is not None:
                outcome, detail = self._cause_of(detail)
            if outcome == "ok":
                self._drain()
            if outcome == "ok" and rdzv is not None:
                self.phase = "finishing"
                logger.info("node %s: %s", cfg.node_rank, self.phase)
                try:
                    rdzv.finish()
                except JobEvent as exc:
                    outcome, detail = "event", exc.event
            if outcome == "ok":
                self._outcome = "ok"
                self.procs = []
                return 0
            if outcome == "signal":
                raise Interrupted(self.signals.received or signal.SIGTERM)
            running = sum(p.exitcode is None for p in procs)
            if outcome == "event" and detail.kind == "abort":
                self._outcome = "aborted"
                self._first_record = {"kind": "abort", "message": detail.message}
                self._stop(procs)
                self._drain()
                say(f"error: {detail.message}")
                return 1
            if outcome == "hang" and rdzv is not None:
                rdzv.wait_hang_acks(self._hangs_seen)  # the other nodes print their ranks' stacks first
            headline, lines, restartable = self._explain(outcome, detail)
            self._outcome = "hang" if (self._first_record or {}).get("kind") == "hang" else "failed"
            self.phase = "stopping the ranks"
            logger.info("node %s: %s", cfg.node_rank, self.phase)
            self._stop(procs)
            self._drain()
            self.procs = []
            if self.signals.received is not None:  # asked to stop while tearing down
                raise Interrupted(self.signals.received)
            say(headline)
            for line in lines:  # a rank's message and traceback: text from another process
                print(f"  {printable(line)}", file=sys.stderr)
            if restartable and attempt < cfg.max_restarts:
                attempt += 1
                self.phase = "restarting"
                logger.info("node %s: %s", cfg.node_rank, self.phase)
                say(f"restarting the job (restart {attempt} of {cfg.max_restarts})"
                    + (f": waiting for all {cfg.nnodes} nodes." if rdzv is not None else "."))
                if rdzv is not None:
                    rdzv.next_generation()
                continue
            if rdzv is not None:
                rdzv.abort(f"the job failed: {headline}")
            other = "" if self._outcome == "hang" else " other"
            say(f"job failed: stopped {running}{other} rank(s) on node {cfg.node_rank}; exit code 1.")
            return 1

    def _serve_ranks_store(self) -> None:
        """Node 0: a new store on MASTER_PORT before this attempt's ranks (or pre-flight) start."""
        if self.ranks_store is None:
            return
        try:
            self.ranks_store.restart()
        except (OSError, RuntimeError) as exc:
            raise LaunchError(f"cannot serve the ranks' store on {self.cfg.addr}:{self.cfg.port} "
                              f"({first_line(exc, 120)}): pick another --port, and an --addr of this host.") from None

    def _explain(self, outcome: str, detail: Any) -> tuple[str, list[str], bool]:
        """The console headline, detail lines and whether a restart can help, for a failure."""
        rdzv = self.rdzv
        if outcome in ("failed", "hang"):  # one of ours
            record = detail.record()
            if rdzv is not None:
                rdzv.publish_failure(record)
                record = rdzv.first_failure() or record
        else:
            record = detail.record
            if detail.kind == "lost":
                rdzv.publish_failure(record)
                record = rdzv.first_failure() or record
        self._first_record = record
        if record.get("kind") == "hang":
            return record.get("message") or "hang", [], True
        if record.get("kind") == "lost":
            node = record.get("node_rank")
            message = record.get("message") or f"lost node {node} ({record.get('host')})"
            after = _failure_from(record.get("after"))
            lines = [f"after it: {after.headline()}"] if after is not None else []
            if node == 0:
                return (f"{message}; node 0 serves the job's rendezvous, so the job ends on every node.",
                        lines, False)
            return message, lines, True
        failure = _failure_from(record)
        if failure is None:  # not a record this launcher writes: say what it says
            return f"the job failed: {record.get('message') or record}", [], True
        where = "" if failure.node_rank == self.cfg.node_rank else f" on node {failure.node_rank}"
        return failure.headline() + where, failure.details(), True

    def _cause_of(self, failure: Failure) -> tuple[str, Any]:
        """A rank's failure, or what caused it: a lost node its connection error names, or an abort.

        Returns ``("failed", failure)`` or ``("event", Event)``, as :meth:`_watch` does
        (:meth:`.Rendezvous.lost_peer`).
        """
        from npu_migrate.launch.rendezvous import Event, JobEvent

        try:
            lost = self.rdzv.lost_peer(failure.record())
        except JobEvent as exc:
            if exc.event.kind in ("abort", "lost"):  # the board already knows why the job ends
                return "event", exc.event
            return "failed", failure  # another node's failure: the earliest wins when ours is published
        if lost is not None:
            return "event", Event("lost", lost["message"], lost)
        return "failed", failure


def _failure_from(record: Any) -> Failure | None:
    """A rank's failure record as another launcher published it, or None if it is not one."""
    if not isinstance(record, dict):
        return None
    try:
        return Failure.from_record(record)
    except TypeError:  # fields missing
        return None


def _signal_name(code: int | None) -> str | None:
    """``SIGKILL`` for an exit code of -9; None for a plain exit."""
    if code is None or code >= 0:
        return None
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


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


def spawn(fn: Callable[..., Any], args: Sequence[Any] = (), options: Any = None, **settings: Any) -> None:
    """Run ``fn(local_rank, *args)`` in one process per device of this node, as ``mp.spawn`` would.

    Every process gets torchrun's variables for its global rank (node rank x nproc + local rank),
    so ``fn`` can call :func:`npu_migrate.init_distributed`. ``fn`` must be importable by name
    (defined at module level) for the worker processes to find it. Their output is relayed as
    on the command line; ``output=output_settings(template="", ...)`` (:mod:`.output`) sets the
    prefix, console filter and ``tee`` there.

    Args:
        fn: the function every process runs.
        args: its arguments after the local rank.
        options: a :class:`npu_migrate.launch.options.LaunchOptions` (the command line's options).
        settings: the same options as keywords, over ``options``: ``nproc``, ``nnodes``,
            ``node_rank``, ``addr``, ``port``, ``device``, ``log_dir``, ``max_restarts``,
            ``join_timeout``, ``job_id``, ``node_timeout``, ``output`` and the others
            :class:`~npu_migrate.launch.options.LaunchOptions` lists.

    Raises:
        LaunchError: bad input; nothing was started.
        JobFailed: a rank failed (its rank, host and error are in the message) or the launcher
            was interrupted.
        TypeError: a keyword that is no launch option.
    """
    methods: list[str] = []
    target = Target(fn=fn, args=tuple(args))
    try:
        cfg = make_config(options, before_device=lambda: methods.append(start_fork_server()),
                          identity=target.identity(), **settings)
    except BaseException:
        stop_fork_server()
        raise
    code = run_job(cfg, target, methods[0])
    if code != 0:
        raise JobFailed(f"the job ended with exit code {code}; see the messages above.", code)
