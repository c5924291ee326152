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

from npu_migrate.device import (
    DEVICES,
    ENV_DEVICE,
    DeviceSpec,
    Selection,
    autocast,
    current_device_index,
    default_backend,
    device_count,
    device_name,
    device_spec,
    device_type,
    empty_cache,
    get_device,
    grad_scaler,
    is_available,
    memory_stats,
    require,
    reset_peak_memory_stats,
    resolve_device,
    seed_everything,
    set_device,
    synchronize,
)
from npu_migrate.distributed import DistInfo, destroy_distributed, init_distributed
from npu_migrate.errors import (
    DeviceUnavailableError,
    DistributedConfigError,
    NpuMigrateError,
    UnknownDeviceError,
)

__all__ = [
    "DEVICES",
    "ENV_DEVICE",
    "DeviceSpec",
    "DeviceUnavailableError",
    "DistInfo",
    "DistributedConfigError",
    "NpuMigrateError",
    "Selection",
    "UnknownDeviceError",
    "__version__",
    "autocast",
    "current_device_index",
    "default_backend",
    "destroy_distributed",
    "device_count",
    "device_name",
    "device_spec",
    "device_type",
    "empty_cache",
    "get_device",
    "grad_scaler",
    "init_distributed",
    "is_available",
    "memory_stats",
    "require",
    "reset_peak_memory_stats",
    "resolve_device",
    "seed_everything",
    "set_device",
    "synchronize",
]
