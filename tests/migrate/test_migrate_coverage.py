"""Runtime migration covers what torch's own metadata says reaches CUDA, from one table (npu_migrate.cuda_api)."""

from __future__ import annotations

import pytest
import torch

from conftest import FAKE_NPU, child_env, run_cli
from npu_migrate import cuda_api
from npu_migrate.errors import MigrationError


def test_every_api_torch_reports_is_classified() -> None:
    """Enumerated from this torch at test time: a release that adds an unclassified API fails here, by name."""
    devices = cuda_api.device_apis()
    for known in ("torch.hann_window", "torch.zeros", "torch.Tensor.new_zeros", "torch.Tensor.pin_memory",
                  "torch.Generator", "torch.asarray"):
        assert known in devices, known
    missing = [f"{name} (device: {p.type}, from its {p.source})" for name, p in devices.items()
               if cuda_api.classify_torch(name, p.type) is None]
    missing += [n for n in cuda_api.tensor_cuda_apis() if cuda_api.classify_torch(n) is None]
    missing += [n for n in cuda_api.public_names() if cuda_api.classify(n) is None]
    assert not missing, f"APIs without a row in npu_migrate/cuda_api/: {missing}"
    assert {"torch.Tensor.cuda", "torch.Tensor.is_cuda", "torch.Tensor.record_stream"} <= set(cuda_api.tensor_cuda_apis())


def test_a_device_parameter_of_another_type_needs_a_row() -> None:
    assert cuda_api.classify_torch("torch.brand_new_factory", "Optional[Device]").op == "device_arg"
    assert cuda_api.classify_torch("torch.brand_new_factory", "int") is None
    assert cuda_api.classify_torch("torch.brand_new_class", "doc") is None
    assert cuda_api.classify_torch("torch.Tensor.brand_new_cuda_method") is None


def test_every_device_api_is_patched_from_the_enumeration() -> None:
    from npu_migrate import migrate

    rows = {n: p for n, p in cuda_api.device_apis().items()
            if cuda_api.classify_torch(n, p.type).op in ("device_arg", "device_query")}
    before = {n: _get(n) for n in rows}
    with migrate.enabled(device="cpu"):
        unpatched = [n for n in rows if _get(n) is before[n]]
    assert not unpatched
    assert all(_get(n) is before[n] for n in rows)


def _get(qualname: str) -> object:
    owner: object = torch
    for part in qualname.split(".")[1:]:
        owner = getattr(owner, part)
    return owner


def test_calls_that_slipped_through_end_on_the_cpu_or_name_themselves() -> None:
    from npu_migrate import migrate
    from npu_migrate.migrate.report import REPORT

    REPORT.reset()
    with migrate.enabled(device="cpu"):
        assert torch.hann_window(8, device="cuda").device.type == "cpu"
        generator = torch.Generator(device="cuda")
        assert generator.device.type == "cpu" and isinstance(generator, torch.Generator)
        assert torch.rand(2, generator=generator.manual_seed(0), device="cuda").device.type == "cpu"
        legacy = torch.cuda.FloatTensor(2)
        assert (legacy.dtype, tuple(legacy.shape), legacy.device.type) == (torch.float32, (2,), "cpu")
        assert torch.cuda.LongTensor([1, 2]).tolist() == [1, 2]
        x = torch.ones(3)
        assert x.pin_memory() is x  # no pinning on cpu: host memory is all there is
        x.record_stream(torch.cuda.current_stream())
        assert torch.ones(2).new_tensor([1.0], device="cuda").device.type == "cpu"
        assert torch.asarray([1, 2], device="cuda:0").device.type == "cpu"
        assert torch.TypedStorage(2, dtype=torch.float32, device="cuda").device.type == "cpu"
        assert torch.cuda.memory.memory_allocated() == 0  # the submodule's name is patched too
        with pytest.raises(MigrationError, match=r"torch\.cuda\.FloatStorage has no cpu equivalent .* legacy CUDA storage"):
            torch.cuda.FloatStorage(2)
        with pytest.raises(MigrationError, match=r"torch\.cuda\.memory_snapshot has no cpu equivalent .* caching allocator"):
            torch.cuda.memory_snapshot()
    kinds = {api: e["kind"] for api, e in REPORT.entries.items()}
    assert kinds["torch.hann_window(device=)"] == "redirected" and kinds["Tensor.pin_memory"] == "noop"
    assert kinds["torch.Generator(device=)"] == "redirected" and kinds["torch.cuda.FloatTensor"] == "redirected"


@pytest.mark.slow
@pytest.mark.fake_npu
def test_calls_that_slipped_through_land_on_the_simulated_npu(tmp_path) -> None:
    script = tmp_path / "slipped.py"
    script.write_text(
        "import torch\n"
        "print(torch.hann_window(4, device='cuda').device, torch.cuda.FloatTensor(2).device,\n"
        "      torch.ones(2, device='cuda').new_tensor([1.0], device='cuda').device,\n"
        "      torch.asarray([1.0], device='cuda:1').device)\n"
        "try:\n"
        "    torch.cuda.FloatStorage(2)\n"
        "except RuntimeError as exc:\n"
        "    print(str(exc).split(' is ')[0])\n"
    )
    result = run_cli("run", "--device-num", "2", str(script), env=child_env(FAKE_NPU, ASCEND_RT_VISIBLE_DEVICES="0,1"))
    assert result.returncode == 0, result.stderr
    # torch_npu's torch.npu has FloatStorage (the wheel's __all__), so the legacy class is redirected to it; the
    # stand-in, which simulates no storage classes, names the call it received.
    assert result.stdout.split() == ["npu:0", "npu:0", "npu:0", "npu:1", "fake", "npu:", "torch.npu.FloatStorage"]
