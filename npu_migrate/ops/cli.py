"""``npu-migrate ops``: audit which operators of a CUDA script's training step the NPU runs, before booking one.

Usage::

    npu-migrate ops train.py --epochs 1                       # 2 optimizer steps on this CPU, markdown report
    npu-migrate ops --torch-npu 2.1.0.post17 --json ops.json --markdown ops.md train.py
    npu-migrate ops --op-list my_ops.txt --steps 5 train.py
    npu-migrate ops --seconds 30 infer.py                     # no optimizer: to its end, or 30 s

The script runs unmodified under runtime migration (its CUDA branch is taken) on the CPU, as a
world of one rank: torchrun's variables get one-rank defaults and ``torch.multiprocessing.spawn``
runs rank 0 in this process. After ``--steps`` optimizer steps it is ended (the exception
:class:`npu_migrate.ops.record.AuditDone`) and the report is printed.

Exit status: 0 when every operator runs on the NPU, 1 when some fall back or fail (or the script
failed before its steps), 2 for a usage error (a missing script, an unreachable release).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
from typing import Any, Callable, Iterator

from npu_migrate.argparsing import OneLineParser
from npu_migrate.errors import InputError, UsageError

_ONE_RANK = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "0",
             "MASTER_ADDR": "127.0.0.1"}


def build_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """Add ``ops`` to ``subparsers`` (or make a stand-alone parser)."""
    description = ("Run a CUDA training script for a few optimizer steps on this CPU and report, for one torch-npu "
                   "release, which of its operators run on the NPU, decompose, or fall back to the host.")
    if subparsers is None:
        parser = OneLineParser(prog="npu-migrate ops", description=description)
    else:
        parser = subparsers.add_parser("ops", help="Audit a script's operators against a torch-npu release.",
                                       description=description)
    add_arguments(parser)
    parser.set_defaults(func=run)
    return parser


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The audit's options and arguments, shared by ``ops`` and ``advise`` (one run answers both)."""
    parser.add_argument("--torch-npu", "--torch_npu", dest="torch_npu", default=None, metavar="VERSION",
                        help="The torch-npu release to judge against (default: the installed torch_npu, else the "
                             "release made for this torch; a wheel is downloaded once into the cache).")
    parser.add_argument("--op-list", "--op_list", dest="op_list", default=None, metavar="FILE",
                        help="Judge against this operator list instead: a torch-npu codegen YAML or one "
                             "aten::name.overload a line.")
    parser.add_argument("--steps", type=int, default=2,
                        help="Optimizer steps to record before the script is ended (default: %(default)s).")
    parser.add_argument("--seconds", type=float, default=None,
                        help="End the script after this many seconds (for scripts without an optimizer; "
                             "default: no limit).")
    parser.add_argument("--meta", action="store_true",
                        help="Make the device's tensors on torch's meta device (shapes only, no memory), so a model "
                             "too big for this machine can be audited; values read back on the host are zeros.")
    parser.add_argument("--json", dest="json_path", default=None, metavar="FILE",
                        help="Also write every recorded operator as JSON to FILE.")
    parser.add_argument("--markdown", dest="markdown_path", default=None, metavar="FILE",
                        help="Also write the report as markdown to FILE.")
    parser.add_argument("-m", "--module", action="store_true", help="Run SCRIPT as a module, like python -m.")
    from npu_migrate.migrate import usercode  # torch-free

    usercode.add_argument(parser)
    parser.add_argument("script", metavar="SCRIPT", help="The CUDA training script, unmodified.")
    parser.add_argument("script_args", metavar="ARGS", nargs=argparse.REMAINDER, help="Its arguments, untouched.")


@contextlib.contextmanager
def one_rank() -> Iterator[None]:
    """torchrun's variables with one-rank defaults, and ``mp.spawn`` running rank 0 in this process."""
    import torch.multiprocessing as mp

    from npu_migrate.launch.setup import hccl, ports  # torch-free

    saved = {k: os.environ.get(k) for k in (*_ONE_RANK, "MASTER_PORT")}
    picked = None
    if not os.environ.get("MASTER_PORT"):  # held until the audit ends, as the launcher holds its own
        try:
            avoid = hccl.host_ports(dict(os.environ))
        except ValueError as exc:
            raise UsageError(f"{exc} Fix or unset it.") from exc  # the launcher's words for it
        picked = ports.pick_free_port(avoid)
        os.environ["MASTER_PORT"] = str(picked)
    for key, value in _ONE_RANK.items():
        os.environ.setdefault(key, value)

    def spawn(fn: Any, args: tuple = (), nprocs: int = 1, join: bool = True, daemon: bool = False,
              start_method: str = "spawn", **kwargs: Any) -> None:
        fn(0, *args)  # a world of one rank: rank 0, here, where the recorder is

    originals = {name: getattr(mp, name) for name in ("spawn", "start_processes")}
    for name in originals:
        setattr(mp, name, spawn)
    try:
        yield
    finally:
        for name, value in originals.items():
            setattr(mp, name, value)
        if picked is not None:
            ports.release(picked)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


REFIRE_S = 0.05
"""Once ``--seconds`` has expired, how often it fires again until the script has stopped."""


def _on_stack(frame: Any, matches: Callable[[Any], bool]) -> bool:
    """Whether the code of a frame on ``frame``'s stack ``matches``."""
    while frame is not None:
        if matches(frame.f_code):
            return True
        frame = frame.f_back
    return False


def _importing(frame: Any) -> bool:
    """Whether ``frame`` runs inside an import: a frame of importlib's bootstrap is on the stack."""
    return _on_stack(frame, lambda code: code.co_filename.startswith("<frozen importlib."))


@contextlib.contextmanager
def time_limit(seconds: float | None, within: Any = None) -> Iterator[None]:
    """Raise AuditDone into the script after ``seconds`` (main thread only, like SIGALRM).

    Python runs a signal handler wherever the main thread is, and an exception raised inside a
    weakref callback, a ``__del__`` or a garbage-collector callback is printed and dropped (torch
    frees tensors through such callbacks all the time: an audit of a ``while True`` loop once ran
    on for good). So once expired, the limit fires again every :data:`REFIRE_S` until the script
    has stopped, and such a dropped AuditDone is not printed. A firing does nothing inside an
    import (a module stopped half-way keeps what it registered, torch's operators, and fails the
    next import of it) or, with ``within`` (a function), where no call of ``within`` is on the stack:
    the script has already stopped and its runner is handling that. The caller's SIGALRM handler
    comes back afterwards, and a timer it had armed runs on with the time it had left (held while
    the audit runs: one process has one real-time timer).
    """
    from npu_migrate.ops.record import AuditDone

    if not seconds:
        yield
        return
    code = getattr(within, "__code__", None)

    def expired(signum: int, frame: Any) -> None:
        signal.setitimer(signal.ITIMER_REAL, REFIRE_S, REFIRE_S)  # again, until the limit is left
        if _importing(frame) or (code is not None and not _on_stack(frame, lambda running: running is code)):
            return  # the next firing decides
        raise AuditDone(f"--seconds {seconds:g} reached")

    def unraisable(args: Any) -> None:
        if isinstance(args.exc_value, AuditDone):
            return  # a dropped firing: it fires again, so nothing to tell the user
        previous_hook(args)

    previous = signal.signal(signal.SIGALRM, expired)
    previous_hook, sys.unraisablehook = sys.unraisablehook, unraisable
    started = time.monotonic()
    outer_delay, outer_interval = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        sys.unraisablehook = previous_hook
        if outer_delay or outer_interval:
            # A timer the caller had armed (pytest-timeout's, a harness's) runs on where it was; one
            # due while the audit ran fires now, with its handler back.
            left = outer_delay - (time.monotonic() - started)
            signal.setitimer(signal.ITIMER_REAL, left if left > 0 else 1e-6, outer_interval)


def _operators(args: argparse.Namespace) -> Any:
    from npu_migrate.releases import ReleaseNotFound, operators

    try:
        return operators.resolve(args.torch_npu, args.op_list)
    except ReleaseNotFound as exc:
        raise UsageError(str(exc)) from exc
    except FileNotFoundError as exc:
        raise UsageError(f"torch-npu {args.torch_npu or ''} has no {operators.OPERATORS_YAML}: expected a "
                         "torch-npu wheel; pass --op-list FILE instead.") from exc


def audit(args: argparse.Namespace, attach: Callable[[Any], Any] | None = None) -> tuple[dict[str, Any], str | None]:
    """Run the script under the recorder; return the report and the script's failure (or None).

    ``attach(recorder)``, if given, returns a context manager entered inside the recorder for the run
    (``npu-migrate advise`` watches the same run).
    """
    from npu_migrate import migrate
    from npu_migrate.migrate import usercode
    from npu_migrate.migrate.cli import run_script

    operators = _operators(args)  # before the script runs: an unreachable release fails in one line
    usercode.export(args.user_code, usercode.script_of(args.script, args.module))
    from npu_migrate.ops import report
    from npu_migrate.ops.cuda_only import Watch
    from npu_migrate.ops.record import AuditDone, Recorder
    from npu_migrate.ops.verdict import Judge

    failure = None
    ended = "the script ended"
    argv, path = list(sys.argv), list(sys.path)
    with one_rank():
        migrate.install(device="cpu", device_count=1, propagate=True)
        try:
            recorder = Recorder(Judge(operators), steps=args.steps, fake=args.meta)
            with Watch() as watch, recorder, attach(recorder) if attach else contextlib.nullcontext(), \
                    time_limit(args.seconds, within=run_script):
                try:
                    run_script(args.script, args.script_args, module=args.module)
                except AuditDone as exc:
                    ended = str(exc)
                except SystemExit as exc:
                    if exc.code not in (None, 0):
                        ended = failure = f"the script exited with {exc.code}"
                except Exception as exc:  # the script's own failure: reported, not raised
                    if isinstance(exc, ImportError):
                        watch.failed(exc)
                    first = str(exc).splitlines()[0] if str(exc) else ""
                    failure = f"the script failed: {type(exc).__name__}: {first}"
                    ended = failure
        finally:
            sys.argv[:], sys.path[:] = argv, path
            _destroy_group()
            migrate.uninstall()
    return report.build(recorder, watch, operators, args.script, ended), failure


def _destroy_group() -> None:
    """A script ended mid-step leaves its process group: destroy it, as the script would have."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def check_args(args: argparse.Namespace) -> None:
    """Usage errors of the audit's options, before anything runs (one line each)."""
    if args.steps < 1:
        raise UsageError(f"--steps {args.steps} is not positive: expected 1 or more optimizer steps.")
    if args.seconds is not None and args.seconds <= 0:
        raise UsageError(f"--seconds {args.seconds:g} is not positive: expected a time limit above 0, or leave it out.")
    if not args.module and not os.path.isfile(args.script):
        raise InputError(f"script {args.script!r} not found (working directory {os.getcwd()}).")
    for flag, path in (("--json", args.json_path), ("--markdown", args.markdown_path)):
        check_output(flag, path)


def check_output(flag: str, path: str | None) -> None:
    """A file to write the report to: its folder exists and it is not a folder itself (one line each)."""
    if not path:
        return
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UsageError(f"{flag} {path!r}: folder {folder} does not exist; create it or write elsewhere.")
    if os.path.isdir(path):
        raise UsageError(f"{flag} {path!r} is a folder: name a file in it, such as {os.path.join(path, 'report')!r}.")


def write_reports(report: Any, data: Any, json_path: str | None, markdown_path: str | None) -> None:
    """Write ``data`` with ``report``'s writers to the files asked for (``--json``, ``--markdown``)."""
    if json_path:
        report.write_json(data, json_path)
    if markdown_path:
        report.write_markdown(data, markdown_path)


def run(args: argparse.Namespace) -> int:
    """``npu-migrate ops``: audit, print the markdown report, write the files; return the exit status."""
    from npu_migrate.ops import report
    from npu_migrate.textsafe import printable

    check_args(args)
    data, failure = audit(args)
    sys.stdout.flush()
    print(report.to_markdown(data))
    write_reports(report, data, args.json_path, args.markdown_path)
    if failure:
        print(f"npu-migrate ops: {printable(failure)}; the report covers what ran before it.", file=sys.stderr)
        return 1
    return report.exit_status(data)
