"""Multi-node membership: torch.distributed.elastic's dynamic rendezvous, plus a heartbeat and failure board.

Usage (by the supervisor; one object per launcher)::

    rdzv = Rendezvous(cfg, signals)
    rdzv.connect()                 # reach node 0's store, check the job token, claim this node rank
    rnd = rdzv.join()              # every node is in: generation, node ranks and hosts
    ...                            # start the workers; poll rdzv.event() while they run
    rdzv.finish(rnd.generation)    # every node's workers are done
    rdzv.close()

**Engine.** Node 0's launcher serves a ``TCPStore`` on ``--port + 1``. Membership is torch's
:class:`DynamicRendezvousHandler` over the c10d backend (``C10dRendezvousBackend``) with
``min_nodes = max_nodes = --nnodes`` and ``run_id`` = the job token; its keep-alive drops a
participant that stops beating after ``--node-timeout``, so a replacement can join the next round.
The handler numbers nodes its own way; the job's ranks stay ``node_rank x nproc + local_rank``:
after each round every node publishes its ``--node-rank`` under its handler rank, and the round
is accepted when the ranks are exactly ``0..nnodes-1``.

**Keys** (all under ``npu_migrate/<job id>/`` in that store, except the first):

===================== ====================================================================
``npu_migrate/job``   the job token, set by node 0; a launcher with another token is refused
                      and touches nothing else (another job or a stale launcher).
``shape``             ``{"nnodes", "device_num", "max_restarts", "hccl"}`` (``hccl``: the HCCL
                      variables every node must share, :mod:`.hccl`), first writer wins; a node
                      with other values aborts the job, so every node says why.
``claim/<K>``         ``{"owner", "host", "pid"}`` of the launcher holding node rank K (with
                      ``"ended": true`` once the job finished). Taken over when its owner is
                      marked lost or does not answer a ping for ``--node-timeout``; while it
                      answers, after it ended, or if node 0 ends meanwhile, the newcomer is a
                      duplicate and is refused.
``ping/<owner>``,
``pong/<owner>/<n>``  "are you there?" (:mod:`.liveness`): answered by the owner's heartbeat.
``alive/<owner>``     a counter each launcher adds 1 to every ``node_timeout / 10`` seconds
                      (the heartbeat board); a counter that stands still for ``--node-timeout``
                      means that node is lost. Node 0's own loss shows as the store going away.
``lost/<owner>``      set by the node that noticed the loss: the relaunched node may claim at once.
``running``           the generation that is running ("" while nodes are joining): a duplicate
                      node rank ends a forming job, but is only refused by a running one.
``gen``               the newest generation (restart count).
``fail/<gen>``        the first failure of a generation (a rank's error, a hang, or a lost
                      node, also one a rank's connection error named: :meth:`Rendezvous.lost_peer`),
                      JSON; the one with the earliest ``time`` wins (compare-and-set: a node
                      replaces a later one); every node stops its ranks, then restarts or ends.
``flight/<gen>/<K>``  node K's ranks' flight records (:mod:`.flight`), JSON, every heartbeat;
                      node 0 reads them to decide a hang for the whole job (:mod:`.watchdog`).
``hang/<gen>``        the latest hang node 0 declared: ``{"id", "summary", "states", ...}``;
                      every node prints its own ranks' stacks for a new id, then adds 1 to
``hang_ack/<gen>/<id>`` which node 0 waits for (a few seconds) before ending the job.
``abort``             a reason that ends every launcher of the job, in any phase (duplicate
                      node rank, mismatched flags, a signalled launcher, the job's last failure).
``done/<gen>``,
``acked/<gen>``       counters: every node's ranks finished; node 0 serves until all have read it.
``seen/abort``,
``seen/<gen>``        counters: the nodes that read ``abort`` / ``fail/<gen>``; node 0 serves
                      (for at most two heartbeats) until the others have read why the job ends.
``member/<i>``        (in the round's own store) ``{"node_rank", "host", "owner", "gen", "addr"}`` of
                      handler rank i.
===================== ====================================================================

Node 0 holds the store: if node 0 is lost, the other nodes end the job even with
``--max-restarts`` (a new node 0 would serve an empty store that the survivors do not know).

The token is a namespace, not a secret. Node 0 serves the store on ``--addr`` only
(:mod:`.stores`), but anyone who reaches ``--port + 1`` can read and write every key there, as
with torchrun's c10d rendezvous: torch's rendezvous state is a pickle, so that is code execution
in every launcher. With a job secret (``NPU_MIGRATE_JOB_SECRET`` or ``--secret-file``, the same
on every node) every value above, counters included, is signed and checked before it is used
(:mod:`.authstore`); a node with another secret, or none, is refused in one line.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import socket
import threading
import time
import uuid
from datetime import timedelta
from typing import Any, Callable

from npu_migrate.launch import authstore, cluster, stores
from npu_migrate.launch.board import FIELD_LIMIT as _FIELD_LIMIT
from npu_migrate.launch.board import Event, JobEvent, Member, Round
from npu_migrate.launch.board import as_record as _as_record
from npu_migrate.launch.board import peek as _peek
from npu_migrate.launch.config import CONTROL_PORT_OFFSET, LaunchConfig
from npu_migrate.launch.errors import LaunchError, first_line
from npu_migrate.launch.liveness import Liveness, answer_pings, ask, lost_record, named_in
from npu_migrate.launch.signals import Interrupted, Signals, run_interruptibly
from npu_migrate.textsafe import printable

logger = logging.getLogger(__name__)

JOB_KEY = "npu_migrate/job"
_ERRORS_BEFORE_LOST = 3
LOSS_CONFIRM_SHARE = 0.5
"""How long (a share of ``--node-timeout``) a node named in a rank's connection error is asked
whether its launcher is there before it is called lost. A live launcher answers within one
heartbeat (a tenth of the node timeout); half of it leaves a busy one five beats, and names a
node that is gone in half the time the heartbeat board would."""
LOSS_CONFIRM_BEATS = 3
"""... and never fewer heartbeats than this, where a tenth of the node timeout is clamped."""


def _describe_host() -> str:
    return socket.gethostname()


class Rendezvous:
    """This launcher's membership in a multi-node job (see the module docstring)."""

    def __init__(self, cfg: LaunchConfig, signals: Signals) -> None:
        self.cfg = cfg
        self.signals = signals
        self.prefix = f"npu_migrate/{cfg.job_id}"
        self.owner = uuid.uuid4().hex
        found = cluster.interface_for(cfg.addr)
        self.local_ip = found[1] if found else None
        self.host = f"{_describe_host()} ({self.local_ip})" if self.local_ip else _describe_host()
        self.secret = authstore.job_secret()  # None: values are not signed (as before)
        self._server: Any = None  # node 0: the store server itself (see :mod:`.stores`)
        self.store: Any = None
        self._watch_store: Any = None
        self._handler: Any = None
        self.generation = 0
        self._lock = threading.Lock()
        self._members: dict[int, Member] = {}
        self._last_change: dict[int, float] = {}
        self._counters: dict[int, int] = {}
        self._last_ok = time.monotonic()
        self._errors = 0
        self._last_error = ""
        self._abort: str | None = None
        self._fail: dict[int, str] = {}
        self._stop = threading.Event()
        self._claimed = False
        self._watching = False
        self._interval = max(0.2, min(2.0, cfg.node_timeout / 10))
        self._seen_sent: set[str] = set()
        self._answered = 0  # pings to this launcher answered (:mod:`.liveness`)
        self._finished = False  # every node's ranks finished: the claim stays, marked ended
        self._lost: set[int] = set()  # node ranks this launcher published as lost
        self._told: tuple[str, float] | None = None  # (seen key, when) of the job's end, published or read
        self.flight_out: str | None = None  # this node's ranks' flight records, published every beat
        self.flight_in: dict[int, str] = {}  # node 0: the other nodes' records, as last read
        self.hang_in: dict[str, Any] | None = None  # the latest hang node 0 announced

    # -- store helpers

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}"

    def _wait(self, fn: Callable[[], Any], name: str) -> Any:
        """Run a blocking store call in a thread; signals and job events interrupt the wait.

        A store error that comes with (or right after) an abort is reported as the abort: node 0
        ends its store soon after telling everyone why.
        """
        try:
            return run_interruptibly(fn, self.signals, f"npu_migrate-{name}", also=self._raise_event)
        except (JobEvent, LaunchError, Interrupted):
            raise
        except Exception as exc:  # noqa: BLE001 - store and rendezvous errors from torch
            logger.debug("%s: %s", name, exc)
            self._raise_event()
            if self._watching and self._abort_soon():
                self._raise_event()
            raise

    def _abort_soon(self) -> bool:
        """Wait up to two heartbeats for the board to explain a store error; True if it did."""
        deadline = time.monotonic() + 2 * self._interval + 0.5
        while time.monotonic() < deadline:
            if self.event() is not None:
                return True
            self.signals.check()
            time.sleep(0.05)
        return False

    def _raise_event(self) -> None:
        event = self.event()
        if event is not None:
            raise JobEvent(event)

    def _make_store(self, master: bool, timeout: float) -> Any:
        """Node 0's store server (on ``--addr`` only) or a client of it: padded, and signed with a secret."""
        port = self.cfg.port + CONTROL_PORT_OFFSET
        if master:
            self._server = stores.serve(self.cfg.addr, port, timeout)
        return authstore.wrap(stores.client(self.cfg.addr, port, timeout), self.secret)

    # -- phase 1: connect, check the token, claim the node rank

    def connect(self) -> None:
        """Reach node 0's store (or serve it), check the job token and flags, claim the node rank.

        Raises:
            LaunchError: node 0 unreachable or gone, another job there, or this node rank taken.
            JobEvent: the job was aborted meanwhile (another node's duplicate rank or flags).
            Interrupted: SIGINT/SIGTERM meanwhile.
        """
        cfg = self.cfg
        where = f"{cfg.addr}:{cfg.port + CONTROL_PORT_OFFSET}"
        master = cfg.node_rank == 0
        try:
            self.store = self._wait(lambda: self._make_store(master, cfg.join_timeout), "connect")
            self._watch_store = self._wait(lambda: self._make_store(False, cfg.join_timeout), "connect")
        except (RuntimeError, ValueError, TimeoutError, OSError) as exc:
            logger.debug("store: %s", exc)
            if master:
                raise LaunchError(
                    f"cannot serve the launcher store on {where} ({first_line(exc, 120)}): is another launcher "
                    "with --node-rank 0 running? Pick another --port on every node."
                ) from None
            raise LaunchError(
                f"could not reach node 0's launcher at {where} within {cfg.join_timeout:g} s: start the "
                "launcher with --node-rank 0 on that host, with the same --port (and check that this "
                "host can reach it)."
            ) from None
        try:
            self._enter(where, master)
        except (JobEvent, LaunchError, Interrupted):
            raise
        except Exception as exc:  # noqa: BLE001 - store errors from torch: node 0's launcher went away
            raise LaunchError(
                f"node 0's launcher at {where} stopped answering while this node was joining "
                f"({first_line(exc, 120)}): the job ended there, or node 0 failed. Start the job again "
                "on every node."
            ) from None

    def _enter(self, where: str, master: bool) -> None:
        """Check the token and flags, start the heartbeat and claim the node rank (:meth:`connect`)."""
        cfg = self.cfg
        for client in (self.store, self._watch_store):
            client.set_timeout(timedelta(seconds=max(30.0, cfg.node_timeout)))
        if master:
            self._wait(lambda: self.store.set(JOB_KEY, cfg.job_id), "token")
        theirs = printable(self._wait(self._read_token, "token"), _FIELD_LIMIT)
        if theirs != cfg.job_id:
            raise LaunchError(
                f"node 0's launcher at {where} runs job {theirs!r}, not this job {cfg.job_id!r}: another job "
                "uses this address and port. Give this job another --port, or the same --job-id on every node."
            )
        # A relaunched node continues at the job's generation, not at 0 (whose failure is over).
        self.generation = int(self._wait(lambda: _peek(self.store, self._key("gen")), "generation") or 0)
        self._last_ok = time.monotonic()
        self._watching = True
        threading.Thread(target=self._beat, name="npu_migrate-heartbeat", daemon=True).start()
        self._wait(self._check_shape, "shape")
        self._wait(self._claim, "claim")
        self._claimed = True

    def _secret_mismatch(self) -> str | None:
        """Why node 0's token cannot be read with this node's secret (or lack of one), if so."""
        padded = getattr(self.store, "inner", self.store)  # below the signing
        raw = _peek(padded, JOB_KEY)
        if raw is None:
            return None
        where = f"node 0's launcher at {self.cfg.addr}:{self.cfg.port + CONTROL_PORT_OFFSET}"
        fix = (f"set {authstore.SECRET_ENV} (or --secret-file) to the same value on every node, or on none.")
        signed = authstore.is_signed(raw.encode())
        if self.secret is None:
            return f"{where} uses a job secret and this node has none: {fix}" if signed else None
        if not signed:
            return f"{where} has no job secret but this node has one: {fix}"
        if authstore.verify(self.secret, JOB_KEY, raw.encode()) is None:
            return f"{where} uses another job secret than this node: {fix}"
        return None

    def _read_token(self) -> str:
        deadline = time.monotonic() + 30
        while True:
            mismatch = self._secret_mismatch()
            if mismatch:
                raise LaunchError(mismatch)
            token = _peek(self.store, JOB_KEY)
            if token is not None:
                break
            if time.monotonic() > deadline:
                return "(none)"
            time.sleep(0.05)
        return token

    def _check_shape(self) -> None:
        cfg = self.cfg
        mine: dict[str, Any] = {"nnodes": cfg.nnodes, "device_num": cfg.nproc, "max_restarts": cfg.max_restarts,
                                "hccl": dict(cfg.agreed)}  # HCCL variables every node must share (.hccl)
        agreed = json.loads(self.store.compare_set(self._key("shape"), "", json.dumps(mine, sort_keys=True)).decode())
        agreed = agreed if isinstance(agreed, dict) else {}
        if agreed != mine:
            flags = [k for k in mine if k != "hccl" and mine[k] != agreed.get(k)]
            if flags:
                diff = " ".join(f"--{k.replace('_', '-')} {mine[k]}" for k in flags)
                theirs = " ".join(f"--{k.replace('_', '-')} {printable(agreed.get(k), 40)}" for k in flags)
                fix = "use the same --nnodes, --device-num and --max-restarts on every node."
            else:
                job = agreed.get("hccl") if isinstance(agreed.get("hccl"), dict) else {}
                names = [k for k in sorted(set(mine["hccl"]) | set(job)) if mine["hccl"].get(k, "") != job.get(k, "")]
                if not names:  # the same values; only the record's form differs
                    return
                diff = " ".join(f"{printable(k, 100)}={printable(mine['hccl'].get(k, ''), 200) or '(unset)'}" for k in names)
                theirs = " ".join(f"{printable(k, 100)}={printable(job.get(k, ''), 200) or '(unset)'}" for k in names)
                fix = "HCCL needs the same value on every node; set it alike everywhere (or nowhere)."
            message = f"node {cfg.node_rank} ({self.host}) has {diff} but the job has {theirs}: {fix}"
            self.abort(message)
            raise LaunchError(message)

    def _claim_value(self, **extra: Any) -> str:
        return json.dumps({"owner": self.owner, "host": self.host, "pid": os.getpid(), **extra})

    def _claim(self) -> None:
        """Take ``claim/<node rank>``; refuse this launcher if a live (or finished) launcher holds it.

        Whether the holder is live is asked, not guessed from a heartbeat counter (:mod:`.liveness`):
        every outcome is decided once, whenever the job around it ends. A holder that answers, one
        that left cleanly while it was asked, one that ran the job to its end, and a store that went
        away meanwhile (node 0 ended the job) all mean that this node rank was taken: one refusal.
        Only a holder marked lost, or silent for ``--node-timeout``, is taken over.
        """
        cfg, store = self.cfg, self.store
        key = self._key(f"claim/{cfg.node_rank}")
        mine = self._claim_value()
        while True:
            current = store.compare_set(key, "", mine).decode()
            if current == mine:
                return
            if not current:
                continue
            other = _as_record(current)
            owner = str(other.get("owner"))
            if not other.get("ended") and (
                    _peek(store, self._key(f"lost/{owner}"))
                    or ask(store, self._connect_for, self.prefix, owner, cfg.node_timeout) is Liveness.SILENT):
                # Its launcher is gone: this is the node's replacement.
                now = store.compare_set(key, current, mine).decode()
                if now == mine:
                    logger.info("took over node rank %s from a lost launcher on %s", cfg.node_rank,
                                printable(other.get("host")))
                    return
                if now:
                    continue  # another replacement came first: ask about that one
                # Released while it was asked: it was alive after all, and this launcher is a duplicate.
            self._refuse_duplicate(other)

    def _refuse_duplicate(self, other: dict[str, Any]) -> None:
        cfg = self.cfg
        message = (f"node rank {cfg.node_rank} is already taken by the launcher on host "
                   f"{printable(other.get('host'), _FIELD_LIMIT)} (pid {printable(other.get('pid'), _FIELD_LIMIT)}), "
                   f"and host {self.host} (pid {os.getpid()}) was started with it too: "
                   f"give every node a different --node-rank in [0, {cfg.nnodes}).")
        try:
            running = bool(_peek(self.store, self._key("running")))
        except Exception:  # noqa: BLE001 - node 0 ended the job meanwhile: nothing left to end
            running = True
        if not running:
            self.abort(message)  # a forming job ends on every node, which all say why
        raise LaunchError(message)  # a running job stays: only the newcomer is refused

    def _connect_for(self, seconds: float) -> Any:
        """Another client of node 0's store, for one blocking wait (:func:`.liveness.ask`)."""
        return self._make_store(False, seconds)

    # -- the heartbeat board (its own thread and store connection)

    def _beat(self) -> None:
        interval = self._interval
        store = self._watch_store
        alive = self._key(f"alive/{self.owner}")
        while not self._stop.is_set():
            try:
                store.add(alive, 1)
                self._answered = answer_pings(store, self.prefix, self.owner, self._answered)
                abort = _peek(store, self._key("abort"))
                gen = self.generation
                fail = _peek(store, self._key(f"fail/{gen}"))
                with self._lock:
                    members = dict(self._members)
                with self._lock:  # recorded before telling node 0, which may then close the store
                    if abort:
                        self._abort = abort
                    if fail:
                        self._fail[gen] = fail
                    if self.cfg.node_rank == 0 and self._told is None and (abort or fail):
                        # Another node ended the job: node 0 serves the store until the rest read why too.
                        self._told = ("seen/abort" if abort else f"seen/{gen}", time.monotonic())
                counters = {k: store.add(self._key(f"alive/{m.owner}"), 0) for k, m in members.items()}
                self._flight(store, gen, members)
                # Tell node 0 we read it: it keeps serving the store until every node has.
                # Only a node of the job counts: a refused duplicate that read its own abort is none.
                for seen, value in (("seen/abort", abort), (f"seen/{gen}", fail)):
                    if value and seen not in self._seen_sent and self.cfg.node_rank != 0 and self._claimed:
                        self._seen_sent.add(seen)
                        store.add(self._key(seen), 1)
                now = time.monotonic()
                with self._lock:
                    self._last_ok = now
                    self._errors = 0
                    for k, value in counters.items():
                        if self._counters.get(k) != value:
                            self._counters[k] = value
                            self._last_change[k] = now
            except Exception as exc:  # noqa: BLE001 - the store is gone or unreachable
                with self._lock:
                    self._errors += 1
                    self._last_error = first_line(exc)
                logger.debug("heartbeat: %s", exc)
            self._stop.wait(interval)

    def _flight(self, store: Any, gen: int, members: dict[int, Member]) -> None:
        """Publish this node's flight records; node 0 reads everyone's, the others read node 0's hang."""
        if not members:
            return
        out = self.flight_out
        if out is not None and self.cfg.node_rank != 0:
            store.set(self._key(f"flight/{gen}/{self.cfg.node_rank}"), out)
        if self.cfg.node_rank == 0:
            found = {k: _peek(store, self._key(f"flight/{gen}/{k}")) for k in members if k != 0}
            with self._lock:
                self.flight_in = {k: v for k, v in found.items() if v}
        else:
            hang = _peek(store, self._key(f"hang/{gen}"))
            if hang:
                self.hang_in = _as_record(hang)

    def announce_hang(self, record: dict[str, Any]) -> None:
        """Node 0: tell every node about a hang (each prints its own ranks' stacks)."""
        key, value = self._key(f"hang/{self.generation}"), json.dumps(record)
        self._quietly(lambda: self.store.set(key, value))

    def ack_hang(self, hang_id: int) -> None:
        """This node printed its stacks for hang ``hang_id``."""
        key = self._key(f"hang_ack/{self.generation}/{hang_id}")
        self._quietly(lambda: self.store.add(key, 1))

    def wait_hang_acks(self, hang_id: int, seconds: float = 5.0) -> None:
        """Node 0: wait (a few seconds at most) until the other nodes have printed their stacks."""
        key, others = self._key(f"hang_ack/{self.generation}/{hang_id}"), self.cfg.nnodes - 1

        def wait() -> None:
            deadline = time.monotonic() + seconds
            while self.store.add(key, 0) < others and time.monotonic() < deadline:
                time.sleep(0.05)

        self._quietly(wait, seconds + 1)

    def event(self) -> Event | None:
        """What the board says now (never blocks): an abort, this generation's failure, or a lost node."""
        with self._lock:
            # A failure first: the node that saw it also aborts the job when no restart is left,
            # and the failure is the better report.
            fail = self._fail.get(self.generation) if self._members else None  # only while a round runs
            if fail:
                record = _as_record(fail)
                return Event("failed", printable(record.get("message") or ""), record)
            if self._abort:
                return Event("abort", printable(self._abort), {})
            now = time.monotonic()
            if self._watching and self.cfg.node_rank != 0 and (now - self._last_ok > self.cfg.node_timeout
                                            or self._errors >= _ERRORS_BEFORE_LOST):
                host0 = self._members[0].host if 0 in self._members else self.cfg.addr
                why = (f"its store stopped answering ({self._last_error})" if self._errors
                       else f"no answer for {self.cfg.node_timeout:g} s")
                message = f"lost node 0 ({host0}): {why}"
                return Event("lost", message,
                             {"kind": "lost", "node_rank": 0, "host": host0, "owner": None, "message": message})
            for k, seen in self._last_change.items():
                if k != self.cfg.node_rank and now - seen > self.cfg.node_timeout:
                    member = self._members[k]
                    message = f"lost node {k} ({member.host}): no heartbeat for {self.cfg.node_timeout:g} s (--node-timeout)"
                    return Event("lost", message, {"kind": "lost", "node_rank": k, "host": member.host,
                                                   "owner": member.owner, "message": message})
        return None

    # -- phase 2: the rendezvous round

    def _handler_for(self) -> Any:
        if self._handler is None:
            from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
            from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
                DynamicRendezvousHandler,
                RendezvousTimeout,
            )

            cfg = self.cfg
            backend = C10dRendezvousBackend(self.store, cfg.job_id)  # padded: it calls compare_set
            extra: dict[str, Any] = {}
            keep_alive = 5  # torch < 2.4 fixes the handler's keep-alive at 5 s
            if "keep_alive_interval" in inspect.signature(DynamicRendezvousHandler.from_backend).parameters:
                keep_alive = max(1, min(5, int(cfg.node_timeout / 4)))
                extra["keep_alive_interval"] = keep_alive
            timeout = RendezvousTimeout(
                join=timedelta(seconds=cfg.join_timeout),
                last_call=timedelta(seconds=1),
                close=timedelta(seconds=30),
                # The handler drops a participant silent for this long; never less than three of
                # its keep-alives, or a slow machine would lose live nodes.
                heartbeat=timedelta(seconds=max(cfg.node_timeout, 3 * keep_alive)),
            )
            # torch >= 2.4 would also start a second TCPStore server for torchelastic's agent;
            # our workers rendezvous on MASTER_PORT themselves.
            os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
            self._handler = DynamicRendezvousHandler.from_backend(
                run_id=cfg.job_id, store=self.store.raw, backend=backend, min_nodes=cfg.nnodes,
                max_nodes=cfg.nnodes, local_addr=self.local_ip, timeout=timeout, **extra)
        return self._handler

    def _next_round(self) -> tuple[Any, int, int]:
        info = self._handler_for().next_rendezvous()
        if isinstance(info, tuple):  # torch < 2.4: (store, rank, world_size)
            return info[0], int(info[1]), int(info[2])
        return info.store, int(info.rank), int(info.world_size)

    def join(self) -> Round:
        """Wait until every node is in (``--join-timeout``); agree on the generation and node ranks.

        Raises:
            LaunchError: the nodes did not all come in time, or node ranks do not fit.
            JobEvent: the job was aborted meanwhile.
            Interrupted: SIGINT/SIGTERM meanwhile.
        """
        cfg = self.cfg
        with self._lock:
            self._members, self._last_change, self._counters = {}, {}, {}
        deadline = time.monotonic() + cfg.join_timeout
        while True:
            try:
                store, hrank, hworld = self._wait(self._next_round, "rendezvous")
                gen = self._wait(lambda: _peek(self.store, self._key("gen")), "generation")
                self.generation = max(self.generation, int(gen or 0))
                members = self._wait(lambda: self._exchange(authstore.wrap(store, self.secret), hrank, hworld), "members")
            except (JobEvent, LaunchError, Interrupted):
                raise
            except Exception as exc:  # noqa: BLE001 - RendezvousError and store errors from torch
                logger.debug("rendezvous: %s", exc)
                name = type(exc).__name__
                if "Timeout" in name:
                    raise LaunchError(
                        f"not every node joined within {cfg.join_timeout:g} s (--join-timeout): start the "
                        f"launcher on every node with --nnodes {cfg.nnodes} --addr {cfg.addr} --port {cfg.port}."
                    ) from None
                raise LaunchError(f"the rendezvous failed: {name}: {first_line(exc)}") from None
            if members is not None:
                break
            if time.monotonic() > deadline:
                raise LaunchError(f"not every node joined within {cfg.join_timeout:g} s (--join-timeout).")
            logger.info("a node of the round did not report; joining the next round")
        self.generation = max(m.generation for m in members.values())
        now = time.monotonic()
        with self._lock:
            self._members = members
            self._last_change = {k: now for k in members}
            self._counters = {}
        try:
            self._wait(lambda: self.store.set(self._key("running"), str(self.generation)), "running")
        except JobEvent:
            raise
        return Round(self.generation, members)

    def _exchange(self, store: Any, hrank: int, hworld: int) -> dict[int, Member] | None:
        """Publish our node rank under our handler rank; read everyone's. None if one never comes."""
        record = {"node_rank": self.cfg.node_rank, "host": self.host, "owner": self.owner, "gen": self.generation,
                  "addr": self.local_ip}
        store.set(f"member/{hrank}", json.dumps(record))
        deadline = time.monotonic() + self.cfg.node_timeout
        found: dict[int, str] = {}
        while len(found) < hworld:
            for i in range(hworld):
                if i not in found:
                    value = _peek(store, f"member/{i}")
                    if value is not None:
                        found[i] = value
            if len(found) < hworld:
                if time.monotonic() > deadline:
                    return None
                time.sleep(0.05)
        members: dict[int, Member] = {}
        for i in range(hworld):
            rec = json.loads(found[i])
            if rec["node_rank"] in members:
                message = (f"node rank {rec['node_rank']} is in the job twice (hosts "
                           f"{members[rec['node_rank']].host} and {rec['host']}): give every node a different "
                           f"--node-rank in [0, {self.cfg.nnodes}).")
                self.abort(message)
                raise LaunchError(message)
            members[rec["node_rank"]] = Member(rec["node_rank"], rec["host"], rec["owner"], int(rec["gen"]),
                                               rec.get("addr"))
        return members

    # -- while running, and after

    def publish_failure(self, record: dict[str, Any]) -> None:
        """Tell every node that this generation failed (the first report wins); never blocks long."""
        gen = self.generation
        if record.get("kind") == "lost" and isinstance(record.get("node_rank"), int):
            self._lost.add(record["node_rank"])  # it will never read why the job ends: no one waits for it
        self._told = (f"seen/{gen}", time.monotonic())

        def publish() -> None:
            key, mine = self._key(f"fail/{gen}"), json.dumps(record)
            current = self.store.compare_set(key, "", mine).decode()
            # The earliest failure wins, whichever node saw its own first.
            while current != mine and _as_record(current).get("time", 0.0) > record.get("time", float("inf")):
                current = self.store.compare_set(key, current, mine).decode()
            if record.get("kind") == "lost" and record.get("owner"):
                self.store.set(self._key(f"lost/{record['owner']}"), "1")
            self.store.set(self._key("running"), "")

        self._quietly(publish)

    def lost_peer(self, failure: dict[str, Any]) -> dict[str, Any] | None:
        """The node behind a rank's connection error, when that node is gone: a ``lost`` record, cause first.

        A rank whose peer's launcher was killed fails at once with the backend's connection error,
        which names the peer's address; the heartbeat board would call the node lost only after
        ``--node-timeout``, and the report would blame this node's rank. Each other node the error
        names (:func:`.liveness.named_in`) is asked whether its launcher is there
        (:func:`.liveness.ask`, :data:`LOSS_CONFIRM_SHARE` of the node timeout at most). The record
        keeps the rank's failure under ``"after"`` and carries the time of the node's last
        heartbeat seen here, so it wins over its consequences on every node.

        Raises:
            JobEvent: the board spoke meanwhile (another node's failure, an abort, a lost node).
            Interrupted: SIGINT/SIGTERM meanwhile.
        """
        self._raise_event()  # the board may already say why (an abort ends ranks on every node)
        text = f"{failure.get('message') or ''}\n{failure.get('traceback') or ''}"
        with self._lock:
            members, changed = dict(self._members), dict(self._last_change)
        seconds = max(self._interval * LOSS_CONFIRM_BEATS, self.cfg.node_timeout * LOSS_CONFIRM_SHARE)
        for member in named_in(text, members, self.cfg.node_rank):
            state = self._wait(lambda m=member: ask(self.store, self._connect_for, self.prefix, m.owner, seconds),
                               "liveness")
            if state is Liveness.ALIVE or (state is Liveness.GONE and member.node_rank != 0):
                continue  # alive: the rank's error stands; the store gone: the board names node 0
            self._raise_event()  # an abort read meanwhile explains the loss (node 0 ended the job)
            last_beat = time.time() - (time.monotonic() - changed.get(member.node_rank, time.monotonic()))
            return lost_record(member, state, seconds, failure, self.cfg.node_rank, last_beat)
        return None

    def first_failure(self) -> dict[str, Any] | None:
        """The failure that won for this generation (as every node sees it), if readable.

        Read after one heartbeat: a node whose rank failed earlier may see it a little later.
        """
        key = self._key(f"fail/{self.generation}")
        time.sleep(min(1.0, self._interval))

        def read() -> dict[str, Any] | None:
            value = _peek(self.store, key)
            return _as_record(value) if value else None

        return self._quietly(read)

    def next_generation(self) -> None:
        """After a failure: the next round runs generation + 1."""
        self.generation += 1
        gen = str(self.generation)
        self._quietly(lambda: self.store.set(self._key("gen"), gen))

    def abort(self, message: str) -> None:
        """End every launcher of the job with ``message`` (the first reason wins)."""
        self._told = ("seen/abort", time.monotonic())
        logger.info("aborting the job: %s", message)
        self._quietly(lambda: self.store.compare_set(self._key("abort"), "", message))

    def _quietly(self, fn: Callable[[], Any], seconds: float = 5.0) -> Any:
        """A store call that gives up after ``seconds`` (node 0 may be unreachable)."""
        box: dict[str, Any] = {}
        done = threading.Event()

        def call() -> None:
            try:
                box["value"] = fn()
            except Exception as exc:  # noqa: BLE001 - nobody left to tell
                logger.debug("store: %s", exc)
            finally:
                done.set()

        threading.Thread(target=call, name="npu_migrate-store", daemon=True).start()
        done.wait(seconds)
        return box.get("value")

    def finish(self) -> None:
        """Wait until every node's ranks of this generation are done.

        Raises:
            JobEvent: a failure, a lost node or an abort meanwhile.
            Interrupted: SIGINT/SIGTERM meanwhile.
        """
        done, acked = self._key(f"done/{self.generation}"), self._key(f"acked/{self.generation}")
        nnodes = self.cfg.nnodes

        def wait_done() -> None:
            self.store.add(done, 1)
            while self.store.add(done, 0) < nnodes:
                time.sleep(0.1)
            self.store.add(acked, 1)

        self._wait(wait_done, "finish")
        self._finished = True
        if self.cfg.node_rank == 0:  # keep serving until every node has read the result
            def wait_acked() -> None:
                deadline = time.monotonic() + 10
                while self.store.add(acked, 0) < nnodes and time.monotonic() < deadline:
                    time.sleep(0.05)

            self._quietly(wait_acked, 11)

    def close(self) -> None:
        """Stop the heartbeat and give this node rank back (a relaunch on this host may claim it).

        Node 0 first serves the store a little longer after telling the others that the job ends,
        so they read why instead of finding the store gone: until every other node has read it, or
        for half the node timeout at most (a busy node polls late; a lost one never reads).
        """
        if self.cfg.node_rank == 0 and self._told is not None and self.store is not None:
            key, since = self._told
            deadline = since + max(4.0, 2 * self._interval + 0.5, self.cfg.node_timeout / 2)
            others = self.cfg.nnodes - 1 - len(self._lost - {0})

            def linger() -> None:
                while self.store.add(self._key(key), 0) < others and time.monotonic() < deadline:
                    time.sleep(0.05)

            self._quietly(linger, max(0.0, deadline - time.monotonic()))
            logger.info("served the store until %s nodes read %s (or for %.1f s)", others, key, deadline - since)
        self._stop.set()
        if self._handler is not None:
            # Stop torch's keep-alive timer here, from this thread: were the handler freed while
            # the timer's own thread runs, its finalizer would join that thread from itself and
            # print "RuntimeError: cannot join current thread" at exit.
            stop = getattr(self._handler, "_stop_heartbeats", None)
            if stop is not None:
                self._quietly(stop, 2.0)
        if self._claimed and self.store is not None:
            # A launcher asking about this one meanwhile hears that it was here (:meth:`_claim`), then
            # the node rank is given back, unless the job finished: a late duplicate is refused then too.
            key = self._key(f"claim/{self.cfg.node_rank}")
            after = self._claim_value(ended=True) if self._finished else ""

            def leave() -> None:
                answer_pings(self.store, self.prefix, self.owner, self._answered)
                self.store.compare_set(key, self._claim_value(), after)

            self._quietly(leave, 2.0)
