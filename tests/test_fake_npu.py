"""The simulated-NPU tier: the real NPU code paths against tests/fake_npu's torch_npu stand-in.

The stand-in changes torch for the whole interpreter (it renames PrivateUse1), so every test
here runs it in child processes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import FAKE_NPU, LAUNCH_SCRIPTS, child_env, run_cli, run_ranks
from npu_migrate.releases import pairs

pytestmark = pytest.mark.fake_npu
TORCH_RELEASE = torch.__version__.split("+")[0]


@pytest.mark.slow
def test_env_detects_npu_and_hccl_first() -> None:
    result = run_cli("env", "--json", env=child_env(FAKE_NPU, NPU_MIGRATE_DEVICE=""))  # detection, not forced
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["device_type"], report["device_source"], report["backend"]) == ("npu", "detected", "hccl")
    assert report["device_count"] == 8
    # The release the stand-in simulates, built for this torch's line (tests/test_fake_npu_surface.py
    # checks it is the one that pairs with it).
    assert pairs.release_of(report["torch_npu_version"]) == pairs.release_of(TORCH_RELEASE)
    assert report["families"]["npu"] is True


@pytest.mark.slow
def test_visible_devices_mask_is_respected() -> None:
    result = run_cli("env", "--json", env=child_env(FAKE_NPU, ASCEND_RT_VISIBLE_DEVICES="4,5"))
    report = json.loads(result.stdout)
    assert report["device_count"] == 2
    assert report["environment"]["ASCEND_RT_VISIBLE_DEVICES"] == "4,5"


@pytest.mark.slow
def test_forcing_cpu_overrides_detected_npu() -> None:
    result = run_cli("env", "--json", env=child_env(FAKE_NPU, NPU_MIGRATE_DEVICE="cpu"))
    report = json.loads(result.stdout)
    assert (report["device_type"], report["device_source"], report["backend"]) == ("cpu", "NPU_MIGRATE_DEVICE", "gloo")


@pytest.mark.slow
def test_cuda_and_nccl_settings_are_flagged_on_npu() -> None:
    env = child_env(FAKE_NPU, CUDA_VISIBLE_DEVICES="0,1", NCCL_SOCKET_IFNAME="eth0", ASCEND_TOOLKIT_HOME="/nonexistent")
    report = json.loads(run_cli("env", "--json", env=env).stdout)
    assert "CUDA_VISIBLE_DEVICES is set but has no effect on npu; set ASCEND_RT_VISIBLE_DEVICES instead." in report["warnings"]
    assert any("NCCL_SOCKET_IFNAME is set but hccl ignores it; look for HCCL_SOCKET_IFNAME" in w for w in report["warnings"])
    assert report["environment"]["NCCL_SOCKET_IFNAME"] == "eth0"


@pytest.mark.slow
def test_two_rank_job_runs_on_hccl_with_one_device_per_rank(tmp_path: Path) -> None:
    reports = run_ranks(LAUNCH_SCRIPTS / "rank_report.py", 2, tmp_path, FAKE_NPU)
    assert {r["rank"] for r in reports} == {0, 1}
    for rank, r in enumerate(reports):
        assert (r["device_type"], r["backend"], r["group_backend"]) == ("npu", "hccl", "hccl")
        assert r["device"] == f"npu:{rank}"
        assert r["current_device_index"] == rank
        assert r["npu_set_device_calls"] == [rank]  # bound once, to its own index
        assert r["all_reduce_sum"] == 3.0


@pytest.mark.slow
def test_more_ranks_than_visible_devices_is_refused(tmp_path: Path) -> None:
    with pytest.raises(AssertionError, match=r"LOCAL_RANK=1 but this process sees only 1 npu device\(s\) \(ASCEND_RT_VISIBLE_DEVICES='3'\)\. Start at most 1 processes per node"):
        run_ranks(LAUNCH_SCRIPTS / "rank_report.py", 2, tmp_path, FAKE_NPU, timeout=60, ASCEND_RT_VISIBLE_DEVICES="3")


@pytest.mark.slow
def test_smoke_job_trains_on_simulated_npus() -> None:
    result = run_cli("smoke", "--nproc", "2", "--steps", "5", env=child_env(FAKE_NPU))
    assert result.returncode == 0, result.stderr
    assert "smoke: ok: 2 ranks on npu/hccl, held-out loss" in result.stdout
