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
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from npu_migrate.errors import NpuMigrateError
from npu_migrate.launch.config import DEFAULT_NODE_TIMEOUT, LaunchConfig, Target, make_config
from npu_migrate.launch.errors import JobFailed, LaunchError, first_line, say
from npu_migrate.launch.forkserver import start_fork_server, stop_fork_server
from npu_migrate.launch.output import OutputSettings, Relay, log_path
from npu_migrate.launch.signals import SIGNAL_GRACE_S, STOP_GRACE_S, Interrupted, Signals
from npu_migrate.launch.worker import worker_main

logger = logging.getLogger(__name__)

_POLL_S = 0.05
_ERROR_TAIL_LINES = 12


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
            hint = ""
            if self.signal_name == "SIGKILL":
                hint = (" (often the kernel's out-of-memory killer: check `dmesg` or `journalctl -k`, "
                        "then lower the batch size or --device-num)")
            elif self.signal_name == "SIGSEGV":
                hint = " (a crash in native code: a driver, CANN/CUDA or an extension)"
            return f"{who} was killed by {self.signal_name}{hint}"
        return f"{who} exited with code {self.exit_code} without a Python traceback"

    def details(self) -> list[str]:
        lines = []
        if self.traceback:
            tail = self.traceback.rstrip().splitlines()[-_ERROR_TAIL_LINES:]
            lines += ["traceback (last lines):"] + [f"  {line}" for line in tail]
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
        handler = logging.FileHandler(log_file)
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
        self.error_dir = tempfile.mkdtemp(prefix="npu_migrate_launch_")
        self.relay: Relay | None = None
        self.attempt = 0

    # -- process handling

    def _start(self, attempt: int) -> list[Any]:
        import torch.multiprocessing as mp

        self._drain()
        for name in os.listdir(self.error_dir):
            os.unlink(os.path.join(self.error_dir, name))
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

        send(sig)
        deadline = time.monotonic() + grace
        seen = self.signals.count
        while any(p.exitcode is None for p in procs) and time.monotonic() < deadline:
            if self.signals.count > seen:
                break  # asked (again) while stopping: stop waiting
            multiprocessing.connection.wait([p.sentinel for p in procs if p.exitcode is None], timeout=_POLL_S)
        send(signal.SIGKILL)
        for proc in procs:
            proc.join()
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
        signal_name = None
        if code is not None and code < 0:
            try:
                signal_name = signal.Signals(-code).name
            except ValueError:
                signal_name = f"signal {-code}"
        return Failure(rank, local, self.cfg.node_rank, socket.gethostname(), exit_code=code,
                       signal_name=signal_name, log=log)

    def _watch(self, procs: list[Any]) -> tuple[str, Any]:
        """Wait for the workers; return ("ok"|"failed"|"event"|"signal", detail)."""
        while True:
            if self.signals.received is not None:
                return "signal", None
            live = [p.sentinel for p in procs if p.exitcode is None]
            if live:
                multiprocessing.connection.wait(live, timeout=_POLL_S)
            failed = [(i, p) for i, p in enumerate(procs) if p.exitcode not in (None, 0)]
            if failed:
                # The root cause is the earliest Python failure; ranks that died of its broken
                # collectives come later. Without tracebacks, the lowest rank.
                candidates = [self._failure_of(i, p) for i, p in failed]
                candidates.sort(key=lambda f: (f.exc_type is None, f.time if f.exc_type else 0, f.rank))
                return "failed", candidates[0]
            if all(p.exitcode == 0 for p in procs):
                return "ok", None
            if self.rdzv is not None:
                event = self.rdzv.event()
                if event is not None:
                    return "event", event

    # -- the job

    def run(self) -> int:
        cfg = self.cfg
        with self.signals:
            try:
                if cfg.log_dir:
                    os.makedirs(cfg.log_dir, exist_ok=True)
                log_file = os.path.join(cfg.log_dir, f"launcher-node{cfg.node_rank}.log") if cfg.log_dir else None
                _quiet_torch_elastic(log_file)
                if cfg.nnodes > 1:
                    from npu_migrate.launch.rendezvous import Rendezvous

                    self.rdzv = Rendezvous(cfg, self.signals)
                return self._attempts()
            except Interrupted as exc:
                return self._interrupted(exc.signum)
            except NpuMigrateError:
                raise
            except Exception as exc:  # noqa: BLE001 - one line on the console, details in the log
                logger.exception("launcher failure")
                raise LaunchError(f"the launcher failed while {self.phase}: {type(exc).__name__}: "
                                  f"{first_line(exc)}") from None
            finally:
                if self.procs:
                    self._stop(self.procs, signal.SIGKILL, 0)
                self._drain()
                if self.rdzv is not None:
                    self.rdzv.close()
                for name in os.listdir(self.error_dir):
                    os.unlink(os.path.join(self.error_dir, name))
                os.rmdir(self.error_dir)

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
            rdzv.connect()
        while True:
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
            self.phase = "running"
            logger.info("node %s: %s", cfg.node_rank, self.phase)
            procs = self._start(attempt)
            outcome, detail = self._watch(procs)
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
                self.procs = []
                return 0
            if outcome == "signal":
                raise Interrupted(self.signals.received or signal.SIGTERM)
            running = sum(p.exitcode is None for p in procs)
            if outcome == "event" and detail.kind == "abort":
                self._stop(procs)
                self._drain()
                say(f"error: {detail.message}")
                return 1
            headline, lines, restartable = self._explain(outcome, detail)
            self.phase = "stopping the ranks"
            logger.info("node %s: %s", cfg.node_rank, self.phase)
            self._stop(procs)
            self._drain()
            self.procs = []
            if self.signals.received is not None:  # asked to stop while tearing down
                raise Interrupted(self.signals.received)
            say(headline)
            for line in lines:
                print(f"  {line}", file=sys.stderr)
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
            say(f"job failed: stopped {running} other rank(s) on node {cfg.node_rank}; exit code 1.")
            return 1

    def _explain(self, outcome: str, detail: Any) -> tuple[str, list[str], bool]:
        """The console headline, detail lines and whether a restart can help, for a failure."""
        rdzv = self.rdzv
        if outcome == "failed":  # one of ours
            failure: Failure = detail
            if rdzv is None:
                return failure.headline(), failure.details(), True
            rdzv.publish_failure(failure.record())
            record = rdzv.first_failure() or failure.record()
        else:
            record = detail.record
            if detail.kind == "lost":
                rdzv.publish_failure(record)
                record = rdzv.first_failure() or record
        if record.get("kind") == "lost":
            node = record.get("node_rank")
            message = record.get("message") or f"lost node {node} ({record.get('host')})"
            if node == 0:
                return (f"{message}; node 0 serves the job's rendezvous, so the job ends on every node.",
                        [], False)
            return message, [], True
        failure = Failure.from_record(record)
        where = "" if failure.node_rank == self.cfg.node_rank else f" on node {failure.node_rank}"
        return failure.headline() + where, failure.details(), True


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


def spawn(
    fn: Callable[..., Any],
    args: Sequence[Any] = (),
    *,
    nproc: int | None = None,
    nnodes: int | None = None,
    node_rank: int | None = None,
    addr: str | None = None,
    port: int | None = None,
    device: str | None = None,
    log_dir: str | None = None,
    max_restarts: int = 0,
    join_timeout: float = 600.0,
    job_id: str | None = None,
    node_timeout: float = DEFAULT_NODE_TIMEOUT,
    output: OutputSettings | None = None,
) -> None:
    """Run ``fn(local_rank, *args)`` in one process per device of this node, as ``mp.spawn`` would.

    Every process gets torchrun's variables for its global rank (node rank x nproc + local rank),
    so ``fn`` can call :func:`npu_migrate.init_distributed`. ``fn`` must be importable by name
    (defined at module level) for the worker processes to find it. Their output is relayed as
    on the command line; ``output=output_settings(template="", ...)`` (:mod:`.output`) sets the
    prefix, console filter and ``tee`` there.

    Raises:
        LaunchError: bad input; nothing was started.
        JobFailed: a rank failed (its rank, host and error are in the message) or the launcher
            was interrupted.
    """
    methods: list[str] = []
    target = Target(fn=fn, args=tuple(args))
    try:
        cfg = make_config(nproc, nnodes, node_rank, addr, port, device, log_dir, max_restarts, join_timeout,
                          before_device=lambda: methods.append(start_fork_server()), job_id=job_id,
                          node_timeout=node_timeout, identity=target.identity(), output=output)
    except NpuMigrateError:
        stop_fork_server()
        raise
    code = run_job(cfg, target, methods[0])
    if code != 0:
        raise JobFailed(f"the job ended with exit code {code}; see the messages above.", code)
