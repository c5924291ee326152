"""Hardware tiers: the smoke job, the launcher with 2 ranks and an example epoch on real devices.

    python -m pytest -m cuda     # on a host with 2 or more CUDA devices (nccl)
    python -m pytest -m npu      # on an Ascend host with 2 or more NPUs (hccl, torch_npu + CANN)

Each test skips, with the reason, where the hardware is missing. Nothing here uses the stand-ins:
the family is forced, so a test can only pass on the real device and backend.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import LAUNCH_SCRIPTS, ROOT, child_env, run_cli

BACKENDS = {"cuda": "nccl", "npu": "hccl"}


def _devices(family: str) -> tuple[int, str]:
    """(count, reason if unusable) for a real family on this host."""
    if family == "npu" and importlib.util.find_spec("torch_npu") is None:
        return 0, "torch_npu is not installed (no Ascend stack on this host)"
    if family == "cuda" and torch.version.cuda is None:
        return 0, f"this torch build ({torch.__version__}) has no CUDA"
    probe = subprocess.run(
        [sys.executable, "-c", f"import npu_migrate as nm; print(nm.device_count() if nm.is_available({family!r}) else 0)"],
        env=child_env(NPU_MIGRATE_DEVICE=family), capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    count = int(probe.stdout.strip() or 0) if probe.returncode == 0 else 0
    return count, f"fewer than 2 {family} devices here ({count})"


def _family(request: pytest.FixtureRequest) -> str:
    family = request.param
    count, reason = _devices(family)
    if count < 2:
        pytest.skip(reason)
    return family


@pytest.fixture(params=[pytest.param("cuda", marks=pytest.mark.cuda), pytest.param("npu", marks=pytest.mark.npu)])
def family(request: pytest.FixtureRequest) -> str:
    return _family(request)


def test_smoke_job(family: str) -> None:
    result = run_cli("smoke", "--device", family, "--nproc", "2", env=child_env(NPU_MIGRATE_DEVICE=family), timeout=600)
    assert result.returncode == 0, result.stderr
    assert f"2 ranks on {family}/{BACKENDS[family]}" in result.stdout
    assert "parameters identical across ranks" in result.stdout


def test_launcher_two_ranks(family: str, tmp_path: Path) -> None:
    result = run_cli("launch", "--device", family, "--device-num", "2", str(LAUNCH_SCRIPTS / "launch_job.py"),
                     env=child_env(NPU_MIGRATE_DEVICE=family, OUT_DIR=str(tmp_path)), timeout=600)
    assert result.returncode == 0, result.stderr
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for rank, r in enumerate(reports):
        assert (r["backend"], r["device"], r["current_device_index"], r["sum"]) == (
            BACKENDS[family], f"{family}:{rank}", rank, 3.0)


def test_mnist_epoch(family: str, tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "npu_migrate.launch", "--device", family, "--device-num", "2",
           str(ROOT / "examples" / "mnist.py"), "--dataset", "digits", "--epochs", "1",
           "--data-dir", str(tmp_path / "data"), "--metrics", str(tmp_path / "metrics.jsonl")]
    result = subprocess.run(cmd, env=child_env(NPU_MIGRATE_DEVICE=family), capture_output=True, text=True,
                            timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert f"2 process(es) on {family}" in result.stderr
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows and rows[-1]["test_accuracy"] > 0.5
