"""The board: what the launchers of a running job tell each other through node 0's store.

Usage (by :mod:`.membership` and the supervisor)::

    board = Board(cfg, signals)       # board.js: this launcher's JobStore (:mod:`.store`), which it listens to
    board.start()                     # the heartbeat thread: beats, reads abort / fail, answers pings
    board.set_round(gen, members)     # after each round (:mod:`.membership`)
    event = board.event()             # None, or Event(EventKind.FAILED / ABORT / LOST, ...)
    board.publish_failure(record); record = board.first_failure()   # typed records (:mod:`.records`)
    board.finish()                    # every node's ranks finished (blocking)
    board.linger(); board.stop()      # node 0 serves until the others read why the job ended

**Keys** (under ``npu_migrate/<job id>/`` in node 0's store; membership's in :mod:`.membership`,
the ping's in :mod:`.liveness`):

===================== ====================================================================
``alive/<owner>``     a counter each launcher adds 1 to every heartbeat
                      (:func:`.timing.heartbeat_interval`); one that stands still for
                      ``--node-timeout`` (:func:`.timing.lost_after`) means that node is lost.
                      Node 0 reads every node's counter, the others node 0's only
                      (:func:`watched`): node 0's store serves O(N) reads a beat, not O(N x N),
                      and node 0 tells the others through ``fail/<gen>``. Node 0's own loss
                      also shows as the store going away (:data:`.timing.ERRORS_BEFORE_LOST`).
``lost/<owner>``      set by the node that noticed the loss: the relaunched node may claim at once.
``running``           the generation that is running ("" while nodes are joining or failed).
``gen``               the newest generation (restart count).
``fail/<gen>``        the first failure of a generation (a rank's error, a hang, or a lost node,
                      also one a rank's connection error named: :meth:`Board.lost_peer`), JSON
                      with ``"kind"`` (:class:`FailureKind`; read by :func:`.records.read_failure`);
                      the first (:func:`.records.order`) wins (compare-and-set); every node
                      stops its ranks, then restarts or ends.
``flight/<gen>/<K>``  node K's ranks' flight records (:mod:`..hangs.flight`), JSON, every heartbeat;
                      node 0 reads them to decide a hang for the whole job (:mod:`..hangs.watchdog`).
``hang/<gen>``        the latest hang node 0 declared: ``{"id", "summary", "states", ...}``;
                      every node prints its own ranks' stacks for a new id, then arrives at
``hang_ack/<gen>/<id>`` which node 0 waits for (:data:`.timing.HANG_ACK_WAIT_S`) before ending.
``abort``             a reason that ends every launcher of the job, in any phase (duplicate
                      node rank, mismatched flags, a signalled launcher, the job's last failure).
``done/<gen>``,
``acked/<gen>``       arrivals: every node's ranks finished; node 0 serves until all have read it.
``seen/abort``,
``seen/<gen>``        arrivals: the nodes that read ``abort`` / ``fail/<gen>``; node 0 serves
                      (:func:`.timing.linger_window` at most) until the others read why the job ends.
===================== ====================================================================

An *arrival* at ``K`` (:func:`.store.arrive`) adds 1 to the counter ``K`` and sets ``K/<n>``
for its number n: a waiter blocks in ``store.wait([K/<n>])`` instead of reading the counter in
a loop.

Every record here comes from another process, possibly another machine: :func:`as_record` reads
it without trusting its shape, and text from it goes through :func:`npu_migrate.textsafe.printable`
where it is printed.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from npu_migrate.launch.nodes import timing
from npu_migrate.launch.errors import first_line
from npu_migrate.launch.setup.config import LaunchConfig
from npu_migrate.launch.signals import Signals
from npu_migrate.launch.nodes.store import JobStore, arrival_key, arrive, arrived, peek
from npu_migrate.launch.nodes.liveness import Liveness, answer_pings, ask, failure_text, lost_record, named_in
from npu_migrate.launch.nodes.records import (
    FIELD_LIMIT,
    Event,
    EventKind,
    Failure,
    FailureKind,
    FailureRecord,
    JobEvent,
    LostNode,
    Member,
    Round,
    as_record,
    order,
    read_failure,
)
from npu_migrate.textsafe import printable

logger = logging.getLogger(__name__)

__all__ = ["FIELD_LIMIT", "Board", "Event", "EventKind", "FailureKind", "JobEvent", "Member", "Round", "as_record",
           "peek"]


@dataclass
class BoardState:
    """Everything about the job that this launcher's board knows and that changes: read and written
    by the heartbeat thread and the main thread, always under :attr:`Board._lock` (and only there).
    """

    generation: int = 0
    """The generation (restart count) this launcher runs or joins; the main thread sets it."""
    claimed: bool = False
    """This launcher holds its node rank: it counts as one of the job's nodes."""
    finished: bool = False
    """Every node's ranks of this generation finished."""
    watching: bool = False
    """The heartbeat runs: node 0's silence or store errors mean it is lost."""
    answered: int = 0
    """Pings to this launcher answered (:mod:`.liveness`)."""
    flight_out: str | None = None
    """This node's ranks' flight records, published every beat."""
    flight_in: dict[int, str] = field(default_factory=dict)
    """Node 0: the other nodes' flight records, as last read."""
    hang_in: dict[str, Any] | None = None
    """The latest hang node 0 announced."""
    members: dict[int, Member] = field(default_factory=dict)
    """The round's nodes whose heartbeats are watched (none while a round forms)."""
    last_change: dict[int, float] = field(default_factory=dict)
    """When (``time.monotonic()``) each member's heartbeat counter last moved."""
    counters: dict[int, int] = field(default_factory=dict)
    """Each member's heartbeat counter, as last read."""
    last_ok: float = field(default_factory=time.monotonic)
    """When the last heartbeat went through."""
    errors: int = 0
    """Heartbeats in a row that failed with a store error."""
    last_error: str = ""
    """The last of those errors, in one line."""
    abort: str | None = None
    """The job's ``abort`` reason, once read."""
    fail: dict[int, str] = field(default_factory=dict)
    """Each generation's winning failure (``fail/<gen>``), as read."""
    seen_sent: set[str] = field(default_factory=set)
    """The ``seen/...`` keys this launcher arrived at (once each)."""
    lost: set[int] = field(default_factory=set)
    """Node ranks this launcher published as lost."""
    told: tuple[str, float] | None = None
    """The ``seen`` key of the job's end and when it was published or read (node 0 lingers on it)."""


def watched(node_rank: int, members: dict[int, Member]) -> dict[int, Member]:
    """The members whose heartbeat ``node_rank`` watches: every other node for node 0, node 0 for the rest.

    A node that every node watched would cost node 0's store N x N reads a heartbeat (1,048,576
    at 1,024 nodes); node 0 alone watching costs N, and it publishes a loss as the generation's
    failure, which every node reads within one beat (``benchmarks/bench_join.py``).
    """
    if node_rank == 0:
        return {k: m for k, m in members.items() if k != 0}
    return {k: m for k, m in members.items() if k == 0}


class Board:
    """This launcher's side of the board (see the module docstring).

    Two threads share it, the heartbeat (:meth:`_beat`) and the main thread (:meth:`event`, the
    ``publish``/``abort`` calls, :meth:`finish`, :meth:`linger`). Everything that changes is one
    :class:`BoardState`, guarded by one lock, :attr:`_lock`: every read and write of it holds the
    lock, and none holds it across a store call. The rest is fixed at construction (the store
    connections, the heartbeat interval) or is an :class:`threading.Event` of its own (:attr:`_stop`).
    The node's config is the :class:`.JobStore`'s, replaced whole (never changed in place) when
    the rendezvous gives the node rank, before the heartbeat matters for it.
    """

    def __init__(self, cfg: LaunchConfig, signals: Signals) -> None:
        self.js = JobStore(cfg, signals, self)  # its calls: interrupted by this board's events, errors explained
        self.interval = timing.heartbeat_interval(cfg.node_timeout, cfg.nnodes)
        self._lock = threading.Lock()
        self._beaten = threading.Condition(self._lock)  # notified after every heartbeat
        self._stop = threading.Event()
        self._state = BoardState()

    def _get(self, name: str) -> Any:
        with self._lock:
            return getattr(self._state, name)

    def _set(self, name: str, value: Any) -> None:
        with self._lock:
            setattr(self._state, name, value)

    generation = property(lambda self: self._get("generation"), lambda self, v: self._set("generation", v),
                          doc="The generation this launcher runs or joins (:attr:`BoardState.generation`).")
    claimed = property(lambda self: self._get("claimed"), lambda self, v: self._set("claimed", v),
                       doc="This launcher holds its node rank (:attr:`BoardState.claimed`).")
    finished = property(lambda self: self._get("finished"),
                        doc="Every node's ranks of this generation finished (:attr:`BoardState.finished`).")
    answered = property(lambda self: self._get("answered"),
                        doc="Pings to this launcher answered (:attr:`BoardState.answered`).")
    flight_out = property(lambda self: self._get("flight_out"), lambda self, v: self._set("flight_out", v),
                          doc="This node's ranks' flight records, published every beat (the hang watch sets it).")
    flight_in = property(lambda self: self._get("flight_in"),
                         doc="Node 0: the other nodes' flight records, as last read (a new dict every beat).")
    hang_in = property(lambda self: self._get("hang_in"), doc="The latest hang node 0 announced.")

    @property
    def cfg(self) -> Any:
        """This node's config (:attr:`.JobStore.cfg`: the node rank is filled in at the rendezvous)."""
        return self.js.cfg

    # -- the round

    def set_round(self, generation: int, members: dict[int, Member]) -> None:
        """A round completed: watch these members' heartbeats from now on."""
        now = time.monotonic()
        with self._lock:
            st = self._state
            st.generation = generation
            st.members = dict(members)
            st.last_change = {k: now for k in watched(self.cfg.node_rank, members)}
            st.counters = {}

    def clear_round(self) -> None:
        """A new round is forming: no member to watch until it completes."""
        self.set_round(self.generation, {})

    # -- what the board says

    def event(self) -> Event | None:
        """What the board says now (never blocks): this generation's failure, an abort, or a lost node."""
        with self._lock:
            st = self._state
            # A failure first: the node that saw it also aborts the job when no restart is left,
            # and the failure is the better report.
            fail = st.fail.get(st.generation) if st.members else None  # only while a round runs
            if fail:
                record = read_failure(fail)
                return Event(EventKind.FAILED, printable(record.message or ""), record)
            if st.abort:
                return Event(EventKind.ABORT, printable(st.abort), None)
            return self._lost_node(st, time.monotonic())

    def _lost_node(self, st: BoardState, now: float) -> Event | None:
        """A lost node in ``st`` (read under the lock), if any."""
        cfg = self.cfg
        lost_after = timing.lost_after(cfg.node_timeout, cfg.nnodes)
        if st.watching and cfg.node_rank != 0 and (now - st.last_ok > lost_after
                                                   or st.errors >= timing.ERRORS_BEFORE_LOST):
            host0 = st.members[0].host if 0 in st.members else cfg.addr
            why = (f"its store stopped answering ({st.last_error})" if st.errors
                   else f"no answer for {lost_after:g} s")
            return self._lost_event(0, host0, None, f"lost node 0 ({host0}): {why}")
        for k, seen in st.last_change.items():
            if k != cfg.node_rank and now - seen > lost_after:
                member = st.members[k]
                message = f"lost node {k} ({member.host}): no heartbeat for {lost_after:g} s (--node-timeout)"
                return self._lost_event(k, member.host, member.owner, message)
        return None

    @staticmethod
    def _lost_event(node_rank: int, host: str, owner: str | None, message: str) -> Event:
        return Event(EventKind.LOST, message, LostNode(node_rank, host, owner, message))

    def raise_event(self) -> None:
        """Raise :class:`JobEvent` if the board says something."""
        event = self.event()
        if event is not None:
            raise JobEvent(event)

    def read_now(self) -> None:
        """Read ``abort`` and this generation's ``fail`` from the store now, not at the next beat; raise what the board then says.

        A rank fails within a beat of what ended it elsewhere: a launcher that received SIGTERM
        publishes its abort, then stops its ranks, and their peers here fail at once with a
        connection error. Read at the next beat, the abort would come after this node had blamed its
        own rank.

        Raises:
            JobEvent: a failure, an abort or a lost node.
        """
        js = self.js
        gen = self._get("generation")
        abort, fail = js.quietly(lambda: (peek(js.store, js.key("abort")), peek(js.store, js.key(f"fail/{gen}")))) \
            or (None, None)
        with self._lock:
            if abort:
                self._state.abort = abort
            if fail:
                self._state.fail[gen] = fail
        self.raise_event()

    def explain_error(self) -> None:
        """After a store error: wait a few heartbeats for the board to say why; raise its event if it does.

        The board's state changes only at a heartbeat, so this waits beat by beat (woken by each)
        rather than reading it in a loop; signals are checked between beats.
        """
        if not self._get("watching"):
            return
        deadline = time.monotonic() + timing.ABORT_EXPLAIN_BEATS * self.interval + timing.ABORT_EXPLAIN_SLACK_S
        while True:
            self.raise_event()
            self.js.signals.check()
            left = deadline - time.monotonic()
            if left <= 0:
                return
            with self._beaten:
                self._beaten.wait(min(left, self.interval))

    # -- the heartbeat (its own thread and store connection)

    def start(self) -> None:
        """Start beating (after the token check, before claiming the node rank)."""
        with self._lock:
            self._state.last_ok = time.monotonic()
            self._state.watching = True
        threading.Thread(target=self._beat, name="npu_migrate-heartbeat", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _beat(self) -> None:
        """One beat every interval until :meth:`stop`: a periodic task, so a loop by nature.

        Every beat counts this launcher alive, answers pings, reads ``abort`` and ``fail/<gen>``
        (either may come; a wait can only block on one set of keys, all of which must come),
        reads the others' counters and relays flight records.
        """
        js, store, st = self.js, self.js.watch, self._state
        alive = js.key(f"alive/{js.owner}")
        while not self._stop.is_set():
            try:
                store.add(alive, 1)
                answered = answer_pings(store, js.prefix, js.owner, self.answered)
                abort = peek(store, js.key("abort"))
                with self._lock:
                    st.answered = answered
                    gen = st.generation
                fail = peek(store, js.key(f"fail/{gen}"))
                with self._lock:  # recorded before telling node 0, which may then close the store
                    members, claimed = dict(st.members), st.claimed
                    if abort:
                        st.abort = abort
                    if fail:
                        st.fail[gen] = fail
                    if self.cfg.node_rank == 0 and st.told is None and (abort or fail):
                        # Another node ended the job: node 0 serves the store until the rest read why too.
                        st.told = ("seen/abort" if abort else f"seen/{gen}", time.monotonic())
                counters = {k: store.add(js.key(f"alive/{m.owner}"), 0)
                            for k, m in watched(self.cfg.node_rank, members).items()}
                self._flight(store, gen, members)
                # Tell node 0 we read it: it keeps serving the store until every node has.
                # Only a node of the job counts: a refused duplicate that read its own abort is none.
                for seen, value in (("seen/abort", abort), (f"seen/{gen}", fail)):
                    if value and self.cfg.node_rank != 0 and claimed and self._first_time(seen):
                        arrive(store, js.key(seen))
                now = time.monotonic()
                with self._lock:
                    st.last_ok = now
                    st.errors = 0
                    for k, value in counters.items():
                        if st.counters.get(k) != value:
                            st.counters[k] = value
                            st.last_change[k] = now
            except Exception as exc:  # noqa: BLE001 - the store is gone or unreachable
                with self._lock:
                    st.errors += 1
                    st.last_error = first_line(exc)
                logger.debug("heartbeat: %s", exc)
            with self._beaten:
                self._beaten.notify_all()
            self._stop.wait(self.interval)

    def _first_time(self, seen: str) -> bool:
        """Whether this launcher has not arrived at ``seen`` yet (it now counts as arrived)."""
        with self._lock:
            if seen in self._state.seen_sent:
                return False
            self._state.seen_sent.add(seen)
            return True

    def _flight(self, store: Any, gen: int, members: dict[int, Member]) -> None:
        """Publish this node's flight records; node 0 reads everyone's, the others read node 0's hang."""
        if not members:
            return
        js, node = self.js, self.cfg.node_rank
        out = self.flight_out
        if out is not None and node != 0:
            store.set(js.key(f"flight/{gen}/{node}"), out)
        if node == 0:
            found = {k: peek(store, js.key(f"flight/{gen}/{k}")) for k in members if k != 0}
            self._set("flight_in", {k: v for k, v in found.items() if v})
        else:
            hang = peek(store, js.key(f"hang/{gen}"))
            if hang:
                self._set("hang_in", as_record(hang))

    # -- hangs

    def announce_hang(self, record: dict[str, Any]) -> None:
        """Node 0: tell every node about a hang (each prints its own ranks' stacks)."""
        key, value = self.js.key(f"hang/{self.generation}"), json.dumps(record)
        self.js.quietly(lambda: self.js.store.set(key, value))

    def ack_hang(self, hang_id: int) -> None:
        """This node printed its stacks for hang ``hang_id``."""
        key = self.js.key(f"hang_ack/{self.generation}/{hang_id}")
        self.js.quietly(lambda: arrive(self.js.store, key))

    def wait_hang_acks(self, hang_id: int) -> None:
        """Node 0: wait (blocking, :data:`.timing.HANG_ACK_WAIT_S` at most) until the other nodes printed their stacks."""
        key = self.js.key(f"hang_ack/{self.generation}/{hang_id}")
        last = arrival_key(key, self.cfg.nnodes - 1)
        self.js.quietly(lambda: self.js.wait_keys([last], timing.HANG_ACK_WAIT_S), timing.HANG_ACK_WAIT_S + 1)

    # -- failures

    def publish_failure(self, record: FailureRecord) -> None:
        """Tell every node that this generation failed (the first report wins); never blocks long."""
        js, gen = self.js, self.generation
        lost = record if isinstance(record, LostNode) else None
        with self._lock:
            if lost is not None and lost.node_rank is not None:
                self._state.lost.add(lost.node_rank)  # it will never read why the job ends: no one waits for it
            self._state.told = (f"seen/{gen}", time.monotonic())

        def publish() -> None:
            key, mine = js.key(f"fail/{gen}"), json.dumps(record.record())
            current = js.store.compare_set(key, "", mine).decode()
            # The first failure wins (records.order: causes before consequences, then the earliest),
            # whichever node published its own first (a compare-and-set retry).
            while current != mine and order(read_failure(current)) > order(record):
                current = js.store.compare_set(key, current, mine).decode()
            if lost is not None and lost.owner:
                js.store.set(js.key(f"lost/{lost.owner}"), "1")
            js.store.set(js.key("running"), "")

        js.quietly(publish)

    def lost_peer(self, failure: Failure) -> LostNode | None:
        """The node behind a rank's connection error, when that node is gone: its loss, cause first.

        A rank whose peer's launcher was killed fails at once with the backend's connection error,
        which names the peer's address; the heartbeat board would call the node lost only after
        ``--node-timeout``, and the report would blame this node's rank. Each other node the error
        names (:func:`.liveness.named_in`) is asked whether its launcher is there
        (:func:`.liveness.ask`, :data:`.timing.LOSS_CONFIRM_SHARE` of the node timeout at most). The
        loss keeps the rank's failure as ``after`` and carries the time of the node's last
        heartbeat seen here, so it wins over its consequences on every node.

        Raises:
            JobEvent: the board spoke meanwhile (another node's failure, an abort, a lost node).
            Interrupted: SIGINT/SIGTERM meanwhile.
        """
        js = self.js
        self.read_now()  # the board may already say why (an abort ends ranks on every node)
        text = failure_text(failure)
        with self._lock:
            members, changed = dict(self._state.members), dict(self._state.last_change)
        seconds = max(self.interval * timing.LOSS_CONFIRM_BEATS, self.cfg.node_timeout * timing.LOSS_CONFIRM_SHARE)
        for member in named_in(text, members, self.cfg.node_rank):
            state = js.call(lambda m=member: ask(js.store, js.client, js.prefix, m.owner, seconds), "liveness")
            if state is Liveness.ALIVE or (state is Liveness.GONE and member.node_rank != 0):
                continue  # alive: the rank's error stands; the store gone: the board names node 0
            self.raise_event()  # an abort read meanwhile explains the loss (node 0 ended the job)
            last_beat = time.time() - (time.monotonic() - changed.get(member.node_rank, time.monotonic()))
            return lost_record(member, state, seconds, failure, self.cfg.node_rank, last_beat)
        return None

    def first_failure(self) -> FailureRecord | None:
        """The failure that won for this generation (as every node sees it), if readable.

        Read after one heartbeat (:data:`.timing.FAILURE_SETTLE_MAX_S`): a node whose rank failed
        earlier may publish it a little later.
        """
        key = self.js.key(f"fail/{self.generation}")
        self._stop.wait(min(timing.FAILURE_SETTLE_MAX_S, self.interval))

        def read() -> FailureRecord | None:
            value = peek(self.js.store, key)
            return read_failure(value) if value else None

        return self.js.quietly(read)

    def next_generation(self) -> None:
        """After a failure: the next round runs generation + 1."""
        with self._lock:
            self._state.generation += 1
            gen = str(self._state.generation)
        self.js.quietly(lambda: self.js.store.set(self.js.key("gen"), gen))

    def abort(self, message: str) -> None:
        """End every launcher of the job with ``message`` (the first reason wins)."""
        self._set("told", ("seen/abort", time.monotonic()))
        logger.info("aborting the job: %s", message)
        self.js.quietly(lambda: self.js.store.compare_set(self.js.key("abort"), "", message))

    # -- the end

    def finish(self) -> None:
        """Wait (blocking) until every node's ranks of this generation are done.

        Every node arrives at ``done/<gen>`` and waits for the last arrival's key; the signed
        count confirms it (a key alone could be set by anyone who reaches the store). Node 0 then
        serves until every node has arrived at ``acked/<gen>`` (:data:`.timing.ACK_WAIT_S` at most).

        Raises:
            JobEvent: a failure, a lost node or an abort meanwhile.
            Interrupted: SIGINT/SIGTERM meanwhile.
        """
        js, nnodes = self.js, self.cfg.nnodes
        done, acked = js.key(f"done/{self.generation}"), js.key(f"acked/{self.generation}")
        js.call(lambda: arrive(js.store, done), "finish")
        js.await_keys([arrival_key(done, nnodes)], "finish")
        if not js.call(lambda: arrived(js.store, done, nnodes), "finish"):
            raise RuntimeError(f"{done}/{nnodes} was set, but fewer nodes arrived: not by a launcher of this job")
        js.call(lambda: arrive(js.store, acked), "finish")
        self._set("finished", True)
        if self.cfg.node_rank == 0:  # keep serving until every node has read the result
            last = arrival_key(acked, nnodes)
            js.quietly(lambda: js.wait_keys([last], timing.ACK_WAIT_S), timing.ACK_WAIT_S + 1)

    def linger(self) -> None:
        """Node 0: serve the store a little longer after telling the others that the job ends.

        So that they read why instead of finding the store gone: until every other node has
        arrived at the ``seen`` key (blocking), or :func:`.timing.linger_window` at most (a busy
        node reads late; a lost one never).
        """
        with self._lock:
            told, lost = self._state.told, set(self._state.lost)
        if self.cfg.node_rank != 0 or told is None or self.js.store is None:
            return
        key, since = told
        deadline = since + timing.linger_window(self.cfg.node_timeout, self.cfg.nnodes)
        others = self.cfg.nnodes - 1 - len(lost - {0})
        if others > 0:
            last = arrival_key(self.js.key(key), others)
            left = max(0.0, deadline - time.monotonic())
            self.js.quietly(lambda: self.js.wait_keys([last], left), left)
        logger.info("served the store until %s nodes read %s (or for %.1f s)", others, key, deadline - since)
