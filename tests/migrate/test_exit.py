"""Jobs that finished exit 0: no abort while the interpreter finalizes a process group left alive.

A gloo group still alive at interpreter exit (never destroyed, or destroyed while DDP holds it) can
abort a finished process with SIGABRT on torch 2.14 / Python 3.11; importing npu_migrate installs
an exit hook that tears the groups down first (npu_migrate/_exit.py). Each case runs RUNS times in
a row, with real processes; every run must exit 0 with its report written.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import run_ranks

SCRIPTS = Path(__file__).with_name("scripts")
RUNS = int(os.environ.get("EXIT_RUNS", "20"))  # each run is two fresh interpreters


@pytest.mark.long
@pytest.mark.parametrize("run", range(RUNS))
@pytest.mark.parametrize("case", ["never", "ddp"])
def test_a_finished_job_exits_0_every_time(case: str, run: int, tmp_path: Path) -> None:
    """One run of RUNS: each is its own test, so workers share them and a failure names its run."""
    reports = run_ranks(SCRIPTS / "exit_job.py", 2, tmp_path, timeout=120, CASE=case)
    assert [(r["rank"], r["sum"]) for r in reports] == [(0, 6.0), (1, 6.0)]


@pytest.mark.slow
@pytest.mark.parametrize("case", ["never", "ddp"])
def test_a_finished_job_exits_0(case: str, tmp_path: Path) -> None:
    """The fast loop's one run of each case (the slow tier repeats them)."""
    reports = run_ranks(SCRIPTS / "exit_job.py", 2, tmp_path, timeout=120, CASE=case)
    assert [(r["rank"], r["sum"]) for r in reports] == [(0, 6.0), (1, 6.0)]
