"""Runtime migration as a launcher feature: ``--migrate``, ``--migrate-report`` and ``--user-code``.

Usage::

    python -m npu_migrate.launch --migrate --device-num 2 train.py
    python -m npu_migrate.launch --migrate --migrate-report report.md --user-code src train.py

The launcher finds :data:`FEATURE` through :data:`npu_migrate.launch.features.BUILT_IN` and
calls its hooks (:class:`npu_migrate.launch.features.LaunchFeature`; this module imports nothing
of the launcher): the flags; before the fork
server starts, the environment that makes every worker migrate (:mod:`.environment`) and a
directory each worker writes its record into; after the job, the merged report
(:func:`npu_migrate.migrate.cli.write_report`). This module imports nothing heavy: the launcher
checks its flags before torch is imported.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from typing import Callable

from npu_migrate.errors import UsageError


class MigrationJob:
    """One launched job with runtime migration: its report directory, its report."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.report_dir: str | None = None

    def prepare(self) -> None:
        from npu_migrate.migrate import environment, usercode

        args = self.args
        usercode.export(args.user_code, usercode.script_of(args.script, args.module))  # checks --user-code
        # Also for the warning of a job that met no CUDA call, without --migrate-report.
        self.report_dir = tempfile.mkdtemp(prefix="npu_migrate_report_")
        environment.export_environment(args.device, args.nproc or 1, self.report_dir)

    def in_fork_server(self) -> None:
        """In a fork server forked from the launcher: what the bootstrap ``sitecustomize`` arms in a
        new one (the workers install migration when they start)."""
        from npu_migrate.migrate import hook

        hook.arm()

    def describe(self, device: str) -> str:
        return f"CUDA calls migrated to {device}"

    def finish(self, code: int | None, say: Callable[[str], None]) -> int | None:
        from npu_migrate.migrate.cli import write_report

        if self.report_dir is None:
            return code
        try:
            line = write_report(self.report_dir, self.args.migrate_report, job_failed=code != 0)
            if line:
                say(line)
        finally:
            self.discard()
        return code

    def discard(self) -> None:
        if self.report_dir is not None:  # no worker will write into it any more
            shutil.rmtree(self.report_dir, ignore_errors=True)
            self.report_dir = None


class Migration:
    """``--migrate``: the script's CUDA calls go to the chosen device in every worker."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        from npu_migrate.migrate import usercode  # torch-free

        parser.add_argument("--migrate", action="store_true",
                            help="Runtime migration: the script's CUDA calls go to the chosen device (npu, or cpu "
                                 "for tests).")
        parser.add_argument("--migrate-report", dest="migrate_report", default=None,
                            help="With --migrate, merge what every rank redirected into FILE (.json or markdown).")
        usercode.add_argument(parser)

    def for_job(self, args: argparse.Namespace) -> MigrationJob | None:
        if args.migrate_report and not args.migrate:
            raise UsageError("--migrate-report needs --migrate: it reports what runtime migration redirected.")
        if args.user_code and not args.migrate:
            raise UsageError("--user-code needs --migrate: it says whose CUDA calls runtime migration redirects.")
        return MigrationJob(args) if args.migrate else None


FEATURE = Migration()
