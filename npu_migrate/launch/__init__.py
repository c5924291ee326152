"""``python -m npu_migrate.launch``: one process per device, on one node or many, ending as one job.

Usage::

    python -m npu_migrate.launch --device-num 8 train.py --epochs 10
    # two nodes: the same command on each, with its own --node-rank
    python -m npu_migrate.launch --device-num 8 --nnodes 2 --node-rank 0 --addr 10.0.0.1 train.py

    # a function target, as scripts that call mp.spawn themselves do: fn(local_rank, *args) on every device
    from npu_migrate.launch import spawn
    spawn(train, args=(opt,), nproc=8, nnodes=opt.world_size, node_rank=opt.rank, addr=opt.addr)

Every worker gets torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,
MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT...) plus NODE_RANK, NPU_MIGRATE_DEVICE,
OMP_NUM_THREADS and the interface that reaches node 0, has its device bound, and runs SCRIPT as
``__main__`` with ``sys.argv = [SCRIPT, *ARGS]``.

The package is in wings, one concept each (as ``torch.distributed.elastic`` keeps ``agent/``,
``rendezvous/``, ``multiprocessing/``); each wing's docstring lists its modules:

* :mod:`.torchrun`: torchrun's command line, whole, and what each flag becomes;
* :mod:`.setup`: what one node will run, from the user's options and the host, checked;
* :mod:`.nodes`: the multi-node control plane (stores, membership, the board, liveness);
* :mod:`.hangs`: flight records, the watchdog, every rank's stack;
* :mod:`.procs`: the supervisor, the fork server, the ranks and their output.

Each wing imports only the wings above it in this list (tests/test_layout.py holds it): the
processes use the hang watch, which reads the nodes' records, which run on the set-up, which reads
torchrun's flags.

At the top: :mod:`.cli` (the flags, ``run`` and ``main``), :mod:`.api` (:func:`spawn`),
:mod:`.features` (what plugs into the launcher), and what every wing may use: :mod:`.signals`
(SIGINT/SIGTERM in every phase), :mod:`.hints` (what a signal or a known backend error means),
:mod:`.errors` (exceptions and one-line messages), :mod:`.cpplog` (torch's C++ log level in the
launcher, its fork server and its workers). A job, in order: ``cli`` -> ``setup.options`` -> ``setup.config`` ->
``procs.supervisor`` (-> ``nodes.membership`` on several nodes) -> ``procs.ranks`` ->
``procs.worker`` in each rank -> the user's script -> ``procs.failure`` / ``procs.report``.

Importing this package does not import torch: the launcher starts its fork server first.
"""

from __future__ import annotations

from npu_migrate.launch.cli import add_arguments, build_parser, main, run
from npu_migrate.launch.setup.config import LaunchConfig, make_config, world_table
from npu_migrate.launch.setup.options import DEFAULT_NODE_TIMEOUT, LaunchOptions
from npu_migrate.launch.setup.ports import CONTROL_PORT_OFFSET, DEFAULT_PORT
from npu_migrate.launch.setup.target import Target
from npu_migrate.launch.errors import JobFailed, LaunchError, LaunchUsageError
from npu_migrate.launch.signals import STOP_GRACE_S
from npu_migrate.launch.api import spawn


__all__ = [
    "CONTROL_PORT_OFFSET", "DEFAULT_NODE_TIMEOUT", "DEFAULT_PORT", "STOP_GRACE_S", "JobFailed", "LaunchConfig",
    "LaunchError", "LaunchOptions", "LaunchUsageError", "Target", "add_arguments", "build_parser", "main", "make_config", "run",
    "spawn", "world_table",
]
