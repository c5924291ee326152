"""The npu-migrate command as a user runs it: exit codes, one-line errors, the env report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import BROKEN_NPU, MISMATCHED_NPU, ROOT, child_env, run_cli

REQUIRED_KEYS = {"device_type", "backend", "device_count", "torch_version", "torch_npu_version"}


def assert_one_line_error(result: subprocess.CompletedProcess, code: int, *needles: str) -> str:
    assert result.returncode == code, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0]
    return lines[0]


def test_env_json_here_is_cpu_gloo() -> None:
    result = run_cli("env", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert REQUIRED_KEYS <= report.keys()
    assert (report["device_type"], report["backend"], report["device_count"]) == ("cpu", "gloo", 1)
    assert report["torch_version"] == torch.__version__
    assert report["torch_npu_version"] is None


def test_env_text_names_family_and_source() -> None:
    result = run_cli("env", env=child_env(NPU_MIGRATE_DEVICE="cpu", HCCL_CONNECT_TIMEOUT="600"))
    assert result.returncode == 0, result.stderr
    assert "device_type          cpu (NPU_MIGRATE_DEVICE)" in result.stdout
    assert "HCCL_CONNECT_TIMEOUT=600" in result.stdout


def test_forcing_npu_without_torch_npu_fails_in_one_line() -> None:
    result = run_cli("env", env=child_env(NPU_MIGRATE_DEVICE="npu"))
    assert_one_line_error(result, 1, "torch_npu", "pip install")


def test_broken_torch_npu_fails_in_one_line() -> None:
    result = run_cli("env", "--device", "npu", env=child_env(BROKEN_NPU))
    assert_one_line_error(result, 1, "failed to import: libascendcl.so", "set_env.sh")


def test_broken_torch_npu_is_a_warning_when_detecting() -> None:
    report = json.loads(run_cli("env", "--json", env=child_env(BROKEN_NPU)).stdout)
    assert report["device_type"] == "cpu"
    assert any("libascendcl.so" in w for w in report["warnings"])


def test_mismatched_torch_npu_fails_in_one_line() -> None:
    result = run_cli("env", "--device", "npu", env=child_env(MISMATCHED_NPU))
    assert_one_line_error(result, 1, "torch_npu 2.1.0.post3", f"torch {torch.__version__}")


@pytest.mark.parametrize("how", ["flag", "variable"])
def test_unknown_family_is_a_usage_error_listing_families(how: str) -> None:
    if how == "flag":
        result = run_cli("env", "--device", "gpu")
    else:
        result = run_cli("env", env=child_env(NPU_MIGRATE_DEVICE="gpu"))
    assert_one_line_error(result, 2, "Unknown device 'gpu'", "Expected one of: auto, npu, cuda, cpu")


def test_console_script_matches_python_dash_m() -> None:
    script = Path(sys.executable).with_name("npu-migrate")
    if not script.exists():
        pytest.skip("npu-migrate is not installed next to this interpreter (not a pip install)")
    result = subprocess.run([str(script), "env", "--json"], capture_output=True, text=True, env=child_env(), cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["device_type"] == "cpu"


def test_version_and_missing_subcommand() -> None:
    assert run_cli("--version").stdout.startswith("npu-migrate 0.1.0")
    assert run_cli().returncode == 2
