"""Every timing window of the multi-node launcher, each with the reason for its value.

Usage::

    from npu_migrate.launch.nodes import timing

    interval = timing.heartbeat_interval(cfg.node_timeout)   # seconds between two heartbeats
    store.set_timeout(timedelta(seconds=timing.store_call_timeout(cfg.node_timeout)))

The windows are grouped by who uses them: the store connections (:mod:`.store`), membership
(:mod:`.membership`), the board (:mod:`.board`) and the supervisor's watch loop
(:mod:`..procs.supervisor`). Windows that follow ``--node-timeout`` are functions of it; the rest are
constants. Nothing here is a synchronisation by sleeping: each is the longest a launcher waits
for something that usually comes much sooner, or the period of a loop that has to stay a loop
(the heartbeat, the watch over workers and signals).
"""

from __future__ import annotations

# --------------------------------------------------------------------------- store connections

STORE_CALL_MIN_S = 30.0
"""The shortest timeout of one call on node 0's store: a node timeout of a few seconds must not
make an ordinary ``set`` on a busy store fail (the store answers within milliseconds when idle)."""

QUIET_CALL_S = 5.0
"""How long a store call that nobody may wait for (telling the others about a failure, an abort)
is given before the launcher goes on without it: node 0 may be gone."""

LEAVE_S = 2.0
"""How long the launcher's last store calls (stop torch's keep-alive, give the node rank back)
may take at exit: the launcher must end within 5 s of a signal."""


def store_call_timeout(node_timeout: float, read_timeout: float | None = None) -> float:
    """The timeout of one call on node 0's store: never below :data:`STORE_CALL_MIN_S`, or below
    ``read_timeout`` where ``--rdzv-conf`` gives one (torch's c10d store timeout), nor ``node_timeout``."""
    return max(STORE_CALL_MIN_S if read_timeout is None else read_timeout, node_timeout)


# --------------------------------------------------------------------------- the heartbeat

HEARTBEATS_PER_NODE_TIMEOUT = 10
"""A node is lost after ``--node-timeout`` without a beat: ten beats in that time let one busy
beat (a slow store, a loaded host) pass without a false loss."""

HEARTBEAT_MIN_S = 0.2
"""The fastest heartbeat: each beat is a few store calls per node, and node 0's store serves them all."""

HEARTBEAT_MAX_S = 2.0
"""The slowest heartbeat: a failure on another node is read within one beat, and ends this node's ranks."""

ERRORS_BEFORE_LOST = 3
"""Heartbeats in a row that fail with a store error before node 0 counts as lost: one error is a
hiccup (a reconnect), three are a store that went away."""


NODE0_BEATS_PER_S = 500
"""The most heartbeats a second node 0's store is given, whatever the node count: past
``NODE0_BEATS_PER_S x HEARTBEAT_MAX_S`` nodes (1,000 with the default node timeout) the heartbeat
slows down with the node count instead of node 0's load growing with it. One beat is about 7
store requests (node 0's own beat 2 per node: it alone reads every node's counter and flight
record), so this keeps node 0's store near 4,500 requests a second at any size: under a tenth of
one core of its store thread in ``benchmarks/bench_join.py``, which leaves room for the ranks'
own store traffic and a loaded host."""

LOST_MIN_BEATS = 5
"""A node is called lost after ``--node-timeout``, never after fewer of its heartbeats than this:
where the heartbeat slowed down for a large job, one late beat must not lose a live node."""


def heartbeat_interval(node_timeout: float, nnodes: int = 1) -> float:
    """Seconds between two heartbeats for this ``--node-timeout`` and node count.

    ``clamp(node_timeout / HEARTBEATS_PER_NODE_TIMEOUT, HEARTBEAT_MIN_S, HEARTBEAT_MAX_S)``, and
    never less than ``nnodes / NODE0_BEATS_PER_S``: node 0 then gets at most
    :data:`NODE0_BEATS_PER_S` beats a second (2.05 s at 1,024 nodes, 8.2 s at 4,096).
    """
    interval = max(HEARTBEAT_MIN_S, min(HEARTBEAT_MAX_S, node_timeout / HEARTBEATS_PER_NODE_TIMEOUT))
    return max(interval, nnodes / NODE0_BEATS_PER_S)


def lost_after(node_timeout: float, nnodes: int = 1) -> float:
    """Seconds without a heartbeat before a node counts as lost: ``--node-timeout``, or
    :data:`LOST_MIN_BEATS` heartbeats where the heartbeat slowed down for the node count."""
    return max(node_timeout, LOST_MIN_BEATS * heartbeat_interval(node_timeout, nnodes))


ABORT_EXPLAIN_BEATS = 2
"""After a store error, the heartbeats waited for the board to say why (node 0 ends its store soon
after it tells every node that the job ends): the reason is read within one beat, two leave one spare."""

ABORT_EXPLAIN_SLACK_S = 0.5
"""... plus this, for the beat that is under way when the error comes."""


# --------------------------------------------------------------------------- membership

TOKEN_WAIT_S = 30.0
"""How long a node waits for node 0's job token once node 0's store answers: node 0 writes it
right after it serves the store, so only a store of something else stays without one."""

CALL_SLACK_S = 5.0
"""How long past its own timeout a store connection may block before the launcher gives up on it
(torch's client waits for good on a listener that accepts and never answers)."""

STORE_ANSWER_S = 15.0
"""How long a node waits for node 0's store to answer once something listens at its address (at
most ``--join-timeout``): a store of the same torch answers in milliseconds, one of another torch
release never (its protocol differs), and the node says so instead of waiting out the join. Also
the longest wait for a node's second connection, made right after node 0 answered its first: a
node 0 that went away meanwhile (its job ended) is named then, not after ``--join-timeout``."""

TORCH_KEEP_ALIVE_S = 5
"""torch < 2.4 fixes its rendezvous handler's keep-alive at 5 s (and the most we use on newer torch)."""

KEEP_ALIVES_PER_NODE_TIMEOUT = 4
"""On torch >= 2.4, four of the handler's keep-alives fit in ``--node-timeout``."""

KEEP_ALIVES_BEFORE_DROP = 3
"""The handler drops a participant silent for ``--node-timeout``, never for less than three of its
keep-alives: a slow machine would lose live nodes."""

ROUND_LAST_CALL_S = 1.0
"""torch's ``last_call`` window: every node is expected (min = max = ``--nnodes``), so the round
closes as soon as the last one is in; the window only covers the handler's own bookkeeping."""

ROUND_CLOSE_S = 30.0
"""torch's ``close`` timeout of a rendezvous round (the handler's default)."""


KEEP_ALIVES_PER_S = 100
"""The most keep-alives of torch's handler a second at node 0 (torch >= 2.4, where it can be set):
each one reads and compare-and-sets the whole rendezvous state, which grows with the node count
(about 100 bytes a node), so node 0's bytes grow as N x N / interval; past 500 nodes the
keep-alive slows down with the node count instead (11 s at 1,024 nodes)."""


def keep_alive_interval(node_timeout: float, nnodes: int = 1) -> int:
    """The keep-alive of torch's rendezvous handler on torch >= 2.4, in whole seconds: a quarter of
    ``--node-timeout`` (at most :data:`TORCH_KEEP_ALIVE_S`), never less than ``nnodes / KEEP_ALIVES_PER_S``."""
    interval = max(1, min(TORCH_KEEP_ALIVE_S, int(node_timeout / KEEP_ALIVES_PER_NODE_TIMEOUT)))
    return max(interval, -(-nnodes // KEEP_ALIVES_PER_S))


# --------------------------------------------------------------------------- the board

LOSS_CONFIRM_SHARE = 0.5
"""How long (a share of ``--node-timeout``) a node named in a rank's connection error is asked
whether its launcher is there before it is called lost. A live launcher answers within one
heartbeat (a tenth of the node timeout); half of it leaves a busy one five beats, and names a
node that is gone in half the time the heartbeat board would."""

LOSS_CONFIRM_BEATS = 3
"""... and never fewer heartbeats than this, where a tenth of the node timeout is clamped."""

FAILURE_SETTLE_MAX_S = 1.0
"""Before reading the failure that won a generation, a node waits one heartbeat (at most this
long): a node whose rank failed earlier publishes its failure within one beat of noticing it, and
the earliest one wins (compare-and-set). No key says "every node that will report has", since
nodes whose ranks were only stopped report nothing, so this stays a window."""

ACK_WAIT_S = 10.0
"""Node 0 serves its store after the job finished until every node has read that it did, this
long at most (a node that is gone meanwhile never reads it)."""

HANG_ACK_WAIT_S = 5.0
"""Node 0 waits this long at most for the other nodes to print their ranks' stacks at a hang
before it ends the job (ending first would cut their stacks short)."""

LINGER_MIN_S = 4.0
"""Node 0 serves its store at least this long (or until every other node read it) after it told
the others that the job ends, so they read why instead of finding the store gone ..."""

LINGER_NODE_TIMEOUT_SHARE = 0.5
"""... or half the node timeout where that is longer (a busy node reads late; a lost one never)."""

FINISH_WAIT_SLICE_S = 60.0
"""The blocking wait for every node's ranks to finish has no end of its own (ranks of other nodes
may run for hours longer), but runs in slices of this length on a connection of its own, so a
wait abandoned for a board event (a failure, a lost node) ends within one slice."""


def linger_window(node_timeout: float, nnodes: int = 1) -> float:
    """How long node 0 serves the store at most after telling the others that the job ends."""
    interval = heartbeat_interval(node_timeout, nnodes)
    return max(LINGER_MIN_S, ABORT_EXPLAIN_BEATS * interval + ABORT_EXPLAIN_SLACK_S,
               node_timeout * LINGER_NODE_TIMEOUT_SHARE)


# --------------------------------------------------------------------------- the supervisor

WORKER_POLL_S = 0.05
"""How long the watch loop waits for a worker to exit before it looks at the signals, the board and
the flight records: it waits on the workers' sentinels, and the other sources have no descriptor
to wait on beside them, so a worker's exit is seen at once and everything else within this."""

FLIGHT_READ_S = 0.5
"""How often the launcher reads its ranks' flight records (a hang is declared after minutes)."""
