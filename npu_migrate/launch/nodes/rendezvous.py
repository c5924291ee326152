"""A launcher's seat in a multi-node job: its store connections, its membership and its side of the board.

Usage (by the supervisor; one object per launcher)::

    rdzv = Rendezvous(cfg, signals)
    rdzv.connect()                 # reach node 0's store, check the job token, claim this node rank
    rnd = rdzv.join()              # every node is in: generation, node ranks and hosts
    ...                            # start the workers; poll rdzv.board.event() while they run
    rdzv.board.finish()            # every node's workers are done
    rdzv.close()

Three modules do the work; this one only puts them together in the right order:

* :mod:`.jobstore`: node 0's launcher store (``--port + 1``), the connections to it, and the
  interruptible, quiet and blocking ways of calling it (:mod:`.storewait`);
* :mod:`.membership`: the job token, the agreed flags, the node rank's claim (a duplicate is
  refused), and the rounds of torch's ``DynamicRendezvousHandler``;
* :mod:`.board`: while the job runs, the heartbeats, failures and aborts, the hang relay, and the
  end (every node's ranks done, and node 0 serving until the others read why the job ended).

Node 0 holds the store: if node 0 is lost, the other nodes end the job even with
``--max-restarts`` (a new node 0 would serve an empty store that the survivors do not know).
"""

from __future__ import annotations

from npu_migrate.launch.nodes.board import Board
from npu_migrate.launch.setup.config import LaunchConfig
from npu_migrate.launch.errors import LaunchError
from npu_migrate.launch.nodes.jobstore import JobStore
from npu_migrate.launch.nodes.membership import JOB_KEY, Membership
from npu_migrate.launch.nodes.records import Event, EventKind, JobEvent, Round
from npu_migrate.launch.signals import Signals

__all__ = ["JOB_KEY", "Event", "EventKind", "JobEvent", "Rendezvous", "Round"]


class Rendezvous:
    """This launcher's membership in a multi-node job and its side of the board (see the module docstring)."""

    def __init__(self, cfg: LaunchConfig, signals: Signals) -> None:
        self.js = JobStore(cfg, signals)
        self.board = Board(self.js)
        self.membership = Membership(self.js, self.board)

    @property
    def cfg(self) -> LaunchConfig:
        """This node's config; with node ranks from the rendezvous, its node rank is known after :meth:`connect`."""
        return self.js.cfg

    @property
    def host(self) -> str:
        """This host's name and the address it reaches node 0 from."""
        return self.js.host

    def connect(self) -> None:
        """See :meth:`.Membership.connect`; a node rank from the rendezvous: this node's earlier logs are refused."""
        self.membership.connect()
        cfg = self.cfg
        if cfg.rdzv.assign:
            try:
                cfg.output.check(cfg.nproc, cfg.log_dir, cfg.node_rank)
            except LaunchError as exc:  # the others would wait for this node in the round: end the job
                self.board.abort(f"node {cfg.node_rank} ({self.host}): {exc}")
                raise

    def join(self) -> Round:
        """See :meth:`.Membership.join`."""
        return self.membership.join()

    def close(self) -> None:
        """Node 0 serves until the others read why the job ended; stop the heartbeat; give the node rank back."""
        self.board.linger()
        self.board.stop()
        self.membership.close()
