"""Device families, the choice between them, and the device calls the rest of the toolkit uses.

Usage::

    import npu_migrate as nm

    spec = nm.device_spec()            # DeviceSpec(name="npu", backend="hccl", ...)
    dev = nm.get_device(local_rank)    # torch.device("npu", 3); torch.device("cpu") on CPU
    nm.set_device(local_rank)
    with nm.autocast(enabled=args.amp):
        loss = model(x).sum()
    scaler = nm.grad_scaler(enabled=args.amp)

The family is chosen in this order: the explicit argument, then ``NPU_MIGRATE_DEVICE``, then
the first row of :data:`DEVICES` that is available on this machine. Everything a family needs
is one row of that table (:mod:`npu_migrate.registry`); code here reaches the device through
``getattr(torch, spec.name)`` (or ``torch.accelerator`` where torch has it), never through
per-device branches.

This package imports torch, guarded (below); its modules, each one concept:

- :mod:`.extension`: loading a family's extension (torch_npu) and the one-line reasons it fails;
- :mod:`.selection`: which family, why, and whether one is usable here; its default backend;
- :mod:`.calls`: the device calls (index, count, seeds, autocast, memory, DDP arguments);
- :mod:`.host`: events and streams, with CPU stand-ins that measure time.
"""

from __future__ import annotations

import sys

from npu_migrate import autoload
from npu_migrate.errors import DeviceUnavailableError

if "torch" not in sys.modules:
    autoload.check_versions()  # torch >= 2.5 would import a mismatched torch_npu, which can abort
try:
    import torch  # noqa: F401 - first, guarded: every module below imports it
except RuntimeError as _exc:  # torch's autoload of a broken torch_npu: no retry is possible
    _line = autoload.explain(_exc)
    if _line is None:
        raise
    raise DeviceUnavailableError(_line) from _exc

from npu_migrate.device import calls as _calls  # noqa: E402 - after the guarded import of torch
from npu_migrate.device import extension as _extension  # noqa: E402
from npu_migrate.device import selection as _selection  # noqa: E402
from npu_migrate.device.calls import (  # noqa: E402
    _count,
    _name,
    accelerator_available,
    autocast,
    current_device_index,
    device_count,
    device_ids,
    device_name,
    empty_cache,
    get_device,
    grad_scaler,
    manual_seed_all,
    max_memory_allocated,
    max_memory_reserved,
    memory_allocated,
    memory_reserved,
    memory_stats,
    output_device,
    reset_peak_memory_stats,
    seed_everything,
    set_device,
    synchronize,
    visible_devices_env,
)
from npu_migrate.device.extension import _release_tuple, extension_version  # noqa: E402
from npu_migrate.device.host import Event, HostEvent, HostStream, Stream, current_stream, stream  # noqa: E402
from npu_migrate.device.selection import (  # noqa: E402
    SOURCES,
    Selection,
    default_backend,
    device_spec,
    device_type,
    is_available,
    require,
    resolve_device,
    unavailable_reason,
)
from npu_migrate.registry import DEVICES, ENV_DEVICE, DeviceSpec  # noqa: E402 - re-exported


def _clear_caches() -> None:
    """Forget detection and extension imports (for tests and workers that change the environment)."""
    _selection._detect.cache_clear()
    _selection._unavailable.cache_clear()
    _extension._load_extension.cache_clear()
    _calls._accelerator_works.cache_clear()


__all__ = [
    "DEVICES", "DeviceSpec", "ENV_DEVICE", "Event", "HostEvent", "HostStream", "SOURCES", "Selection", "Stream",
    "accelerator_available", "autocast", "current_device_index", "current_stream", "default_backend",
    "device_count", "device_ids", "device_name", "device_spec", "device_type", "empty_cache", "extension_version",
    "get_device", "grad_scaler", "is_available", "manual_seed_all", "max_memory_allocated", "max_memory_reserved",
    "memory_allocated", "memory_reserved", "memory_stats", "output_device", "require", "reset_peak_memory_stats",
    "resolve_device", "seed_everything", "set_device", "stream", "synchronize", "unavailable_reason",
    "visible_devices_env",
]
