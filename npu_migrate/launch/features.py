"""Features that plug into the launcher: their flags, the workers' environment, their work after the job.

Usage::

    # in the unit that owns the feature (npu_migrate/migrate/launch_feature.py, compare/, ops/)
    class Migration:
        def add_arguments(self, parser): parser.add_argument("--migrate", action="store_true", ...)
        def for_job(self, args):              # check the flags; None when this job does not use it
            return MigrationJob(args) if args.migrate else None

    FEATURE = Migration()                     # found through BUILT_IN, or: features.register(Migration())

    # in the launcher (npu_migrate/launch/cli.py)
    features.add_arguments(parser)
    jobs = features.jobs_for(args)            # every feature's checks, before anything starts
    exported = features.prepare(jobs)         # before the fork server: the workers inherit the environment
    arm = features.fork_server_arming(jobs)   # a fork server forked from the launcher runs it (None: cannot)
    code = features.finish(jobs, code, say)   # after the job: reports, clean-up, maybe exit 1

The launcher knows features only through the two protocols here, and a feature needs nothing from
the launcher: the hooks get what they need as arguments (the parser, the flags, the device, the
job's exit code, the launcher's line printer), so ``launch/`` imports no feature and no feature
imports ``launch/``. The built-in ones (runtime migration, the probe, torch_npu's operator lines)
are listed in :data:`BUILT_IN` by module name and imported when the launcher's parser is built, as
pytest finds its default plugins, so ``python -m npu_migrate.launch --migrate`` works without the
top-level CLI; :func:`register` adds others (a test, an extension).
"""

from __future__ import annotations

import argparse
import importlib
import os
from typing import Callable, Protocol

BUILT_IN: tuple[str, ...] = (
    "npu_migrate.migrate.launch_feature",   # --migrate, --migrate-report, --user-code
    "npu_migrate.compare.launch_feature",   # --probe DIR and its filters
    "npu_migrate.ops.launch_feature",       # --strict-ops; the summary of torch_npu's operator lines
    "npu_migrate.profile.launch_feature",   # --profile DIR; the summary of the profiled steps
)
"""Modules whose ``FEATURE`` is a built-in launcher feature. Hooks run in this order before the
job, and in the reverse order after it (the last one prepared finishes first)."""

Say = Callable[[str], None]
"""The launcher's line printer: ``say("...")`` prints ``npu-migrate launch: ...`` on stderr."""

_registered: list[LaunchFeature] = []
_loaded = False


class FeatureJob(Protocol):
    """One job's use of a feature, returned by :meth:`LaunchFeature.for_job`."""

    def prepare(self) -> None:
        """Before the fork server starts (never with ``--dry-run``): export what the workers inherit."""

    def describe(self, device: str) -> str:
        """A note for the launcher's start-up line, e.g. ``CUDA calls migrated to npu`` ('' for none)."""

    def finish(self, code: int | None, say: Say) -> int | None:
        """After the job: write reports, clean up, print lines with ``say``. ``code``: the job's exit
        code, None when the launcher itself failed. Return the exit code this feature wants
        (``code``, or a failure for a job that succeeded)."""

    def discard(self) -> None:
        """The job was refused or interrupted after :meth:`prepare` and before it started: clean up."""

    # Optional: ``in_fork_server(self) -> None``. In a fork server forked from the launcher (not a
    # new interpreter, :mod:`.procs.forkserver`), before its first worker: arm what the environment
    # :meth:`prepare` exported arms at a new interpreter's start-up (a start-up hook waiting for
    # ``import torch``), or nothing where the workers read it as they run. A job without it has its
    # fork server started as a new interpreter whenever it changed the environment.


class LaunchFeature(Protocol):
    """A feature of the launcher: its flags, and a :class:`FeatureJob` for each job that uses them."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Add the feature's flags to the launcher's parser (before SCRIPT and its arguments)."""

    def for_job(self, args: argparse.Namespace) -> FeatureJob | None:
        """Check the feature's flags (raise ``npu_migrate.errors.UsageError``; nothing has started)
        and return this job's hooks, or None when the job does not use the feature."""


def register(feature: LaunchFeature) -> None:
    """Add ``feature`` after the built-in ones (once; registering it again changes nothing)."""
    if not any(f is feature for f in _registered):
        _registered.append(feature)


def unregister(feature: LaunchFeature) -> None:
    """Take ``feature`` out again (for tests and extensions that register for a while)."""
    _registered[:] = [f for f in _registered if f is not feature]


def active() -> tuple[LaunchFeature, ...]:
    """Every feature: the built-in ones (imported on first use), then the registered ones."""
    global _loaded
    if not _loaded:
        built_in = [importlib.import_module(name).FEATURE for name in BUILT_IN]
        _registered[:0] = [f for f in built_in if not any(f is r for r in _registered)]
        _loaded = True
    return tuple(_registered)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Every feature's flags."""
    for feature in active():
        feature.add_arguments(parser)


def jobs_for(args: argparse.Namespace) -> list[FeatureJob]:
    """Every feature's checks of ``args``, in order; the hooks of those the job uses."""
    return [job for job in (feature.for_job(args) for feature in active()) if job is not None]


def prepare(jobs: list[FeatureJob]) -> frozenset[str]:
    """Each job's :meth:`FeatureJob.prepare`; where one fails, the ones prepared before it are discarded.

    Returns:
        The names of the variables the jobs set, changed or removed: the workers' environment.
    """
    before = dict(os.environ)
    done: list[FeatureJob] = []
    try:
        for job in jobs:
            job.prepare()
            done.append(job)
    except BaseException:
        discard(done)
        raise
    return frozenset(name for name in set(before) | set(os.environ) if before.get(name) != os.environ.get(name))


def fork_server_arming(jobs: list[FeatureJob]) -> Callable[[], None] | None:
    """What a fork server forked from the launcher runs before its first worker: every job's
    ``in_fork_server`` (see :class:`FeatureJob`); None where a job has none."""
    hooks = [getattr(job, "in_fork_server", None) for job in jobs]
    if any(hook is None for hook in hooks):
        return None

    def arm() -> None:
        for hook in hooks:
            hook()

    return arm


def discard(jobs: list[FeatureJob]) -> None:
    """Each job's :meth:`FeatureJob.discard`, the last prepared first."""
    for job in reversed(jobs):
        job.discard()


def finish(jobs: list[FeatureJob], code: int | None, say: Say) -> int | None:
    """Each job's :meth:`FeatureJob.finish`, the last prepared first; every one runs even where one raises.

    Returns:
        The job's code, or the first failure a feature adds to a job that succeeded.
    """
    result, failed = code, None
    for job in reversed(jobs):
        try:
            wanted = job.finish(code, say)
        except BaseException as exc:  # the others still clean up; the first failure is raised after
            failed = failed or exc
            continue
        if result == 0 and wanted:
            result = wanted
    if failed is not None:
        raise failed
    return result
