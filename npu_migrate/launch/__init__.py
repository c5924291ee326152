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

One concept per module:

* :mod:`.options`: the options the user gave (:class:`LaunchOptions`: flags or ``spawn()``'s keywords);
* :mod:`.config`: the checked settings of one node (:func:`make_config`), the world table;
* :mod:`.features`: features that plug into the launcher (runtime migration, the probe);
* :mod:`.cluster`: Slurm/Kubeflow variables, host lists, addresses, interfaces, cores;
* :mod:`.rendezvous`: a node's seat in a multi-node job: :mod:`.jobstore` (node 0's store and the
  calls on it), :mod:`.membership` (token, flags, claims, rounds), :mod:`.board` (heartbeats,
  failures, hang relay, the end), :mod:`.storewait` (blocking waits), :mod:`.timing` (every window);
* :mod:`.worker`: the bootstrap of each worker process;
* :mod:`.supervisor`: the job's phases, restarts and failure reports; :mod:`.api`: :func:`spawn`; :mod:`.ranks`
  (this node's worker processes), :mod:`.failure`, :mod:`.hangwatch`, :mod:`.rundir` (the run directory);
* :mod:`.flight`: each rank's flight record (the collective it is in), written in the worker;
* :mod:`.watchdog`: hang detection and who is behind (``--hang-timeout``), in the launcher;
* :mod:`.stacks`: every rank's stack on a hang, SIGUSR1 or ``npu-migrate stacks PID``;
* :mod:`.hints`: what a signal or a known backend error means (tables);
* :mod:`.report`: the JSON report of every rank's exit (``--error-file``);
* :mod:`.preflight`: the pre-flight all-reduce (``--preflight``);
* :mod:`.output`: the ranks' output relay: whole lines, prefixes, console filter, rank logs;
* :mod:`.forkserver`: the fork server that has torch loaded;
* :mod:`.signals`: SIGINT/SIGTERM in every phase;
* :mod:`.errors`: exceptions and one-line messages;
* :mod:`.cli`: the flags, ``run`` and ``main``; :mod:`.torchrun_flags` (torchrun's other flags) and
  :mod:`.torchrun_settings` (what they become in a job), :mod:`.logs_layout` (torchrun's log files),
  :mod:`.executable` (``--no-python``), :mod:`.elastic_events` (``--event-log-handler``);
* :mod:`.target`: what each worker runs.

Importing this package does not import torch: the launcher starts its fork server first.
"""

from __future__ import annotations

from npu_migrate.launch.cli import add_arguments, build_parser, main, run
from npu_migrate.launch.config import (
    CONTROL_PORT_OFFSET,
    DEFAULT_NODE_TIMEOUT,
    DEFAULT_PORT,
    LaunchConfig,
    Target,
    make_config,
    world_table,
)
from npu_migrate.launch.errors import JobFailed, LaunchError, LaunchUsageError
from npu_migrate.launch.options import LaunchOptions
from npu_migrate.launch.signals import STOP_GRACE_S
from npu_migrate.launch.api import spawn


__all__ = [
    "CONTROL_PORT_OFFSET", "DEFAULT_NODE_TIMEOUT", "DEFAULT_PORT", "STOP_GRACE_S", "JobFailed", "LaunchConfig",
    "LaunchError", "LaunchOptions", "LaunchUsageError", "Target", "add_arguments", "build_parser", "main", "make_config", "run",
    "spawn", "world_table",
]
