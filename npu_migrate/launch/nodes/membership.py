"""Multi-node membership: who is in the job, over torch.distributed.elastic's dynamic rendezvous.

Usage (by the supervisor; one object per launcher)::

    member = Membership(cfg, signals)  # its board (:mod:`.board`) and the board's JobStore (:mod:`.store`)
    member.connect()                   # reach node 0's store, check the job token and flags, claim the node rank
    rnd = member.join()                # every node is in: generation, node ranks and hosts
    ...                                # start the workers; poll member.board.event() while they run
    member.board.finish()              # every node's ranks are done
    member.close()                     # node 0 serves until the others read why; the node rank given back

**Ownership.** A launcher's membership is the one object the supervisor holds for the control
plane: it makes the board (which makes, and listens to, the store connections), starts the
board's heartbeat once the job token is checked, and at the end lets node 0 serve until the others
read why the job ended, stops the heartbeat and gives the node rank back. Node 0 holds the store:
if node 0 is lost, the other nodes end the job even with ``--max-restarts`` (a new node 0 would
serve an empty store that the survivors do not know).

**Engine.** A job that is never started again (``--max-restarts 0``, the default) of a fixed
node count joins by arrivals, as torchrun's static rendezvous does (:meth:`Membership.counted`):
every node sets its record under its claimed node rank, node 0 waits for all of them
(``--join-timeout``) and lists them; O(N) requests and bytes at node 0. A job with restarts or
``--nnodes MIN:MAX`` joins by rounds: torch's :class:`DynamicRendezvousHandler` over the c10d
backend (``C10dRendezvousBackend``) on node 0's launcher store, with ``min_nodes = max_nodes =
--nnodes`` and ``run_id`` = the job token; its keep-alive drops a participant that stops beating
after ``--node-timeout``, so a replacement can join the next round. The handler numbers nodes
its own way; the job's ranks stay ``node_rank x nproc + local_rank``: after each round every node
publishes its ``--node-rank`` (torch's ``synchronize``, :mod:`.store`), and the round is
accepted when the ranks are exactly ``0..nnodes-1``.

**Keys** (under ``npu_migrate/<job id>/`` in node 0's store, except the first):

========================== ===============================================================
``npu_migrate/job``        the job token, set by node 0; a launcher with another token is
                           refused and touches nothing else (another job or a stale launcher).
``shape``                  ``{"nnodes", "device_num", "max_restarts", "rdzv_backend", "hccl", "software"}``
                           (``hccl``: the HCCL variables every node must share, :mod:`..setup.hccl`;
                           ``software``: the device family, backend, torch and torch_npu
                           releases, :mod:`..setup.software`), first writer wins; a node with other
                           values aborts the job, so every node says why.
``claim/<K>``              ``{"owner", "host", "pid"}`` of the launcher holding node rank K (with
                           ``"ended": true`` once the job finished). Taken over when its owner
                           is marked lost or does not answer a ping for ``--node-timeout``
                           (:mod:`.liveness`); while it answers, after it ended, or if node 0
                           ends meanwhile, the newcomer is a duplicate and is refused.
``join/<gen>/<K>``          ``{"node_rank", "host", "owner", "gen", "addr"}`` of node rank K
                           (joined by arrivals); ``join/<gen>/members``: node 0's list of them.
``round/<id>/member/<i>``  the same record of handler rank i in round ``<id>`` (joined by rounds;
                           an id the round's first node writes under ``round`` in the round's
                           own store, so every node of the round uses the same keys), and
                           torch's ``synchronize`` keys beside them.
========================== ===============================================================

**Node ranks from the rendezvous** (c10d without ``--node-rank``; node rank -1 until then) are
given by :mod:`.assignment` after the token and flags were checked, before the claim.

**Duplicates.** A node rank is claimed before the node joins a round: a second launcher with
the same ``--node-rank`` finds the claim held by a launcher that answers its ping, and is refused
in one line. While the job is forming (``running`` is empty) the refusal also aborts the job on
every node, which each say why; a running job stays and only the newcomer is refused.

The token is a namespace, not a secret. Node 0 serves the store on ``--addr`` only
(:mod:`.servers`), but anyone who reaches ``--port + 1`` can read and write every key there, as
with torchrun's c10d rendezvous: torch's rendezvous state is a pickle, so that is code execution
in every launcher. With a job secret (``NPU_MIGRATE_JOB_SECRET`` or ``--secret-file``, the same
on every node) every value is signed and checked before it is used (:mod:`.values`); a node
with another secret, or none, is refused in one line.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import time
import uuid
from datetime import timedelta
from typing import Any

from npu_migrate.launch.nodes import assignment, secret, timing, values

from npu_migrate.launch.setup import software
from npu_migrate.launch.nodes.board import Board
from npu_migrate.launch.errors import LaunchError, first_line
from npu_migrate.launch.nodes.store import JobStore, peek, synchronize
from npu_migrate.launch.nodes.liveness import Liveness, answer_pings, ask
from npu_migrate.launch.nodes.records import FIELD_LIMIT, JobEvent, Member, Round, as_record
from npu_migrate.launch.setup.config import LaunchConfig
from npu_migrate.launch.signals import Interrupted, Signals
from npu_migrate.textsafe import printable

logger = logging.getLogger(__name__)

JOB_KEY = "npu_migrate/job"


class Membership:
    """This launcher's membership in a multi-node job (see the module docstring)."""

    def __init__(self, cfg: LaunchConfig, signals: Signals) -> None:
        self.board = Board(cfg, signals)
        self.js: JobStore = self.board.js
        self._handler: Any = None
        self._token_read = False

    @property
    def cfg(self) -> LaunchConfig:
        """This node's config (:attr:`.JobStore.cfg`: with node ranks from the rendezvous, the node rank
        is known after :meth:`connect`)."""
        return self.js.cfg

    # -- phase 1: connect, check the token, claim the node rank

    def connect(self) -> None:
        """Reach node 0's store (or serve it), check the job token and flags, claim the node rank.

        With a node rank from the rendezvous, this node's earlier logs are refused then (the
        ``--log-dir`` files of that node rank), and the job is aborted: the others would wait for
        this node in the round.

        Raises:
            LaunchError: node 0 unreachable or gone, another job there, or this node rank taken.
            JobEvent: the job was aborted meanwhile (another node's duplicate rank or flags).
            Interrupted: SIGINT/SIGTERM meanwhile.
        """
        self.js.open()
        try:
            self._enter()
        except (JobEvent, LaunchError, Interrupted):
            raise
        except Exception as exc:  # noqa: BLE001 - store errors from torch: node 0's launcher went away
            if not self._token_read:  # a store of another torch release closes the connection, or never answers
                raise LaunchError(
                    f"node 0's launcher at {self.js.where} did not answer this node's first request "
                    f"({first_line(exc, 120)}): node 0 runs another torch release than this node's "
                    f"{software.torch_release()} (torch's store protocol "
                    "differs between releases: every node must run the same torch), another program holds that "
                    "port, or its launcher failed."
                ) from exc
            raise LaunchError(
                f"node 0's launcher at {self.js.where} stopped answering while this node was joining "
                f"({first_line(exc, 120)}): the job ended there, or node 0 failed. Start the job again "
                "on every node."
            ) from exc
        cfg = self.cfg
        if cfg.rdzv.assign:
            try:
                cfg.output.check(cfg.nproc, cfg.log_dir, cfg.node_rank)
            except LaunchError as exc:  # the others would wait for this node in the round: end the job
                self.board.abort(f"node {cfg.node_rank} ({self.js.host}): {exc}")
                raise

    def _enter(self) -> None:
        """Check the token and flags, start the heartbeat and claim the node rank (:meth:`connect`)."""
        js, cfg = self.js, self.cfg
        for client in (js.store, js.watch):
            client.set_timeout(timedelta(seconds=timing.store_call_timeout(cfg.node_timeout, cfg.rdzv.read_timeout)))
        if js.server is not None:  # node 0: it serves the store
            js.call(lambda: js.store.set(JOB_KEY, cfg.job_id), "token")
        theirs = printable(js.call(self._read_token, "token", within=timing.TOKEN_WAIT_S), FIELD_LIMIT)
        self._token_read = True
        if theirs != cfg.job_id:
            raise LaunchError(
                f"node 0's launcher at {js.where} runs job {theirs!r}, not this job {cfg.job_id!r}: another job "
                "uses this address and port. Give this job another --port, or the same --job-id on every node."
            )
        # A relaunched node continues at the job's generation, not at 0 (whose failure is over).
        self.board.generation = int(js.call(lambda: js.peek("gen"), "generation") or 0)
        self.board.start()
        js.call(self._check_shape, "shape")
        if cfg.rdzv.assign:
            assignment.assign(js, self.take)  # js.cfg gets this node's rank and the node count
        js.call(self._claim, "claim")
        self.board.claimed = True

    def _secret_mismatch(self) -> str | None:
        """Why node 0's token cannot be read with this node's secret (or lack of one), if so."""
        js = self.js
        padded = getattr(js.store, "inner", js.store)  # below the signing
        raw = peek(padded, JOB_KEY)
        if raw is None:
            return None
        where = f"node 0's launcher at {js.where}"
        fix = f"set {secret.SECRET_ENV} (or --secret-file) to the same value on every node, or on none."
        signed = values.is_signed(raw.encode())
        if js.secret is None:
            return f"{where} uses a job secret and this node has none: {fix}" if signed else None
        if not signed:
            return f"{where} has no job secret but this node has one: {fix}"
        if values.verify(js.secret, JOB_KEY, raw.encode()) is None:
            return f"{where} uses another job secret than this node: {fix}"
        return None

    def _read_token(self) -> str:
        """Node 0's job token: waits (blocking, :data:`.timing.TOKEN_WAIT_S`) for node 0 to write it."""
        self.js.wait_keys([JOB_KEY], timing.TOKEN_WAIT_S)
        mismatch = self._secret_mismatch()
        if mismatch:
            raise LaunchError(mismatch)
        return peek(self.js.store, JOB_KEY) or "(none)"

    def _check_shape(self) -> None:
        js, cfg = self.js, self.cfg
        rdzv = cfg.rdzv
        mine: dict[str, Any] = {"nnodes": cfg.nnodes if rdzv.min_nodes is None else f"{rdzv.min_nodes}:{cfg.nnodes}",
                                "device_num": cfg.nproc, "max_restarts": cfg.max_restarts,
                                "rdzv_backend": rdzv.backend + (" without --node-rank" if rdzv.assign else ""),
                                "hccl": dict(cfg.agreed),  # HCCL variables every node must share (.hccl)
                                "software": software.of_node(cfg.device, cfg.backend)}
        agreed = json.loads(js.store.compare_set(js.key("shape"), "", json.dumps(mine, sort_keys=True)).decode())
        agreed = agreed if isinstance(agreed, dict) else {}
        if agreed == mine:
            return
        flags = [k for k in mine if k not in ("hccl", "software") and mine[k] != agreed.get(k)]
        job_software = agreed.get("software") if isinstance(agreed.get("software"), dict) else {}
        verb = "has"
        if flags:
            diff = " ".join(f"--{k.replace('_', '-')} {mine[k]}" for k in flags)
            theirs = " ".join(f"--{k.replace('_', '-')} {printable(agreed.get(k), 40)}" for k in flags)
            fix = ("use the same --rdzv-backend on every node, with --node-rank on every node or on none."
                   if "rdzv_backend" in flags else
                   "use the same --nnodes, --device-num and --max-restarts on every node.")
        elif job_software != mine["software"]:
            diff = software.describe(mine["software"])
            theirs = printable(software.describe(job_software), 200)
            fix = software.fix(mine["software"], job_software)
            verb = "runs"
        else:
            job = agreed.get("hccl") if isinstance(agreed.get("hccl"), dict) else {}
            names = [k for k in sorted(set(mine["hccl"]) | set(job)) if mine["hccl"].get(k, "") != job.get(k, "")]
            if not names:  # the same values; only the record's form differs
                return
            diff = " ".join(f"{printable(k, 100)}={printable(mine['hccl'].get(k, ''), 200) or '(unset)'}" for k in names)
            theirs = " ".join(f"{printable(k, 100)}={printable(job.get(k, ''), 200) or '(unset)'}" for k in names)
            fix = "HCCL needs the same value on every node; set it alike everywhere (or nowhere)."
        who = f"node {cfg.node_rank} ({js.host})" if cfg.node_rank >= 0 else f"the launcher on {js.host}"
        message = f"{who} {verb} {diff} but the job {verb} {theirs}: {fix}"
        self.board.abort(message)
        raise LaunchError(message)

    def _claim_value(self, **extra: Any) -> str:
        return json.dumps({"owner": self.js.owner, "host": self.js.host, "pid": os.getpid(), **extra})

    def _claim(self) -> None:
        """Take ``claim/<node rank>``; refuse this launcher if a live (or finished) launcher holds it.

        Whether the holder is live is asked, not guessed from a heartbeat counter (:mod:`.liveness`):
        every outcome is decided once, whenever the job around it ends. A holder that answers, one
        that left cleanly while it was asked, one that ran the job to its end, and a store that went
        away meanwhile (node 0 ended the job) all mean that this node rank was taken: one refusal.
        Only a holder marked lost, or silent for ``--node-timeout``, is taken over. The loop is a
        compare-and-set retry (another launcher changed the claim meanwhile), never a poll.
        """
        other = self.take(self.cfg.node_rank)
        if other is not None:
            self._refuse_duplicate(other)

    def take(self, node_rank: int) -> dict[str, Any] | None:
        """Take ``claim/<node_rank>`` if free or its launcher is lost: None, else the holder's record."""
        js, cfg = self.js, self.cfg
        key = js.key(f"claim/{node_rank}")
        mine = self._claim_value()
        while True:
            current = js.store.compare_set(key, "", mine).decode()
            if current == mine:
                return None
            if not current:
                continue
            other = as_record(current)
            owner = str(other.get("owner"))
            if not other.get("ended") and (
                    js.peek(f"lost/{owner}")
                    or ask(js.store, js.client, js.prefix, owner, cfg.node_timeout) is Liveness.SILENT):
                # Its launcher is gone: this is the node's replacement.
                now = js.store.compare_set(key, current, mine).decode()
                if now == mine:
                    logger.info("took over node rank %s from a lost launcher on %s", node_rank,
                                printable(other.get("host")))
                    return None
                if now:
                    continue  # another replacement came first: ask about that one
                # Released while it was asked: it was alive after all, and this launcher is a duplicate.
            return other

    def _refuse_duplicate(self, other: dict[str, Any]) -> None:
        js, cfg = self.js, self.cfg
        message = (f"node rank {cfg.node_rank} is already taken by the launcher on host "
                   f"{printable(other.get('host'), FIELD_LIMIT)} (pid {printable(other.get('pid'), FIELD_LIMIT)}), "
                   f"and host {js.host} (pid {os.getpid()}) was started with it too: "
                   f"give every node a different --node-rank in [0, {cfg.nnodes}).")
        try:
            running = bool(js.peek("running"))
        except Exception:  # noqa: BLE001 - node 0 ended the job meanwhile: nothing left to end
            running = True
        if not running:
            self.board.abort(message)  # a forming job ends on every node, which all say why
        raise LaunchError(message)  # a running job stays: only the newcomer is refused

    # -- phase 2: the rendezvous round

    def _handler_for(self) -> Any:
        if self._handler is None:
            from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
            from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
                DynamicRendezvousHandler,
                RendezvousTimeout,
            )

            cfg = self.cfg
            backend = C10dRendezvousBackend(self.js.store, cfg.job_id)  # padded: it calls compare_set
            extra: dict[str, Any] = {}
            keep_alive = timing.TORCH_KEEP_ALIVE_S  # torch < 2.4 fixes the handler's keep-alive
            if "keep_alive_interval" in inspect.signature(DynamicRendezvousHandler.from_backend).parameters:
                keep_alive = timing.keep_alive_interval(cfg.node_timeout, cfg.nnodes)
                extra["keep_alive_interval"] = keep_alive
            timeout = RendezvousTimeout(
                join=timedelta(seconds=cfg.join_timeout),
                last_call=timedelta(seconds=timing.ROUND_LAST_CALL_S),
                close=timedelta(seconds=cfg.rdzv.close_timeout or timing.ROUND_CLOSE_S),
                heartbeat=timedelta(seconds=max(cfg.node_timeout, timing.KEEP_ALIVES_BEFORE_DROP * keep_alive)),
            )
            # torch >= 2.4 would also start a second TCPStore server for torchelastic's agent;
            # our workers rendezvous on MASTER_PORT themselves.
            os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
            self._handler = DynamicRendezvousHandler.from_backend(
                run_id=cfg.job_id, store=self.js.store.raw, backend=backend, min_nodes=cfg.nnodes,
                max_nodes=cfg.nnodes, local_addr=self.js.local_ip, timeout=timeout, **extra)
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
        js, cfg, board = self.js, self.cfg, self.board
        board.clear_round()
        deadline = time.monotonic() + cfg.join_timeout
        members = self._arrive(deadline) if self.counted else self._round(deadline)
        board.set_round(max(m.generation for m in members.values()), members)
        js.call(lambda: js.store.set(js.key("running"), str(board.generation)), "running")
        if cfg.max_restarts == 0:
            self._stop_keep_alive()  # no next round: the board alone watches the nodes
        return Round(board.generation, members)

    def _round(self, deadline: float) -> dict[int, Member]:
        """Join by torch's rendezvous rounds (``--nnodes MIN:MAX``, restarts): the members."""
        js, cfg, board = self.js, self.cfg, self.board
        while True:  # a round where a node never reported is followed by the next one
            try:
                store, hrank, hworld = js.call(self._next_round, "rendezvous")
                gen = js.call(lambda: js.peek("gen"), "generation")
                board.generation = max(board.generation, int(gen or 0))
                members = js.call(lambda: self._exchange(values.wrap(store, js.secret), hrank, hworld), "members")
            except (JobEvent, LaunchError, Interrupted):
                raise
            except Exception as exc:  # noqa: BLE001 - RendezvousError and store errors from torch
                from torch.distributed.elastic.rendezvous import RendezvousTimeoutError  # torch 2.1 and later

                logger.debug("rendezvous: %s", exc)
                name = type(exc).__name__
                # torch's handler raises RendezvousTimeoutError when the round did not complete in
                # --join-timeout; TimeoutError is a call of this launcher's that got no answer in time.
                if isinstance(exc, (RendezvousTimeoutError, TimeoutError)):
                    raise LaunchError(
                        f"not every node joined within {cfg.join_timeout:g} s (--join-timeout): start the "
                        f"launcher on every node with --nnodes {cfg.nnodes} --addr {cfg.addr} --port {cfg.port}."
                    ) from exc
                raise LaunchError(f"the rendezvous failed: {name}: {first_line(exc)}") from exc
            if members is not None:
                return members
            if time.monotonic() > deadline:
                raise LaunchError(f"not every node joined within {cfg.join_timeout:g} s (--join-timeout).")
            logger.info("a node of the round did not report; joining the next round")

    @property
    def counted(self) -> bool:
        """Whether this job joins by counted arrivals (:meth:`_arrive`) rather than torch's rounds.

        torch's round lets a node come or go between rounds: it serves ``--nnodes MIN:MAX`` and
        restarts. A job of a fixed node count that is never started again (``--max-restarts 0``,
        the default) needs neither, and the round costs node 0 about N x N: every node
        compare-and-sets the whole state, about 100 bytes a node, and retries when another node
        came first (``benchmarks/bench_join.py --simulate N``; docs/launch.md, "Many nodes").
        Such a job joins as torchrun's static rendezvous does, by arrivals at node 0's store.
        """
        return self.cfg.max_restarts == 0 and self.cfg.rdzv.min_nodes is None

    def _member_record(self) -> dict[str, Any]:
        js, cfg = self.js, self.cfg
        return {"node_rank": cfg.node_rank, "host": js.host, "owner": js.owner, "gen": self.board.generation,
                "addr": js.local_ip}

    def _members(self, records: list[dict[str, Any]]) -> dict[int, Member]:
        """The round's members from their records; two records of one node rank end the job."""
        cfg = self.cfg
        members: dict[int, Member] = {}
        for rec in records:
            if rec["node_rank"] in members:
                message = (f"node rank {rec['node_rank']} is in the job twice (hosts "
                           f"{members[rec['node_rank']].host} and {rec['host']}): give every node a different "
                           f"--node-rank in [0, {cfg.nnodes}).")
                self.board.abort(message)
                raise LaunchError(message)
            members[rec["node_rank"]] = Member(rec["node_rank"], rec["host"], rec["owner"], int(rec["gen"]),
                                               rec.get("addr"))
        return members

    def _arrive(self, deadline: float) -> dict[int, Member]:
        """Join by arrivals (:attr:`counted`): O(N) requests and bytes at node 0.

        Every node sets ``join/<gen>/<node rank>`` to its record (its node rank is claimed, so the
        key is its own). Node 0 waits for all of them until ``--join-timeout``, then writes the
        list to ``join/<gen>/members``, which every other node waits for and reads: one request a
        node, one wait a node, and node 0 reads N records once. Where a node does not come, node 0
        ends the job on every node, naming the node ranks still missing.
        """
        js, cfg = self.js, self.cfg
        prefix = f"join/{self.board.generation}/"
        record = json.dumps(self._member_record())
        js.call(lambda: js.store.set(js.key(f"{prefix}{cfg.node_rank}"), record), "join")
        listed = js.key(f"{prefix}members")
        if cfg.node_rank != 0:  # node 0 decides, and ends the job where a node did not come
            js.await_keys([listed], "join")
            members = self._members(json.loads(js.call(lambda: js.store.get(listed), "members")))
            listed_here = members.get(cfg.node_rank)
            if listed_here is None or listed_here.owner != js.owner:
                # This launcher took the node rank over from one it found silent, after node 0
                # had listed that one: the job runs with it, and this launcher is the duplicate.
                holder = listed_here.host if listed_here else "?"
                raise LaunchError(
                    f"node rank {cfg.node_rank} is already taken by the launcher on host {holder} (in the job), "
                    f"and host {js.host} (pid {os.getpid()}) was started with it too: give every node a different "
                    f"--node-rank in [0, {cfg.nnodes}).")
            return members
        keys = [js.key(f"{prefix}{k}") for k in range(cfg.nnodes)]
        if not js.await_keys(keys, "join", max(0.0, deadline - time.monotonic())):
            missing = [k for k in range(cfg.nnodes) if js.peek(f"{prefix}{k}") is None]
            shown = ", ".join(str(k) for k in missing[:20]) + (f" and {len(missing) - 20} more" if len(missing) > 20
                                                                else "")
            message = (f"not every node joined within {cfg.join_timeout:g} s (--join-timeout): node rank"
                       f"{'s' if len(missing) > 1 else ''} {shown} did not come. Start the launcher on every "
                       f"node with --nnodes {cfg.nnodes} --addr {cfg.addr} --port {cfg.port}.")
            self.board.abort(message)
            raise LaunchError(message)
        found = js.call(lambda: js.store.multi_get(keys), "members")
        records = [json.loads(value) for value in found]
        js.call(lambda: js.store.set(listed, json.dumps(records)), "members")
        return self._members(records)

    def _exchange(self, store: Any, hrank: int, hworld: int) -> dict[int, Member] | None:
        """Publish our node rank under our handler rank; read everyone's. None if one never comes.

        The round's first node names the round (``round`` in the round's own store), and every
        node exchanges its record with torch's ``synchronize`` under that name, on a connection
        of its own (a blocking wait on the shared one would stall torch's keep-alive).
        """
        js, cfg = self.js, self.cfg
        mine = uuid.uuid4().hex
        round_id = store.compare_set("round", "", mine).decode() or mine
        record = self._member_record()
        client = js.client(cfg.node_timeout)
        prefix = js.key(f"round/{printable(round_id, 64)}/member/")
        try:
            found = synchronize(client, json.dumps(record).encode(), hrank, hworld, prefix, cfg.node_timeout)
        except Exception as exc:  # noqa: BLE001 - torch's store error: a node never reported, or the store is gone
            logger.debug("member exchange: %s", exc)
            js.peek("gen")  # raises if the store is gone; else a node of the round did not report
            return None
        return self._members([json.loads(value) for value in found])

    # -- the end

    def _stop_keep_alive(self) -> None:
        """Stop torch's keep-alive (at the end; or once the round is in, where no next round can come).

        Each keep-alive reads and compare-and-sets torch's whole rendezvous state, about 100 bytes
        a node: at 1,024 nodes, 96 KB each way per node per keep-alive, the largest traffic at
        node 0 while the job runs. It only lets a later round drop a node that stopped; without
        ``--max-restarts`` there is none, and the board watches the nodes. Stopped here, from this
        thread: were the handler freed while the timer's own thread runs, its finalizer would
        join that thread from itself and print "RuntimeError: cannot join current thread" at exit.
        """
        stop = getattr(self._handler, "_stop_heartbeats", None) if self._handler is not None else None
        if stop is not None:
            self.js.quietly(stop, timing.LEAVE_S)

    def close(self) -> None:
        """Node 0 serves until the others read why the job ended; stop the heartbeat and torch's
        keep-alive; give this node rank back (a relaunch on this host may claim it)."""
        js = self.js
        self.board.linger()
        self.board.stop()
        self._stop_keep_alive()
        if self.board.claimed and js.store is not None:
            # A launcher asking about this one meanwhile hears that it was here (:meth:`_claim`), then
            # the node rank is given back, unless the job finished: a late duplicate is refused then too.
            key = js.key(f"claim/{self.cfg.node_rank}")
            after = self._claim_value(ended=True) if self.board.finished else ""

            def leave() -> None:
                answer_pings(js.store, js.prefix, js.owner, self.board.answered)
                js.store.compare_set(key, self._claim_value(), after)

            js.quietly(leave, timing.LEAVE_S)
