"""What ``--profile`` profiles and where: the flags, their checks, the environment that carries them to the ranks.

Usage::

    parser = argparse.ArgumentParser()
    settings.add_arguments(parser)                  # --profile DIR, --profile-steps A-B, --profile-ranks R
    chosen = settings.from_args(parser.parse_args())  # None without --profile; bad values raise ProfileError
    chosen.prepare_directory()                      # creates DIR; refuses a file
    chosen.export()                                 # every process started from now on profiles
    ProfileSettings.from_env()                      # in a rank: the same settings back

Standard library only, so a launcher checks the flags before anything imports torch. The ranks'
side is :mod:`.recorder`; the summary read after the job is :mod:`.summary`.

Defaults: optimizer steps 3-5 (as torch's own example schedule ``wait=1, warmup=1, active=3``: step
1 is the job's warm-up, with allocation, autotuning and the NPU's operator compilation; step 2
warms the profiler up; 3 to 5 are recorded), on every rank (the summary names the slowest one;
``--profile-ranks 0`` profiles one).
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
from dataclasses import dataclass
from typing import Callable

from npu_migrate.errors import NpuMigrateError

ENV_DIR = "NPU_MIGRATE_PROFILE"
ENV_STEPS = "NPU_MIGRATE_PROFILE_STEPS"
ENV_RANKS = "NPU_MIGRATE_PROFILE_RANKS"
ENV_JOB = "NPU_MIGRATE_PROFILE_JOB"
ENV_NAMES = (ENV_DIR, ENV_STEPS, ENV_RANKS, ENV_JOB)

DEFAULT_STEPS = (3, 5)


class ProfileError(NpuMigrateError, ValueError):
    """Bad ``--profile`` flags, or a directory that cannot hold the traces."""


def parse_steps(text: str | None) -> tuple[int, int]:
    """Read ``"3-5"`` or ``"4"`` (1-based optimizer steps, inclusive); ``None`` gives the default.

    Raises:
        ProfileError: anything else, or an empty range.
    """
    if text is None:
        return DEFAULT_STEPS
    found = re.fullmatch(r"\s*(\d+)\s*(?:[-:]\s*(\d+)\s*)?", text)
    if not found:
        raise ProfileError(f"--profile-steps {text!r} is not a step range. Expected A-B or N with 1-based optimizer "
                           "steps, e.g. 3-5.")
    first = int(found.group(1))
    last = int(found.group(2)) if found.group(2) else first
    if first < 1:
        raise ProfileError(f"--profile-steps {text!r}: steps count from 1 (the first optimizer step).")
    if last < first:
        raise ProfileError(f"--profile-steps {text!r} is empty: the last step {last} comes before the first {first}.")
    return first, last


def parse_ranks(text: str | None) -> tuple[int, ...] | None:
    """Read ``"0"``, ``"0,2"``, ``"0-3"`` or ``"all"``; ``None``, ``""`` and ``"all"`` mean every rank.

    Raises:
        ProfileError: anything that is not a list of ranks.
    """
    if text is None or text.strip() in ("", "all"):
        return None
    ranks: set[int] = set()
    for part in text.split(","):
        found = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if not found or (found.group(2) and int(found.group(2)) < int(found.group(1))):
            raise ProfileError(f"--profile-ranks {text!r} is not a list of ranks. Expected e.g. 0 or 0,2 or 0-3 or all.")
        ranks.update(range(int(found.group(1)), int(found.group(2) or found.group(1)) + 1))
    return tuple(sorted(ranks))


@dataclass(frozen=True)
class ProfileSettings:
    """One job's profiling, as every process of the job sees it.

    Attributes:
        directory: where each profiled rank writes its trace and ``rank{R}.profile.json``.
        first, last: the optimizer steps profiled (1-based, inclusive).
        ranks: the ranks profiled (``None``: all).
        job: a token naming this job, so the summary reads none of an earlier job's files in DIR.
    """

    directory: str
    first: int = DEFAULT_STEPS[0]
    last: int = DEFAULT_STEPS[1]
    ranks: tuple[int, ...] | None = None
    job: str = ""

    def profiles(self, rank: int) -> bool:
        """Whether ``rank`` is profiled."""
        return self.ranks is None or rank in self.ranks

    def describe(self) -> str:
        """``optimizer steps 3-5 of every rank`` style words."""
        steps = f"optimizer step {self.first}" if self.first == self.last else f"optimizer steps {self.first}-{self.last}"
        ranks = "every rank" if self.ranks is None else f"rank(s) {','.join(map(str, self.ranks))}"
        return f"{steps} of {ranks}"

    # -- the rank side

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> ProfileSettings | None:
        """The settings a launcher exported, or ``None`` when this process does not profile."""
        env = os.environ if environ is None else environ
        directory = env.get(ENV_DIR)
        if not directory:
            return None
        first, last = parse_steps(env.get(ENV_STEPS) or None)
        return cls(directory, first, last, parse_ranks(env.get(ENV_RANKS)), env.get(ENV_JOB, ""))

    def to_env(self) -> dict[str, str]:
        """The variables that carry these settings to the ranks."""
        env = {ENV_DIR: os.path.abspath(self.directory), ENV_STEPS: f"{self.first}-{self.last}", ENV_JOB: self.job}
        if self.ranks is not None:
            env[ENV_RANKS] = ",".join(map(str, self.ranks))
        return env

    def export(self, set_env: Callable[[str, str], None] | None = None) -> None:
        """Make every Python process started from now on profile (a sitecustomize arms it at ``import torch``)."""
        from npu_migrate._torch_hook import export_bootstrap

        export_bootstrap(set_env, self.to_env())

    # -- the launcher side

    def prepare_directory(self) -> None:
        """Create the directory (one that exists is used: each job's traces carry their own time).

        Raises:
            ProfileError: the path is a file, or the directory cannot be created or written.
        """
        if os.path.exists(self.directory) and not os.path.isdir(self.directory):
            raise ProfileError(f"--profile {self.directory!r} is a file; expected a directory for the ranks' traces.")
        try:
            os.makedirs(self.directory, exist_ok=True)
        except OSError as exc:
            raise ProfileError(f"--profile {self.directory!r} cannot be created: {exc.strerror or exc}.") from exc
        if not os.access(self.directory, os.W_OK | os.X_OK):
            raise ProfileError(f"--profile {self.directory!r} is not writable; choose a directory of your own.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The profiling flags shared by ``python -m npu_migrate.launch`` and ``npu-migrate run``."""
    group = parser.add_argument_group("profiling")
    group.add_argument("--profile", metavar="DIR", default=None,
                       help="Profile optimizer steps of every rank with torch.profiler (torch_npu.profiler on the NPU) "
                            "into DIR, for TensorBoard and ui.perfetto.dev, and print a summary at the end "
                            "(default: off).")
    group.add_argument("--profile-steps", dest="profile_steps", metavar="A-B", default=None,
                       help=f"The optimizer steps profiled, 1-based (default: {DEFAULT_STEPS[0]}-{DEFAULT_STEPS[1]}: "
                            "step 1 warms the job up, step 2 the profiler).")
    group.add_argument("--profile-ranks", dest="profile_ranks", metavar="RANKS", default=None,
                       help="The ranks profiled, e.g. 0 or 0,2 or 0-3 (default: all).")


def from_args(args: argparse.Namespace) -> ProfileSettings | None:
    """The settings of parsed :func:`add_arguments` flags; ``None`` without ``--profile``.

    Raises:
        ProfileError: a profiling flag without ``--profile``, or a bad value.
    """
    if not args.profile:
        for flag, value in (("--profile-steps", args.profile_steps), ("--profile-ranks", args.profile_ranks)):
            if value is not None:
                raise ProfileError(f"{flag} needs --profile DIR: it says what is profiled. Add --profile DIR.")
        return None
    first, last = parse_steps(args.profile_steps)
    return ProfileSettings(args.profile, first, last, parse_ranks(args.profile_ranks), secrets.token_hex(8))
