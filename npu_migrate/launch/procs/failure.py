"""Which failure is the job's first, and how the one that won reads on the console.

The failure records themselves (a rank's :class:`~.records.Failure`, a lost node, a hang, an
abort) are typed in :mod:`npu_migrate.launch.nodes.records`, which reads them off the wire and orders them
(:func:`~npu_migrate.launch.nodes.records.order`: which one is the job's first).

Usage::

    failure = Failure(rank=1, local_rank=1, node_rank=0, host="gpu7", exc_type="ValueError", message="boom")
    say(failure.headline())              # "rank 1 (local rank 1 on node 0, host gpu7) failed: ValueError: boom"
    exit_signal(-9)                      # "SIGKILL"
    headline, lines, restartable = explain(record, node_rank)
"""

from __future__ import annotations

import signal

from npu_migrate.launch.nodes.records import Failure, FailureRecord, HangFailure, LostNode

__all__ = ["Failure", "exit_signal", "explain"]


def exit_signal(code: int | None) -> str | None:
    """``SIGKILL`` for an exit code of -9; None for a plain exit."""
    if code is None or code >= 0:
        return None
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def explain(record: FailureRecord, node_rank: int) -> tuple[str, list[str], bool]:
    """The console headline, detail lines and whether a restart can help, for the failure that won.

    Args:
        record: the winning failure (``fail/<gen>``; a rank's, a lost node's or a hang's).
        node_rank: this node (a rank's failure on another node says which).
    """
    if isinstance(record, HangFailure):
        return record.message, [], True
    if isinstance(record, LostNode):
        lines = [f"after it: {record.after.headline()}"] if record.after is not None else []
        if record.node_rank == 0:
            return (f"{record.message}; node 0 serves the job's rendezvous, so the job ends on every node.",
                    lines, False)
        return record.message, lines, True
    if isinstance(record, Failure):
        where = "" if record.node_rank == node_rank else f" on node {record.node_rank}"
        return record.headline() + where, record.details(), True
    # not a record this launcher writes (or an abort): say what it says
    return f"the job failed: {record.message or record.record()}", [], True
