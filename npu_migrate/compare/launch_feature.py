"""The probe as a launcher feature: ``--probe DIR`` and its filters record every rank of a launched job.

Usage::

    python -m npu_migrate.launch --device-num 2 --probe runs/gpu train.py
    npu-migrate compare runs/gpu runs/npu

The launcher finds :data:`FEATURE` through :data:`npu_migrate.launch.features.BUILT_IN` (this
module imports nothing of the launcher): the
flags and their checks come from :mod:`.recording.settings` (standard library only, so the launcher checks
them before torch is imported); before the fork server starts, the directory is checked and the
settings exported, so every worker records (flags or a directory that cannot be used are usage
errors, exit 2); after the job, a filter that matched nothing ends it
with exit 1 (:func:`.recording.settings.finish_job`).
"""

from __future__ import annotations

import argparse
import contextlib
from typing import Callable, Iterator

from npu_migrate.compare.recording import settings
from npu_migrate.errors import UsageError


@contextlib.contextmanager
def usage_errors() -> Iterator[None]:
    """The probe's flags or directory cannot be used: a usage error (exit 2), nothing has started."""
    try:
        yield
    except settings.ProbeError as exc:
        raise UsageError(str(exc)) from exc


class ProbeJob:
    """One launched job that records: its settings and the world size the flags give."""

    def __init__(self, probe: settings.ProbeSettings, world_size: int | None) -> None:
        self.probe = probe
        self.world_size = world_size

    def prepare(self) -> None:
        # Before the fork server starts: it imports torch, and the probe must be armed there.
        with usage_errors():  # a directory in use: nothing has started, another --probe DIR fixes it
            self.probe.prepare_directory(self.world_size)
        self.probe.export()

    def in_fork_server(self) -> None:
        """In a fork server forked from the launcher: what the bootstrap ``sitecustomize`` arms in a
        new one (each worker starts recording when it starts)."""
        from npu_migrate.compare.recording import _hook

        _hook.arm()

    def describe(self, device: str) -> str:
        return ""

    def finish(self, code: int | None, say: Callable[[str], None]) -> int | None:
        if code is None:  # the launcher failed: what it says matters more than "nothing recorded"
            return code
        return settings.finish_job(self.probe, code)

    def discard(self) -> None:
        pass  # the directory stays: --probe DIR is the user's, and may hold an earlier run's files


class Probe:
    """``--probe DIR``: every rank records its losses and per-module statistics for ``npu-migrate compare``."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        settings.add_probe_arguments(parser)

    def for_job(self, args: argparse.Namespace) -> ProbeJob | None:
        with usage_errors():  # bad values, before anything starts
            probe = settings.from_args(args)
        if probe is None:
            return None
        return ProbeJob(probe, args.nproc * (args.nnodes or 1) if args.nproc else None)


FEATURE = Probe()
