"""Jobs that finished exit 0: no abort while the interpreter finalizes a process group left alive.

A gloo group still alive at interpreter exit (never destroyed, or destroyed while DDP holds it) can
abort a finished process with SIGABRT on torch 2.14 / Python 3.11; importing npu_migrate installs
an exit hook that tears the groups down first (npu_migrate/_exit.py). Each case runs RUNS times in
a row (5; ``EXIT_RUNS=20`` for a longer stress run), with real processes; every run must exit 0 with
its report written. The cause itself is checked once, deterministically: the group is freed and its
gloo threads are gone before the interpreter finalizes
(``test_a_group_ddp_was_built_on_is_freed_before_the_interpreter_finalizes``).

The cases: a torchrun-style rank that never destroys its group (``never``), one that destroys it
while DDP holds it (``ddp``), and the mp.spawn-style script of tests/port/scripts ported by
``npu-migrate port`` and run as its users run it: two "nodes", each a fresh interpreter that
spawns its worker (spawn-started, so the worker imports npu_migrate through the script's module).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, child_env, free_port, run_cli, run_ranks

SCRIPTS = Path(__file__).with_name("scripts")
PORT_SCRIPTS = ROOT / "tests" / "port" / "scripts"
RUNS = int(os.environ.get("EXIT_RUNS", "5"))  # each run is two fresh interpreters (four for spawn)


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


@pytest.mark.slow
def test_a_group_ddp_was_built_on_is_freed_before_the_interpreter_finalizes(tmp_path: Path) -> None:
    """torch alone keeps it (its ``group=group.WORLD`` defaults, imported with DDP); the exit hook frees it.

    On torch 2.14 the group kept holds its gloo threads too (measured; on torch 2.1 to 2.7
    destroy_process_group stops them even while the group object lives on).
    """
    (tmp_path / "torch").mkdir()
    (tmp_path / "hook").mkdir()
    kept = run_ranks(SCRIPTS / "exit_threads.py", 1, tmp_path / "torch", HOOK="0")
    freed = run_ranks(SCRIPTS / "exit_threads.py", 1, tmp_path / "hook")
    assert kept[0]["group_alive"] and freed[0]["group_alive"] is False
    if freed[0]["threads"] is not None:  # Linux: the threads themselves
        assert not {"pt_gloo_runloop", "gloo_tcp_loop"} & set(freed[0]["threads"]), freed[0]["threads"]


@pytest.fixture(scope="module")
def ported_spawn(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/port/scripts/cuda_spawn.py as ``npu-migrate port`` writes it."""
    out = tmp_path_factory.mktemp("ported")
    result = run_cli("port", str(PORT_SCRIPTS), "--out", str(out))
    assert result.returncode == 0, result.stderr
    script = out / "cuda_spawn.py"
    assert "import npu_migrate as nm" in script.read_text()  # what installs the exit hook, in the workers too
    return script


@pytest.mark.long
@pytest.mark.parametrize("run", range(RUNS))
def test_a_finished_ported_spawn_job_exits_0_every_time(ported_spawn: Path, run: int, tmp_path: Path) -> None:
    """Two nodes of one spawned worker each: every process exits 0, and mp.spawn saw no signal."""
    port = str(free_port())
    nodes = [
        subprocess.Popen([sys.executable, str(ported_spawn), "--world-size", "2", "--rank", str(node),
                          "--port", port, "--out-dir", str(tmp_path)],
                         env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for node in (0, 1)
    ]
    try:
        logs = [proc.communicate(timeout=180)[0] for proc in nodes]
    finally:
        for proc in nodes:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert [proc.returncode for proc in nodes] == [0, 0], "\n".join(logs)
    assert not any("terminate called" in log for log in logs), "\n".join(logs)
    reports = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert reports[0]["params"] == reports[1]["params"] and {r["world_size"] for r in reports} == {2}
