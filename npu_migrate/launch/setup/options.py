"""The launcher's options as the user gives them: one object for the command line, ``spawn()`` and ``make_config``.

Usage::

    opts = LaunchOptions.from_args(parser.parse_args())          # python -m npu_migrate.launch
    opts = LaunchOptions.build(nproc=2, node_timeout=30.0)         # spawn(fn, nproc=2, node_timeout=30.0)
    cfg = make_config(opts)                                        # npu_migrate.launch.setup.config: checked, filled in

A :class:`LaunchOptions` holds what was asked for, ``None`` where the flag was left out: the
scheduler's environment, the rank table and the single-node defaults fill those in
(:func:`npu_migrate.launch.setup.config.make_config`). :meth:`LaunchOptions.check` refuses values that
cannot work whatever the environment says, in one line each (:class:`.errors.LaunchUsageError`).
Adding an option means one field here, its flag in :mod:`..cli` and its use in :mod:`.config`.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, fields, replace
from typing import Any

from npu_migrate.launch.errors import LaunchUsageError
from npu_migrate.launch.setup.binding import MODES
from npu_migrate.launch.torchrun.logs import TorchrunLogs
from npu_migrate.launch.setup.output_settings import OutputSettings, output_settings

DEFAULT_NODE_TIMEOUT = 20.0
"""Seconds without a heartbeat after which a node counts as lost (checked every tenth of it)."""

DEFAULT_JOIN_TIMEOUT = 600.0
"""Seconds to wait for the other nodes' launchers: long enough for a scheduler that starts the
nodes' containers one after another, short enough that a node that never comes is reported."""

DEFAULT_HANG_TIMEOUT = 480.0
"""Seconds without progress before a job of several ranks counts as hung (why 480:
:mod:`npu_migrate.launch.hangs.watchdog`)."""


def effective_timeout(timeout: float | None, world_size: int) -> float:
    """``--hang-timeout`` as given, else the default for this world size (0: off)."""
    if timeout is not None:
        return timeout
    return DEFAULT_HANG_TIMEOUT if world_size > 1 else 0.0


MIN_NODE_TIMEOUT = 3.0
"""The shortest --node-timeout: heartbeats go every tenth of it, and below a few seconds a busy
host's scheduling delay alone would count a healthy node as lost."""

HANG_ACTIONS = ("end", "report")
"""What --hang-action may say: end the job on a hang (exit 1), or only report it."""


@dataclass(frozen=True)
class LaunchOptions:
    """What the user asked the launcher for (flags or ``spawn()``'s keyword arguments); ``None``: not given.

    Attributes:
        nproc: processes on this node, one per device (None: the family's devices, 1 on CPU).
        nnodes: nodes in the job (None: 1, or from the scheduler); with ``min_nodes``, the most.
        min_nodes: ``--nnodes MIN:MAX``'s MIN (None: ``nnodes`` is fixed; :mod:`..torchrun.rdzv`).
        node_rank: index of this node (None: 0, or from the scheduler).
        addr: address of node 0 (None: 127.0.0.1, or from the scheduler).
        port: MASTER_PORT (None: a free port on one node, the default port on several).
        device: device family (None: ``NPU_MIGRATE_DEVICE``, else detected).
        log_dir: one ``rank{N}.log`` per rank there instead of the console.
        max_restarts: how often the whole job is started again after a failure.
        join_timeout: seconds to wait for the other nodes' launchers.
        job_id: the job's token (None: the scheduler's job id, TORCHELASTIC_RUN_ID, or a hash of
            the address, port and what the job runs).
        node_timeout: seconds without a heartbeat before a node counts as lost.
        hang_timeout: seconds without progress before a hang is reported (None: the default for
            the world size, :func:`effective_timeout`; 0: off).
        hang_action: ``"end"`` or ``"report"`` (:data:`HANG_ACTIONS`).
        error_file: where to write the JSON report of every rank's exit (``--error-file``).
        preflight: the pre-flight all-reduce (None: off; see :mod:`..procs.preflight` for why).
        output: the checked output flags (:func:`npu_migrate.launch.setup.output_settings.output_settings`;
            None: prefixes by default, no filter, no tee).
        rank_table_timeout: seconds to wait for ``RANK_TABLE_FILE`` to be completed (None:
            ``NPU_MIGRATE_RANK_TABLE_TIMEOUT``, else :data:`.ranktable.DEFAULT_TIMEOUT`).
        rdzv_backend: ``"c10d"`` or ``"static"`` (None: static; :mod:`..torchrun.rdzv`).
        rdzv_endpoint: ``HOST[:PORT]``, node 0's address (None: ``addr`` and ``port``).
        rdzv_conf: ``"key=value,..."``, torchrun's ``--rdzv-conf`` (:data:`.rdzv_flags.CONF_KEYS`).
        standalone, role, monitor_interval, signals_to_handle, shutdown_timeout, virtual_local_rank,
            local_addr, event_log_handler, numa_binding: torchrun's flags of those names
            (:mod:`..torchrun.flags`; ``nproc`` may also be one of its ``--nproc-per-node`` words).
    """

    nproc: int | str | None = None
    nnodes: int | None = None
    node_rank: int | None = None
    addr: str | None = None
    port: int | None = None
    device: str | None = None
    log_dir: str | None = None
    max_restarts: int = 0
    join_timeout: float = DEFAULT_JOIN_TIMEOUT
    job_id: str | None = None
    node_timeout: float = DEFAULT_NODE_TIMEOUT
    hang_timeout: float | None = None
    hang_action: str = "end"
    error_file: str | None = None
    preflight: bool | None = None
    output: OutputSettings | None = None
    rank_table_timeout: float | None = None
    min_nodes: int | None = None
    rdzv_backend: str | None = None
    rdzv_endpoint: str | None = None
    rdzv_conf: str | None = None
    standalone: bool = False
    role: str = "default"
    monitor_interval: float | None = None
    signals_to_handle: tuple[int, ...] | None = None
    shutdown_timeout: float | None = None
    virtual_local_rank: bool = False
    local_addr: str | None = None
    event_log_handler: str | None = None
    numa_binding: str | None = None
    cpu_binding: str | None = None

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """Every option's name: ``spawn()``'s and ``make_config``'s keyword arguments."""
        return tuple(f.name for f in fields(cls))

    @classmethod
    def build(cls, base: LaunchOptions | int | None = None, /, **given: Any) -> LaunchOptions:
        """Options from keyword arguments, over ``base`` (an int is the process count, as ``make_config(2)``).

        Raises:
            TypeError: a keyword that is no option, naming the ones there are.
        """
        unknown = sorted(set(given) - set(cls.names()))
        if unknown:
            raise TypeError(f"unknown launch option(s) {', '.join(map(repr, unknown))}: expected some of "
                            f"{', '.join(cls.names())} (npu_migrate.launch.setup.options.LaunchOptions).")
        if base is None:
            return cls(**given)
        if isinstance(base, LaunchOptions):
            return replace(base, **given)
        if isinstance(base, int) and not isinstance(base, bool) and "nproc" not in given:
            return cls(nproc=base, **given)
        raise TypeError(f"launch options {base!r}: expected LaunchOptions, a process count, or keywords.")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> LaunchOptions:
        """The options of ``python -m npu_migrate.launch`` / ``npu-migrate launch`` (:func:`.cli.add_arguments`).

        Raises:
            LaunchUsageError: output flags that cannot go together.
        """
        # Internal: --inherit-output keeps the workers on the launcher's descriptors (the benchmark's
        # baseline for the relay's cost); it takes none of the relay's flags.
        inherit = getattr(args, "inherit_output", False)
        relayed = any((args.log_dir, args.tee, args.log_append, args.prefix_template is not None, args.ranks_filter))
        if inherit and relayed:
            raise LaunchUsageError("--inherit-output takes no --log-dir, --tee, --log-append, prefix or filter.")
        tee = getattr(args, "tee", None)
        logs = TorchrunLogs(redirects=getattr(args, "redirects", None) or "0",
                            tee=tee if isinstance(tee, str) else "0",
                            stdout_filters=tuple(getattr(args, "stdout_filters", None) or ()),
                            stderr_filters=tuple(getattr(args, "stderr_filters", None) or ()),
                            specs=getattr(args, "logs_specs", None))
        output = output_settings(args.prefix_template, args.ranks_filter, tee is True, args.log_dir, args.log_append,
                                 relay=not inherit, logs=logs)
        names = set(cls.names()) - {"output"}
        return cls(output=output, **{k: v for k, v in vars(args).items() if k in names})

    def check(self) -> None:
        """Refuse values that cannot work whatever the environment says; one line each.

        Raises:
            LaunchUsageError: naming the flag, its value and what was expected.
        """
        job_id = self.job_id
        if job_id is not None and (not job_id or any(c.isspace() or c == "/" for c in job_id)):
            raise LaunchUsageError(f"--job-id {job_id!r} is not usable: expected a non-empty name without spaces or '/'.")
        if self.node_timeout < MIN_NODE_TIMEOUT:
            raise LaunchUsageError(f"--node-timeout {self.node_timeout:g} is too short: expected "
                                   f"{MIN_NODE_TIMEOUT:g} seconds or more.")
        if self.hang_timeout is not None and self.hang_timeout < 0:
            raise LaunchUsageError(f"--hang-timeout {self.hang_timeout:g} is negative: expected seconds, or 0 to "
                                   "turn hang detection off.")
        if self.hang_action not in HANG_ACTIONS:
            raise LaunchUsageError(f"--hang-action {self.hang_action!r} is not one of: {', '.join(HANG_ACTIONS)}.")
        if self.error_file is not None and os.path.isdir(self.error_file):
            raise LaunchUsageError(f"--error-file {self.error_file!r} is a directory: expected a file name, e.g. "
                                   f"{os.path.join(self.error_file, 'error.json')}.")
        if self.join_timeout <= 0:
            raise LaunchUsageError(f"--join-timeout {self.join_timeout:g} is not positive: expected seconds to wait "
                                   "for the other nodes.")
        if self.monitor_interval is not None and self.monitor_interval < 0:
            raise LaunchUsageError(f"--monitor-interval {self.monitor_interval:g} is negative: expected seconds.")
        if self.cpu_binding is not None and self.cpu_binding not in MODES:
            raise LaunchUsageError(f"--cpu-binding {self.cpu_binding!r} is not one of: {', '.join(MODES)}.")
        if self.shutdown_timeout is not None and self.shutdown_timeout < 0:
            raise LaunchUsageError(f"--shutdown-timeout {self.shutdown_timeout:g} is negative: expected seconds "
                                   "before SIGKILL.")
