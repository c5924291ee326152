"""Node ranks assigned at the rendezvous: torchrun's c10d form without ``--node-rank``, and ``--nnodes MIN:MAX``.

Usage (by :mod:`.membership`, after the job token and the flags were checked)::

    assign(js, take)   # js.cfg gets this node's rank and the node count; take(k): claim node rank k (None)

**Node 0** is the launcher that serves the job's stores at the endpoint (:meth:`.JobStore.open`):
the one on the host that has the endpoint's address (``is_host`` in ``--rdzv-conf`` says so
explicitly), and of several launchers on that host the first to bind its port, as torch's c10d
backend decides who hosts its store. Node 0 must be that launcher here: it serves the ranks' store
on MASTER_PORT and the launchers' own store.

**The other nodes** arrive in node 0's store, each with its ``--local-addr`` or host name (FQDN)
and pid. Node 0 closes the rendezvous as soon as MAX nodes are in, or ``last_call_timeout``
after MIN are (``--nnodes MIN:MAX``; a fixed ``--nnodes N`` waits for all N within
``--join-timeout``), and numbers the others 1, 2, ... in torch's c10d order: sorted by that name,
then pid (torch's ``_NodeDesc``; torch sorts the store's host among them, here it is always node
0). The node count and the order are fixed there, once: restarts keep every node's rank.

**Keys** (under ``npu_migrate/<job id>/``, beside :mod:`.membership`'s):

======================== ================================================================
``assign/arrivals``      a counter; the n-th node to arrive sets ``assign/arrivals/<n>`` to
                         ``{"owner", "host", "fqdn", "pid"}``
``assign/world``         ``{"nnodes": N, "order": [owner of node 1, owner of node 2, ...]}``,
                         set once by node 0 when it closes the rendezvous
======================== ================================================================

**Late launchers.** A launcher that arrives after the world was fixed (a relaunched node, or one
more than the rendezvous took) takes the node rank of a lost launcher, as a relaunched node with
``--node-rank`` does (:meth:`.Membership.take`); where every node rank is held by a launcher
that answers, it is refused in one line: the world does not grow after its rendezvous.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from dataclasses import replace
from typing import Any, Callable

from npu_migrate.launch.nodes import timing
from npu_migrate.launch.errors import LaunchError
from npu_migrate.launch.nodes.store import JobStore, arrival_key, peek
from npu_migrate.launch.nodes.records import as_record

logger = logging.getLogger(__name__)

ARRIVALS = "assign/arrivals"
WORLD = "assign/world"


def assign(js: JobStore, take: Callable[[int], Any]) -> None:
    """Set this node's node rank and the job's node count in ``js.cfg`` (blocking until node 0 closes the rendezvous).

    Args:
        js: this launcher's store connections; node 0 is the one that serves them.
        take: claims a node rank when it is free or its holder is lost (None), else returns the holder's record.

    Raises:
        LaunchError: too few nodes in time, node 0 never closed the rendezvous, or no node rank left.
        JobEvent: the job was aborted meanwhile (another node's flags or node rank).
        Interrupted: SIGINT/SIGTERM meanwhile.
    """
    node_rank, nnodes = _node_rank(js, take)
    js.cfg = replace(js.cfg, node_rank=node_rank, nnodes=nnodes)


def _node_rank(js: JobStore, take: Callable[[int], Any]) -> tuple[int, int]:
    if js.server is not None:
        return 0, _close(js)
    cfg = js.cfg
    world = _world(js)
    if world is None:
        name = cfg.torchrun.local_addr or socket.getfqdn()  # torch's _NodeDesc.addr
        record = json.dumps({"owner": js.owner, "host": js.host, "fqdn": name, "pid": os.getpid()})
        js.call(lambda: _arrive(js.store, js.key(ARRIVALS), record), "rendezvous")
        wait = cfg.join_timeout + cfg.rdzv.last_call_timeout + timing.STORE_ANSWER_S
        if not js.await_keys([js.key(WORLD)], "rendezvous", wait):
            raise LaunchError(f"node 0's launcher at {js.where} did not close the rendezvous within {wait:g} s: "
                              "it failed, or it waits for more nodes than came (--nnodes).")
        world = _world(js)
    nnodes, order = _parse_world(world)
    if js.owner in order:
        return 1 + order.index(js.owner), nnodes
    # Late: the world is fixed. Take a lost node's rank, as a relaunched node would.
    for node_rank in range(1, nnodes):
        if js.call(lambda: take(node_rank), "claim") is None:
            logger.info("the rendezvous had closed; took node rank %s of a lost launcher", node_rank)
            return node_rank, nnodes
    raise LaunchError(
        f"the rendezvous of job {cfg.job_id!r} at {js.where} closed with {nnodes} node(s) before this launcher "
        "came, and every node rank is held by a running launcher: the world is fixed at the rendezvous and a "
        "running job does not grow. Start this node with the next job, or in place of a lost node.")


def _arrive(store: Any, key: str, record: str) -> int:
    """Count this node's arrival at ``key``; ``<key>/<n>`` holds its record."""
    n = int(store.add(key, 1))
    store.set(arrival_key(key, n), record)
    return n


def _world(js: JobStore) -> dict[str, Any] | None:
    value = js.call(lambda: js.peek(WORLD), "rendezvous")
    return None if value is None else as_record(value)


def _parse_world(world: dict[str, Any] | None) -> tuple[int, list[str]]:
    order = (world or {}).get("order")
    nnodes = (world or {}).get("nnodes")
    if not isinstance(order, list) or not isinstance(nnodes, int) or nnodes != len(order) + 1:
        raise LaunchError(f"the rendezvous's world record is not one this launcher wrote: {world!r:.200}")
    return nnodes, [str(o) for o in order]


def _close(js: JobStore) -> int:
    """Node 0: wait for the nodes (MIN, then MAX or the last call), number them, fix the world; return N."""
    cfg = js.cfg
    high = cfg.nnodes
    low = cfg.rdzv.min_nodes or high
    key = js.key(ARRIVALS)
    if low > 1 and not js.await_keys([arrival_key(key, low - 1)], "rendezvous", cfg.join_timeout):
        came = 1 + _count(js, key)
        raise LaunchError(
            f"only {came} of the job's {low} node(s) reached the rendezvous within {cfg.join_timeout:g} s "
            f"(--join-timeout): start the launcher on every node with --rdzv-endpoint {cfg.addr}:{cfg.port}.")
    if high > low:  # elastic: the last call for more nodes, up to MAX
        js.await_keys([arrival_key(key, high - 1)], "rendezvous", cfg.rdzv.last_call_timeout)
    count = min(_count(js, key), high - 1)
    names = [arrival_key(key, n) for n in range(1, count + 1)]
    # Each node sets its record right after it was counted: only a node that died just then is missing.
    js.await_keys(names, "rendezvous", timing.STORE_ANSWER_S)
    records = []
    for name in names:
        value = js.call(lambda: peek(js.store, name), "rendezvous")
        record = as_record(value) if value else {}
        if isinstance(record.get("owner"), str) and isinstance(record.get("pid"), int):
            records.append(record)
    # torch's c10d order: its _NodeDesc (host name, pid, ...) sorted.
    records.sort(key=lambda r: (str(r.get("fqdn", "")), r["pid"]))
    world = {"nnodes": 1 + len(records), "order": [r["owner"] for r in records]}
    js.call(lambda: js.store.set(js.key(WORLD), json.dumps(world)), "rendezvous")
    logger.info("rendezvous closed: %s node(s), in order %s", world["nnodes"],
                ", ".join(f"{r.get('host')} pid {r['pid']}" for r in records))
    return int(world["nnodes"])


def _count(js: JobStore, key: str) -> int:
    return int(js.call(lambda: js.store.add(key, 0), "rendezvous"))
