"""Hang watching: which collective each rank is in, who stopped making progress, and every rank's stack.

* :mod:`.flight` (with :mod:`.flight_record`, its shared-memory file): written in each rank;
* :mod:`.watchdog`: in the launcher, who made no progress for ``--hang-timeout`` and who is behind;
* :mod:`.hangwatch`: this node's watch over its ranks and the hang relay between nodes;
* :mod:`.stacks`: every rank's Python stack on a hang, on SIGUSR1, or ``npu-migrate stacks PID``.
"""
