"""What launchers of one job tell each other through the store: the records and how they are read.

Usage::

    from npu_migrate.launch.board import Event, JobEvent, Member, as_record, peek

    value = peek(store, key)            # a key's value, or None, without blocking (torch 2.1 too)
    record = as_record(value)           # a JSON record another launcher wrote, never an exception

Every record here comes from another process, possibly another machine: :func:`as_record` reads
it without trusting its shape, and text from it goes through :func:`npu_migrate.textsafe.printable`
where it is printed. The keys themselves are described in :mod:`.rendezvous` and :mod:`.liveness`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from npu_migrate.textsafe import printable


@dataclass(frozen=True)
class Member:
    """One node of a round.

    Attributes:
        node_rank: its ``--node-rank``.
        host: host name and the address it reaches node 0 from, e.g. ``gpu7 (10.0.0.7)``.
        owner: the id of its launcher (a new one for every launcher process).
        generation: the restart count that launcher last knew.
        addr: the address it reaches node 0 from (what a peer's connection error names), if known.
    """

    node_rank: int
    host: str
    owner: str
    generation: int
    addr: str | None = None


@dataclass(frozen=True)
class Round:
    """A completed rendezvous: the generation to run and every node in it."""

    generation: int
    members: dict[int, Member]


@dataclass(frozen=True)
class Event:
    """Something another node (or the heartbeat board) says about the job.

    Attributes:
        kind: ``"abort"`` (end every node, no restart), ``"failed"`` (the generation failed:
            restart if allowed) or ``"lost"`` (a node stopped beating; ``record`` names it).
        message: one line for the console.
        record: the failure's JSON record (a rank's error, or the lost node).
    """

    kind: str
    message: str
    record: dict[str, Any]


class JobEvent(Exception):
    """Raised out of a wait when an :class:`Event` arrives."""

    def __init__(self, event: Event) -> None:
        super().__init__(event.message)
        self.event = event


ABSENT = "\0npu_migrate:absent"
FIELD_LIMIT = 200
"""Characters kept of one field another launcher wrote (a host name, a pid) in a console line."""


def as_record(text: str) -> dict[str, Any]:
    """A JSON record another launcher wrote, or (when it is not one) its text as the message."""
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    return value if isinstance(value, dict) else {"message": printable(text)}


def peek(store: Any, key: str) -> str | None:
    """A key's value, or None if unset, without blocking.

    torch 2.1's TCPStore has no ``check`` in Python; ``compare_set`` with an expected value that
    is never stored returns that value when the key is missing (the c10d rendezvous backend
    reads its state the same way). ``store`` is a :class:`PaddedStore`, so this is safe beside
    the launcher's other threads on torch < 2.4 too.
    """
    value = store.compare_set(key, ABSENT, ABSENT).decode()
    return None if value == ABSENT else value
