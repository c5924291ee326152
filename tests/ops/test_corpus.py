"""``npu-migrate ops`` end to end on an unmodified public CUDA script from the corpus, through the console command.

rasbt/LLMs-from-scratch's DDP script is written for torchrun (``LOCAL_RANK``, ``nccl``,
``torch.cuda.set_device(rank)``, an int rank as the device, DDP): the audit runs it as a world of
one rank on this CPU, stops it after 2 optimizer steps and checks its JSON.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import TESTS, child_env

CORPUS = TESTS / "corpus"


@pytest.mark.long
def test_rasbt_ddp_script_audited_unmodified(tmp_path: Path, release: str) -> None:
    work = tmp_path / "rasbt_ddp_torchrun"
    shutil.copytree(CORPUS / "rasbt_ddp_torchrun", work, ignore=shutil.ignore_patterns("SOURCE.json", "LICENSE"))
    command = [sys.executable, "-m", "npu_migrate", "ops", "--torch-npu", release, "--json", "ops.json",
               "--markdown", "ops.md", "DDP-script-torchrun.py"]
    result = subprocess.run(command, cwd=work, env=child_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    # It took its CUDA branch, as one rank, and was ended after its second step.
    assert "CUDA available: True" in result.stdout and "Number of GPUs available: 1" in result.stdout
    assert "[GPU0] Epoch: 001/003 | Batchsize 002" in result.stdout
    assert "[GPU0] Epoch: 002/003" not in result.stdout
    data = json.loads((work / "ops.json").read_text())
    assert data["format"] == 1 and data["torch_npu"] == release and data["op_list"] == "cache"
    assert data["steps"] == 2 and data["ended"] == "ended after --steps 2" and data["verdict"] == "npu"
    assert data["script"] == "DDP-script-torchrun.py" and data["summary"]["cpu_fallback"] == 0
    ops = {(o["op"], o["phase"], o["site"]) for o in data["ops"]}
    assert ("aten::addmm", "forward", "DDP-script-torchrun.py:80") in ops  # the model's Linear layers
    assert ("aten::mm", "backward", "DDP-script-torchrun.py:152") in ops  # loss.backward()
    assert any(p == "optimizer step" and s == "DDP-script-torchrun.py:153" for _, p, s in ops)  # optimizer.step()
    for entry in data["ops"]:
        assert set(entry) >= {"op", "overload", "verdict", "count", "dtypes", "site", "phase"}
        assert entry["verdict"] in ("npu", "decomposed") and entry["count"] >= 1
    # The batches are made on the host by the DataLoader: their ops are not the device's.
    assert not [o for o in data["ops"] if "dataloader" in o["site"] or "DDP-script-torchrun.py:5" in o["site"]]
    # The loss printed with :.2f reads it back: a host synchronisation, counted.
    assert [(s["what"], s["site"]) for s in data["risks"]["syncs"]] == [
        ("aten::_local_scalar_dense", "DDP-script-torchrun.py:156")]
    assert (work / "ops.md").read_text().startswith(f"# Operator audit: DDP-script-torchrun.py on torch-npu {release}")
