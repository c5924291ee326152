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
