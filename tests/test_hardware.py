"""Hardware tiers: the smoke job, the launcher and an example epoch on real devices.

    python -m pytest -m cuda     # on a host with CUDA devices (nccl)
    python -m pytest -m npu      # on an Ascend host with NPUs (hccl, torch_npu + CANN)

Each job runs one rank per device, two at most: on a host with one device the collectives still go
through the real backend (a world of one), on a host with two or more they cross devices.

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
        env=child_env(real_devices=True, NPU_MIGRATE_DEVICE=family), capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    count = int(probe.stdout.strip() or 0) if probe.returncode == 0 else 0
    detail = probe.stderr.strip().splitlines()[-1] if probe.returncode else f"{family} device count 0"
    return count, f"no {family} device here ({detail})"


@pytest.fixture(scope="module", params=[pytest.param("cuda", marks=pytest.mark.cuda),
                                        pytest.param("npu", marks=pytest.mark.npu)])
def hardware(request: pytest.FixtureRequest) -> tuple[str, int]:
    """(family, ranks): the real family, and one rank per device, two at most."""
    family = request.param
    count, reason = _devices(family)
    if count < 1:
        pytest.skip(reason)
    return family, min(count, 2)


@pytest.fixture
def family(hardware: tuple[str, int]) -> str:
    return hardware[0]


@pytest.fixture
def nproc(hardware: tuple[str, int]) -> int:
    return hardware[1]


def test_smoke_job(family: str, nproc: int) -> None:
    result = run_cli("smoke", "--device", family, "--nproc", str(nproc), env=child_env(real_devices=True, NPU_MIGRATE_DEVICE=family),
                     timeout=600)
    assert result.returncode == 0, result.stderr
    assert f"{nproc} ranks on {family}/{BACKENDS[family]}" in result.stdout
    assert "parameters identical across ranks" in result.stdout


def test_launcher_ranks(family: str, nproc: int, tmp_path: Path) -> None:
    result = run_cli("launch", "--device", family, "--device-num", str(nproc), str(LAUNCH_SCRIPTS / "launch_job.py"),
                     env=child_env(real_devices=True, NPU_MIGRATE_DEVICE=family, OUT_DIR=str(tmp_path)), timeout=600)
    assert result.returncode == 0, result.stderr
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(nproc)]
    for rank, r in enumerate(reports):
        assert (r["backend"], r["device"], r["current_device_index"], r["sum"]) == (
            BACKENDS[family], f"{family}:{rank}", rank, float(sum(range(1, nproc + 1))))


def test_mnist_epoch(family: str, nproc: int, tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "npu_migrate.launch", "--device", family, "--device-num", str(nproc),
           str(ROOT / "examples" / "mnist.py"), "--dataset", "digits", "--epochs", "1",
           "--data-dir", str(tmp_path / "data"), "--metrics", str(tmp_path / "metrics.jsonl")]
    result = subprocess.run(cmd, env=child_env(real_devices=True, NPU_MIGRATE_DEVICE=family), capture_output=True, text=True,
                            timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert f"{nproc} process(es) on {family}" in result.stderr
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows and rows[-1]["test_accuracy"] > 0.5


def test_probe_compares_with_the_cpu_baseline(family: str, nproc: int, tmp_path: Path) -> None:
    """The same MNIST steps from the same weights, on CPU and on the device, agree module by module.

    Dropout is off (the two devices' random streams differ); the device's TF32 or HF32 float32
    convolutions are recorded and compared at their own precision.
    """
    seed = tmp_path / "init.pt"
    runs = {}
    for name in ("cpu", family):  # the CPU run first: it saves the initial weights the device run loads
        runs[name] = tmp_path / name
        cmd = [sys.executable, "-m", "npu_migrate.launch", "--device", name, "--device-num", str(nproc),
               "--probe", str(runs[name]), "--probe-level", "modules", "--probe-seed-checkpoint", str(seed),
               "--probe-no-dropout",
               str(ROOT / "examples" / "mnist.py"), "--dataset", "digits", "--dry-run",
               "--data-dir", str(tmp_path / "data")]
        result = subprocess.run(cmd, env=child_env(real_devices=True, NPU_MIGRATE_DEVICE=name), capture_output=True, text=True,
                                timeout=600, cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-4000:]
    result = run_cli("compare", str(runs["cpu"]), str(runs[family]), "--json", str(tmp_path / "cmp.json"))
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads((tmp_path / "cmp.json").read_text())
    assert (data["a"]["device"], data["b"]["device"]) == ("cpu", family)
    assert "| float32 math | float32 |" in result.stdout, result.stdout
