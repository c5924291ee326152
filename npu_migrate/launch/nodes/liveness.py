"""Is another launcher of the job still there? A blocking ping on the store, and the node behind a peer address.

Usage (by :mod:`.membership` and :mod:`.board`)::

    answered = answer_pings(store, prefix, my_owner, answered)   # every heartbeat, in the owner
    state = ask(store, connect, prefix, their_owner, seconds)      # Liveness.ALIVE / SILENT / GONE
    for member in named_in(error_text, members, me=node_rank): ...  # nodes whose address a rank's error names

**The ping** (keys under the job's prefix in node 0's launcher store)::

    ping/<owner>       a counter: whoever asks adds 1 and keeps the value n it got back
    pong/<owner>/<n>   set by <owner>'s heartbeat thread for every n up to the counter

The asker blocks in :func:`.store.wait_keys` for ``pong/<owner>/<n>`` on a connection of its own (a TCPStore
client holds one lock for a whole request, so a blocking wait on a shared client would stall the
launcher's other calls). A live launcher answers within one heartbeat; one that stays silent for
the whole wait is gone; and a store that stops answering means node 0's launcher ended (the job
finished, or node 0 was lost). This replaces watching a heartbeat counter in a polling loop, whose
answer also depended on when the job around it ended.

**Addresses.** A backend's connection error names the peer's address (gloo: ``Read error
[10.0.0.2]:55509: Connection reset by peer``; NCCL, HCCL and the TCPStore write ``10.0.0.2:port`` or
``[fe80::1]:port``). :func:`named_in` maps the addresses found to the round's members by the
address each launcher reached node 0 from (``Member.addr``).
"""

from __future__ import annotations

import ipaddress
import re
from enum import Enum
from typing import Any, Callable

from npu_migrate.launch.nodes.records import Failure, LostNode
from npu_migrate.launch.nodes.store import peek, wait_keys
from npu_migrate.launch.nodes.values import PaddedStore


class Liveness(Enum):
    """What a ping found out about a launcher."""

    ALIVE = "alive"
    """It answered: its heartbeat thread runs."""
    SILENT = "silent"
    """The store answered, the launcher did not, for the whole wait: it is gone."""
    GONE = "gone"
    """The store itself stopped answering: node 0's launcher ended (the job, or node 0, is over)."""


# Dotted IPv4, not part of a longer dotted number (a version such as 1.2.3.4.5), and bracketed IPv6.
_IPV4 = re.compile(r"(?<![\d.])(\d{1,3}(?:\.\d{1,3}){3})(?![\d.]*\d)")
_IPV6 = re.compile(r"\[([0-9A-Fa-f:]*:[0-9A-Fa-f:.]*)\]")


def failure_text(failure: Failure) -> str:
    """What a rank's failure says (its message and traceback): where its addresses are read."""
    return f"{failure.message or ''}\n{failure.traceback or ''}"


def addresses_in(text: str) -> list[str]:
    """The IP addresses written in ``text`` (a rank's error), normalised, in order, once each."""
    found: list[str] = []
    for match in (*_IPV4.finditer(text), *_IPV6.finditer(text)):
        try:
            addr = str(ipaddress.ip_address(match.group(1)))
        except ValueError:
            continue
        if addr not in found:
            found.append(addr)
    return found


def named_in(text: str, members: dict[int, Any], me: int) -> list[Any]:
    """The other members of the round whose address ``text`` names (by node rank).

    ``members`` maps node ranks to :class:`~.board.Member` (anything with ``addr``). When
    several nodes share an address (nodes on one host over loopback), each is named: the ping
    then tells which of them is gone. A connection error that names no other member's address
    (a rank of this node closed first, its own peer gone) makes every other member a suspect.
    """
    wanted = set(addresses_in(text))
    named = [m for k, m in sorted(members.items()) if k != me and m.addr and _normal(m.addr) in wanted]
    if named or not wanted:
        return named
    # Only this node's own address, or none of the job's: the peer that closed was a rank of this
    # node, itself ended by another node's loss; each other node is then a suspect.
    return [m for k, m in sorted(members.items()) if k != me and m.addr]


def _normal(addr: str) -> str:
    try:
        return str(ipaddress.ip_address(addr))
    except ValueError:
        return addr


ANSWERS_PER_BEAT = 64
"""The most pings one heartbeat answers (the newest): a few launchers ask at once at most, and a
counter someone raised by millions must not keep the heartbeat busy."""


def _ping_key(prefix: str, owner: str) -> str:
    return f"{prefix}/ping/{owner}"


def _pong_key(prefix: str, owner: str, n: int) -> str:
    return f"{prefix}/pong/{owner}/{n}"


def answer_pings(store: PaddedStore, prefix: str, owner: str, answered: int) -> int:
    """Answer every ping to ``owner`` asked since ``answered``; return the new count answered."""
    asked = int(store.add(_ping_key(prefix, owner), 0))
    for n in range(max(answered, asked - ANSWERS_PER_BEAT) + 1, asked + 1):
        store.set(_pong_key(prefix, owner, n), "1")
    return max(answered, asked)


def ask(store: PaddedStore, connect: Callable[[float], Any], prefix: str, owner: str, seconds: float) -> Liveness:
    """Ping ``owner`` and wait (blocking, at most ``seconds``) for its answer.

    Args:
        store: the launcher's own client of node 0's store.
        connect: opens another client of the same store, given its timeout in seconds; the
            blocking wait runs on that one.
        prefix: the job's key prefix (``npu_migrate/<job id>``).
        owner: the launcher asked about.
        seconds: how long a silent launcher is waited for.
    """
    try:
        n = int(store.add(_ping_key(prefix, owner), 1))
    except Exception:  # noqa: BLE001 - the store is gone: node 0's launcher ended
        return Liveness.GONE
    pong = _pong_key(prefix, owner, n)
    try:
        if wait_keys(connect(seconds), [pong], seconds, check=store):  # read again after the wait
            return Liveness.ALIVE
    except Exception:  # noqa: BLE001 - a timeout, or the store went away: the next read tells which
        pass
    return _read_answer(store, pong)


def _read_answer(store: PaddedStore, pong: str) -> Liveness:
    """After a wait that did not end with the answer: was it there after all, or is the store gone?"""
    try:
        return Liveness.SILENT if peek(store, pong) is None else Liveness.ALIVE
    except Exception:  # noqa: BLE001 - the store is gone
        return Liveness.GONE


def lost_record(member: Any, state: Liveness, seconds: float, failure: Failure, node_rank: int,
                last_beat: float) -> LostNode:
    """The loss of ``member``, a node found gone after ``failure`` (a rank's) named its address.

    Args:
        member: the lost node (:class:`.board.Member`).
        state: what asking its launcher found (SILENT, or GONE for node 0, whose store it is).
        seconds: how long it was asked.
        failure: the rank's failure on this node (kept as ``after``).
        node_rank: this node.
        last_beat: when (``time.time()``) this node last saw the lost node's heartbeat move; the
            record's time, so that the loss wins over its consequences on every node.
    """
    why = ("its launcher store stopped answering" if state is Liveness.GONE
           else f"its launcher stopped answering (no heartbeat for {seconds:g} s)")
    named = member.addr and _normal(member.addr) in set(addresses_in(failure_text(failure)))
    then = f"lost its connection to {member.addr}" if named else "failed with a connection error"
    message = (f"lost node {member.node_rank} ({member.host}): {why}; then rank {failure.rank} on node "
               f"{node_rank} {then}")
    return LostNode(member.node_rank, member.host, member.owner, message, min(last_beat, failure.time), failure)
