"""Under ``npu-migrate run``, flash_attn, xformers and apex imports resolve to npu_migrate.libs and are reported.

Each test runs a real ``npu-migrate run`` on a script written here, on the CPU tier and on the
simulated NPU (tests/fake_npu first on the path), and checks what the script printed, its exit
code and the migrate report.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import FAKE_NPU, child_env, run_cli

SCRIPT = '''
import flash_attn
from flash_attn import flash_attn_func, flash_attn_varlen_func, flash_attn_qkvpacked_func, flash_attn_kvpacked_func
from flash_attn.flash_attn_interface import flash_attn_func as interface_func
import xformers.ops as xops
from xformers.ops import LowerTriangularMask, LowerTriangularFromBottomRightMask, BlockDiagonalMask
from xformers.ops.fmha.attn_bias import BlockDiagonalCausalMask
from apex.optimizers import FusedAdam, FusedSGD
from apex.normalization import FusedLayerNorm, FusedRMSNorm
from apex import amp
import torch

q = torch.randn(2, 5, 4, 8, device="cuda")
k = torch.randn(2, 7, 2, 8, device="cuda")
out = flash_attn_func(q, k, k, causal=True)
assert interface_func is flash_attn_func
x = xops.memory_efficient_attention(q, k, k, attn_bias=LowerTriangularFromBottomRightMask())
torch.testing.assert_close(out, x)
mask = BlockDiagonalMask.from_seqlens([2, 3])
y = xops.memory_efficient_attention(q[:1, :5], q[:1, :5], q[:1, :5], attn_bias=mask.make_causal())
model = torch.nn.Sequential(torch.nn.Linear(8, 8), FusedRMSNorm(8), FusedLayerNorm(8)).cuda()
opt = FusedAdam(model.parameters(), lr=1e-3)
model(out.sum(2)).sum().backward()
opt.step()
try:
    import flash_attn.layers.rotary
except ImportError as exc:
    print("rotary:", exc)
print("flash_attn", flash_attn.__version__, "device", out.device.type)
'''


def _run(tmp_path: Path, *paths: Path) -> tuple[str, str]:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    report = tmp_path / "report.md"
    result = run_cli("run", "--migrate-report", str(report), str(script), env=child_env(*paths), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout, report.read_text()


def _check_report(report: str) -> None:
    for api in ("flash_attn.flash_attn_func", "flash_attn.flash_attn_varlen_func", "xformers.ops.memory_efficient_attention",
                "xformers.ops.LowerTriangularFromBottomRightMask", "xformers.ops.BlockDiagonalMask",
                "apex.optimizers.FusedAdam", "apex.normalization.FusedRMSNorm"):
        assert f"`{api}`" in report, f"{api} missing from the report:\n{report}"
    assert "served by npu_migrate.libs.flash_attn" in report
    assert "train.py:" in report.split("`flash_attn.flash_attn_func`")[1].splitlines()[0]  # the user's line


@pytest.mark.slow
def test_imports_resolve_on_cpu_and_are_reported(tmp_path: Path) -> None:
    stdout, report = _run(tmp_path)
    assert "device cpu" in stdout and "flash_attn 2.7.4" in stdout
    assert "rotary: No module named 'flash_attn.layers'" in stdout and "guard the import" in stdout
    _check_report(report)


@pytest.mark.slow
@pytest.mark.fake_npu
def test_imports_resolve_on_the_simulated_npu(tmp_path: Path) -> None:
    stdout, report = _run(tmp_path, FAKE_NPU)
    assert "device npu" in stdout
    _check_report(report)


@pytest.mark.slow
def test_an_installed_cuda_build_is_replaced_off_cuda(tmp_path: Path) -> None:
    """flash_attn installed (its CUDA extension cannot load here): the target is not CUDA, so ours serves."""
    site = tmp_path / "site"
    (site / "flash_attn").mkdir(parents=True)
    (site / "flash_attn" / "__init__.py").write_text('raise ImportError("flash_attn_2_cuda: libcudart.so.12 not found")\n')
    script = tmp_path / "t.py"
    script.write_text("from flash_attn import flash_attn_func\nprint(flash_attn_func.__module__)\n")
    result = run_cli("run", str(script), env=child_env(site), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "npu_migrate.libs.flash_attn"


def test_without_migration_nothing_is_served(tmp_path: Path) -> None:
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", "import npu_migrate.migrate.libraries.libs_hook as h; h.register(); "
                           "import flash_attn"], env=child_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "No module named 'flash_attn'" in proc.stderr


@pytest.mark.slow
def test_launch_migrate_serves_an_import_made_before_torch(tmp_path: Path) -> None:
    """A torchrun-style worker that imports flash_attn first: the finder arms the migration by importing torch."""
    import subprocess
    import sys

    script = tmp_path / "worker.py"
    script.write_text(
        "from flash_attn import flash_attn_func\n"
        "import os\nimport torch\nimport torch.distributed as dist\n"
        "dist.init_process_group('nccl')\n"
        "q = torch.randn(1, 4, 2, 8, device=f\"cuda:{os.environ['LOCAL_RANK']}\")\n"
        "out = flash_attn_func(q, q, q, causal=True)\n"
        "print('rank', dist.get_rank(), out.device.type, flash_attn_func.__module__)\n"
        "dist.destroy_process_group()\n")
    report = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "npu_migrate.launch", "--migrate", "--device", "cpu", "--device-num",
                           "2", "--migrate-report", str(report), str(script)],
                          env=child_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in (0, 1):
        assert f"rank {rank} cpu npu_migrate.libs.flash_attn" in proc.stdout
    import json

    assert json.loads(report.read_text())["apis"]["flash_attn.flash_attn_func"]["processes"] == 2


def test_uninstall_stops_serving() -> None:
    import importlib
    import sys

    from npu_migrate import migrate

    def forget() -> None:
        for name in [n for n in sys.modules if n.partition(".")[0] in ("flash_attn", "apex")]:
            del sys.modules[name]

    forget()
    try:
        with migrate.enabled(device="cpu"):
            assert importlib.import_module("flash_attn").flash_attn_func.__module__ == "npu_migrate.libs.flash_attn"
            assert importlib.import_module("apex.amp").initialize.__module__ == "npu_migrate.libs.apex_amp"
        forget()
        with pytest.raises(ModuleNotFoundError, match="No module named 'flash_attn'"):
            importlib.import_module("flash_attn")
    finally:
        forget()


def test_every_served_module_has_an_implementation_with_public_names() -> None:
    import importlib

    from npu_migrate.libs.table import MODULES

    for name, impl in MODULES.items():
        if impl:
            module = importlib.import_module(impl)
            assert module.__all__ and all(hasattr(module, n) for n in module.__all__), name
