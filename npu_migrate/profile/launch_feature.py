"""``--profile DIR`` as a launcher feature: every chosen rank profiles the chosen optimizer steps.

Usage::

    python -m npu_migrate.launch --device-num 2 --profile prof train.py
    python -m npu_migrate.launch --profile prof --profile-steps 10-12 --profile-ranks 0 train.py

The launcher finds :data:`FEATURE` through :data:`npu_migrate.launch.features.BUILT_IN` (this
module imports nothing of the launcher): the flags and their checks from :mod:`.settings`
(bad values and a path that is a file are usage errors, exit 2, before anything starts); before
the fork server starts, the directory is made and the settings exported, so every rank's
``import torch`` arms :mod:`.recorder`; after the job, the summary (:mod:`.summary`), and exit 1
for a job that succeeded and profiled nothing.
"""

from __future__ import annotations

import argparse
import contextlib
from typing import Callable, Iterator

from npu_migrate.errors import UsageError
from npu_migrate.profile import settings


@contextlib.contextmanager
def usage_errors() -> Iterator[None]:
    """Profiling flags or a directory that cannot be used: a usage error (exit 2), nothing has started."""
    try:
        yield
    except settings.ProfileError as exc:
        raise UsageError(str(exc)) from exc


class ProfileJob:
    """One launched job that profiles: its settings."""

    def __init__(self, chosen: settings.ProfileSettings) -> None:
        self.settings = chosen

    def prepare(self) -> None:
        with usage_errors():
            self.settings.prepare_directory()
        self.settings.export()

    def in_fork_server(self) -> None:
        """In a fork server forked from the launcher: what the bootstrap ``sitecustomize`` arms in a new one."""
        from npu_migrate.profile import _hook

        _hook.arm()

    def describe(self, device: str) -> str:
        return f"profiling {self.settings.describe()} into {self.settings.directory}"

    def finish(self, code: int | None, say: Callable[[str], None]) -> int | None:
        return finish_job(self.settings, code, say)

    def discard(self) -> None:
        pass  # the directory is the user's, and may hold an earlier job's traces


def finish_job(chosen: settings.ProfileSettings, code: int | None, say: Callable[[str], None]) -> int | None:
    """After a job: the summary's lines; exit 1 for a job that succeeded and profiled nothing."""
    from npu_migrate.profile import summary

    if code is None:  # the launcher failed: what it says matters more
        return code
    lines, nothing = summary.lines(chosen)
    if nothing and code != 0:
        return code  # a failed job says why itself
    for line in lines:
        say(("error: " if nothing else "") + line)
    return 1 if nothing else code


class Profile:
    """``--profile DIR``: profile optimizer steps of every chosen rank, and summarize them."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        settings.add_arguments(parser)

    def for_job(self, args: argparse.Namespace) -> ProfileJob | None:
        with usage_errors():
            chosen = settings.from_args(args)
        return ProfileJob(chosen) if chosen is not None else None


FEATURE = Profile()
