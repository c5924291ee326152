"""Ranks as under torchrun: a script written the way users write them, through every way ranks start.

The script (``scripts/workers_job.py``) uses what training scripts use: DataLoader workers in each
multiprocessing context (with ``persistent_workers`` and ``pin_memory``), a ``multiprocessing.Pool``
of the rank's own, a ``subprocess``, ``torch.multiprocessing.spawn`` inside a rank, autocast, a
checkpoint loaded with ``weights_only=True``, an ``atexit`` handler and a ``TemporaryDirectory``.
Each case checks what the user would: every sample of each rank's shard seen once per epoch, the
shards covering the data set, the Pool's and the subprocess's answers, multiprocessing as a new
interpreter has it (Python's default start method, ``MainProcess``) and the script's exit handlers
run. ``scripts/unguarded_job.py`` has no ``__main__`` guard and DataLoader workers in the default
context, which torchrun runs.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FAKE_NPU, LAUNCH_SCRIPTS, TESTS, child_env, free_port, run_cli
from support import Launch

WORKERS = LAUNCH_SCRIPTS / "workers_job.py"
UNGUARDED = LAUNCH_SCRIPTS / "unguarded_job.py"
SAMPLES = 48
SECRET = "5e" * 32


@pytest.fixture(scope="module")
def default_start_method() -> str:
    """What ``multiprocessing.get_start_method()`` says in a new interpreter of this Python."""
    return subprocess.run([sys.executable, "-c", "import multiprocessing as m; print(m.get_start_method())"],
                          capture_output=True, text=True, check=True).stdout.strip()


def check_workers(out: Path, world: int, start_method: str, *, mp_spawn: bool = False,
                  process: str = "MainProcess") -> None:
    """Each rank's report, as the module docstring says; ``process``: the name multiprocessing gives
    the rank (a regular expression)."""
    got = [json.loads((out / f"workers{rank}.json").read_text()) for rank in range(world)]
    for epoch in range(2):  # the ranks' shards of each epoch: disjoint, covering the data set
        assert sorted(i for r in got for i in r["shards"][epoch]) == list(range(SAMPLES))
    for rank, r in enumerate(got):
        assert (r["rank"], r["world_size"]) == (rank, world)
        for seen, shard in zip(r["epochs"], r["shards"]):
            assert sorted(seen) == sorted(shard)  # every sample of the shard once per epoch
        assert r["loader_pids"] and r["pid"] not in r["loader_pids"]  # read by worker processes
        assert r["total"] == float(sum(range(SAMPLES)))
        assert (r["squares"], r["echoed"]) == ([0, 1, 4, 9, 16, 25], str(rank))
        assert r["start_method"] == start_method and re.fullmatch(process, r["process"])
        assert (out / f"atexit{rank}").read_text() == "ran"  # the script's exit handlers ran
        assert not Path(r["scratch"]).exists()  # and its TemporaryDirectory's finalizer
        if mp_spawn:
            assert (out / f"mpspawn{rank}-0").exists() and (out / f"mpspawn{rank}-1").exists()


def test_dataloader_workers_pool_and_subprocess_in_a_launched_job(tmp_path: Path, default_start_method: str) -> None:
    job = Launch(tmp_path, "--device-num", "2", str(WORKERS), "--pin-memory")
    assert job.wait() == 0, job.err
    check_workers(tmp_path, 2, default_start_method)
    assert "Traceback" not in job.err + job.outtext  # nothing the rank inherited breaks at its exit


@pytest.mark.slow
@pytest.mark.parametrize("flags", [
    ("--context", "fork"),
    ("--context", "spawn", "--persistent", "--workers", "1"),
    ("--context", "forkserver", "--pin-memory"),
    ("--context", "forkserver", "--mp-spawn"),
], ids=["fork", "spawn-persistent", "forkserver-pinned", "forkserver-mp-spawn"])
def test_each_start_method_of_the_loader(tmp_path: Path, default_start_method: str, flags: tuple[str, ...]) -> None:
    job = Launch(tmp_path, "--device-num", "2", str(WORKERS), *flags)
    assert job.wait() == 0, job.err
    check_workers(tmp_path, 2, default_start_method, mp_spawn="--mp-spawn" in flags)


@pytest.mark.slow
@pytest.mark.parametrize("launcher", [
    ("--migrate",), ("--probe", "{tmp}/probe"), ("--strict-ops",),
], ids=["migrate", "probe", "strict-ops"])
def test_launcher_features_keep_the_workers(tmp_path: Path, default_start_method: str,
                                            launcher: tuple[str, ...]) -> None:
    flags = [arg.format(tmp=tmp_path) for arg in launcher]
    cuda = ["--cuda"] if "--migrate" in flags else []  # an unmodified CUDA script, as --migrate is for
    job = Launch(tmp_path, "--device-num", "2", *flags, str(WORKERS), "--context", "forkserver", *cuda)
    assert job.wait() == 0, job.err
    check_workers(tmp_path, 2, default_start_method)
    if "--probe" in flags:
        assert (tmp_path / "probe" / "rank0.jsonl").exists()


@pytest.mark.slow
def test_a_job_with_a_secret_on_two_nodes(tmp_path: Path, default_start_method: str) -> None:
    port = str(free_port())
    common = ["--nnodes", "2", "--device-num", "1", "--addr", "127.0.0.1", "--port", port, "--join-timeout", "60"]
    nodes = [Launch(tmp_path, *common, "--node-rank", str(node), str(WORKERS), "--context", "forkserver",
                    name=f"node{node}", NPU_MIGRATE_JOB_SECRET=SECRET) for node in (1, 0)]
    for node in nodes:
        assert node.wait() == 0, node.err
    check_workers(tmp_path, 2, default_start_method)


@pytest.mark.slow
@pytest.mark.parametrize("launcher", [(), ("--migrate",)], ids=["launch", "migrate"])
def test_a_script_without_a_main_guard(tmp_path: Path, default_start_method: str, launcher: tuple[str, ...]) -> None:
    job = Launch(tmp_path, "--device-num", "2", *launcher, str(UNGUARDED))
    assert job.wait() == 0, job.err
    for rank in (0, 1):
        got = json.loads((tmp_path / f"unguarded{rank}.json").read_text())
        assert (got["seen"], got["total"], got["start_method"]) == (list(range(24)), 48.0, default_start_method)


@pytest.mark.slow
def test_a_function_target_of_spawn(tmp_path: Path, default_start_method: str) -> None:
    from npu_migrate.launch import spawn
    from launch.scripts.workers_job import train

    spawn(train, args=(["--context", "forkserver", "--out", str(tmp_path)],), nproc=2)
    check_workers(tmp_path, 2, default_start_method)


@pytest.mark.slow
def test_run_of_an_mp_spawn_script(tmp_path: Path) -> None:
    # mp.spawn's children are spawned processes, and Python says so: as without npu_migrate.
    result = run_cli("run", "--device", "cpu", "--device-num", "2", str(WORKERS), "--cuda", "--self-spawn", "2",
                     "--workers", "1", "--persistent", "--out", str(tmp_path),
                     env=child_env(WORKERS_JOB_PORT=str(free_port())), timeout=240)
    assert result.returncode == 0, result.stderr
    check_workers(tmp_path, 2, "spawn", process=r"SpawnProcess-\d+")  # numbered as that torch's spawn numbers them


@pytest.mark.fake_npu
@pytest.mark.slow
def test_the_simulated_npu_family(tmp_path: Path, default_start_method: str) -> None:
    job = Launch(tmp_path, "--migrate", "--device-num", "2", str(WORKERS), "--cuda", "--context", "forkserver",
                 "--pin-memory", paths=(FAKE_NPU,), ASCEND_RT_VISIBLE_DEVICES="0,1")
    assert job.wait() == 0, job.err
    check_workers(tmp_path, 2, default_start_method)


def test_a_system_exit_message_comes_before_the_exit_handlers(tmp_path: Path) -> None:
    # As `python train.py` does: the message of `raise SystemExit("...")` is printed, then the
    # script's exit handlers run; the launcher may stop a rank whose peer ended first, so the
    # line must not wait for the handlers.
    script = tmp_path / "exits.py"
    script.write_text("import atexit, sys\n"
                      "atexit.register(lambda: print('exit handler ran', file=sys.stderr, flush=True))\n"
                      "raise SystemExit('error: the data is not there')\n")
    job = Launch(tmp_path, "--device-num", "1", str(script))
    assert job.wait() == 1, job.err
    lines = job.err.splitlines()
    said = [i for i, line in enumerate(lines) if line.endswith("error: the data is not there")]
    ran = [i for i, line in enumerate(lines) if line.endswith("exit handler ran")]
    assert len(said) == 1 and len(ran) == 1 and said[0] < ran[0], job.err
    assert "Traceback" not in job.err
