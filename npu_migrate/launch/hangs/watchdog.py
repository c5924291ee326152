"""Hang detection in the launcher: who made no progress for ``--hang-timeout`` seconds, and who is behind.

Usage (by the supervisor, polled while the ranks run)::

    dog = Watchdog(timeout=480, ranks={0: path0, 1: path1})
    hang = dog.poll()            # None, or a Hang once per stall (again only after progress)
    print(hang.summary)          # "rank 1 is in all_reduce #57 since 12:00:01; rank 0 is in all_reduce #58 since ..."

**Progress** is a rank's flight record (:mod:`.flight`) changing: entering or leaving a
collective. The job *hangs* when at least one rank is inside a collective (someone waits) and no
rank has made progress for ``timeout`` seconds: this covers a rank that skipped a collective,
a rank stuck in a Python loop or in I/O while the others wait, and a collective that never
completes on any rank. Ranks that all compute outside collectives never count as hung, however
long they take. Times are the launcher's own monotonic clock, so clocks of other hosts do not
matter; on several nodes node 0 polls every node's published records (:mod:`.rendezvous`).

**Default timeout** (:data:`DEFAULT_HANG_TIMEOUT`): 480 s for jobs of more than one rank, off
for a single rank. torch's NCCL watchdog aborts a collective after 10 minutes, HCCL after
``HCCL_EXEC_TIMEOUT`` (1836 s) and gloo after 30 minutes: 8 minutes reports with every stack
before any of them ends the job with a bare timeout, and leaves a rank alone for minutes while
the others wait (a checkpoint save on rank 0, an evaluation). ``--hang-timeout 0`` turns it off.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from npu_migrate.launch.hangs import flight
from npu_migrate.launch.nodes.records import FailureKind

DEFAULT_HANG_TIMEOUT = 480.0
"""Seconds without progress before a job of several ranks counts as hung (see the module docstring)."""


def effective_timeout(timeout: float | None, world_size: int) -> float:
    """``--hang-timeout`` as given, else the default for this world size (0: off)."""
    if timeout is not None:
        return timeout
    return DEFAULT_HANG_TIMEOUT if world_size > 1 else 0.0


@dataclass
class Hang:
    """A stall: every rank's state, who is behind, and one line saying so.

    Attributes:
        states: rank -> its flight state (as dicts, so they travel between nodes as JSON).
        behind: the ranks the others wait for.
        summary: the console line: who is behind, where the others are.
        stalled_s: seconds since the last progress of any rank.
        time: wall time the hang was declared.
    """

    states: dict[int, dict[str, Any]]
    behind: list[int]
    summary: str
    stalled_s: float
    time: float = field(default_factory=time.time)

    def record(self) -> dict[str, Any]:
        return {"kind": FailureKind.HANG, "message": f"hang: {self.summary}", "behind": self.behind,
                "states": {str(k): v for k, v in self.states.items()}, "stalled_s": self.stalled_s,
                "time": self.time}


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"


def behind_summary(states: dict[int, flight.FlightState]) -> tuple[list[int], str]:
    """Who is behind, and the sentence that says so.

    The front is the collective with the highest sequence number that ranks are waiting in (the
    most ranks, on a tie). Every rank not waiting there is behind: in an earlier collective, in
    another group, or in no collective at all.
    """
    waiting = [s for s in states.values() if s.in_collective]
    if not waiting:
        return [], "no rank is in a collective"
    fronts: dict[tuple[str, int, str], list[int]] = {}
    for s in waiting:
        fronts.setdefault((s.op, s.seq, s.group), []).append(s.rank)
    key = max(fronts, key=lambda k: (k[1], len(fronts[k])))
    front = sorted(fronts[key])
    first = states[front[0]]
    at_front = f"{_ranks(front)} {'is' if len(front) == 1 else 'are'} in {first.label()} since {clock_of(front, states)}"
    behind = sorted(r for r in states if r not in front)
    if not behind:
        return [], (f"every rank is in {first.label()} since {clock_of(front, states)} and none is behind: the "
                    "collective itself does not complete (check the network between the nodes)")
    parts = [f"rank {r} is {states[r].describe()}" for r in behind]
    return behind, "; ".join(parts) + f"; {at_front}"


def clock_of(ranks: list[int], states: dict[int, flight.FlightState]) -> str:
    return flight.clock(min(states[r].entered for r in ranks))


class Watchdog:
    """Reads flight records and declares a hang after ``timeout`` seconds without progress.

    Args:
        timeout: seconds; 0 turns detection off (:meth:`poll` only reads).
        paths: rank -> its flight record file, for the ranks this launcher reads itself.
    """

    def __init__(self, timeout: float, paths: dict[int, str]) -> None:
        self.timeout = timeout
        self.paths = dict(paths)
        self._last: dict[int, tuple[int, bool]] = {}
        self._since: dict[int, float] = {}
        self._reported = False
        self.states: dict[int, flight.FlightState] = {}

    def read(self) -> dict[int, flight.FlightState]:
        """This launcher's ranks' records now (a rank without a readable record is left out)."""
        found = {}
        for rank, path in self.paths.items():
            state = flight.read(path)
            if state is not None:
                found[rank] = state
        return found

    def poll(self, extra: dict[int, flight.FlightState] | None = None, now: float | None = None) -> Hang | None:
        """Read the records (plus ``extra``, other nodes' ranks); return a Hang once per stall.

        After a hang is returned, the next one comes only once some rank made progress again.
        """
        now = time.monotonic() if now is None else now
        states = {**self.read(), **(extra or {})}
        self.states = states
        progressed = False
        for rank, state in states.items():
            if self._last.get(rank) != state.progress:
                if rank in self._last:
                    progressed = True
                self._last[rank] = state.progress
                self._since[rank] = now
        if progressed:
            self._reported = False
        if self.timeout <= 0 or self._reported or not states:
            return None
        if not any(s.in_collective for s in states.values()):
            return None
        stalled = now - max(self._since[r] for r in states)
        if stalled < self.timeout:
            return None
        self._reported = True
        behind, summary = behind_summary(states)
        return Hang({r: s.as_dict() for r, s in sorted(states.items())}, behind, summary, stalled)


def state_from_dict(record: dict[str, Any]) -> flight.FlightState:
    """A flight state that travelled as JSON (from another node)."""
    names = flight.FlightState.__dataclass_fields__
    return flight.FlightState(**{k: v for k, v in record.items() if k in names})
