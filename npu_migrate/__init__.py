"""npu_migrate: run PyTorch distributed training unchanged on Ascend NPUs, NVIDIA GPUs and CPUs.

Usage::

    import npu_migrate as nm

    info = nm.init_distributed()                 # hccl on npu, nccl on cuda, gloo on cpu
    model = DDP(model.to(info.device), device_ids=info.device_ids)
    with nm.autocast(enabled=amp):
        loss = model(x).sum()
"""

from __future__ import annotations

__version__ = "0.1.0"

import importlib
from typing import TYPE_CHECKING

from npu_migrate import _exit

# Every process that imports npu_migrate (ported code, the launcher's workers, `npu-migrate run`)
# leaves no process group for the interpreter to finalize: see npu_migrate/_exit.py.
_exit.install()


# Names resolve on first use (PEP 562), so `python -m npu_migrate.launch` can start its
# worker fork server before this process pays for `import torch`.
_EXPORTS = {
    "DEVICES": "npu_migrate.device",
    "DeviceSpec": "npu_migrate.device",
    "ENV_DEVICE": "npu_migrate.device",
    "Event": "npu_migrate.device",
    "HostEvent": "npu_migrate.device",
    "HostStream": "npu_migrate.device",
    "Selection": "npu_migrate.device",
    "Stream": "npu_migrate.device",
    "accelerator_available": "npu_migrate.device",
    "autocast": "npu_migrate.device",
    "current_device_index": "npu_migrate.device",
    "current_stream": "npu_migrate.device",
    "default_backend": "npu_migrate.device",
    "device_count": "npu_migrate.device",
    "device_ids": "npu_migrate.device",
    "device_name": "npu_migrate.device",
    "device_spec": "npu_migrate.device",
    "device_type": "npu_migrate.device",
    "empty_cache": "npu_migrate.device",
    "get_device": "npu_migrate.device",
    "grad_scaler": "npu_migrate.device",
    "is_available": "npu_migrate.device",
    "manual_seed_all": "npu_migrate.device",
    "max_memory_allocated": "npu_migrate.device",
    "max_memory_reserved": "npu_migrate.device",
    "memory_allocated": "npu_migrate.device",
    "memory_reserved": "npu_migrate.device",
    "memory_stats": "npu_migrate.device",
    "output_device": "npu_migrate.device",
    "require": "npu_migrate.device",
    "reset_peak_memory_stats": "npu_migrate.device",
    "resolve_device": "npu_migrate.device",
    "seed_everything": "npu_migrate.device",
    "set_device": "npu_migrate.device",
    "stream": "npu_migrate.device",
    "synchronize": "npu_migrate.device",
    "visible_devices_env": "npu_migrate.device",
    "DistInfo": "npu_migrate.distributed",
    "destroy_distributed": "npu_migrate.distributed",
    "init_distributed": "npu_migrate.distributed",
    "DeviceUnavailableError": "npu_migrate.errors",
    "DistributedConfigError": "npu_migrate.errors",
    "NpuMigrateError": "npu_migrate.errors",
    "UnknownDeviceError": "npu_migrate.errors",
    "UsageError": "npu_migrate.errors",
}


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'npu_migrate' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from npu_migrate.device import (
        DEVICES,
        DeviceSpec,
        ENV_DEVICE,
        Event,
        HostEvent,
        HostStream,
        Selection,
        Stream,
        accelerator_available,
        autocast,
        current_device_index,
        current_stream,
        default_backend,
        device_count,
        device_ids,
        device_name,
        device_spec,
        device_type,
        empty_cache,
        get_device,
        grad_scaler,
        is_available,
        manual_seed_all,
        max_memory_allocated,
        max_memory_reserved,
        memory_allocated,
        memory_reserved,
        memory_stats,
        output_device,
        require,
        reset_peak_memory_stats,
        resolve_device,
        seed_everything,
        set_device,
        stream,
        synchronize,
        visible_devices_env,
    )
    from npu_migrate.distributed import DistInfo, destroy_distributed, init_distributed
    from npu_migrate.errors import (
        DeviceUnavailableError,
        DistributedConfigError,
        NpuMigrateError,
        UnknownDeviceError,
        UsageError,
    )

__all__ = [
    "DEVICES",
    "DeviceSpec",
    "DeviceUnavailableError",
    "DistInfo",
    "DistributedConfigError",
    "ENV_DEVICE",
    "Event",
    "HostEvent",
    "HostStream",
    "NpuMigrateError",
    "Selection",
    "Stream",
    "UnknownDeviceError",
    "UsageError",
    "__version__",
    "accelerator_available",
    "autocast",
    "current_device_index",
    "current_stream",
    "default_backend",
    "destroy_distributed",
    "device_count",
    "device_ids",
    "device_name",
    "device_spec",
    "device_type",
    "empty_cache",
    "get_device",
    "grad_scaler",
    "init_distributed",
    "is_available",
    "manual_seed_all",
    "max_memory_allocated",
    "max_memory_reserved",
    "memory_allocated",
    "memory_reserved",
    "memory_stats",
    "output_device",
    "require",
    "reset_peak_memory_stats",
    "resolve_device",
    "seed_everything",
    "set_device",
    "stream",
    "synchronize",
    "visible_devices_env",
]
