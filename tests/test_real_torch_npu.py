"""The real torch-npu wheel on a node without CANN: every command says why in one line, cpu keeps working.

This tier needs the wheel, installed apart from the suite's environment (it breaks ``import torch``
for every process that can see it):

    pip install --no-deps --target DIR torch-npu==<the [npu] extra's release, which declares the pinned torch> pyyaml
    NPU_MIGRATE_REAL_TORCH_NPU=DIR python -m pytest -m real_torch_npu

``.ci/run`` does exactly that. Elsewhere the tests skip, saying so.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
from pathlib import Path

import pytest

from conftest import LAUNCH_SCRIPTS, TORCH_AUTOLOADS, child_env, run_cli

pytestmark = pytest.mark.real_torch_npu

REAL = os.environ.get("NPU_MIGRATE_REAL_TORCH_NPU")
if not REAL or not any(Path(REAL).glob("torch_npu-*.dist-info")):
    pytest.skip("the real torch-npu wheel is not installed: set NPU_MIGRATE_REAL_TORCH_NPU to a "
                "`pip install --target` directory holding it (.ci/run does)", allow_module_level=True)
if not TORCH_AUTOLOADS:
    pytest.skip("this torch does not auto-load device extensions (torch < 2.5)", allow_module_level=True)

REAL_PATH = Path(REAL)
WHEEL = next(d for d in importlib.metadata.distributions(path=[REAL]) if d.metadata["Name"] in ("torch_npu", "torch-npu"))
WHEEL_VERSION = WHEEL.version
FIX = ("source /usr/local/Ascend/ascend-toolkit/set_env.sh", "TORCH_DEVICE_BACKEND_AUTOLOAD=0")


def real_env(**extra: str) -> dict[str, str]:
    # No family forced: as on a user's node, where detection runs.
    return child_env(REAL_PATH, NPU_MIGRATE_DEVICE="", **extra)


def one_line(result, code: int) -> str:
    assert result.returncode == code, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text("import torch\nprint('trained on', torch.zeros(1).device)\n")
    return path


@pytest.mark.parametrize("command", ["env", "launch", "run", "python -m npu_migrate.launch"])
def test_every_command_names_what_failed_and_both_fixes(command: str, script: Path) -> None:
    if command == "env":
        result = run_cli("env", env=real_env())
    elif command == "python -m npu_migrate.launch":
        import subprocess
        import sys

        result = subprocess.run([sys.executable, "-m", "npu_migrate.launch", "--device-num", "1", str(script)],
                                env=real_env(), capture_output=True, text=True, timeout=120)
    else:
        result = run_cli(command, str(script), env=real_env())
    line = one_line(result, 1)
    assert "it auto-loads torch_npu, which failed: " in line
    assert ".so" in line  # the library CANN would provide (libhccl.so, libascendcl.so...)
    for fix in FIX:
        assert fix in line


def test_env_with_cpu_forced_reports_the_wheel(script: Path) -> None:
    result = run_cli("env", "--json", "--device", "cpu", env=real_env())
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert (report["device_type"], report["backend"]) == ("cpu", "gloo")
    assert report["torch_npu_version"] == WHEEL_VERSION
    assert report["environment"]["TORCH_DEVICE_BACKEND_AUTOLOAD"] == "0"
    # The pair, from the wheel's METADATA: .ci/run installs the release that declares the pinned torch.
    from npu_migrate.releases import pairs

    assert report["torch_npu_requires"] == pairs.requirement_of_metadata(WHEEL.requires or [])
    assert report["torch_pair_declared"] is True
    assert not any("does not declare" in w for w in report["warnings"])


def test_launch_with_cpu_forced_runs_its_workers(tmp_path: Path) -> None:
    result = run_cli("launch", "--device", "cpu", "--device-num", "2", str(LAUNCH_SCRIPTS / "launch_job.py"),
                     env=real_env(OUT_DIR=str(tmp_path)))
    assert result.returncode == 0, result.stderr
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [(r["backend"], r["device"], r["sum"]) for r in reports] == [("gloo", "cpu", 3.0)] * 2


def test_run_with_cpu_forced_runs_the_script(script: Path) -> None:
    result = run_cli("run", "--device", "cpu", str(script), env=real_env())
    assert result.returncode == 0, result.stderr
    assert "trained on cpu" in result.stdout


def test_cuda_forced_never_loads_torch_npu(script: Path) -> None:
    result = run_cli("env", "--json", "--device", "cuda", env=real_env())
    if result.returncode == 0:  # a GPU host
        assert json.loads(result.stdout)["device_type"] == "cuda"
    else:
        line = one_line(result, 1)
        assert "No cuda device is visible" in line or "not supported by this torch build" in line
        assert "torch_npu" not in line
