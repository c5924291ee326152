"""Every stand-in runtime migration installs takes torch's signature (names, kinds, defaults), on both torch tiers.

A stand-in that differs breaks callers that use another spelling: timm calls
``torch.cuda.stream(stream=s)``. Differences are allowed only where
:data:`npu_migrate.migrate.signatures.DIFFERENCES` documents them.
"""

from __future__ import annotations

import pytest
import torch

from npu_migrate import migrate
from npu_migrate.migrate import signatures
from npu_migrate.migrate.patches import cuda_namespace


def test_every_stand_in_takes_torchs_signature() -> None:
    with migrate.enabled(device="cpu", device_count=2):
        found = signatures.installed_mismatches()
    assert found == [], "\n".join(found)


def test_documented_differences_are_real_stand_ins() -> None:
    """A reason kept for a stand-in that no longer differs, or no longer exists, is stale."""
    with migrate.enabled(device="cpu", device_count=2):
        saved = dict(signatures.DIFFERENCES)
        signatures.DIFFERENCES.clear()
        try:
            differing = {line.split(":")[0] for line in signatures.installed_mismatches()}
        finally:
            signatures.DIFFERENCES.update(saved)
    stale = sorted(set(saved) - differing)
    # These differ only on some torch versions (newer parameters or defaults): kept for the others.
    assert not [api for api in stale if api not in ("torch.cuda.Event", "torch.cuda.get_device_properties")], stale


def test_stand_ins_take_every_spelling_torch_takes() -> None:
    with migrate.enabled(device="cpu", device_count=2):
        with torch.cuda.stream(stream=torch.cuda.Stream()):  # timm's train.py
            pass
        with torch.cuda.StreamContext(stream=None):
            pass
        torch.cuda.synchronize(device=0)
        assert torch.cuda.memory_allocated(device="cuda:1") == 0
        torch.cuda.manual_seed_all(seed=3)
        torch.cuda.set_device(device=1)
        assert torch.cuda.current_device() == 1
        assert torch.cuda.get_device_capability(device=0) == (8, 0)
        start = torch.cuda.Event(enable_timing=True, blocking=False, interprocess=False)
        start.record()
        torch.cuda.nvtx.range_push(msg="step")
        torch.cuda.nvtx.range_pop()
        with pytest.raises(TypeError):
            torch.cuda.synchronize(0, 1)  # torch rejects it: so does the stand-in
        with pytest.raises(TypeError):
            torch.cuda.memory_allocated(dev=0)
        with pytest.raises(TypeError):
            torch.cuda.utilization(0, 1)  # an unmapped name: torch's TypeError before ours
        if hasattr(torch, "accelerator"):
            torch.accelerator.synchronize(0)
            with pytest.raises(TypeError):
                torch.accelerator.synchronize(device=0)  # positional-only in torch


def test_a_stand_in_with_another_signature_fails_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    import contextlib

    monkeypatch.setitem(cuda_namespace.CPU, "stream", (lambda s=None: contextlib.nullcontext(s), ""))
    with migrate.enabled(device="cpu", device_count=2):
        found = signatures.installed_mismatches()
    assert [line for line in found if line.startswith("torch.cuda.stream:")] == [
        "torch.cuda.stream: the stand-in takes (s=None [positional_or_keyword]), torch's takes "
        "(stream [positional_or_keyword])"
    ]
