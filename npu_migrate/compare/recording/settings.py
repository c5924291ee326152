"""What a probe records and where: the settings, their flags, their environment variables, the directory checks.

Usage::

    parser = argparse.ArgumentParser()
    settings.add_probe_arguments(parser)              # --probe DIR, --probe-level, --probe-modules...
    probe = settings.from_args(parser.parse_args())   # None without --probe; bad values raise ProbeError
    probe.prepare_directory(world_size=2)             # refuses an existing DIR unless --probe-append
    probe.export(os.environ.__setitem__)              # every worker started from now on records
    ...                                               # the job runs
    code = settings.finish_job(probe, code)           # 1 if a filter matched nothing

Workers read the same settings back with :meth:`ProbeSettings.from_env`. This module needs only
the standard library, so a launcher can check the flags before anything imports torch. The
recording itself lives in :mod:`npu_migrate.compare.recording.probe`.
"""

from __future__ import annotations

import argparse
import glob
import json
import logging
import os
import re
import sys
from dataclasses import asdict, dataclass
from typing import Any, Callable, Literal

from npu_migrate.errors import NpuMigrateError

logger = logging.getLogger(__name__)

ENV_DIR = "NPU_MIGRATE_PROBE"
ENV_LEVEL = "NPU_MIGRATE_PROBE_LEVEL"
ENV_MODULES = "NPU_MIGRATE_PROBE_MODULES"
ENV_STEPS = "NPU_MIGRATE_PROBE_STEPS"
ENV_RANKS = "NPU_MIGRATE_PROBE_RANKS"
ENV_APPEND = "NPU_MIGRATE_PROBE_APPEND"
ENV_SEED_CHECKPOINT = "NPU_MIGRATE_PROBE_SEED_CHECKPOINT"
ENV_SEED_MODE = "NPU_MIGRATE_PROBE_SEED_MODE"
ENV_NO_DROPOUT = "NPU_MIGRATE_PROBE_NO_DROPOUT"
ENV_NAMES = (ENV_DIR, ENV_LEVEL, ENV_MODULES, ENV_STEPS, ENV_RANKS, ENV_APPEND, ENV_SEED_CHECKPOINT,
             ENV_SEED_MODE, ENV_NO_DROPOUT)

LEVELS = ("steps", "modules")
Level = Literal["steps", "modules"]


class ProbeError(NpuMigrateError, ValueError):
    """Bad probe settings, a directory that is in use, or a filter that matched nothing."""


@dataclass(frozen=True)
class StepRange:
    """Inclusive range of optimizer steps (1-based); ``None`` ends are open."""

    first: int | None = None
    last: int | None = None

    @classmethod
    def parse(cls, text: str | None, flag: str = "--probe-steps") -> StepRange:
        """Read ``"5"``, ``"5:"``, ``":20"`` or ``"5:20"``.

        Raises:
            ProbeError: for anything else, or an empty range.
        """
        if text is None or text.strip() in ("", ":", "all"):
            return cls()
        found = re.fullmatch(r"\s*(\d*)\s*(:?)\s*(\d*)\s*", text)
        if not found or (not found.group(2) and not found.group(1)) or (not found.group(2) and found.group(3)):
            raise ProbeError(f"{flag} {text!r} is not a step range. Expected N, FIRST:LAST, FIRST: or :LAST "
                             "with 1-based optimizer steps, e.g. 10:20.")
        first = int(found.group(1)) if found.group(1) else None
        last = first if not found.group(2) else (int(found.group(3)) if found.group(3) else None)
        if first is not None and first < 1 or last is not None and last < 1:
            raise ProbeError(f"{flag} {text!r}: steps count from 1 (the first optimizer step).")
        if first is not None and last is not None and last < first:
            raise ProbeError(f"{flag} {text!r} is empty: the last step {last} comes before the first {first}.")
        return cls(first, last)

    def __contains__(self, step: int) -> bool:
        return (self.first is None or step >= self.first) and (self.last is None or step <= self.last)

    def __str__(self) -> str:
        if self.first is None and self.last is None:
            return "all"
        if self.first == self.last:
            return str(self.first)
        return f"{self.first or ''}:{self.last or ''}"


def parse_ranks(text: str | None) -> tuple[int, ...] | None:
    """Read ``"0"``, ``"0,2"`` or ``"0-3"`` (and mixes); ``None`` or ``""`` means every rank.

    Raises:
        ProbeError: for anything that is not a list of ranks.
    """
    if text is None or not text.strip():
        return None
    ranks: set[int] = set()
    for part in text.split(","):
        found = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if not found:
            raise ProbeError(f"--probe-ranks {text!r} is not a list of ranks. Expected e.g. 0 or 0,2 or 0-3.")
        low = int(found.group(1))
        high = int(found.group(2)) if found.group(2) else low
        if high < low:
            raise ProbeError(f"--probe-ranks {text!r}: the range {part.strip()} is empty.")
        ranks.update(range(low, high + 1))
    return tuple(sorted(ranks))


@dataclass(frozen=True)
class ProbeSettings:
    """One run's recording settings, as every process of the job sees them.

    Attributes:
        directory: where ``rank{R}.jsonl`` files go.
        level: ``steps`` (loss, gradient norm, learning rate) or ``modules`` (also per-module statistics).
        modules: regular expression, searched in module names, that selects module records.
        steps: optimizer steps whose module records are kept.
        ranks: ranks that record modules (``None``: all).
        append: add to an existing directory instead of refusing it.
        seed_checkpoint: file of initial weights, saved by the first run and loaded by later ones.
        seed_mode: ``save`` or ``load``, decided once for the whole job (``None`` without a file).
        no_dropout: set every dropout module's probability to 0.
    """

    directory: str
    level: Level = "steps"
    modules: str | None = None
    steps: StepRange = StepRange()
    ranks: tuple[int, ...] | None = None
    append: bool = False
    seed_checkpoint: str | None = None
    seed_mode: Literal["save", "load"] | None = None
    no_dropout: bool = False

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise ProbeError(f"--probe-level {self.level!r} is unknown. Expected one of: {', '.join(LEVELS)}.")
        if self.modules is not None:
            try:
                re.compile(self.modules)
            except re.error as exc:
                raise ProbeError(f"--probe-modules {self.modules!r} is not a regular expression ({exc}). "
                                 "Pass a Python regex searched in module names, e.g. 'layer1|fc'.") from exc
        if self.seed_mode not in (None, "save", "load"):
            raise ProbeError(f"seed mode {self.seed_mode!r} is unknown. Expected save or load.")

    # -- the worker side

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> ProbeSettings | None:
        """The settings a launcher exported, or ``None`` when this process does not record."""
        env = os.environ if environ is None else environ
        directory = env.get(ENV_DIR)
        if not directory:
            return None
        return cls(
            directory=directory,
            level=env.get(ENV_LEVEL) or "steps",  # type: ignore[arg-type]
            modules=env.get(ENV_MODULES) or None,
            steps=StepRange.parse(env.get(ENV_STEPS)),
            ranks=parse_ranks(env.get(ENV_RANKS)),
            append=env.get(ENV_APPEND) == "1",
            seed_checkpoint=env.get(ENV_SEED_CHECKPOINT) or None,
            seed_mode=env.get(ENV_SEED_MODE) or None,  # type: ignore[arg-type]
            no_dropout=env.get(ENV_NO_DROPOUT) == "1",
        )

    def to_env(self) -> dict[str, str]:
        """The environment variables that carry these settings to worker processes."""
        env = {ENV_DIR: os.path.abspath(self.directory), ENV_LEVEL: self.level, ENV_STEPS: str(self.steps)}
        if self.modules is not None:
            env[ENV_MODULES] = self.modules
        if self.ranks is not None:
            env[ENV_RANKS] = ",".join(map(str, self.ranks))
        if self.append:
            env[ENV_APPEND] = "1"
        if self.seed_checkpoint:
            env[ENV_SEED_CHECKPOINT] = os.path.abspath(self.seed_checkpoint)
            env[ENV_SEED_MODE] = self.seed_mode or ("load" if os.path.exists(self.seed_checkpoint) else "save")
        if self.no_dropout:
            env[ENV_NO_DROPOUT] = "1"
        return env

    def export(self, set_env: Callable[[str, str], None] | None = None) -> None:
        """Make every Python process started from now on record (a sitecustomize arms it at ``import torch``)."""
        from npu_migrate._torch_hook import export_bootstrap

        export_bootstrap(set_env, self.to_env())

    def describe(self) -> dict[str, Any]:
        """The settings as the header of every rank file records them."""
        data = asdict(self)
        data["steps"] = str(self.steps)
        data["ranks"] = list(self.ranks) if self.ranks is not None else None
        return data

    # -- the launcher side

    def prepare_directory(self, world_size: int | None = None) -> None:
        """Create the directory, refusing one that holds files unless ``append`` is set.

        Args:
            world_size: ranks of the job, to warn about a rank filter that selects none of them.

        Raises:
            ProbeError: the directory is in use, or is a file.
        """
        if os.path.exists(self.directory) and not os.path.isdir(self.directory):
            raise ProbeError(f"--probe {self.directory!r} is a file; expected a directory for rank{{R}}.jsonl files.")
        if os.path.isdir(self.directory) and os.listdir(self.directory) and not self.append:
            count = len(os.listdir(self.directory))
            raise ProbeError(f"--probe directory {self.directory!r} already exists with {count} file(s); nothing "
                             "was overwritten. Choose a new directory, or pass --probe-append to add to it.")
        os.makedirs(self.directory, exist_ok=True)
        if world_size is not None and self.ranks is not None and not any(r < world_size for r in self.ranks):
            print(f"npu-migrate: warning: --probe-ranks {','.join(map(str, self.ranks))} selects none of the "
                  f"{world_size} rank(s) 0-{world_size - 1}; this will be an error when the job ends.",
                  file=sys.stderr, flush=True)


def add_probe_arguments(parser: argparse.ArgumentParser) -> None:
    """The recording flags shared by ``python -m npu_migrate.launch`` and ``npu-migrate run``."""
    group = parser.add_argument_group("recording for npu-migrate compare")
    group.add_argument("--probe", metavar="DIR", default=None,
                       help="Record loss, gradient norm and learning rate at every optimizer step to "
                            "DIR/rank{R}.jsonl, for `npu-migrate compare` (default: %(default)s, off).")
    group.add_argument("--probe-level", dest="probe_level", choices=LEVELS, default="steps",
                       help="steps: per-step figures only; modules: also every module's forward inputs and "
                            "outputs and backward gradients (default: %(default)s).")
    group.add_argument("--probe-modules", dest="probe_modules", metavar="REGEX", default=None,
                       help="Record only modules whose name matches REGEX (re.search) (default: all).")
    group.add_argument("--probe-steps", dest="probe_steps", metavar="RANGE", default=None,
                       help="Record modules only in these optimizer steps: N, FIRST:LAST, FIRST: or :LAST "
                            "(default: all).")
    group.add_argument("--probe-ranks", dest="probe_ranks", metavar="RANKS", default=None,
                       help="Record modules only on these ranks, e.g. 0 or 0,2 or 0-3 (default: all).")
    group.add_argument("--probe-append", dest="probe_append", action="store_true",
                       help="Add to an existing --probe DIR instead of refusing it (default: off).")
    group.add_argument("--probe-seed-checkpoint", dest="probe_seed_checkpoint", metavar="FILE", default=None,
                       help="Save the model's initial weights to FILE, or load them from FILE when it exists, "
                            "so two runs start from the same weights (default: %(default)s).")
    group.add_argument("--probe-no-dropout", dest="probe_no_dropout", action="store_true",
                       help="Turn every dropout module off (p=0) so two runs draw no random masks (default: off).")


def from_args(args: argparse.Namespace) -> ProbeSettings | None:
    """The settings of parsed :func:`add_probe_arguments` flags; ``None`` without ``--probe``.

    Raises:
        ProbeError: a probe flag without ``--probe``, or a bad value.
    """
    extra = [flag for flag, value in (
        ("--probe-modules", args.probe_modules), ("--probe-steps", args.probe_steps),
        ("--probe-ranks", args.probe_ranks), ("--probe-append", args.probe_append),
        ("--probe-seed-checkpoint", args.probe_seed_checkpoint), ("--probe-no-dropout", args.probe_no_dropout),
        ("--probe-level", args.probe_level != "steps"),
    ) if value]
    if not args.probe:
        if extra:
            raise ProbeError(f"{extra[0]} needs --probe DIR: it changes what a recording holds. Add --probe DIR.")
        return None
    if args.probe_modules is not None and args.probe_level != "modules":
        raise ProbeError("--probe-modules selects module records; add --probe-level modules.")
    if args.probe_seed_checkpoint and os.path.isdir(args.probe_seed_checkpoint):
        raise ProbeError(f"--probe-seed-checkpoint {args.probe_seed_checkpoint!r} is a directory; expected a file "
                         "path such as init.pt.")
    return ProbeSettings(
        directory=args.probe, level=args.probe_level, modules=args.probe_modules,
        steps=StepRange.parse(args.probe_steps), ranks=parse_ranks(args.probe_ranks), append=args.probe_append,
        seed_checkpoint=args.probe_seed_checkpoint, no_dropout=args.probe_no_dropout,
    )


def rank_files(directory: str) -> dict[int, str]:
    """``{rank: path}`` of the ``rank{R}.jsonl`` files in ``directory``."""
    found = {}
    for path in glob.glob(os.path.join(glob.escape(directory), "rank*.jsonl")):
        name = re.fullmatch(r"rank(\d+)\.jsonl", os.path.basename(path))
        if name:
            found[int(name.group(1))] = path
    return dict(sorted(found.items()))


def unmatched_filters(directory: str) -> list[str]:
    """Why no module record was made in a whole job's directory; empty when some were (or none were asked).

    Reads the ``end`` record each rank writes when it exits cleanly.
    """
    reasons: list[str] = []
    records = 0
    asked = False
    for path in rank_files(directory).values():
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                if '"kind": "end"' not in line and '"kind":"end"' not in line:
                    continue
                try:
                    end = json.loads(line)
                except ValueError:
                    continue
                asked = asked or end.get("level") == "modules"
                records += int(end.get("module_records", 0))
                reasons.extend(r for r in end.get("unmatched", []) if r not in reasons)
    if not asked or records:
        return []
    return reasons or ["no module record was made"]


def missing_recordings(directory: str) -> str | None:
    """Why a finished job left no rank file in ``directory`` (``None`` if it left some)."""
    if rank_files(directory):
        return None
    return ("no process wrote a rank file: the job never ran an optimizer step, a backward pass or a training "
            "forward (or the probe could not start; see the messages above)")


COMPILED_ONLY = ("no module ran forward outside torch.compile: the model ran compiled, and the modules inside "
                 "torch.compile are not recorded (the hooks would change the compiled graph); to record them, run "
                 "with TORCHDYNAMO_DISABLE=1 (the model then runs eagerly)")
"""Why a rank recorded no module at ``--probe-level modules`` when its model only ran compiled."""


def finish_job(settings: ProbeSettings | None, code: int) -> int:
    """After a job: turn a filter that matched nothing into exit 1, with one line saying why."""
    if settings is None:
        return code
    empty = missing_recordings(settings.directory)
    if empty and code == 0:
        print(f"npu-migrate: error: --probe {settings.directory}: {empty}.", file=sys.stderr, flush=True)
        return 1
    reasons = unmatched_filters(settings.directory)
    if reasons and code == 0:
        fix = "" if set(reasons) == {COMPILED_ONLY} else (" Nothing was recorded per module: check --probe-modules, "
                                                          "--probe-steps and --probe-ranks.")
        print(f"npu-migrate: error: --probe {settings.directory}: {'; '.join(reasons)}.{fix}", file=sys.stderr,
              flush=True)
        return 1
    return code
