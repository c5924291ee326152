"""Tensors and modules: factories' ``device=``, ``Tensor.to``/``.cuda``/``.is_cuda``, ``Module.to``/``.cuda``.

Usage::

    from npu_migrate.migrate.patches import tensors

    tensors.install()   # torch.zeros(2, device="cuda") and x.cuda() land on the target
"""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable

import torch

from npu_migrate.migrate.callers import is_internal_caller, record
from npu_migrate.migrate.mapping import map_device, target_device
from npu_migrate.migrate.sim import index
from npu_migrate.migrate.state import STATE, patch

FACTORIES = (
    "tensor", "as_tensor", "asarray", "zeros", "ones", "empty", "full", "rand", "randn", "randint",
    "randperm", "arange", "range", "linspace", "logspace", "eye", "zeros_like", "ones_like",
    "empty_like", "full_like", "rand_like", "randn_like", "randint_like", "empty_strided",
    "scalar_tensor", "tril_indices", "triu_indices", "normal", "frombuffer",
)
TENSOR_NEW = ("new_tensor", "new_zeros", "new_ones", "new_empty", "new_full", "new_empty_strided")


def remap_device_kwarg(kwargs: dict[str, Any], api: str) -> None:
    """Map ``kwargs["device"]`` in place when it is a CUDA device, and count it as ``api``."""
    dev = kwargs.get("device")
    if dev is not None:
        mapped = map_device(dev)
        if mapped is not dev:
            kwargs["device"] = mapped
            record(api)


def device_kwarg(original: Callable[..., Any], api: str) -> Callable[..., Any]:
    """``original`` with a CUDA ``device=`` keyword mapped to the target."""

    def call(*args: Any, **kwargs: Any) -> Any:
        if kwargs:
            remap_device_kwarg(kwargs, api)
        return original(*args, **kwargs)

    functools.update_wrapper(call, original)
    return call


def to_wrapper(original: Callable[..., Any], api: str) -> Callable[..., Any]:
    """``Tensor.to``/``Module.to`` with a CUDA device, positional or keyword, mapped to the target."""

    def to(self: Any, *args: Any, **kwargs: Any) -> Any:
        if args:
            first = args[0]
            if type(first) in (str, torch.device, int):
                mapped = map_device(first)
                if mapped is not first:
                    args = (mapped, *args[1:])
                    record(api)
        if kwargs:
            remap_device_kwarg(kwargs, api)
        return original(self, *args, **kwargs)

    functools.update_wrapper(to, original)
    return to


def install() -> None:
    """Patch the tensor factories, ``Tensor``'s device methods and ``Module.to``/``.cuda``."""
    tensor_to = torch.Tensor.to
    module_to = torch.nn.Module.to
    patch(torch.Tensor, "to", to_wrapper(tensor_to, "Tensor.to"))
    patch(torch.nn.Module, "to", to_wrapper(module_to, "Module.to"))

    def tensor_cuda(self: Any, device: Any = None, non_blocking: bool = False, **kwargs: Any) -> Any:
        record("Tensor.cuda")
        return tensor_to(self, target_device(index(device)), non_blocking=non_blocking, **kwargs)

    def module_cuda(self: Any, device: Any = None) -> Any:
        record("Module.cuda")
        return module_to(self, target_device(index(device)))

    patch(torch.Tensor, "cuda", tensor_cuda)
    patch(torch.nn.Module, "cuda", module_cuda)
    # torch < 2.2 names the C base class _TensorBase.
    tensor_base = torch._C.TensorBase if hasattr(torch._C, "TensorBase") else torch._C._TensorBase
    is_cuda = tensor_base.is_cuda
    name = STATE.target.name  # type: ignore[union-attr]

    def get_is_cuda(self: Any) -> bool:
        if is_internal_caller(sys._getframe(1)):
            return is_cuda.__get__(self)
        record("Tensor.is_cuda")
        return self.device.type == name

    patch(torch.Tensor, "is_cuda", property(get_is_cuda))
    for fname in FACTORIES:
        if hasattr(torch, fname):
            patch(torch, fname, device_kwarg(getattr(torch, fname), f"torch.{fname}(device=)"))
    for fname in TENSOR_NEW:
        if hasattr(torch.Tensor, fname):
            patch(torch.Tensor, fname, device_kwarg(getattr(torch.Tensor, fname), f"Tensor.{fname}(device=)"))
    set_default = torch.set_default_device

    def set_default_device(device: Any) -> None:
        mapped = map_device(device)
        if mapped is not device:
            record("torch.set_default_device")
        set_default(mapped)

    patch(torch, "set_default_device", set_default_device)
