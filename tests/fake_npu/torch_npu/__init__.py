"""Test-only stand-in for Huawei's torch_npu. NEVER installed; tests put tests/fake_npu on sys.path.

It does what the real torch_npu does at import, as far as npu_migrate can see, so the real NPU
selection, naming and set-up code runs on a machine without an NPU:

* renames torch's PrivateUse1 backend to ``npu`` (``torch.device("npu", 1)`` parses);
* registers a ``torch.npu`` device module with FAKE_NPU_DEVICE_COUNT simulated devices (default 8,
  masked by ASCEND_RT_VISIBLE_DEVICES like the real runtime) that records ``set_device``;
* registers the ``hccl`` backend through ``torch.distributed.Backend.register_backend``; each
  group it creates is a real gloo group, so collectives on CPU tensors really run.

Tensors cannot live on the simulated devices: there are no kernels behind them.
"""

from __future__ import annotations

import os
import types

import torch
import torch.distributed as dist

__version__ = torch.__version__.split("+")[0]  # "built for" the installed torch

_visible = os.environ.get("ASCEND_RT_VISIBLE_DEVICES")
if _visible is not None:
    _COUNT = len([d for d in _visible.split(",") if d.strip()])
else:
    _COUNT = int(os.environ.get("FAKE_NPU_DEVICE_COUNT", "8"))

_state = {"current": 0, "set_device_calls": [], "seed": None}


def _check(index: int) -> int:
    index = int(index.index if isinstance(index, torch.device) else index)
    if not 0 <= index < _COUNT:
        raise RuntimeError(f"fake npu: invalid device index {index}, {_COUNT} device(s) visible")
    return index


def _set_device(index) -> None:
    _state["current"] = _check(index)
    _state["set_device_calls"].append(_state["current"])


def _manual_seed_all(seed: int) -> None:
    _state["seed"] = int(seed)


npu = types.ModuleType("torch_npu.npu")
npu.is_available = lambda: _COUNT > 0
npu.device_count = lambda: _COUNT
npu.current_device = lambda: _state["current"]
npu.set_device = _set_device
npu.synchronize = lambda device=None: None
npu.is_initialized = lambda: True
npu._lazy_init = lambda: None
npu.manual_seed = _manual_seed_all
npu.manual_seed_all = _manual_seed_all
npu.get_device_name = lambda device=None: f"FakeAscend910B (simulated {_check(0 if device is None else device)})"
npu.get_amp_supported_dtype = lambda: [torch.float16, torch.bfloat16]
npu.empty_cache = lambda: None
for _name in ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved"):
    setattr(npu, _name, lambda device=None: 0)
npu.reset_peak_memory_stats = lambda device=None: None
npu._state = _state  # lets tests read what npu_migrate asked the device to do

torch.utils.rename_privateuse1_backend("npu")
torch._register_device_module("npu", npu)


def _create_hccl(store, rank, world_size, timeout):
    return dist.ProcessGroupGloo(store, rank, world_size, timeout)


# The real torch_npu registers devices=["npu"]; "cpu" is added so collectives on CPU tensors
# (the only tensors this stand-in can hold) go through the same hccl group.
dist.Backend.register_backend("hccl", _create_hccl, devices=["npu", "cpu"])
