"""A probe's statistics: what is computed per tensor on its device, and how a step's become records.

Usage::

    stats = tensor_stats(tensor)                   # min, max, mean, norm, NaN and Inf counts, on the device
    job = functools.partial(step_records, fence, step, losses, grad_parts, lr, autocast, modules)
    writer.put(job)                                # the values are fetched where the file is written

:func:`tensor_stats` runs in the training thread, right where a tensor is seen (it may change or
be freed afterwards); nothing is fetched from an accelerator there. :class:`ModuleStats` holds a
step's statistics stacked on the device, one tensor per device and dtype; :func:`step_records`
turns a step's tensors into its ``step``, ``layout`` and ``modules`` records
(:mod:`npu_migrate.compare.records`), after waiting for the device (:class:`~npu_migrate.compare.recording.writer.DeviceFence`).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch

from npu_migrate.compare import records
from npu_migrate.compare.recording.writer import DeviceFence


@functools.lru_cache(maxsize=None)
def dtype_name(dtype: torch.dtype) -> str:
    """``float32`` for ``torch.float32``: the spelling of the records."""
    return str(dtype).replace("torch.", "")


def autocast_dtype(device_type: str) -> str | None:
    """The autocast dtype active now on ``device_type`` or the CPU, else ``None``."""
    for dev in dict.fromkeys((device_type, "cpu")):
        try:  # torch >= 2.4: one API for every device type
            if torch.is_autocast_enabled(dev):
                return dtype_name(torch.get_autocast_dtype(dev))
            continue
        except (TypeError, AttributeError, RuntimeError):
            pass
        if dev == "cpu" and torch.is_autocast_cpu_enabled():
            return dtype_name(torch.get_autocast_cpu_dtype())
        if dev == "cuda" and torch.is_autocast_enabled():
            return dtype_name(torch.get_autocast_gpu_dtype())
        module = getattr(torch, dev, None)  # torch_npu on torch < 2.4: torch.npu.is_autocast_enabled()
        if dev not in ("cpu", "cuda") and hasattr(module, "is_autocast_enabled"):
            try:
                if module.is_autocast_enabled():
                    return dtype_name(module.get_autocast_dtype())
            except Exception:  # noqa: BLE001 - an extension without the query records no autocast
                pass
    return None


HF32_SWITCHES = ("conv", "matmul")
"""torch_npu's objects under ``torch.npu`` whose ``allow_hf32`` lets float32 run in HF32 (a test reads
them from the released wheels' ``torch_npu/npu/__init__.py``)."""


def float32_math(device_type: str) -> str | None:
    """The narrower format ``device_type`` computes float32 convolutions or matrix products in now, or ``None``.

    ``tfloat32`` on CUDA devices of compute capability 8.0 or newer while cuDNN's
    ``torch.backends.cudnn.allow_tf32`` (convolutions; on by default) or cuBLAS's
    ``torch.backends.cuda.matmul.allow_tf32`` (off by default) is set; ``hfloat32`` on Ascend while
    torch_npu's ``torch.npu.conv.allow_hf32`` (on by default) or ``torch.npu.matmul.allow_hf32`` is
    set. Both keep float32's range with about float16's precision (10 and 11 bits of mantissa), so a
    float32 run on such a device agrees with a CPU run only to that precision.
    """
    try:
        if device_type == "cuda":
            if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 0):
                return None
            backends = torch.backends
            on = (backends.cudnn.allow_tf32 and backends.cudnn.is_available()) or backends.cuda.matmul.allow_tf32
            return "tfloat32" if on else None
        module = getattr(torch, device_type, None) if device_type != "cpu" else None
        if module is not None and any(getattr(getattr(module, part, None), "allow_hf32", False) is True
                                      for part in HF32_SWITCHES):
            return "hfloat32"
    except Exception:  # noqa: BLE001 - a device without the switches computes float32 as float32
        return None
    return None


def tensor_stats(tensor: torch.Tensor) -> torch.Tensor:
    """min, max, mean, L2 norm, NaN count and Inf count of ``tensor``, as one tensor on its device.

    Computed in float32, or float64 for float64 tensors; complex tensors by magnitude. Nothing
    is fetched from an accelerator here. The NaN and Inf counts are two more passes over the
    tensor, each several times dearer than the other four statistics together on a CPU; they
    are skipped there when min and max are finite (then both counts are 0), since reading a CPU
    value costs no device synchronisation. On an accelerator they are always counted on the device.
    """
    x = tensor.detach()
    if x.is_complex():
        x = x.abs()
    if x.dtype != torch.float64:
        x = x.float()
    if x.numel() == 0:
        return torch.zeros(records.NSTATS, dtype=x.dtype, device=x.device)
    low, high = torch.aminmax(x)
    mean, norm = x.mean(), torch.linalg.vector_norm(x)
    if x.device.type == "cpu" and math.isfinite(low) and math.isfinite(high):
        zero = _cpu_zero(x.dtype)
        return torch.stack((low, high, mean, norm, zero, zero))
    return torch.stack((low, high, mean, norm, torch.isnan(x).sum().to(x.dtype), torch.isinf(x).sum().to(x.dtype)))


@functools.lru_cache(maxsize=None)
def _cpu_zero(dtype: torch.dtype) -> torch.Tensor:
    return torch.zeros((), dtype=dtype)


class ModuleStats:
    """One step's module statistics as the training thread leaves them: stacked, still on the device."""

    __slots__ = ("step", "layout_id", "layout", "count", "groups")

    def __init__(self, step: int, layout_id: int, layout: dict[str, Any] | None, count: int,
                 groups: list[tuple[list[int], torch.Tensor]]) -> None:
        self.step, self.layout_id, self.layout, self.count, self.groups = step, layout_id, layout, count, groups

    def __call__(self) -> list[dict[str, Any]]:
        """The ``layout`` line (for a new layout) and the ``modules`` line; fetches the values to the host."""
        rows: list[Any] = [None] * self.count
        for idx, block in self.groups:
            for i, row in zip(idx, block.to("cpu").double().tolist()):
                rows[i] = row
        flat = [v for row in rows for v in row]
        line = {"kind": "modules", "step": self.step, "layout": self.layout_id, "stats": records.encode_stats(flat)}
        return [line] if self.layout is None else [self.layout, line]


def fenced(fence: DeviceFence | None, job: Any) -> list[dict[str, Any]]:
    """``job()`` once the device has done the work queued before ``fence``."""
    if fence is not None:
        fence.wait()
    return job()


def step_records(fence: DeviceFence | None, step: int, losses: list[torch.Tensor], grad_parts: list[torch.Tensor],
                 lr: float | None, autocast: str | None, modules: ModuleStats | None,
                 float32: str | None = None) -> list[dict[str, Any]]:
    """A step's records from what the training thread left on the device (run by the writer)."""
    if fence is not None:
        fence.wait()
    loss = torch.stack([t.to("cpu", torch.float64) for t in losses]).mean().item() if losses else None
    grad_norm = None
    if grad_parts:
        grad_norm = torch.linalg.vector_norm(torch.stack([p.to("cpu", torch.float64) for p in grad_parts])).item()
    out = [{"kind": "step", "step": step, "loss": loss, "backwards": len(losses), "grad_norm": grad_norm, "lr": lr,
            "autocast": autocast, **({"float32_math": float32} if float32 else {})}]
    return out + modules() if modules is not None else out
