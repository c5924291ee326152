"""The output flags, checked where they enter: prefix template, local-ranks filter, tee, log files.

Usage::

    settings = output_settings(template="[${rank}]: ", ranks_filter="0,1", tee=True, log_dir="logs")
    settings.check(nproc=2, log_dir="logs", node_rank=0)   # filter in range; no earlier run's logs in the way
    log_path("logs", rank=3, attempt=1)                      # logs/rank3.attempt1.log

Each bad value becomes one :class:`~npu_migrate.launch.errors.LaunchUsageError` line. The relay
that applies the settings is :mod:`npu_migrate.launch.procs.output` (its docstring describes prefix,
filter and log files as the user sees them).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from string import Template

from npu_migrate.launch.errors import LaunchUsageError
from npu_migrate.launch.torchrun.logs import TorchrunLogs

DEFAULT_TEMPLATE = "[${host} node${node_rank} rank${rank}] "
"""The console prefix with world size > 1 when no --log-line-prefix-template is given."""

TEMPLATE_VARS = ("role_name", "rank", "local_rank", "node_rank", "host", "hostname")
"""The ``${name}`` variables a prefix template may use (``hostname`` is torchrun's name for ``host``)."""


@dataclass(frozen=True)
class OutputSettings:
    """How the workers' output reaches the console and the log files (checked input).

    Attributes:
        template: the prefix template; None: :data:`DEFAULT_TEMPLATE` with world size > 1, none
            with 1; "": no prefix.
        ranks_filter: local ranks shown on the console; None: all.
        tee: with a log dir, also show the ranks' output on the console (the launcher's ``--tee``
            switch; torchrun's ``--tee VALUE`` is in ``logs``).
        append: add to an earlier run's log files instead of refusing to start.
        relay: False keeps the workers on the launcher's own descriptors (the pre-relay
            behaviour; only for the benchmark's baseline: no prefix, filter or log files).
        logs: torchrun's ``--redirects``, ``--tee VALUE``, duplicate filters and ``--logs-specs``
            (:mod:`..torchrun.logs`); when active they replace the ``rank{N}.log`` layout.
    """

    template: str | None = None
    ranks_filter: frozenset[int] | None = None
    tee: bool = False
    append: bool = False
    relay: bool = True
    logs: TorchrunLogs = TorchrunLogs()

    def prefix_template(self, world_size: int) -> str:
        if self.template is not None:
            return self.template
        return DEFAULT_TEMPLATE if world_size > 1 else ""

    def check(self, nproc: int, log_dir: str | None, node_rank: int) -> None:
        """The checks that need the node's process count: filter range, this node's earlier logs.

        Raises:
            LaunchUsageError: as one line.
        """
        if log_dir and not self.relay:
            raise LaunchUsageError("log files need the output relay: drop --inherit-output or --log-dir.")
        if self.ranks_filter is not None:
            outside = sorted(r for r in self.ranks_filter if r >= nproc)
            if outside:
                raise LaunchUsageError(
                    f"--local-ranks-filter names local rank {outside[0]}, but this node runs local ranks "
                    f"0-{nproc - 1}: the filter takes each node's local ranks, not global ranks.")
        if log_dir and not self.append and not self.logs.active and os.path.isdir(log_dir):
            names = set(os.listdir(log_dir))
            for rank in range(node_rank * nproc, (node_rank + 1) * nproc):
                pattern = re.compile(rf"rank{rank}(\.attempt\d+)?\.log")
                found = sorted((n for n in names if pattern.fullmatch(n)), key=lambda n: (len(n), n))
                if found:
                    raise LaunchUsageError(
                        f"--log-dir {log_dir} already holds {found[0]} from an earlier run: pass a new "
                        "--log-dir, remove the old logs, or add --log-append to append to them.")


def _parse_filter(value: str) -> frozenset[int]:
    items = [v.strip() for v in value.split(",")]
    bad = [v for v in items if not v.isdigit()]
    if bad or not items:
        raise LaunchUsageError(
            f"--local-ranks-filter {value!r} is not a list of local ranks ({bad[0]!r} is not one): "
            "expected numbers separated by commas, e.g. 0,1.")
    return frozenset(int(v) for v in items)


def _check_template(template: str) -> None:
    for match in Template.pattern.finditer(template):
        if match.group("invalid") is not None:
            raise LaunchUsageError(
                f"--log-line-prefix-template {template!r} has a '$' at position {match.start()} "
                "that starts no variable: write $$ for a dollar sign, or ${name}.")
        name = match.group("named") or match.group("braced")
        if name is not None and name not in TEMPLATE_VARS:
            raise LaunchUsageError(
                f"--log-line-prefix-template {template!r} uses unknown ${{{name}}}: expected "
                f"{', '.join('${' + v + '}' for v in TEMPLATE_VARS)}.")


def _check_log_dir(log_dir: str) -> None:
    """The directory, or its nearest existing parent, is a directory this user can write to."""
    path = os.path.abspath(log_dir)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    if not os.path.isdir(path):
        raise LaunchUsageError(f"--log-dir {log_dir}: {path} is not a directory: pass a directory path.")
    if not os.access(path, os.W_OK | os.X_OK):
        raise LaunchUsageError(f"--log-dir {log_dir}: {path} is not writable: pass a directory you can write to.")


def output_settings(
    template: str | None = None,
    ranks_filter: str | None = None,
    tee: bool = False,
    log_dir: str | None = None,
    append: bool = False,
    relay: bool = True,
    logs: TorchrunLogs | None = None,
) -> OutputSettings:
    """Check the output flags where they enter and return the settings.

    Args:
        tee: the launcher's ``--tee`` switch (with ``--log-dir``); torchrun's ``--tee VALUE`` is
            ``logs.tee``.
        logs: torchrun's log flags (:class:`.logs_layout.TorchrunLogs`).

    Raises:
        LaunchUsageError: a bad filter, an unknown ``${var}``, an unusable log dir, ``--tee``
            or ``--log-append`` without ``--log-dir``, the ``--tee`` switch or ``--log-append``
            with torchrun's layout, an unknown ``--logs-specs``.
    """
    logs = logs or TorchrunLogs()
    if template is not None:
        _check_template(template)
    parsed = _parse_filter(ranks_filter) if ranks_filter is not None else None
    if logs.active:
        logs.check()
        if tee:
            raise LaunchUsageError(
                "--tee without a value (the launcher's switch for --log-dir's rank{N}.log files) does not go with "
                "torchrun's --redirects, --tee VALUE, --duplicate-*-filters or --logs-specs: give --tee torchrun's "
                "value, e.g. --tee 3 (both streams of every rank, to their files and the console).")
        if append:
            raise LaunchUsageError(
                "--log-append is for --log-dir's rank{N}.log files: torchrun's layout (--redirects, --tee VALUE) "
                "writes a new directory for every run, so there is nothing to append to.")
    if tee and not log_dir:
        raise LaunchUsageError("--tee needs --log-dir: without it every rank's output is on the console already "
                               "(torchrun's --tee VALUE, e.g. --tee 3, writes files under a temporary directory).")
    if append and not log_dir:
        raise LaunchUsageError("--log-append needs --log-dir: it appends to the rank logs there.")
    if log_dir:
        _check_log_dir(log_dir)
    return OutputSettings(template=template, ranks_filter=parsed, tee=tee, append=append, relay=relay, logs=logs)


def log_path(log_dir: str, rank: int, attempt: int) -> str:
    """``rank{N}.log`` for the first attempt, ``rank{N}.attempt{K}.log`` for restart K."""
    return os.path.join(log_dir, f"rank{rank}.log" if attempt == 0 else f"rank{rank}.attempt{attempt}.log")
