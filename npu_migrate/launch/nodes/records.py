"""The records launchers of one job exchange, and the kinds they carry: read without trusting their shape.

Usage::

    from npu_migrate.launch.nodes.records import Event, EventKind, Failure, JobEvent, LostNode, as_record

    record = as_record(value)                     # a JSON record another launcher wrote, never an exception
    first = read_failure(value)                   # a ``fail/<gen>`` value as its typed record, never an exception
    if isinstance(first, LostNode): ...           # Failure, LostNode, HangFailure, Ended or Unreadable
    value = json.dumps(first.record())            # the wire form, written only by the board and the report
    raise JobEvent(Event(EventKind.ABORT, message, None))

**Failure records** (``fail/<gen>``, the report's ``first_failure``) are typed, one class per
:class:`FailureKind`: a rank's :class:`Failure`, a :class:`LostNode`, a :class:`HangFailure`, an
:class:`Ended` job (abort, pre-flight), and :class:`Unreadable` for a value no launcher of this
version writes (kept as read, and explained by its message). They become JSON (``record()``)
only where they leave the launcher: the board's ``fail/<gen>`` and the report; they are read
back by :func:`read_failure` alone.

Every record here comes from another process, possibly another machine: :func:`as_record` reads
it without trusting its shape, and text from it goes through :func:`npu_migrate.textsafe.printable`
where it is printed. The keys that hold them are described in :mod:`.membership` and :mod:`.board`.
The enums are ``str`` enums: ``json.dumps`` writes their values, so the wire format is the
plain strings it always was.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar, Union

from npu_migrate.launch import hints
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
        record: the failure (a rank's error, a hang, the lost node); None for an abort.
    """

    kind: EventKind
    message: str
    record: FailureRecord | None


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


# -- failure records (``fail/<gen>``)

ERROR_TAIL_LINES = 12
"""The last lines of a rank's traceback shown on the console (the whole one is in the report)."""


@dataclass
class Failure:
    """A rank's failure (kind ``rank``): why the job is ending, as every launcher reports it."""

    kind: ClassVar[FailureKind] = FailureKind.RANK
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
    own_hint: str | None = None  # the rank's process knew what to do (npu_migrate.failure_hints)

    def headline(self) -> str:
        who = f"rank {self.rank} (local rank {self.local_rank} on node {self.node_rank}, host {self.host})"
        if self.exc_type is not None:
            return f"{who} failed: {self.exc_type}: {self.message}"
        if self.signal_name is not None:
            hint = hints.signal_hint(self.signal_name)
            return f"{who} was killed by {self.signal_name}" + (f" ({hint})" if hint else "")
        return f"{who} exited with code {self.exit_code} without a Python traceback"

    def hint(self) -> str | None:
        """What the rank's own process said to do, else what to check for a known backend error in the
        message or traceback."""
        if self.exc_type is None:
            return None
        return self.own_hint or hints.error_hint(f"{self.message}\n{self.traceback or ''}")

    def details(self) -> list[str]:
        lines = []
        hint = self.hint()
        if hint:
            lines.append(f"hint: {hint}")
        if self.traceback:
            tail = self.traceback.rstrip().splitlines()[-ERROR_TAIL_LINES:]
            title = "traceback (last lines):" if self.exc_type else "Python stack at the signal (last lines):"
            lines += [title] + [f"  {line}" for line in tail]
        if self.log:
            lines.append(f"full output: {self.log}")
        return lines

    def record(self) -> dict[str, Any]:
        return {"kind": self.kind, **self.__dict__, "message_line": self.headline()}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Failure:
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in record.items() if k in names and k != "kind"})


@dataclass(frozen=True)
class LostNode:
    """A node that is gone (kind ``lost``): its heartbeat stood still, its store stopped answering,
    or a rank's connection error named it and its launcher did not answer (:mod:`.liveness`).

    Attributes:
        node_rank: the node (None in a record whose ``node_rank`` is not a number).
        host: its host, as the round named it.
        owner: its launcher's id (None for node 0 lost through its store).
        message: the console line.
        time: when it was last seen beating, when a rank's error named it (the loss then wins
            over its consequences on every node); None when the heartbeat board found it.
        after: the rank failure on this node that named it.
    """

    kind: ClassVar[FailureKind] = FailureKind.LOST
    node_rank: int | None
    host: str
    owner: str | None
    message: str
    time: float | None = None
    after: Failure | None = None

    def record(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "node_rank": self.node_rank, "host": self.host,
                               "owner": self.owner, "message": self.message}
        if self.time is not None:
            out["time"] = self.time
        if self.after is not None:
            out["after"] = self.after.record()
        return out


@dataclass(frozen=True)
class HangFailure:
    """A hang node 0 declared (kind ``hang``; :class:`.watchdog.Hang` makes it).

    Attributes:
        message: ``hang: <who is behind>``.
        behind: the ranks the others wait for.
        states: rank (a string) -> its flight state as a dict.
        stalled_s: seconds since the last progress of any rank.
        time: wall time the hang was declared.
    """

    kind: ClassVar[FailureKind] = FailureKind.HANG
    message: str
    behind: list[int]
    states: dict[str, Any]
    stalled_s: float
    time: float

    def record(self) -> dict[str, Any]:
        return {"kind": self.kind, "message": self.message, "behind": self.behind, "states": self.states,
                "stalled_s": self.stalled_s, "time": self.time}


@dataclass(frozen=True)
class Ended:
    """The job ended this launcher without a failure of its own (kind ``abort`` or ``preflight``)."""

    kind: FailureKind
    message: str
    time: ClassVar[None] = None

    def record(self) -> dict[str, Any]:
        return {"kind": self.kind, "message": self.message}


@dataclass(frozen=True)
class Unreadable:
    """A failure record no launcher of this version writes: kept as read, explained by its message."""

    fields: dict[str, Any]
    kind: ClassVar[None] = None

    @property
    def message(self) -> str | None:
        message = self.fields.get("message")
        return message if isinstance(message, str) else None

    @property
    def time(self) -> float | None:
        return _number(self.fields.get("time"))

    def record(self) -> dict[str, Any]:
        return self.fields


FailureRecord = Union[Failure, LostNode, HangFailure, Ended, Unreadable]
"""A failure record of any kind (``fail/<gen>``, the report's ``first_failure``)."""


def order(record: FailureRecord) -> tuple[bool, float]:
    """Which failure is the job's first (``min(records, key=order)``): causes before consequences, then the earliest.

    A rank that fails because a peer's connection closed (``hints.after_a_peer``) failed after
    that peer, whatever the clocks say: a rank killed by a signal is timed when its launcher saw
    the death, which on a busy machine can be after its peers' errors about it.
    """
    text = ""
    if isinstance(record, Failure) and record.exc_type:
        text = f"{record.message or ''}\n{record.traceback or ''}"
    return hints.after_a_peer(text), float(record.time or 0.0)


def read_failure(value: Any) -> FailureRecord:
    """A failure record another launcher wrote (its JSON text, or a dict read from it), typed by its kind.

    Nothing in it is trusted: a field of the wrong type is left out (or made a default), and a
    record that is no kind this launcher writes is :class:`Unreadable`. Never raises.
    """
    record = as_record(value) if isinstance(value, str) else value
    if not isinstance(record, dict):
        return Unreadable({"message": printable(str(value))})
    kind = record.get("kind", FailureKind.RANK)
    if kind == FailureKind.HANG:
        states = record.get("states")
        behind = record.get("behind")
        return HangFailure(_text(record.get("message")) or "hang",
                           [r for r in behind if isinstance(r, int)] if isinstance(behind, list) else [],
                           states if isinstance(states, dict) else {},
                           _number(record.get("stalled_s")) or 0.0, _number(record.get("time")) or 0.0)
    if kind == FailureKind.LOST:
        node, host = record.get("node_rank"), _text(record.get("host")) or ""
        node = node if isinstance(node, int) and not isinstance(node, bool) else None
        after = record.get("after")
        return LostNode(node, host, _text(record.get("owner")),
                        _text(record.get("message")) or f"lost node {node} ({host})", _number(record.get("time")),
                        _rank_failure(after) if isinstance(after, dict) else None)
    if kind in (FailureKind.ABORT, FailureKind.PREFLIGHT):
        return Ended(FailureKind(kind), _text(record.get("message")) or "")
    failure = _rank_failure(record) if kind == FailureKind.RANK else None
    return failure if failure is not None else Unreadable(record)


def _rank_failure(record: dict[str, Any]) -> Failure | None:
    """A rank's failure from its record, or None when its fields are missing."""
    try:
        failure = Failure.from_record(record)
    except TypeError:  # fields missing
        return None
    failure.time = _number(record.get("time")) or 0.0  # a record without one comes first, as it always did
    return failure


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
