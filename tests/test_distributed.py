"""init_distributed on the cpu/gloo tier: real processes on loopback, a free port per test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

import npu_migrate as nm
from conftest import LAUNCH_SCRIPTS, free_port, run_cli, run_ranks


def test_single_process_needs_no_launcher() -> None:
    info = nm.init_distributed()
    try:
        assert (info.rank, info.world_size, info.local_rank, info.backend) == (0, 1, 0, "gloo")
        assert info.is_main and info.device_ids is None and str(info.device) == "cpu"
        assert nm.init_distributed() == info  # idempotent
        assert dist.get_world_size() == 1
    finally:
        nm.destroy_distributed()
    assert not dist.is_initialized()


def test_forced_device_is_exported_for_children(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    monkeypatch.delenv("NPU_MIGRATE_DEVICE", raising=False)
    try:
        nm.init_distributed(device="cpu")
        assert os.environ["NPU_MIGRATE_DEVICE"] == "cpu"
    finally:
        nm.destroy_distributed()


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RANK": "0"}, r"RANK is set but WORLD_SIZE is not"),
        ({"WORLD_SIZE": "2"}, r"WORLD_SIZE is set but RANK is not"),
        ({"RANK": "x", "WORLD_SIZE": "2"}, r"RANK='x' is not an integer"),
        ({"RANK": "2", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, r"RANK=2 and WORLD_SIZE=2 are inconsistent"),
        ({"RANK": "1", "WORLD_SIZE": "2"}, r"WORLD_SIZE=2 but LOCAL_RANK is not set"),
        ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}, r"MASTER_ADDR and MASTER_PORT not set for a job of WORLD_SIZE=2"),
    ],
)
def test_bad_environment_is_one_clear_error(monkeypatch: pytest.MonkeyPatch, env: dict, message: str) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(nm.DistributedConfigError, match=message):
        nm.init_distributed()
    assert not dist.is_initialized()


@pytest.mark.slow
def test_two_ranks_torchrun_style(tmp_path: Path) -> None:
    reports = run_ranks(LAUNCH_SCRIPTS / "rank_report.py", 2, tmp_path)
    assert {r["rank"] for r in reports} == {0, 1}
    for rank, r in enumerate(reports):
        assert r["world_size"] == 2 and r["local_rank"] == rank and r["node_rank"] == 0
        assert (r["device_type"], r["backend"], r["group_backend"], r["device"]) == ("cpu", "gloo", "gloo", "cpu")
        assert r["all_reduce_sum"] == 3.0
        assert r["same_on_second_call"]


@pytest.mark.slow
def test_two_ranks_spawned_like_seed_003(tmp_path: Path) -> None:
    from launch.scripts.spawn_job import worker

    mp.spawn(worker, args=(2, free_port(), str(tmp_path)), nprocs=2)
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["rank"] for r in reports] == [0, 1]
    assert all(r["backend"] == "gloo" and r["ranks"] == [0, 1] and r["sum"] == [3.0] * 3 for r in reports)


@pytest.mark.slow
def test_smoke_command_trains_two_ranks() -> None:
    result = run_cli("smoke", "--nproc", "2", "--steps", "5")
    assert result.returncode == 0, result.stderr
    assert "smoke: ok: 2 ranks on cpu/gloo, held-out loss" in result.stdout
    assert "parameters identical across ranks" in result.stdout


@pytest.mark.parametrize(("args", "message"), [
    (["--nproc", "0"], "--nproc 0 is not positive"),
    (["--steps", "0"], "--steps 0 is not positive"),
])
def test_smoke_refuses_bad_input_in_one_line(args: list[str], message: str) -> None:
    result = run_cli("smoke", *args)
    assert result.returncode == 2  # a usage error, as argparse's own
    assert result.stderr.strip().splitlines() == [f"npu-migrate: error: {message}: expected at least 1 " + ("process." if "nproc" in message else "step.")]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["nm", "torch", "ddp"])
def test_destroying_a_group_right_after_a_collective_never_hangs(tmp_path: Path, mode: str) -> None:
    # Before torch 2.8 this could hang on the way out (torch 2.1.2: every run of 20 rounds); the
    # job is killed at the timeout, so a hang fails here instead of stalling the suite.
    reports = run_ranks(LAUNCH_SCRIPTS / "teardown_job.py", 2, tmp_path, timeout=180, MODE=mode)
    assert [r["rounds"] for r in reports] == [20, 20]
    assert all(s == 8.0 for r in reports for s in r["sums"])  # 4 ones from each of 2 ranks
