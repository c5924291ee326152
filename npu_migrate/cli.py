"""The ``npu-migrate`` command and ``python -m npu_migrate``: the table of sub-commands, loaded lazily.

Usage::

    npu-migrate env [--json]
    npu-migrate smoke [--nproc N]
    npu-migrate launch --device-num 8 train.py
    npu-migrate run train.py
    npu-migrate port SRC --out DIR
    npu-migrate check SRC
    npu-migrate compare A B [--exact | --rtol R --atol A] [--plot FILE.png] [--json FILE]
    npu-migrate stacks PID

Each sub-command lives in its own module with ``build_parser(subparsers)`` and ``run(args)``. Only
the module of the command being run is imported, so ``--help``, ``--version``, ``port`` and
``check`` never import torch, and ``launch`` starts its fork server before torch is imported.

Exit codes, the same for every sub-command (:class:`npu_migrate.errors.ExitCode`, mapped in one
place, :func:`npu_migrate.argparsing.run_command`): 0 success, 1 failure, 2 usage error or an input
file that is missing, unreadable or malformed (argparse's, and every
:class:`npu_migrate.errors.UsageError`), 130 Ctrl-C (a launched job also 143 for SIGTERM), 141
when the reader of the output went away (``| head``). Errors meant for the user are one line
without a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from dataclasses import dataclass

from npu_migrate import __version__, autoload
from npu_migrate.argparsing import OneLineParser, run_command


@dataclass(frozen=True)
class Command:
    """One sub-command: its name, the module that builds and runs it, and its one-line help.

    Attributes:
        name: what the user types.
        module: imported only when this command runs (or to show its own ``--help``).
        help: shown by ``npu-migrate --help`` without importing ``module``.
        needs_torch: the command imports torch; torch's device-extension autoload is checked
            (and turned off for ``--device cpu``/``cuda``) before it does.
        prog: the prefix of its error lines (``PROG: error: ...``); the command's own name
            where its other lines carry it too (``npu-migrate launch: ...``).
    """

    name: str
    module: str
    help: str
    needs_torch: bool = True
    prog: str = "npu-migrate"


COMMANDS: tuple[Command, ...] = (
    Command("env", "npu_migrate.env", "Show the device family, backend, versions and settings this machine offers."),
    Command("smoke", "npu_migrate.smoke", "Run a tiny DDP job on this node to check devices, backend and collectives."),
    Command("launch", "npu_migrate.launch", "Run a training script on every device of this node (torchrun's job).",
            prog="npu-migrate launch"),
    Command("run", "npu_migrate.migrate.cli", "Run an unmodified CUDA script with its CUDA calls sent to this machine's devices."),
    Command("port", "npu_migrate.port.cli", "Rewrite CUDA-only (or NPU-only) source into device-neutral source.", False,
            prog="npu-migrate port"),
    Command("check", "npu_migrate.port.cli", "List what needs porting as path:line:col NMxxx message; exit 1 if anything does.",
            False, prog="npu-migrate check"),
    Command("ops", "npu_migrate.ops.cli", "Audit which operators of a CUDA script the NPU runs or sends to the host.",
            prog="npu-migrate ops"),
    Command("advise", "npu_migrate.advise.cli", "Say what to change in a CUDA script, and around it, for speed on the NPU.",
            prog="npu-migrate advise"),
    Command("compare", "npu_migrate.compare.cli", "Compare two runs' losses and per-module statistics; name the first culprit.",
            False, prog="npu-migrate compare"),
    Command("stacks", "npu_migrate.launch.hangs.stacks", "Print every rank's Python stack of a running launcher (PID).", False,
            prog="npu-migrate stacks"),
)
_BY_NAME = {c.name: c for c in COMMANDS}


def _command_in(argv: list[str]) -> Command | None:
    """The sub-command named in ``argv``: the first word that is not a root option."""
    for word in argv:
        if word == "--":
            return None
        if not word.startswith("-"):
            return _BY_NAME.get(word)
    return None


def _device_in(argv: list[str]) -> str | None:
    """The ``--device`` value in ``argv`` (before the script's own arguments), read ahead of argparse."""
    for i, word in enumerate(argv):
        if word == "--":
            break
        if word == "--device" and i + 1 < len(argv):
            return argv[i + 1]
        if word.startswith("--device="):
            return word.partition("=")[2]
        if word.endswith(".py"):  # the script: what follows is its own
            break
    return None


def build_parser(command: Command | None = None) -> argparse.ArgumentParser:
    """Return the root parser; only ``command``'s module is imported to add its arguments.

    Args:
        command: the sub-command that will run. The others get a placeholder with their help
            line, enough for ``npu-migrate --help`` and for argparse's "invalid choice" error.
    """
    parser = OneLineParser(
        prog="npu-migrate",
        description="Move PyTorch distributed training between NVIDIA GPUs, Ascend NPUs and CPUs.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="Log npu_migrate's debug messages.")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    loaded: set[str] = set()
    for cmd in COMMANDS:
        if command is not None and cmd.module == command.module:
            if cmd.module not in loaded:  # one module may add several commands (port, check)
                importlib.import_module(cmd.module).build_parser(subparsers)
                loaded.add(cmd.module)
        else:
            subparsers.add_parser(cmd.name, help=cmd.help, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the CLI and return its exit code (:func:`npu_migrate.argparsing.run_command` maps errors)."""
    command_line = argv is None  # this process's own command line: a command may run it again
    argv = list(sys.argv[1:] if argv is None else argv)
    command = _command_in(argv)
    return run_command(command.prog if command else "npu-migrate", lambda: _run(argv, command_line),
                       explain=autoload.explain)


def _run(argv: list[str], command_line: bool = False) -> int:
    from npu_migrate.log import setup_logging

    command = _command_in(argv)
    if command is not None and command.needs_torch:
        # Before the command's module is imported: some import torch (npu_migrate.migrate).
        autoload.disable_unless_needed(_device_in(argv))
        autoload.check_versions()
    parser = build_parser(command)
    if command is not None and command.name == "launch":  # torchrun's `--tee VALUE` beside the `--tee` switch
        from npu_migrate.launch.torchrun.flags import parse_args

        args = parse_args(parser, argv)  # a usage error: argparse's line and SystemExit(2)
    else:
        args = parser.parse_args(argv)
    args.command_line = command_line
    setup_logging(logging.DEBUG if args.verbose else logging.WARNING, names=("npu_migrate",))
    return int(args.func(args) or 0)
