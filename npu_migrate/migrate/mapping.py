"""Value mapping: CUDA device values, ``nccl`` backends and CUDA environment variables become the target's.

Usage::

    from npu_migrate.migrate.mapping import map_backend, map_device

    map_device("cuda:1")          # torch.device("npu", 1) on npu, torch.device("cpu") on cpu
    map_device("runs/cuda_exp")   # returned as it is: not a device
    map_backend("cuda:nccl,cpu:gloo")   # "npu:hccl,cpu:gloo" on npu, "cpu:gloo" on cpu

Only device values move. A value is rewritten when it *is* a CUDA device (``"cuda"``,
``"cuda:1"``, ``torch.device("cuda", 1)``, an int device index); strings that merely contain
"cuda" are never touched, and an unchanged value comes back as the same object (callers test
``mapped is not value`` to count a redirection).
"""

from __future__ import annotations

import os
import re
from typing import Any

import torch

from npu_migrate import device as _device
from npu_migrate.migrate.report import REPORT
from npu_migrate.migrate.state import STATE
from npu_migrate.registry import DeviceSpec

_CUDA_RE = re.compile(r"^cuda(?::(\d+))?$")
_CPU = torch.device("cpu")


def target_device(index: int | None) -> torch.device:
    """The target's device for CUDA device ``index`` (``None``: the current device)."""
    spec = STATE.require_target("target_device()")
    if not spec.is_accelerator:
        return _CPU
    # "cuda" with no index means the current device: name it, rather than leave the target's
    # index-less device to whatever the backend resolves it to.
    return torch.device(spec.name, _device.current_device_index() if index is None else index)


def map_device(value: Any) -> Any:
    """A CUDA device value becomes the target's; anything else comes back as it is.

    A CUDA device string is mapped once per target and kept in ``STATE.mapped``, which the hot
    wrappers read first. ``"cuda"`` alone names the current device, which changes on an
    accelerator: it is kept only on the CPU.
    """
    kind = type(value)
    if kind is str:
        if not value.startswith("cuda"):
            return value
        hit = STATE.mapped.get(value)
        if hit is not None:
            return hit
        match = _CUDA_RE.match(value)
        if match is None:
            return value
        mapped = target_device(int(match.group(1)) if match.group(1) else None)
        if match.group(1) or not STATE.target.is_accelerator:  # type: ignore[union-attr]
            STATE.mapped[value] = mapped
        return mapped
    if kind is torch.device:
        return target_device(value.index) if value.type == "cuda" else value
    if kind is int:
        return target_device(value)
    return value


def map_backend(value: Any) -> Any:
    """``nccl`` -> the target's backend; ``cuda:nccl,cpu:gloo`` -> ``npu:hccl,cpu:gloo`` or ``cpu:gloo``."""
    if not isinstance(value, str) or "nccl" not in value.lower():
        return value
    spec = STATE.require_target("map_backend()")
    ours = _device.default_backend(spec)
    if ":" not in value:
        return ours if value.lower() == "nccl" else value
    pairs = []
    for part in value.split(","):
        dev, _, name = part.partition(":")
        dev = spec.name if dev.strip() == "cuda" else dev.strip()
        name = ours if name.strip().lower() == "nccl" else name.strip()
        if (dev, name) not in pairs:
            pairs.append((dev, name))
    by_device: dict[str, str] = {}
    for dev, name in pairs:
        by_device.setdefault(dev, name)
    return ",".join(f"{d}:{n}" for d, n in by_device.items())


def map_environment(spec: DeviceSpec) -> None:
    """CUDA_VISIBLE_DEVICES and PYTORCH_CUDA_ALLOC_CONF take their Ascend names on npu."""
    cuda = _device.DEVICES["cuda"]
    for attr in ("visible_devices_env", "alloc_conf_env"):
        theirs, ours = getattr(cuda, attr), getattr(spec, attr)
        if ours and theirs in os.environ and ours not in os.environ:
            STATE.env_before.setdefault(ours, None)
            os.environ[ours] = os.environ[theirs]
            REPORT.record(f"${theirs}", "redirected", "environment", f"copied to {ours}")
