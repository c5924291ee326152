"""The device calls of the chosen family: index, count, seeds, autocast, memory, DDP's arguments.

Usage::

    import npu_migrate as nm

    dev = nm.get_device(local_rank)    # torch.device("npu", 3); torch.device("cpu") on CPU
    nm.set_device(local_rank)
    with nm.autocast(enabled=args.amp):
        loss = model(x).sum()
    scaler = nm.grad_scaler(enabled=args.amp)

Each call reaches the device through ``torch.accelerator`` where torch has it and it speaks for the
family, else ``getattr(torch, spec.name)``; on CPU each does what ``torch.cuda`` does without a GPU.
"""

from __future__ import annotations

import functools
import os
import platform
import random
from contextlib import AbstractContextManager
from types import ModuleType
from typing import Any

import torch

from npu_migrate.device.selection import device_spec
from npu_migrate.errors import DeviceUnavailableError
from npu_migrate.registry import DEVICES, SOURCE_FAMILY, DeviceSpec


def _module(spec: DeviceSpec) -> ModuleType:
    return getattr(torch, spec.name)


def _accelerator(spec: DeviceSpec) -> ModuleType | None:
    """Return ``torch.accelerator`` when torch has it and it speaks for ``spec``'s family."""
    return torch.accelerator if spec.is_accelerator and _accelerator_works(spec.name) else None


@functools.lru_cache(maxsize=None)
def _accelerator_works(name: str) -> bool:
    acc = getattr(torch, "accelerator", None)  # torch >= 2.6
    if acc is None:
        return False
    try:
        try:
            current = acc.current_accelerator(check_available=True)
        except TypeError:  # torch 2.6 has no check_available
            current = acc.current_accelerator()
        if current is None or current.type != name:
            return False
        # A device registered from Python only (no C++ device guard) passes the checks above
        # but fails here with "PyTorch is not linked with support for ... devices".
        (getattr(acc, "current_device_index", None) or acc.current_device_idx)()
    except RuntimeError:
        return False
    return True


def _local_rank_env() -> int | None:
    value = os.environ.get("LOCAL_RANK")
    return int(value) if value not in (None, "") else None


def device_count() -> int:
    """Return how many devices of the chosen family this process sees.

    On CPU: the devices the job simulates, one per rank the launcher (or torchrun) started on this
    node (``LOCAL_WORLD_SIZE``), else 1. A ported guard such as
    ``assert local_rank < nm.device_count()`` then holds on CPU as it does on a node with one
    device per rank.
    """
    return _count(device_spec())


def _count(spec: DeviceSpec) -> int:
    """:func:`device_count` for ``spec``, whatever the environment chooses."""
    if not spec.is_accelerator:
        local = os.environ.get("LOCAL_WORLD_SIZE", "").strip()
        return int(local) if local.isdigit() and int(local) >= 1 else 1
    acc = _accelerator(spec)
    return int(acc.device_count() if acc is not None else _module(spec).device_count())


def current_device_index() -> int:
    """Return the index of this process's current device (0 on CPU)."""
    return _current_index(device_spec())


def _current_index(spec: DeviceSpec) -> int:
    if not spec.is_accelerator:
        return 0
    acc = _accelerator(spec)
    if acc is not None:
        fn = getattr(acc, "current_device_index", None) or acc.current_device_idx
        return int(fn())
    return int(_module(spec).current_device())


def get_device(local_rank: int | None = None) -> torch.device:
    """Return the device for a local rank.

    Args:
        local_rank: index on this node; defaults to ``LOCAL_RANK`` or, outside a job, the
            current device.

    Returns:
        ``torch.device(family, local_rank)`` on an accelerator, ``torch.device("cpu")`` on CPU.
    """
    spec = device_spec()
    if not spec.is_accelerator:
        return torch.device("cpu")
    if local_rank is None:
        local_rank = _local_rank_env()
    if local_rank is None:
        local_rank = current_device_index()
    return torch.device(spec.name, local_rank)


def set_device(index: int | torch.device) -> None:
    """Make ``index`` the current device of this process (nothing to do on CPU)."""
    spec = device_spec()
    if not spec.is_accelerator:
        return
    if isinstance(index, torch.device):
        index = 0 if index.index is None else index.index
    acc = _accelerator(spec)
    if acc is not None:
        (getattr(acc, "set_device_index", None) or acc.set_device_idx)(index)
    else:
        _module(spec).set_device(index)


def synchronize() -> None:
    """Wait for all work queued on the current device (nothing to do on CPU)."""
    spec = device_spec()
    if not spec.is_accelerator:
        return
    acc = _accelerator(spec)
    (acc if acc is not None else _module(spec)).synchronize()


def device_name(index: int | None = None) -> str:
    """Return a human-readable name of a device, such as ``"Ascend910B"``."""
    return _name(device_spec(), index)


def _name(spec: DeviceSpec, index: int | None = None) -> str:
    """:func:`device_name` for ``spec``, whatever the environment chooses."""
    if not spec.is_accelerator:
        return platform.processor() or platform.machine() or "cpu"
    return str(_module(spec).get_device_name(_current_index(spec) if index is None else index))


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy (when installed), torch and every device of the chosen family."""
    random.seed(seed)
    try:
        import numpy as np
    except ImportError:
        pass
    else:
        np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds CUDA and a registered PrivateUse1 device lazily
    spec = device_spec()
    if spec.is_accelerator:
        seed_all = getattr(_module(spec), "manual_seed_all", None)
        if seed_all is not None:
            seed_all(seed)


def autocast(enabled: bool = True, dtype: torch.dtype | None = None) -> AbstractContextManager[Any]:
    """Return ``torch.autocast`` for the chosen family with its default dtype.

    Args:
        enabled: turn mixed precision on; ``False`` gives a context that changes nothing.
        dtype: override the family's default (float16 on npu and cuda, bfloat16 on cpu).
    """
    spec = device_spec()
    return torch.autocast(device_type=spec.name, dtype=dtype or spec.amp_dtype, enabled=enabled)


def grad_scaler(enabled: bool = True, dtype: torch.dtype | None = None, **kwargs: Any) -> Any:
    """Return a gradient scaler that fits :func:`autocast` on the chosen family.

    Loss scaling is only needed for float16; with bfloat16 (the CPU default) the scaler is
    returned disabled, so ``scaler.scale(loss).backward(); scaler.step(opt); scaler.update()``
    works unchanged everywhere.

    Args:
        enabled: whether mixed precision is on at all.
        dtype: the autocast dtype in use; defaults to the family's.
        **kwargs: passed to the scaler (``init_scale``, ``growth_interval``...).
    """
    spec = device_spec()
    enabled = bool(enabled) and (dtype or spec.amp_dtype) == torch.float16
    amp = getattr(torch, "amp", None)
    if amp is not None and hasattr(amp, "GradScaler"):  # torch >= 2.3: one class, device argument
        return amp.GradScaler(spec.name, enabled=enabled, **kwargs)
    legacy = getattr(getattr(_module(spec), "amp", None), "GradScaler", None)
    if legacy is None:
        if enabled:
            raise DeviceUnavailableError(
                f"float16 loss scaling on {spec.name} needs torch >= 2.3 (torch {torch.__version__} "
                "is installed). Use bfloat16 autocast or upgrade torch."
            )
        legacy = torch.cuda.amp.GradScaler  # disabled: a pass-through that never touches CUDA
    return legacy(enabled=enabled, **kwargs)


def empty_cache() -> None:
    """Release cached device memory back to the driver (nothing to do on CPU)."""
    spec = device_spec()
    if not spec.is_accelerator:
        return
    acc = _accelerator(spec)
    target = acc if acc is not None and hasattr(acc, "empty_cache") else _module(spec)
    target.empty_cache()


def memory_stats(index: int | None = None) -> dict[str, int] | None:
    """Return allocator figures in bytes for a device, or ``None`` where the family has none.

    Keys: ``allocated``, ``max_allocated``, ``reserved``, ``max_reserved``.
    """
    spec = device_spec()
    if not spec.is_accelerator:
        return None
    mod = _module(spec)
    index = current_device_index() if index is None else index
    names = {
        "allocated": "memory_allocated",
        "max_allocated": "max_memory_allocated",
        "reserved": "memory_reserved",
        "max_reserved": "max_memory_reserved",
    }
    stats = {key: int(getattr(mod, fn)(index)) for key, fn in names.items() if hasattr(mod, fn)}
    return stats or None


def reset_peak_memory_stats(index: int | None = None) -> None:
    """Reset the peak figures of :func:`memory_stats` (nothing to do on CPU)."""
    spec = device_spec()
    if spec.is_accelerator and hasattr(_module(spec), "reset_peak_memory_stats"):
        _module(spec).reset_peak_memory_stats(current_device_index() if index is None else index)


def _memory_figure(fn: str, index: int | None) -> int:
    spec = device_spec()
    if not spec.is_accelerator:
        return 0
    return int(getattr(_module(spec), fn)(current_device_index() if index is None else index))


def memory_allocated(index: int | None = None) -> int:
    """Bytes held by tensors on a device, like ``torch.cuda.memory_allocated`` (0 on CPU)."""
    return _memory_figure("memory_allocated", index)


def max_memory_allocated(index: int | None = None) -> int:
    """Peak of :func:`memory_allocated` since start or the last reset (0 on CPU)."""
    return _memory_figure("max_memory_allocated", index)


def memory_reserved(index: int | None = None) -> int:
    """Bytes held by the caching allocator, like ``torch.cuda.memory_reserved`` (0 on CPU)."""
    return _memory_figure("memory_reserved", index)


def max_memory_reserved(index: int | None = None) -> int:
    """Peak of :func:`memory_reserved` (0 on CPU)."""
    return _memory_figure("max_memory_reserved", index)


def manual_seed_all(seed: int) -> None:
    """Seed the random generators of every device of the family, like ``torch.cuda.manual_seed_all``.

    Only device generators: on CPU, where ``torch.cuda.manual_seed_all`` does nothing either,
    nothing happens. Use :func:`seed_everything` to seed Python, NumPy and torch as well.
    """
    spec = device_spec()
    if spec.is_accelerator:
        _module(spec).manual_seed_all(seed)


def accelerator_available() -> bool:
    """True when the chosen family is an accelerator: the portable ``torch.cuda.is_available()``."""
    return device_spec().is_accelerator


def device_ids(local_rank: int | None = None) -> list[int] | None:
    """DDP's ``device_ids`` for a local rank: ``[index]`` on an accelerator, ``None`` on CPU."""
    index = get_device(local_rank).index
    return None if index is None else [index]


def output_device(local_rank: int | None = None) -> int | None:
    """DDP's ``output_device`` for a local rank: the index on an accelerator, ``None`` on CPU."""
    return get_device(local_rank).index


def visible_devices_env() -> str:
    """Name of the variable that masks the family's devices (``ASCEND_RT_VISIBLE_DEVICES``...).

    On CPU, which has none, ``CUDA_VISIBLE_DEVICES`` is returned: setting it hides nothing the
    job uses, so code that writes it keeps working.
    """
    return device_spec().visible_devices_env or DEVICES[SOURCE_FAMILY].visible_devices_env or ""
