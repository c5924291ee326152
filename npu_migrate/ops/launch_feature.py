"""torch_npu's operator lines as a launcher feature: ``--strict-ops``, and their summary after the job.

Usage::

    python -m npu_migrate.launch --device-num 8 --strict-ops train.py
    # npu-migrate launch: rank 1: torch_npu reported 1 fallback(s) refused by --strict-ops (aten::...)

The launcher's line relay counts torch_npu's lines per rank (:mod:`npu_migrate.npu_lines`, fed by
:mod:`npu_migrate.launch.procs.output`); this feature (found through
:data:`npu_migrate.launch.features.BUILT_IN`) adds ``--strict-ops``, which every worker inherits
as ``TORCH_NPU_FALLBACK_CPU_DISABLE=1``, and prints one line per rank that printed any when the job
ends. Standard library only: the launcher builds its parser before torch is imported.
"""

from __future__ import annotations

import argparse
import os
from typing import Callable

from npu_migrate import npu_lines

STRICT_ENV = "TORCH_NPU_FALLBACK_CPU_DISABLE"
"""torch_npu's switch: an operator the NPU lacks fails instead of falling back to the CPU."""


class OperatorLines:
    """Every launched job: ``--strict-ops`` into the workers' environment, the per-rank summary after."""

    def __init__(self, strict: bool) -> None:
        self.strict = strict

    def prepare(self) -> None:
        if self.strict:  # before the fork server starts: every worker inherits it
            os.environ[STRICT_ENV] = "1"

    def in_fork_server(self) -> None:
        """Nothing to arm: each rank reads the variable as it runs."""

    def describe(self, device: str) -> str:
        return ""

    def finish(self, code: int | None, say: Callable[[str], None]) -> int | None:
        for line in npu_lines.COLLECTED.summary():
            say(line)
        return code

    def discard(self) -> None:
        pass


class StrictOps:
    """``--strict-ops``, and the summary of torch_npu's lines for every job."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--strict-ops", "--strict_ops", dest="strict_ops", action="store_true",
                            help=f"Set {STRICT_ENV}=1 for the job: an operator the NPU lacks fails instead of "
                                 "running on the CPU (torch_npu's fallback lines are listed per rank either way).")

    def for_job(self, args: argparse.Namespace) -> OperatorLines:
        return OperatorLines(args.strict_ops)


FEATURE = StrictOps()
