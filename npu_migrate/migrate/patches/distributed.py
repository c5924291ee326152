"""torch.distributed: ``nccl`` becomes the target's backend; DDP and barriers get the target's devices.

Usage::

    from npu_migrate.migrate.patches import distributed

    distributed.install()   # init_process_group("nccl") -> hccl on npu, gloo on cpu
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from npu_migrate.distributed import guarded_destroy
from npu_migrate.migrate.callers import record
from npu_migrate.migrate.mapping import map_backend, map_device
from npu_migrate.migrate.state import on_cpu, patch


def install() -> None:
    """Patch ``init_process_group``, ``new_group``, ``barrier``, DDP, (on cpu) ``SyncBatchNorm`` and
    (torch < 2.8) ``destroy_process_group``."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    init = dist.init_process_group

    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        if args:
            mapped = map_backend(args[0])
            if mapped is not args[0]:
                args = (mapped, *args[1:])
                record("init_process_group(backend=)")
        if "backend" in kwargs:
            mapped = map_backend(kwargs["backend"])
            if mapped is not kwargs["backend"]:
                kwargs["backend"] = mapped
                record("init_process_group(backend=)")
        if kwargs.get("device_id") is not None:
            mapped = map_device(kwargs["device_id"])
            kwargs["device_id"] = None if on_cpu() else mapped
        return init(*args, **kwargs)

    functools.update_wrapper(init_process_group, init)
    patch(dist, "init_process_group", init_process_group)
    new_group = dist.new_group

    def new_group_(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("backend") is not None:
            kwargs["backend"] = map_backend(kwargs["backend"])
        return new_group(*args, **kwargs)

    functools.update_wrapper(new_group_, new_group)
    patch(dist, "new_group", new_group_)
    barrier = dist.barrier

    def barrier_(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("device_ids") is not None and on_cpu():
            kwargs["device_ids"] = None  # gloo has no devices to name
            record("dist.barrier(device_ids=)")
        return barrier(*args, **kwargs)

    functools.update_wrapper(barrier_, barrier)
    patch(dist, "barrier", barrier_)
    ddp_init = DDP.__init__

    def ddp(self: Any, module: Any, device_ids: Any = None, output_device: Any = None, *args: Any, **kwargs: Any) -> None:
        if device_ids is not None or output_device is not None:
            if on_cpu():
                device_ids, output_device = None, None  # DDP wants None for CPU modules
            else:
                device_ids = [map_device(d) for d in device_ids] if device_ids is not None else None
                output_device = map_device(output_device)
            record("DistributedDataParallel(device_ids=, output_device=)")
        ddp_init(self, module, device_ids, output_device, *args, **kwargs)

    functools.update_wrapper(ddp, ddp_init)
    patch(DDP, "__init__", ddp)

    guarded = guarded_destroy(dist.destroy_process_group)  # before torch 2.8 a destroy could deadlock
    if guarded is not None:
        patch(dist, "destroy_process_group", guarded)
        patch(dist.distributed_c10d, "destroy_process_group", guarded)

    sync_forward = torch.nn.SyncBatchNorm.forward
    batchnorm_forward = torch.nn.modules.batchnorm._BatchNorm.forward

    if on_cpu():
        def sync_bn_forward(self: Any, input: Any) -> Any:
            if input.device.type == "cpu":
                record("SyncBatchNorm.forward", "noop", "statistics stay per rank on cpu")
                return batchnorm_forward(self, input)
            return sync_forward(self, input)

        patch(torch.nn.SyncBatchNorm, "forward", sync_bn_forward)

        def convert_sync_batchnorm(module: Any, process_group: Any = None) -> Any:
            record("SyncBatchNorm.convert_sync_batchnorm", "noop", "BatchNorm kept: statistics stay per rank on cpu")
            return module

        patch(torch.nn.SyncBatchNorm, "convert_sync_batchnorm", staticmethod(convert_sync_batchnorm))
