"""This node's watch over its ranks while they run: hangs, stacks on request, and the hang relay between nodes.

Usage (by the supervisor, once per start of the ranks)::

    watch = HangWatch(cfg, run_dir, signals, board)   # board: None on a single node
    watch.start(procs)                  # a new watchdog over this attempt's ranks
    hang = watch.poll()                 # serve SIGUSR1, read flight records; a Hang (once per stall) or None
    watch.hang                          # the last hang, as the report records it (with every stack)

On several nodes node 0 decides for the whole job: every other node publishes its ranks' flight
records on the board (:mod:`.board`, each heartbeat), node 0's watchdog reads them beside its
own (:mod:`.watchdog`), announces a hang, and every node prints its own ranks' stacks once per
hang and tells node 0 it did (``hang_ack``).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any

from npu_migrate.launch.hangs import flight, stacks

from npu_migrate.launch.nodes import timing
from npu_migrate.launch.setup.config import LaunchConfig
from npu_migrate.launch.errors import say
from npu_migrate.launch.signals import Signals
from npu_migrate.launch.hangs.watchdog import Hang, Watchdog, state_from_dict
from npu_migrate.textsafe import printable

logger = logging.getLogger(__name__)


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
        self.hang = {**hang.record(), "summary": hang.summary, "stacks": {str(r): t for r, t in texts.items()}}
        if board is not None:
            board.announce_hang({**hang.record(), "summary": hang.summary, "id": self.hangs_seen})
        if cfg.hang_action == "report":  # with "end", the job's failure report says it
            say(f"hang: {hang.summary}")
            say("hang: --hang-action report: the job keeps running; the next report comes after progress resumes.")
        return hang
