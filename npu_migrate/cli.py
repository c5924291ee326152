"""The ``npu-migrate`` command and ``python -m npu_migrate``.

Usage::

    npu-migrate env [--json]
    npu-migrate smoke [--nproc N]
    npu-migrate compare A B [--exact | --rtol R --atol A] [--plot FILE.png] [--json FILE]

Each sub-command lives in its own module with ``build_parser(subparsers)`` and ``run(args)``.
Errors meant for the user (:class:`npu_migrate.errors.NpuMigrateError`) are printed as one line
without a traceback; argparse usage errors exit 2.
"""

from __future__ import annotations

import argparse
import logging
import sys

from npu_migrate import __version__, env, launch, smoke
from npu_migrate.compare import cli as compare_cli
from npu_migrate.migrate import cli as run_cli
from npu_migrate.port import cli as port_cli
from npu_migrate.errors import NpuMigrateError, UnknownDeviceError
from npu_migrate.log import setup_logging

_COMMANDS = (env, launch, run_cli, smoke, port_cli, compare_cli)


def build_parser() -> argparse.ArgumentParser:
    """Return the root parser with every sub-command."""
    parser = argparse.ArgumentParser(
        prog="npu-migrate",
        description="Move PyTorch distributed training between NVIDIA GPUs, Ascend NPUs and CPUs.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="Log debug messages.")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in _COMMANDS:
        module.build_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the CLI and return its exit code."""
    args = build_parser().parse_args(argv)
    setup_logging(logging.DEBUG if args.verbose else logging.WARNING)
    try:
        return int(args.func(args) or 0)
    except NpuMigrateError as exc:
        print(f"npu-migrate: error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, UnknownDeviceError) else 1
    except KeyboardInterrupt:
        print("npu-migrate: interrupted", file=sys.stderr)
        return 130
