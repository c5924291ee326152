"""The records launchers of one job exchange, and the kinds they carry: read without trusting their shape.

Usage::

    from npu_migrate.launch.nodes.records import Event, EventKind, FailureKind, JobEvent, Member, as_record

    record = as_record(value)                     # a JSON record another launcher wrote, never an exception
    if record.get("kind") == FailureKind.LOST: ...  # the enums compare equal to their JSON values
    raise JobEvent(Event(EventKind.ABORT, message, {}))

Every record here comes from another process, possibly another machine: :func:`as_record` reads
it without trusting its shape, and text from it goes through :func:`npu_migrate.textsafe.printable`
where it is printed. The keys that hold them are described in :mod:`.membership` and :mod:`.board`.
The enums are ``str`` enums: ``json.dumps`` writes their values, so the wire format is the
plain strings it always was.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum
from typing import Any

from npu_migrate.textsafe import printable


class WireEnum(str, Enum):
    """A ``str`` enum that is its value wherever it goes: JSON, ``str()``, f-strings, ``printable``."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class EventKind(WireEnum):
    """What the board says about the job."""

    ABORT = "abort"
    """End every node, no restart."""
    FAILED = "failed"
    """This generation failed: restart if allowed."""
    LOST = "lost"
    """A node stopped beating (the record names it)."""


class FailureKind(WireEnum):
    """The ``"kind"`` of a failure record (``fail/<gen>``, the report's ``first_failure``); JSON values as named."""

    RANK = "rank"
    LOST = "lost"
    HANG = "hang"
    ABORT = "abort"
    PREFLIGHT = "preflight"


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
        kind: see :class:`EventKind`.
        message: one line for the console.
        record: the failure's JSON record (a rank's error, or the lost node).
    """

    kind: EventKind
    message: str
    record: dict[str, Any]


class JobEvent(Exception):
    """Raised out of a wait when an :class:`Event` arrives."""

    def __init__(self, event: Event) -> None:
        super().__init__(event.message)
        self.event = event


FIELD_LIMIT = 200
"""Characters kept of one field another launcher wrote (a host name, a pid) in a console line."""


def as_record(text: str) -> dict[str, Any]:
    """A JSON record another launcher wrote, or (when it is not one) its text as the message."""
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    return value if isinstance(value, dict) else {"message": printable(text)}
