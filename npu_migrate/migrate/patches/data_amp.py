"""Data loading and mixed precision: ``DataLoader(pin_memory=)``, ``torch.autocast("cuda")``, ``GradScaler``.

Usage::

    from npu_migrate.migrate.patches import data_amp

    data_amp.install()   # autocast("cuda") runs the target's autocast with its AMP dtype

On a target whose AMP dtype is bfloat16 (the CPU) loss scaling is not needed: ``GradScaler``\\ s
the user creates are disabled pass-throughs.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

import torch

from npu_migrate.migrate.callers import is_internal_caller, record
from npu_migrate.migrate.state import STATE, on_cpu, patch


def autocast(enabled: bool = True, dtype: torch.dtype | None = None, cache_enabled: bool = True) -> Any:
    """``torch.cuda.amp.autocast`` on the target: the target's autocast and AMP dtype."""
    return torch.autocast(STATE.target.name, dtype=dtype or STATE.target.amp_dtype,  # type: ignore[union-attr]
                          enabled=enabled, cache_enabled=cache_enabled)


def cuda_grad_scaler(*args: Any, **kwargs: Any) -> Any:
    """``torch.cuda.amp.GradScaler(...)`` on the target."""
    kwargs.pop("device", None)
    if args and isinstance(args[0], str):
        args = args[1:]
    return new_grad_scaler(*args, **kwargs)


def new_grad_scaler(*args: Any, **kwargs: Any) -> Any:
    """A GradScaler for the target: disabled where the AMP dtype is not float16."""
    spec = STATE.require_target("new_grad_scaler()")
    if spec.amp_dtype != torch.float16:  # bfloat16 autocast needs no loss scaling
        kwargs["enabled"] = False
    if "amp.GradScaler" in STATE.originals:  # torch >= 2.3: one class with a device argument
        return STATE.originals["amp.GradScaler"](spec.name, *args, **kwargs)
    # torch < 2.3: a class per device module (torch_npu's torch.npu.amp.GradScaler). The CPU has
    # none, and needs none (bfloat16): CUDA's own class, disabled, is a pass-through that never
    # touches CUDA. Its module attribute is not the patched torch.cuda.amp.GradScaler.
    own = getattr(getattr(getattr(torch, spec.name, None), "amp", None), "GradScaler", None)
    if own is None:
        from torch.cuda.amp import grad_scaler

        own = grad_scaler.GradScaler
    return own(*args, **kwargs)


def install() -> None:
    """Patch ``DataLoader.__init__``, ``autocast.__init__`` and ``torch.amp.GradScaler``."""
    from torch.utils.data import DataLoader

    loader_init = DataLoader.__init__
    accepts_device = "pin_memory_device" in loader_init.__code__.co_varnames

    def data_loader(self: Any, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("pin_memory"):
            if on_cpu():
                kwargs["pin_memory"] = False  # nothing to pin for: the batches stay on the CPU
                record("DataLoader(pin_memory=True)", "noop", "no pinning on cpu")
            elif accepts_device and not kwargs.get("pin_memory_device"):
                kwargs["pin_memory_device"] = STATE.target.name  # type: ignore[union-attr]
                record("DataLoader(pin_memory=True)")
        loader_init(self, *args, **kwargs)

    functools.update_wrapper(data_loader, loader_init)
    patch(DataLoader, "__init__", data_loader)

    autocast_init = torch.amp.autocast_mode.autocast.__init__

    def autocast_(self: Any, device_type: str, dtype: Any = None, *args: Any, **kwargs: Any) -> None:
        if device_type == "cuda" and not is_internal_caller(sys._getframe(1)):
            device_type = STATE.target.name  # type: ignore[union-attr]
            dtype = dtype if dtype is not None else STATE.target.amp_dtype  # type: ignore[union-attr]
            record('torch.autocast(device_type="cuda")')
        autocast_init(self, device_type, dtype, *args, **kwargs)

    functools.update_wrapper(autocast_, autocast_init)
    patch(torch.amp.autocast_mode.autocast, "__init__", autocast_)

    scaler = getattr(torch.amp, "GradScaler", None)
    if scaler is not None:
        STATE.originals["amp.GradScaler"] = scaler

        class GradScaler(scaler):  # type: ignore[misc, valid-type]
            def __init__(self, device: str = "cuda", *args: Any, **kwargs: Any) -> None:
                if device == "cuda" and not is_internal_caller(sys._getframe(1)):
                    device = STATE.target.name  # type: ignore[union-attr]
                    if STATE.target.amp_dtype != torch.float16:  # type: ignore[union-attr]
                        kwargs["enabled"] = False
                    record('torch.amp.GradScaler("cuda")')
                super().__init__(device, *args, **kwargs)

            def __reduce_ex__(self, protocol: Any) -> Any:
                # Pickled as torch's own class, so a process without migration loads it too.
                return object.__new__, (scaler,), self.__getstate__()

        GradScaler.__qualname__ = GradScaler.__name__ = "GradScaler"
        # Under the public names only. torch.amp.grad_scaler keeps the original, so every
        # scaler, ours included, pickles as that class and loads in any process.
        for owner in (torch.amp, torch):
            if getattr(owner, "GradScaler", None) is scaler:
                patch(owner, "GradScaler", GradScaler)
