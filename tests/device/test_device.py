"""The device table, the choice of family, and the device calls on the CPU family."""

from __future__ import annotations

import random
import re

import pytest
import torch

import npu_migrate as nm
from npu_migrate import device as _device
from conftest import BROKEN_NPU, HOST_FAMILY, MISMATCHED_NPU

# The release line of the installed torch (2.14): a torch_npu built for another line is refused.
TORCH_LINE = re.escape(".".join(torch.__version__.split("+")[0].split(".")[:2]))


@pytest.mark.parametrize("spec", list(nm.DEVICES.values()), ids=list(nm.DEVICES))
def test_every_row_is_complete(spec: nm.DeviceSpec) -> None:
    assert nm.DEVICES[spec.name] is spec
    assert spec.name == spec.name.lower() and spec.backend == spec.backend.lower()
    assert spec.amp_dtype in (torch.float16, torch.bfloat16)
    assert (spec.extension is None) == (spec.pip_name is None)
    for var in (spec.visible_devices_env, spec.alloc_conf_env):
        assert var is None or var == var.upper()
    assert spec.is_accelerator == (spec.visible_devices_env is not None)
    assert all(p == p.upper() for p in spec.env_prefixes)
    # The launcher sets the first interface variable; every backend has one (gloo's carries CPU groups).
    assert spec.interface_env and all(v == v.upper() for v in spec.interface_env)
    assert spec.torch_build is None or hasattr(torch.version, spec.torch_build)
    if spec.toolkit is not None:  # a toolkit sits under an extension, and says how to set it up
        assert spec.extension is not None and spec.toolkit.set_env and spec.toolkit.home_env


def test_table_is_the_issue_table_in_detection_order() -> None:
    assert list(nm.DEVICES) == ["npu", "cuda", "cpu"]
    assert [(s.backend, s.extension, s.visible_devices_env) for s in nm.DEVICES.values()] == [
        ("hccl", "torch_npu", "ASCEND_RT_VISIBLE_DEVICES"),
        ("nccl", None, "CUDA_VISIBLE_DEVICES"),
        ("gloo", None, None),
    ]


def test_detects_this_hosts_family(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NPU_MIGRATE_DEVICE")
    selection = nm.resolve_device()
    assert (selection.spec.name, selection.source, selection.skipped) == (HOST_FAMILY, "detected", ())
    assert nm.default_backend() == {"npu": "hccl", "cuda": "nccl", "cpu": "gloo"}[HOST_FAMILY]


def test_the_cpu_tier_forces_cpu() -> None:
    selection = nm.resolve_device()
    assert (selection.spec.name, selection.source) == ("cpu", "NPU_MIGRATE_DEVICE")
    assert nm.default_backend() == "gloo"


def test_argument_beats_variable_beats_detection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NPU_MIGRATE_DEVICE", "cpu")
    assert nm.resolve_device().source == "NPU_MIGRATE_DEVICE"
    assert nm.resolve_device("cpu").source == "argument"
    monkeypatch.setenv("NPU_MIGRATE_DEVICE", "npu")  # the argument wins, npu is never tried
    assert nm.resolve_device("cpu").spec.name == "cpu"
    monkeypatch.setenv("NPU_MIGRATE_DEVICE", "auto")
    assert nm.resolve_device().source == "detected"
    assert nm.resolve_device(" CPU ").spec.name == "cpu"


def test_unknown_device_lists_the_families(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(nm.UnknownDeviceError, match=r"Unknown device 'gpu' from --device\. Expected one of: auto, npu, cuda, cpu\. Pass --device or set NPU_MIGRATE_DEVICE\."):
        nm.resolve_device("gpu")
    monkeypatch.setenv("NPU_MIGRATE_DEVICE", "xpu")
    with pytest.raises(nm.UnknownDeviceError, match=r"'xpu' from NPU_MIGRATE_DEVICE=xpu\. Expected one of: auto, npu, cuda, cpu"):
        nm.device_spec()


def test_forced_npu_without_torch_npu_says_which_pip_install() -> None:
    from npu_migrate.releases import pairs

    found = pairs.pairing(torch.__version__)  # the cached wheel whose METADATA accepts this torch, if any
    line = pairs.same_line(torch.__version__)  # else the one of this torch's line, for another build
    if found is not None:
        fix = rf"pip install torch-npu=={re.escape(found.version)}, whose METADATA declares {re.escape(found.requires_torch)}"
    elif line is not None:
        fix = (rf"{re.escape(pairs.install_torch(line.requires_torch))} then pip install torch-npu=={re.escape(line.version)}, "
               rf"whose METADATA declares {re.escape(line.requires_torch)} \(torch {re.escape(torch.__version__)} is another build\)")
    else:
        fix = r"the torch-npu release whose Requires-Dist accepts torch .*npu-migrate env --releases"
    with pytest.raises(nm.DeviceUnavailableError, match=rf"npu needs torch_npu, which is not installed\. Install the release that declares torch {re.escape(torch.__version__)}: {fix}"):
        nm.resolve_device("npu")
    assert not nm.is_available("npu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a CUDA device")
def test_forced_cuda_without_gpu_is_refused() -> None:
    # The suite hides the host's GPUs (CUDA_VISIBLE_DEVICES=''): the line names the mask too.
    with pytest.raises(nm.DeviceUnavailableError,
                       match=r"No cuda device is visible \(torch\.cuda\.is_available\(\) is False, CUDA_VISIBLE_DEVICES=''\)"):
        nm.resolve_device("cuda")


def test_broken_torch_npu_quotes_the_import_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BROKEN_NPU))
    with pytest.raises(nm.DeviceUnavailableError, match=r"torch_npu is installed but failed to import: libascendcl\.so: cannot open shared object file.*source /usr/local/Ascend/ascend-toolkit/set_env\.sh"):
        nm.resolve_device("npu")
    # Detection warns about the broken install and goes on to the next family.
    _device._clear_caches()
    monkeypatch.delenv("NPU_MIGRATE_DEVICE")
    selection = nm.resolve_device()
    assert selection.spec.name == HOST_FAMILY
    assert len(selection.skipped) == 1 and "libascendcl.so" in selection.skipped[0]


def test_mismatched_torch_npu_names_both_versions_without_importing_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(MISMATCHED_NPU))
    with pytest.raises(nm.DeviceUnavailableError, match=rf"torch_npu 1\.11\.0\.post1 declares torch==1\.11\.0 but torch {re.escape(torch.__version__)} is installed \(release {TORCH_LINE}\), and importing it can abort the interpreter\. Install the pair it declares: pip install torch==1\.11\.0; or keep this torch: "):
        nm.resolve_device("npu")


def test_cpu_device_calls() -> None:
    assert nm.get_device() == torch.device("cpu")
    assert nm.get_device(3) == torch.device("cpu")
    assert nm.device_count() == 1
    assert nm.current_device_index() == 0
    assert nm.memory_stats() is None
    nm.set_device(0)
    nm.synchronize()
    nm.empty_cache()
    nm.reset_peak_memory_stats()
    assert isinstance(nm.device_name(), str) and nm.device_name()


def test_autocast_uses_the_family_dtype() -> None:
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with nm.autocast():
        assert (a @ b).dtype == torch.bfloat16
    with nm.autocast(enabled=False):
        assert (a @ b).dtype == torch.float32


def test_grad_scaler_is_a_pass_through_with_bfloat16() -> None:
    scaler = nm.grad_scaler(enabled=True)
    assert not scaler.is_enabled()
    w = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([w], lr=0.5)
    loss = (w * 3).sum()
    assert scaler.scale(loss) is loss
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    assert w.detach().tolist() == [-0.5, -0.5]


def test_seed_everything_repeats_every_generator() -> None:
    def draw() -> tuple:
        import numpy as np

        return random.random(), np.random.rand(), torch.rand(3).tolist()

    nm.seed_everything(1234)
    first = draw()
    nm.seed_everything(1234)
    assert draw() == first


def test_portable_torch_cuda_equivalents_on_cpu() -> None:
    assert not nm.accelerator_available()
    assert nm.device_ids(1) is None and nm.output_device(1) is None  # what DDP needs for CPU modules
    assert (nm.memory_allocated(), nm.max_memory_allocated(), nm.memory_reserved(), nm.max_memory_reserved()) == (0, 0, 0, 0)
    assert nm.visible_devices_env() == "CUDA_VISIBLE_DEVICES"
    torch.manual_seed(7)
    expected = torch.rand(2)
    torch.manual_seed(7)
    nm.manual_seed_all(123)  # device generators only: the CPU generator is left alone
    assert torch.equal(torch.rand(2), expected)


def test_host_events_measure_time_and_streams_are_usable() -> None:
    import time

    start, end = nm.Event(enable_timing=True), nm.Event(enable_timing=True)
    host_start = time.perf_counter()
    start.record()
    time.sleep(0.02)  # the work being timed: at least 20 ms
    end.record()
    end.synchronize()
    host_ms = (time.perf_counter() - host_start) * 1000.0
    # The events bracket the sleep and lie inside the host clock's view of the same span.
    assert 20.0 <= start.elapsed_time(end) <= host_ms
    with pytest.raises(RuntimeError, match="enable_timing=True"):
        nm.Event().elapsed_time(end)
    side = nm.Stream()
    with nm.stream(side):
        side.wait_stream(nm.current_stream())
        y = torch.ones(2) * 2
    side.synchronize()
    assert y.tolist() == [2.0, 2.0] and nm.current_stream() == nm.current_stream()


def test_is_available_normalises_the_name_and_answers_for_auto() -> None:
    assert nm.is_available(" CPU ") and nm.is_available("cpu")
    assert nm.is_available("auto") and nm.is_available(" Auto ")  # detection always finds a family (cpu at least)
    with pytest.raises(nm.UnknownDeviceError, match=r"Unknown device 'gpu' from is_available\(\)\. Expected one of: auto, npu, cuda, cpu\."):
        nm.is_available("gpu")
