"""A rank's failure as the launchers report it: the record every node reads, and the console lines.

Usage::

    failure = Failure(rank=1, local_rank=1, node_rank=0, host="gpu7", exc_type="ValueError", message="boom")
    say(failure.headline())              # "rank 1 (local rank 1 on node 0, host gpu7) failed: ValueError: boom"
    record = failure.record()            # JSON for the board (``fail/<gen>``) and the report
    again = failure_from(record)         # None when another launcher wrote something else
    exit_signal(-9)                      # "SIGKILL"
    min(records, key=order)              # the job's first failure: causes before their consequences
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field
from typing import Any

from npu_migrate.launch import hints
from npu_migrate.launch.nodes.records import FailureKind

ERROR_TAIL_LINES = 12
"""The last lines of a rank's traceback shown on the console (the whole one is in the report)."""


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
        return {"kind": FailureKind.RANK, **self.__dict__, "message_line": self.headline()}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Failure:
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in record.items() if k in names})


def failure_from(record: Any) -> Failure | None:
    """A rank's failure record as another launcher published it, or None if it is not one."""
    if not isinstance(record, dict):
        return None
    try:
        return Failure.from_record(record)
    except TypeError:  # fields missing
        return None


def order(record: dict[str, Any]) -> tuple[bool, float]:
    """Which failure is the job's first: causes before consequences, then the earliest.

    A rank that fails because a peer's connection closed (``hints.after_a_peer``) failed after
    that peer, whatever the clocks say: a rank killed by a signal is timed when its launcher saw
    the death, which on a busy machine can be after its peers' errors about it.
    """
    text = f"{record.get('message') or ''}\n{record.get('traceback') or ''}" if record.get("exc_type") else ""
    return hints.after_a_peer(text), float(record.get("time") or 0.0)


def exit_signal(code: int | None) -> str | None:
    """``SIGKILL`` for an exit code of -9; None for a plain exit."""
    if code is None or code >= 0:
        return None
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def explain(record: dict[str, Any], node_rank: int) -> tuple[str, list[str], bool]:
    """The console headline, detail lines and whether a restart can help, for the failure that won.

    Args:
        record: the winning failure record (``fail/<gen>``; a rank's, a lost node's or a hang's).
        node_rank: this node (a rank's failure on another node says which).
    """
    if record.get("kind") == FailureKind.HANG:
        return record.get("message") or "hang", [], True
    if record.get("kind") == FailureKind.LOST:
        node = record.get("node_rank")
        message = record.get("message") or f"lost node {node} ({record.get('host')})"
        after = failure_from(record.get("after"))
        lines = [f"after it: {after.headline()}"] if after is not None else []
        if node == 0:
            return (f"{message}; node 0 serves the job's rendezvous, so the job ends on every node.",
                    lines, False)
        return message, lines, True
    failure = failure_from(record)
    if failure is None:  # not a record this launcher writes: say what it says
        return f"the job failed: {record.get('message') or record}", [], True
    where = "" if failure.node_rank == node_rank else f" on node {failure.node_rank}"
    return failure.headline() + where, failure.details(), True
