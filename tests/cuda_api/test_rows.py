"""npu_migrate.cuda_api: every public torch.cuda name has a row, and the table needs no torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import child_env
from npu_migrate.cuda_api import CUDA_API, classify, public_names
from npu_migrate.port.targets import TARGETS


def test_every_public_torch_cuda_name_is_classified() -> None:
    """Derived from torch itself: a torch release that adds an API fails here until it has a row."""
    names = public_names()
    assert "torch.cuda.is_available" in names and "torch.cuda.amp.autocast" in names
    missing = [n for n in names if classify(n) is None]
    assert not missing, f"torch.cuda names without a row in npu_migrate/cuda_api/: {missing}"


def test_every_mapped_row_names_a_port_target() -> None:
    for api in CUDA_API.values():
        if api.kind == "mapped":
            assert api.op in TARGETS, api.name
        else:
            assert api.note, f"{api.name} ({api.kind}) needs a reason or advice"


@pytest.mark.parametrize(("name", "kind", "op"), [
    ("torch.cuda.get_device_capability", "mapped", "device_capability"),
    ("torch.npu.set_device", "mapped", "set_device"),
    ("torch_npu.npu.synchronize", "mapped", "synchronize"),
    ("torch.cuda.memory.empty_cache", "mapped", "empty_cache"),
    ("torch.cuda.amp.grad_scaler.GradScaler", "mapped", "grad_scaler"),
    ("torch.cuda.FloatTensor", "unsupported", None),
    ("torch.cuda.OutOfMemoryError", "ignored", None),
    ("torch.cuda.nvtx.range_push", "noop", None),
    # Queries whose answer off CUDA is known: runtime migration answers them, the port reports them as no-ops.
    ("torch.cuda.is_tf32_supported", "noop", None),
    ("torch.cuda.get_arch_list", "noop", None),
    ("torch.cuda.memory_summary", "noop", None),
    ("torch.cuda.is_current_stream_capturing", "noop", None),
])
def test_classify(name: str, kind: str, op: str | None) -> None:
    api = classify(name)
    assert api is not None and (api.kind, api.op) == (kind, op)


def test_a_row_says_what_runtime_migration_does_with_the_name() -> None:
    synchronize = classify("torch.cuda.synchronize")
    assert (synchronize.kind, synchronize.cpu, synchronize.runtime_kind) == ("mapped", "nothing", "noop")
    assert synchronize.why  # a runtime kind other than the port kind's says why
    legacy = classify("torch.cuda.HalfTensor")
    assert (legacy.kind, legacy.runtime, legacy.runtime_kind) == ("unsupported", "legacy_type", "redirected")
    graph = classify("torch.cuda.CUDAGraph")
    assert (graph.cpu, graph.runtime_kind) == ("", "unmapped") and graph.note.startswith("CUDA graphs")


def test_unknown_names_are_not_classified() -> None:
    assert classify("torch.cuda.no_such_api") is None
    assert classify("numpy.zeros") is None


def test_table_and_port_import_without_torch() -> None:
    probe = ("import sys\nimport npu_migrate.cuda_api, npu_migrate.port.cli\n"
             "from npu_migrate.port import port_source\nport_source('import torch\\nx = torch.zeros(1).cuda()\\n')\n"
             "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))\n")
    run = subprocess.run([sys.executable, "-c", probe], env=child_env(), capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
