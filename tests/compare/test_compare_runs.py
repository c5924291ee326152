"""``--probe`` and ``npu-migrate compare`` on real 2-rank runs of the MNIST example, on CPU and on the simulated NPU.

Each run is the example's ``--dry-run`` (2 optimizer steps per rank) on the offline digits,
through ``python -m npu_migrate.launch --device-num 2 --probe DIR --probe-level modules``. Runs
are shared by the tests of this module (module-scoped fixtures) to keep the suite short. What
is checked is what a user sees: exit codes, the summary, the ``--json`` file and the rank files.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import FAKE_NPU, ROOT, child_env, run_cli

# The shared runs are made by the first test that needs them: allow for their start-up.
pytestmark = [pytest.mark.timeout(900), pytest.mark.long]  # every test reads training runs a module fixture records

EXAMPLES = ROOT / "examples"
SCRIPTS = Path(__file__).with_name("scripts")
MNIST_ARGS = ["--dataset", "digits", "--dry-run"]


def launch_probe(tmp: Path, name: str, *script_args: str, probe_args: tuple = (), script: Path = EXAMPLES / "mnist.py",
                 paths: tuple = (), timeout: float = 240, **env: str) -> Path:
    """Run SCRIPT on 2 ranks with --probe tmp/NAME; return the probe directory (the run must succeed)."""
    out = tmp / name
    cmd = [sys.executable, "-m", "npu_migrate.launch", "--device-num", "2", "--probe", str(out),
           "--probe-level", "modules", *probe_args, str(script), *script_args]
    result = subprocess.run(cmd, env=child_env(*paths, **env), cwd=tmp, capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    return out


def compare(*args: str) -> tuple[subprocess.CompletedProcess, dict]:
    """``npu-migrate compare ARGS --json F``: the process and the parsed JSON (empty on usage errors)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "cmp.json"
        result = run_cli("compare", *args, "--json", str(path))
        data = json.loads(path.read_text()) if path.exists() else {}
    return result, data


@pytest.fixture(scope="module")
def cpu_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The CPU baseline run of MNIST; it saves the initial weights to ../init.pt."""
    tmp = tmp_path_factory.mktemp("cpu_runs")
    base = launch_probe(tmp, "base", *MNIST_ARGS, "--data-dir", str(tmp / "data"),
                        probe_args=("--probe-seed-checkpoint", str(tmp / "init.pt")))
    assert (tmp / "init.pt").exists(), "the first run saves its initial weights"
    return base


@pytest.fixture(scope="module")
def cpu_runs(cpu_base: Path) -> dict[str, Path]:
    """The baseline, a repeat, one with fc1's output shifted by 1e-2, one in bf16 autocast (all on CPU)."""
    tmp = cpu_base.parent
    data = ["--data-dir", str(tmp / "data")]
    seed = ("--probe-seed-checkpoint", str(tmp / "init.pt"))
    runs = {"base": cpu_base}
    runs["repeat"] = launch_probe(tmp, "repeat", *MNIST_ARGS, *data, probe_args=seed)
    runs["fault"] = launch_probe(tmp, "fault", str(EXAMPLES / "mnist.py"), *MNIST_ARGS, *data, probe_args=seed,
                                 script=SCRIPTS / "with_fault.py", NPU_MIGRATE_TEST_FAULT="fc1")
    runs["bf16"] = launch_probe(tmp, "bf16", *MNIST_ARGS, "--amp", *data, probe_args=seed)
    return runs


def rank_lines(directory: Path, rank: int) -> list[dict]:
    return [json.loads(line) for line in (directory / f"rank{rank}.jsonl").read_text().splitlines()]


def test_recording_has_a_header_and_every_step_on_every_rank(cpu_base: Path) -> None:
    for rank in (0, 1):
        lines = rank_lines(cpu_base, rank)
        header = lines[0]
        assert header["kind"] == "header" and header["rank"] == rank and header["world_size"] == 2
        assert header["device"] == "cpu" and header["default_dtype"] == "float32" and header["seed"] == 1
        assert header["versions"]["torch"] and header["settings"]["level"] == "modules"
        steps = [r for r in lines if r["kind"] == "step"]
        assert [s["step"] for s in steps] == [1, 2]
        assert all(s["loss"] > 0 and s["grad_norm"] > 0 and s["lr"] == 1.0 and s["backwards"] == 1 for s in steps)
        assert [r["step"] for r in lines if r["kind"] == "modules"] == [1, 2]
        layout = next(r for r in lines if r["kind"] == "layout")
        modules = {e[0] for e in layout["entries"]}
        assert {"conv1", "conv2", "fc1", "fc2", "dropout1", "SimpleCNN"} <= modules
        assert lines[-1]["kind"] == "end" and lines[-1]["module_records"] > 0


def test_same_seed_same_device_is_exact(cpu_runs: dict[str, Path]) -> None:
    result, data = compare(str(cpu_runs["base"]), str(cpu_runs["repeat"]), "--exact")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "PASS" in result.stdout
    assert data["passed"] and data["max_abs"] == 0 and data["modules"]["entries_compared"] > 0
    assert data["metrics"]["loss"]["compared"] == 4  # 2 ranks x 2 steps


def test_injected_fault_names_the_layer_not_its_successors(cpu_runs: dict[str, Path]) -> None:
    result, data = compare(str(cpu_runs["base"]), str(cpu_runs["fault"]))
    assert result.returncode == 1, result.stdout + result.stderr
    culprit = data["culprit"]
    assert culprit["module"] == "fc1" and culprit["phase"] == "forward" and culprit["step"] == 1
    assert culprit["worst"]["entry"].startswith("fc1 forward output")
    assert {"dropout2", "fc2", "SimpleCNN"} <= set(culprit["inherited"])
    assert data["first_step"] == 1
    assert "**First culprit:** `fc1` (forward, step 1" in result.stdout
    assert "DIVERGED" in result.stdout


def test_bf16_autocast_against_float32_passes_under_dtype_defaults(cpu_runs: dict[str, Path]) -> None:
    steps = [r for r in rank_lines(cpu_runs["bf16"], 0) if r["kind"] == "step"]
    assert {s["autocast"] for s in steps} == {"bfloat16"}
    result, data = compare(str(cpu_runs["base"]), str(cpu_runs["bf16"]))
    assert result.returncode == 0, result.stdout + result.stderr
    assert data["max_rel"] > 1e-3, "bfloat16 does differ from float32; the defaults absorb it"
    exact, _ = compare(str(cpu_runs["base"]), str(cpu_runs["bf16"]), "--exact")
    assert exact.returncode == 1


def test_plot_and_markdown_outputs(cpu_runs: dict[str, Path], tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="--plot needs matplotlib (the [compare] extra)")
    png, md = tmp_path / "cmp.png", tmp_path / "cmp.md"
    result = run_cli("compare", str(cpu_runs["base"]), str(cpu_runs["fault"]), "--plot", str(png),
                     "--markdown", str(md))
    assert result.returncode == 1
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert md.read_text().strip() == result.stdout.strip()


@pytest.mark.fake_npu
@pytest.mark.skipif(not hasattr(torch._C, "_acc"),
                    reason="the torch_npu stand-in needs torch._C._acc (torch.accelerator), missing in this torch")
def test_simulated_npu_runs_compare_with_each_other_and_with_the_cpu_baseline(cpu_base: Path, tmp_path: Path) -> None:
    data_dir = ["--data-dir", str(tmp_path / "data")]
    npu = dict(paths=(FAKE_NPU,), FAKE_NPU_DEVICE_COUNT="2")
    seed = ("--probe-seed-checkpoint", str(cpu_base.parent / "init.pt"))
    base = launch_probe(tmp_path, "npu", *MNIST_ARGS, *data_dir, probe_args=seed, **npu)
    fault = launch_probe(tmp_path, "npu_fault", str(EXAMPLES / "mnist.py"), *MNIST_ARGS, *data_dir, probe_args=seed,
                         script=SCRIPTS / "with_fault.py", NPU_MIGRATE_TEST_FAULT="fc1", **npu)
    assert rank_lines(base, 1)[0]["device"] == "npu"
    result, data = compare(str(base), str(fault))
    assert result.returncode == 1 and data["culprit"]["module"] == "fc1", result.stdout
    # a baseline recorded elsewhere (here: on CPU) is read from its self-describing files
    result, data = compare(str(cpu_base), str(base))
    assert result.returncode == 0, result.stdout + result.stderr
    assert (data["a"]["device"], data["b"]["device"]) == ("cpu", "npu")
