"""Hangs in the launcher: who made no progress for ``--hang-timeout`` seconds, who is behind, every stack.

Usage (by the supervisor, once per start of the ranks, polled while they run)::

    watch = HangWatch(cfg, run_dir, signals, board)   # board: None on a single node
    watch.start(procs)                  # a new Watchdog over this attempt's ranks' flight records
    hang = watch.poll()                 # serve SIGUSR1, read flight records; a Hang (once per stall) or None
    print(hang.summary)                 # "rank 1 is in all_reduce #57 since 12:00:01; rank 0 is in all_reduce #58 ..."
    watch.hang                          # the last hang, as the report records it (with every stack)

    dog = Watchdog(timeout=480, paths={0: path0, 1: path1})   # the decision alone, on this node's records
    hang = dog.poll(extra)              # None, or a Hang once per stall (again only after progress)

**Progress** is a rank's flight record (:mod:`.flight`) changing: entering or leaving a
collective. The job *hangs* when at least one rank is inside a collective (someone waits) and no
rank has made progress for ``timeout`` seconds: this covers a rank that skipped a collective,
a rank stuck in a Python loop or in I/O while the others wait, and a collective that never
completes on any rank. Ranks that all compute outside collectives never count as hung, however
long they take. Times are the launcher's own monotonic clock, so clocks of other hosts do not
matter.

**Default timeout** (:data:`..setup.options.DEFAULT_HANG_TIMEOUT`): 480 s for jobs of more than one rank, off
for a single rank. torch's NCCL watchdog aborts a collective after 10 minutes, HCCL after
``HCCL_EXEC_TIMEOUT`` (1836 s) and gloo after 30 minutes: 8 minutes reports with every stack
before any of them ends the job with a bare timeout, and leaves a rank alone for minutes while
the others wait (a checkpoint save on rank 0, an evaluation). ``--hang-timeout 0`` turns it off.

**Several nodes.** Node 0 decides for the whole job: every other node publishes its ranks' flight
records on the board (:mod:`..nodes.board`, each heartbeat), node 0's watchdog reads them beside its
own, announces a hang, and every node prints its own ranks' stacks once per
hang and tells node 0 it did (``hang_ack``).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from npu_migrate.launch.errors import say
from npu_migrate.launch.hangs import flight, stacks
from npu_migrate.launch.nodes import timing
from npu_migrate.launch.nodes.records import HangFailure
from npu_migrate.launch.setup.config import LaunchConfig
from npu_migrate.launch.signals import Signals
from npu_migrate.textsafe import printable

logger = logging.getLogger(__name__)


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

    def failure(self) -> HangFailure:
        """The job's failure record of this hang (``fail/<gen>``, the report's ``first_failure``)."""
        return HangFailure(f"hang: {self.summary}", self.behind, {str(k): v for k, v in self.states.items()},
                           self.stalled_s, self.time)


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


class HangWatch:
    """Hangs and stacks of this node's ranks (see the module docstring)."""

    def __init__(self, cfg: LaunchConfig, run_dir: str, signals: Signals, board: Any = None) -> None:
        self.cfg = cfg
        self.run_dir = run_dir
        self.signals = signals
        self.board = board
        self.watchdog: Watchdog | None = None
        self.procs: list[Any] = []
        self.hangs_seen = 0  # hangs declared here, or announced by node 0 and answered
        self.hang: dict[str, Any] | None = None
        self._next_read = 0.0
        self._dumps_served = 0

    def start(self, procs: list[Any]) -> None:
        """A new attempt's ranks: a new watchdog over their flight records."""
        cfg = self.cfg
        self.procs = procs
        self._dumps_served = self.signals.dumps  # asked while no rank ran: nothing to show
        self.watchdog = Watchdog(cfg.hang_timeout, {cfg.rank(i): flight.record_path(self.run_dir, cfg.rank(i))
                                                    for i in range(cfg.nproc)})
        if self.board is not None and cfg.node_rank != 0:
            self.watchdog.timeout = 0  # node 0 decides, from every node's records

    def poll(self) -> Hang | None:
        """Serve SIGUSR1; every :data:`.timing.FLIGHT_READ_S`, read the flight records. A new hang, if any."""
        if self.signals.dumps > self._dumps_served:
            self._dumps_served = self.signals.dumps
            self.dump_stacks("on request (SIGUSR1)")
        if time.monotonic() < self._next_read:
            return None
        self._next_read = time.monotonic() + timing.FLIGHT_READ_S
        return self._read_flight()

    def _live_ranks(self) -> dict[int, int]:
        """{rank: pid} of this node's running ranks that have a flight record (their dumps are armed)."""
        return {self.cfg.rank(i): p.pid for i, p in enumerate(self.procs)
                if p.exitcode is None and p.pid and os.path.exists(flight.record_path(self.run_dir, self.cfg.rank(i)))}

    def dump_stacks(self, why: str, states: dict[int, str] | None = None) -> dict[int, str]:
        """Print every running rank's stack on this node (all threads); also stacks.txt for `npu-migrate stacks`."""
        cfg = self.cfg
        texts = stacks.collect(self.run_dir, self._live_ranks())
        if states is None and self.watchdog is not None:
            states = {r: s.describe() for r, s in self.watchdog.read().items()}
        node = cfg.node_rank if cfg.nnodes > 1 else None
        where = f" on node {cfg.node_rank}" if cfg.nnodes > 1 else ""
        block = stacks.format_stacks(texts, states, node)
        head = f"stacks of {len(texts)} rank(s){where}, {why}, all threads, most recent call first:"
        say(head)
        if block:  # stacks the ranks dumped: strip what could drive the terminal, keep every line
            print(printable(block, max(len(block), 1), keep_newlines=True), file=sys.stderr, flush=True)
        stacks.write_dump(self.run_dir, self.signals.dumps, f"{head}\n{block}")
        return texts

    def _relay_hang(self, announced: dict[str, Any]) -> None:
        """Node 0 announced a hang (a record from the store): print this node's stacks once per hang."""
        try:
            hang_id = int(announced.get("id", 0))
            summary = printable(announced.get("summary"))
            states = {int(r): printable(v["state"], 200) for r, v in announced.get("states", {}).items()}
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            logger.debug("unreadable hang announcement: %s", exc)
            return
        if hang_id <= self.hangs_seen:
            return
        self.hangs_seen = hang_id
        say(f"node 0 reports a hang: {summary}")
        texts = self.dump_stacks("at the hang", states)
        self.hang = {**announced, "summary": summary, "stacks": {str(r): t for r, t in texts.items()}}
        self.board.ack_hang(hang_id)

    def _read_flight(self) -> Hang | None:
        """Read the flight records; report a hang (node 0 decides for every node). Returns the hang, if new."""
        dog, board, cfg = self.watchdog, self.board, self.cfg
        if dog is None:
            return None
        extra = None
        if board is not None:
            extra = {}
            for node, record in board.flight_in.items():
                try:
                    extra.update({int(r): state_from_dict(v) for r, v in json.loads(record).items()})
                except (ValueError, TypeError, KeyError, AttributeError) as exc:  # written by another process
                    logger.debug("node %s's flight records unreadable: %s", node, exc)
            announced = board.hang_in
            if cfg.node_rank != 0 and announced is not None:
                self._relay_hang(announced)
        hang = dog.poll(extra)
        if board is not None and cfg.node_rank != 0:
            board.flight_out = json.dumps({str(r): s.as_dict() for r, s in dog.states.items() if r in dog.paths})
        if hang is None:
            return None
        say(f"hang: no rank made progress for {hang.stalled_s:.0f} s (--hang-timeout {dog.timeout:g}) while "
            f"rank(s) wait in a collective; every rank's stack follows.")
        texts = self.dump_stacks("at the hang", {r: v["state"] for r, v in hang.states.items()})
        self.hangs_seen += 1
        record = hang.failure().record()
        self.hang = {**record, "summary": hang.summary, "stacks": {str(r): t for r, t in texts.items()}}
        if board is not None:
            board.announce_hang({**record, "summary": hang.summary, "id": self.hangs_seen})
        if cfg.hang_action == "report":  # with "end", the job's failure report says it
            say(f"hang: {hang.summary}")
            say("hang: --hang-action report: the job keeps running; the next report comes after progress resumes.")
        return hang
