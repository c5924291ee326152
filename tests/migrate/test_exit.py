"""Jobs that finished exit 0: no abort while the interpreter finalizes a process group left alive.

A gloo group still alive at interpreter exit (never destroyed, or destroyed while DDP holds it) can
abort a finished process with SIGABRT on torch 2.14 / Python 3.11; importing npu_migrate installs
an exit hook that tears the groups down first (npu_migrate/_exit.py). Each case runs once in fresh
interpreters, as a user starts the script, and RUNS times in a row with each rank forked from one
warm interpreter (scripts/exit_runs.py): the rank runs the same script and finalizes the same way,
without paying two torch imports a run. Every run must exit 0 with its reports written.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, child_env, run_ranks

SCRIPTS = Path(__file__).with_name("scripts")
RUNS = int(os.environ.get("EXIT_RUNS", "20"))
CASES = ["never", "ddp"]


@pytest.fixture(scope="module")
def runs_in_a_row(case: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list]:
    """The case's RUNS runs, made once for the module; each test below checks one of them."""
    out = tmp_path_factory.mktemp(f"exit-{case}")
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / "exit_runs.py"), str(SCRIPTS / "exit_job.py"), str(RUNS), str(out)],
        env=child_env(CASE=case), cwd=ROOT, capture_output=True, text=True, timeout=280,
    )
    assert proc.returncode == 0, f"the runs' driver exited {proc.returncode}:\n{proc.stderr}"
    codes = json.loads(proc.stdout.splitlines()[-1])
    assert len(codes) == RUNS
    return out, codes


@pytest.mark.long
@pytest.mark.parametrize("run", range(RUNS))
@pytest.mark.parametrize("case", CASES, scope="module")
def test_a_finished_job_exits_0_every_time(case: str, run: int, runs_in_a_row: tuple[Path, list]) -> None:
    """One run of RUNS in a row: each is its own test, so a failure names its run."""
    out, codes = runs_in_a_row
    run_dir = out / f"run{run}"
    logs = "\n".join(f"rank {r}: {(run_dir / f'rank{r}.log').read_text()}" for r in range(2))
    assert codes[run] == [0, 0], f"run {run} of {RUNS}: exit codes {codes[run]}\n{logs}"
    reports = [json.loads((run_dir / f"rank{r}.json").read_text()) for r in range(2)]
    assert [(r["rank"], r["sum"]) for r in reports] == [(0, 6.0), (1, 6.0)]


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_a_finished_job_exits_0(case: str, tmp_path: Path) -> None:
    """Each case once in fresh interpreters, exactly as a user runs the script."""
    reports = run_ranks(SCRIPTS / "exit_job.py", 2, tmp_path, timeout=120, CASE=case)
    assert [(r["rank"], r["sum"]) for r in reports] == [(0, 6.0), (1, 6.0)]
