"""``npu-migrate run``: run a CUDA script once, in this process, with runtime migration on.

Usage::

    npu-migrate run train.py --world-size 1 --rank 0          # a script that spawns its own workers
    npu-migrate run --device cpu --device-num 2 train.py      # on CPU the script sees 2 cuda devices
    npu-migrate run --migrate-report report.md train.py

For scripts that start their own workers with ``torch.multiprocessing.spawn`` (the
classic ImageNet example): every process they start migrates too. Scripts written for torchrun
go through ``python -m npu_migrate.launch --migrate`` instead: ``run`` runs one process, as
``python train.py`` would, and a script that reads ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE`` or
``LOCAL_WORLD_SIZE`` where none is set (``os.environ["RANK"]``, or ``init_process_group``'s
``env://`` rendezvous) ends in one line that gives the ``launch --migrate`` command to use
(:func:`launcher_variable`, :func:`launch_command`; exit 1).
"""

from __future__ import annotations

import argparse
import os
import re
import runpy
import shlex
import shutil
import sys
import tempfile
from typing import Any

from npu_migrate.argparsing import OneLineParser
from npu_migrate.errors import DistributedConfigError, InputError, UsageError
from npu_migrate.registry import FAMILY_CHOICES


def build_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """Add ``run`` to ``subparsers`` (or make a stand-alone parser)."""
    description = "Run a CUDA script once, in this process, with its CUDA calls sent to the chosen device."
    if subparsers is None:
        parser = OneLineParser(prog="npu-migrate run", description=description)
    else:
        parser = subparsers.add_parser("run", help="Run a CUDA script with runtime migration.", description=description)
    parser.add_argument("--device", default=None, choices=FAMILY_CHOICES,
                        help="Target family (default: NPU_MIGRATE_DEVICE, else detected; auto detects).")
    parser.add_argument("--device-num", "--device_num", dest="device_num", type=int, default=None,
                        help="On cpu, how many cuda devices the script sees (default: 1).")
    parser.add_argument("--migrate-report", dest="migrate_report", default=None,
                        help="Write what was redirected, in every process of the job, to FILE (.json or markdown).")
    parser.add_argument("-m", "--module", action="store_true", help="Run SCRIPT as a module, like python -m.")
    from npu_migrate.migrate import usercode  # torch-free

    usercode.add_argument(parser)
    from npu_migrate.compare.recording import settings as probe_settings  # --probe DIR and its filters

    probe_settings.add_probe_arguments(parser)
    from npu_migrate.profile import settings as profile_settings  # --profile DIR, its steps and ranks

    profile_settings.add_arguments(parser)
    parser.add_argument("script", metavar="SCRIPT", help="The CUDA training script.")
    parser.add_argument("script_args", metavar="ARGS", nargs=argparse.REMAINDER, help="Its arguments, untouched.")
    parser.set_defaults(func=run)
    return parser


def run_script(script: str, script_args: list[str], module: bool = False) -> None:
    """Run the user's script (or ``-m`` module) in this process as ``python`` would, as ``__main__``."""
    sys.argv = [script, *script_args]
    if module:
        sys.path.insert(0, os.getcwd())
        runpy.run_module(script, run_name="__main__", alter_sys=True)
    else:
        sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
        runpy.run_path(script, run_name="__main__")


LAUNCHER_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")
"""What torchrun (and ``launch``) set for each rank: a script that needs them is started as ranks."""

# torch's env:// rendezvous (init_process_group with no init_method), the same words since torch 1.x.
_ENV_RENDEZVOUS = re.compile(r"env:// rendezvous: environment variable (\w+) expected, but not set")

# A read with no default, ``os.environ.get("LOCAL_RANK")`` or ``os.getenv("WORLD_SIZE")``: None when unset,
# which the line then hands to int() (TypeError: ... not 'NoneType').
_READ_WITHOUT_DEFAULT = re.compile(r"""(?:\benviron\.get|\bgetenv)\(\s*(['"])(\w+)\1\s*\)""")


def _unset_read_on_raising_line(exc: TypeError) -> object:
    """The variable read with no default on the line that raised ``exc``, where ``exc`` is about a None."""
    import linecache

    tb = exc.__traceback__
    if tb is None or "NoneType" not in str(exc):
        return None
    while tb.tb_next is not None:
        tb = tb.tb_next
    line = linecache.getline(tb.tb_frame.f_code.co_filename, tb.tb_lineno)
    names = [found.group(2) for found in _READ_WITHOUT_DEFAULT.finditer(line)]
    return names[0] if len(names) == 1 else None


def launcher_variable(exc: BaseException) -> str | None:
    """The launcher's variable whose absence raised ``exc``, or None where ``exc`` is about something else.

    ``os.environ["RANK"]`` with no ``RANK`` set raises ``KeyError('RANK')``, and
    ``init_process_group`` (``env://``) raises torch's ``ValueError`` naming the variable, and
    ``int(os.environ.get("LOCAL_RANK"))`` (or ``os.getenv``, no default) a ``TypeError`` about a
    None on a line that reads that one variable; each means a torchrun-style script run without a
    launcher.
    """
    name: object = None
    if isinstance(exc, KeyError) and len(exc.args) == 1:
        name = exc.args[0]
    elif isinstance(exc, TypeError):
        name = _unset_read_on_raising_line(exc)
    elif isinstance(exc, ValueError):
        found = _ENV_RENDEZVOUS.search(str(exc))
        name = found.group(1) if found else None
    return name if name in LAUNCHER_VARIABLES and not os.environ.get(str(name)) else None  # type: ignore[return-value]


def _user_frame(exc: BaseException) -> str:
    """``file:line`` of the innermost frame of ``exc`` in the user's code (" " + it), or ``""``."""
    from npu_migrate.migrate import usercode

    roots = usercode.internal_roots() + usercode.resolve()
    where = ""
    tb = exc.__traceback__
    while tb is not None:
        path = tb.tb_frame.f_code.co_filename
        if not path.startswith("<"):
            root = usercode.classify(os.path.realpath(path), roots)
            if root is None or root.user:
                relative = os.path.relpath(path)
                where = f"{path if relative.startswith('..') else relative}:{tb.tb_lineno}"
        tb = tb.tb_next
    return where


def launch_command(args: argparse.Namespace) -> str:
    """The ``npu-migrate launch --migrate`` command line that runs ``args``'s script as ranks.

    From this process's own command line where ``run`` was given one (every flag of ``run`` is a
    flag of ``launch`` too), else from the device, device count and script.
    """
    argv = sys.argv[1:] if getattr(args, "command_line", False) else []
    if "run" in argv:
        at = argv.index("run")  # the sub-command: no global option takes a value
        words = [*argv[:at], "launch", "--migrate", *argv[at + 1:]]
    else:
        words = ["launch", "--migrate"]
        words += ["--device", args.device] if args.device else []
        words += ["--device-num", str(args.device_num)] if args.device_num else []
        words += ["-m"] if args.module else []
        words += [args.script, *args.script_args]
    return shlex.join(["npu-migrate", *words])


def write_report(report_dir: str, path: str | None, job_failed: bool = False) -> str | None:
    """Merge every process's record in ``report_dir`` into ``path``; return the console's line about it.

    With no ``path`` (no ``--migrate-report``) nothing is written, and the line is the warning of
    a job that met no CUDA call (:data:`npu_migrate.migrate.report.NOTHING_SEEN`), or None. A job
    that failed gets no such warning: its ranks may have been stopped before writing their records.
    """
    from npu_migrate.migrate import report as _report

    merged = _report.merge(report_dir)
    if job_failed:
        merged["warnings"] = []
    warning = "; ".join(f"warning: {w}" for w in merged["warnings"])
    if path is None:
        return warning or None
    _report.write(merged, path)
    kinds = {k: sum(1 for e in merged["apis"].values() if e["kind"] == k) for k in _report.KINDS}
    return (f"migration report {path}: {merged['processes']} process(es), {kinds['redirected']} API(s) redirected, "
            f"{kinds['noop']} harmless no-op(s), {kinds['unmapped']} unmapped" + (f"; {warning}" if warning else ""))


def hint_last(exc: BaseException | None) -> None:
    """End the script's uncaught ``exc`` with the hint this process has for it (:mod:`npu_migrate.failure_hints`).

    As the last line of its traceback (an exception note, Python >= 3.11), else at once on stderr.
    npu_migrate's own errors are one line already.
    """
    from npu_migrate import failure_hints
    from npu_migrate.errors import NpuMigrateError

    if not isinstance(exc, Exception) or isinstance(exc, NpuMigrateError):
        return
    line = failure_hints.hint(exc)
    if not line:
        return
    line = f"npu-migrate run: hint: {line}"
    if hasattr(exc, "add_note"):
        exc.add_note(line)
    else:
        print(line, file=sys.stderr)


def _finish_profile(profile: Any, code: int, failed: bool) -> int:
    """Stop this process's profiler, then print the summary of every process that profiled."""
    from npu_migrate.profile import launch_feature, recorder

    profiler = recorder.active()
    if profiler is not None:
        profiler.close()
    say = lambda line: print(f"npu-migrate run: {line}", file=sys.stderr, flush=True)  # noqa: E731
    wanted = launch_feature.finish_job(profile, None if failed else code, say)
    return code if wanted is None else wanted


def run(args: argparse.Namespace) -> int:
    """Install migration for this process and its children, then run the script as __main__."""
    from npu_migrate import migrate

    if args.device_num is not None and args.device_num < 1:
        raise UsageError(f"--device-num {args.device_num} is not positive: expected 1 or more devices.")
    if not args.module and not os.path.isfile(args.script):
        raise InputError(f"script {args.script!r} not found (working directory {os.getcwd()}).")
    from npu_migrate.compare.recording import settings as probe_settings

    try:
        probe = probe_settings.from_args(args)
        if probe is not None:
            probe.prepare_directory()
    except probe_settings.ProbeError as exc:  # flags or a directory that cannot be used: nothing has run
        raise UsageError(str(exc)) from exc
    if probe is not None:
        probe.export()  # processes the script starts record too
    from npu_migrate.profile import settings as profile_settings

    try:
        profile = profile_settings.from_args(args)
        if profile is not None:
            profile.prepare_directory()
    except profile_settings.ProfileError as exc:  # flags or a directory that cannot be used: nothing has run
        raise UsageError(str(exc)) from exc
    if profile is not None:
        profile.export()  # processes the script starts (mp.spawn's ranks) profile too
    from npu_migrate.migrate import usercode

    usercode.export(args.user_code, usercode.script_of(args.script, args.module))
    # Always: a job that met no CUDA call is worth a warning even without --migrate-report.
    report_dir = tempfile.mkdtemp(prefix="npu_migrate_report_")
    from npu_migrate.migrate.environment import ENV_WHOLE_LINES
    from npu_migrate.migrate.state import set_env

    set_env(ENV_WHOLE_LINES, "1")  # the processes mp.spawn starts write whole lines (migrate/lines.py)
    migrate.install(device=args.device, device_count=args.device_num, propagate=True, report_dir=report_dir)
    if probe is not None:
        from npu_migrate.compare.recording import probe as probe_module

        probe_module.install_from_env()
    if profile is not None:
        from npu_migrate.profile import recorder

        recorder.install_from_env()
    code = 0
    command = launch_command(args)  # before the script replaces sys.argv
    try:
        try:
            run_script(args.script, args.script_args, module=args.module)
        except (KeyError, ValueError, TypeError) as exc:
            name = launcher_variable(exc)
            if name is None:
                raise
            where = _user_frame(exc)
            raise DistributedConfigError(
                f"{where or 'the script'} needs {name}, which torchrun sets for each rank: a torchrun-style "
                f"script runs as ranks, and run starts one process. Start it as ranks: {command}"
            ) from exc
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    finally:
        if probe is not None:
            from npu_migrate.compare.recording import probe as probe_module

            recording = probe_module.active()
            if recording is not None:
                recording.close()
            if sys.exc_info()[0] is None:  # a script that raised says more than "nothing recorded"
                code = probe_settings.finish_job(probe, code)
        if profile is not None:
            code = _finish_profile(profile, code, failed=sys.exc_info()[0] is not None)
        from npu_migrate.migrate.report import REPORT

        hint_last(sys.exc_info()[1])  # a library's CUDA check: the --user-code that fixes it
        REPORT.dump()
        line = write_report(report_dir, args.migrate_report, job_failed=code != 0 or sys.exc_info()[0] is not None)
        if line:
            print(f"npu-migrate run: {line}", file=sys.stderr)
        shutil.rmtree(report_dir, ignore_errors=True)
    return code
