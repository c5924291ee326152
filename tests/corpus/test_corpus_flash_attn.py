"""A public training script that imports flash_attn, run unmodified under migration and run as ported.

The script is ALLaMo's trainer (chrisociepa/allamo, MIT, 2023; ``allamo_flash_attn/``): its model
imports ``from flash_attn import flash_attn_func`` and, when that import works, computes every
attention with ``flash_attn_func(q, k, v, dropout_p=..., causal=True)``; its defaults are
``device='cuda'``, ``dtype='float16'`` (autocast + GradScaler) and fused AdamW. Settings are made
tiny through its own argparse flags; data is nanoGPT's uint16 memmap layout from stand_ins.py.

- ``npu-migrate run`` on CPU and on the simulated NPU (tests/fake_npu): flash_attn is served by
  npu_migrate.libs, which the migrate report says, and the loss goes down.
- ``npu-migrate port``: the import becomes ``npu_migrate.libs.flash_attn``; the port trains on CPU
  with no runtime migration.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import FAKE_NPU, child_env, run_cli
from corpus import stand_ins

ENTRY = Path(__file__).resolve().parent / "allamo_flash_attn"
_SERVED = "served by npu_migrate.libs.flash_attn"
_RUN_TIMEOUT_S = 300  # the simulated NPU tier takes about 40 s on 2 busy cores


def _tiny(vocab: int, iters: int) -> list[str]:
    """The script's own flags for a one-layer, 32-wide model and ``iters`` steps, evaluated 3 times."""
    every = iters // 2
    return [
        "--dataset=tiny", f"--vocab_size={vocab}", "--n_layer=1", "--n_head=2", "--head_size=16", "--n_embd=32",
        "--multiple_of=32", "--block_size=32", "--batch_size=8", "--gradient_accumulation_steps=1",
        f"--max_iters={iters}", f"--eval_interval={every}", "--eval_iters=2", f"--log_interval={every}",
        "--learning_rate=0.01", "--warmup_iters=0", f"--lr_decay_iters={iters}", "--min_lr=0.001",
    ]


def _workdir(tmp_path: Path) -> tuple[Path, int]:
    """A copy of the entry to run in, with the stand-in dataset in ``data/tiny``; returns it and the vocabulary size."""
    work = tmp_path / "allamo"
    shutil.copytree(ENTRY, work, ignore=shutil.ignore_patterns("SOURCE.json", "LICENSE", "__pycache__"))
    return work, stand_ins.char_memmaps(work / "data" / "tiny")


def _val_losses(console: str) -> dict[int, float]:
    """The script's ``iter N: train loss=X ... val loss=Y`` evaluation lines, as {N: Y}."""
    return {int(m[1].replace(",", "")): float(m[2])
            for m in re.finditer(r"iter ([\d,]+): train loss=[\d.]+ .*? val loss=([\d.]+)", console)}


def _cpu_fused_adamw() -> bool:
    """Whether this torch has fused AdamW kernels for CPU tensors (torch >= 2.4)."""
    try:
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices
    except ImportError:
        return False
    return "cpu" in _get_fused_kernels_supported_devices()


_needs_cpu_fused_adamw = pytest.mark.skipif(not _cpu_fused_adamw(), reason=(
    f"believing it runs on CUDA, the script asks for AdamW(fused=True); fused AdamW for CPU tensors needs "
    f"torch >= 2.4 (torch {torch.__version__})"))


def _migrated_run(work: Path, vocab: int, iters: int, *paths: Path) -> tuple[str, dict]:
    """``npu-migrate run --migrate-report R train.py FLAGS`` as fetched; returns the console and the report."""
    report = work / "migration-report.json"
    result = subprocess.run([sys.executable, "-m", "npu_migrate", "run", "--migrate-report", str(report), "train.py",
                             *_tiny(vocab, iters)], cwd=work, env=child_env(*paths), capture_output=True, text=True,
                            timeout=_RUN_TIMEOUT_S)
    console = result.stdout + result.stderr
    assert result.returncode == 0, console[-4000:]
    return console, json.loads(report.read_text())


def _check_migrated(console: str, report: dict, iters: int, target: str) -> None:
    assert report["targets"] == [target], report  # where the CUDA calls went (and flash_attn ran)
    # The model's flash_attn import worked, so every attention went through flash_attn_func.
    assert "Using Flash Attention 2" in console, console[-4000:]
    assert "Using fused AdamW: True" in console  # it believed it was on CUDA
    losses = _val_losses(console)
    assert sorted(losses) == [0, iters // 2, iters], console[-4000:]
    assert losses[iters] < losses[0] - 1.0, losses  # the loss went down
    served = report["apis"]["flash_attn.flash_attn_func"]
    assert served["kind"] == "redirected" and served["detail"] == _SERVED, served
    assert served["first_site"].endswith("model.py:19"), served  # the script's own import line
    assert {'torch.autocast(device_type="cuda")', "torch.cuda.amp.GradScaler"} <= set(report["apis"]), report


@pytest.mark.long
@_needs_cpu_fused_adamw
def test_allamo_trains_unmodified_with_flash_attn_served_on_cpu(tmp_path: Path) -> None:
    work, vocab = _workdir(tmp_path)
    console, report = _migrated_run(work, vocab, 20)
    _check_migrated(console, report, 20, "cpu")
    state = torch.load(work / "out" / "model_ckpt.pt", map_location="cpu", weights_only=True)  # its checkpoint reloads
    assert state["tok_embeddings.weight"].shape == (vocab, 32)


@pytest.mark.long
@pytest.mark.fake_npu
@_needs_cpu_fused_adamw
def test_allamo_trains_unmodified_with_flash_attn_served_on_the_simulated_npu(tmp_path: Path) -> None:
    work, vocab = _workdir(tmp_path)
    console, report = _migrated_run(work, vocab, 10, FAKE_NPU)
    _check_migrated(console, report, 10, "npu")


@pytest.mark.long
def test_allamo_port_imports_npu_migrate_flash_attn_and_trains_without_migration(tmp_path: Path) -> None:
    ported = tmp_path / "ported"
    result = run_cli("port", str(ENTRY), "--out", str(ported))
    assert result.returncode == 0, result.stderr
    model = (ported / "model.py").read_text()
    assert "from npu_migrate.libs.flash_attn import flash_attn_func" in model and "from flash_attn " not in model
    vocab = stand_ins.char_memmaps(ported / "data" / "tiny")
    # A plain interpreter: no runtime migration, the port's own calls pick the device.
    run = subprocess.run([sys.executable, "train.py", *_tiny(vocab, 10)], cwd=ported, env=child_env(),
                         capture_output=True, text=True, timeout=_RUN_TIMEOUT_S)
    console = run.stdout + run.stderr
    assert run.returncode == 0, console[-4000:]
    assert "Using Flash Attention 2" in console and "Using fused AdamW: False" in console, console[-4000:]
    losses = _val_losses(console)
    assert sorted(losses) == [0, 5, 10] and losses[10] < losses[0] - 1.0, losses
