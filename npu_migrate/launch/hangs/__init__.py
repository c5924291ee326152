"""Hang watching: which collective each rank is in, who stopped making progress, and every rank's stack.

* :mod:`.flight`: the flight record, its shared-memory file written in each rank and read by the launcher;
* :mod:`.watchdog`: in the launcher, who made no progress for ``--hang-timeout``, who is behind, and
  this node's watch over its ranks (stacks, the hang relay between nodes);
* :mod:`.stacks`: every rank's Python stack on a hang, on SIGUSR1, or ``npu-migrate stacks PID``.
"""
