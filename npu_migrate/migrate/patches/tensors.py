"""Tensors and modules: every ``device`` argument, ``Tensor.to``/``.cuda``/``.is_cuda``/``.pin_memory``, ``Module.to``.

Usage::

    from npu_migrate.migrate.patches import tensors

    tensors.install()   # torch.zeros(2, device="cuda"), torch.hann_window(8, device="cuda"),
                        # torch.Generator(device="cuda") and x.cuda() land on the target

Which functions take a device is not a list here: :func:`npu_migrate.cuda_api.device_apis` reads
it from torch's operator schemas, signatures and docstrings, and :func:`npu_migrate.cuda_api.classify_torch`
says how each is handled. A torch release that adds a factory gets it wrapped with no change here.
"""

from __future__ import annotations

import functools
import inspect
import sys
from typing import Any, Callable

import torch

from npu_migrate import cuda_api
from npu_migrate.migrate.callers import caller_aware, is_internal_caller, record, switch_class
from npu_migrate.migrate.mapping import map_device, target_device
from npu_migrate.migrate.report import REPORT
from npu_migrate.migrate.sim import index
from npu_migrate.migrate.state import STATE, on_cpu, patch


def remap_device_kwarg(kwargs: dict[str, Any], api: str) -> None:
    """Map ``kwargs["device"]`` in place when it is a CUDA device, and count it as ``api``."""
    dev = kwargs.get("device")
    if dev is not None:
        if type(dev) is str and not dev.startswith("cuda"):
            return  # the common "cpu"/"npu:0": no call at all
        mapped = map_device(dev)
        if mapped is not dev:
            kwargs["device"] = mapped
            record(api)


def device_kwarg(original: Callable[..., Any], api: str) -> Callable[..., Any]:
    """``original`` with a CUDA ``device=`` keyword mapped to the target."""
    mapped_strings = STATE.mapped

    def call(*args: Any, **kwargs: Any) -> Any:
        if kwargs:  # no lookup at all for torch.ones_like(x) from autograd
            dev = kwargs.get("device")
            if dev is not None:
                # The hot path, torch.randn(n, device="cuda") every step: a string mapped before,
                # counted in place (what record() does, without two calls).
                hit = mapped_strings.get(dev) if type(dev) is str else None
                if hit is not None:
                    kwargs["device"] = hit
                    entry = REPORT.entries.get(api)
                    if entry is not None:
                        entry["count"] += 1
                    else:
                        record(api)
                else:
                    remap_device_kwarg(kwargs, api)
        return original(*args, **kwargs)

    functools.update_wrapper(call, original)
    return call


def device_args(original: Callable[..., Any], api: str) -> Callable[..., Any]:
    """``original`` with a CUDA device mapped whether passed by keyword or positionally (str/torch.device)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        if args:
            for i, value in enumerate(args):
                if type(value) in (str, torch.device):
                    mapped = map_device(value)
                    if mapped is not value:
                        args = (*args[:i], mapped, *args[i + 1:])
                        record(api)
        if kwargs and "device" in kwargs:
            remap_device_kwarg(kwargs, api)
        return original(*args, **kwargs)

    functools.update_wrapper(call, original)
    return call


def device_class(original: type, api: str, positional: bool) -> type:
    """A stand-in for a class that takes a device (``torch.Generator``): user code's CUDA device is mapped."""
    construct = (device_args if positional else device_kwarg)(original, api)
    return switch_class(original, construct, api, "redirected")


def _resolve(qualname: str) -> tuple[Any, str]:
    owner_name, _, attr = qualname.rpartition(".")
    owner: Any = torch
    for part in owner_name.split(".")[1:]:
        owner = getattr(owner, part)
    return owner, attr


def _install_device_apis() -> None:
    """Wrap every torch function, class and Tensor method whose device argument torch's metadata shows."""
    for qualname, param in cuda_api.device_apis().items():
        row = cuda_api.classify_torch(qualname, param.type)
        if row is None or row.op not in ("device_arg", "device_query"):
            continue  # the others have their own patch; an unclassified API fails the coverage test
        owner, attr = _resolve(qualname)
        value = getattr(owner, attr)
        api = f"{qualname.replace('torch.Tensor.', 'Tensor.')}(device=)"
        if row.op == "device_query":
            patch(owner, attr, caller_aware(value, device_args(value, api), api, "redirected"))
        elif inspect.isclass(value):
            patch(owner, attr, device_class(value, api, param.positional))
        else:
            patch(owner, attr, (device_args if param.positional else device_kwarg)(value, api))
    # Storages: every legacy and typed storage class constructs through TypedStorage.__new__ and
    # __init__ (both see the call's arguments). Patching those methods, not the classes, keeps
    # checkpoints that name the classes loadable.
    typed = torch.storage.TypedStorage
    for method in ("__new__", "__init__"):
        patch(typed, method, _storage_method(vars(typed)[method], method == "__new__"))


def _storage_method(original: Any, is_new: bool) -> Any:
    original = original.__func__ if isinstance(original, staticmethod) else original

    def method(cls_or_self: Any, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("device") is not None:
            cls = cls_or_self if is_new else type(cls_or_self)
            remap_device_kwarg(kwargs, f"torch.{cls.__name__}(device=)")
        return original(cls_or_self, *args, **kwargs)

    functools.update_wrapper(method, original)
    return staticmethod(method) if is_new else method


def to_wrapper(original: Callable[..., Any], api: str) -> Callable[..., Any]:
    """``Tensor.to``/``Module.to`` with a CUDA device, positional or keyword, mapped to the target."""

    device_type = torch.device
    mapped_strings = STATE.mapped

    def to(self: Any, *args: Any, **kwargs: Any) -> Any:
        if args:
            first = args[0]
            kind = type(first)
            if kind is str:
                # The hot path, x.to("cuda") every step: a string mapped before, counted in place
                # (what record() does). Without the two calls, 700 -> 400 ns over x.to("cpu"), and
                # bench_migrate.py's 300 us step 1.033 -> 1.024 of native (docs/migrate.md).
                mapped = mapped_strings.get(first)
                if mapped is not None:
                    args = (mapped, *args[1:])
                    entry = REPORT.entries.get(api)
                    if entry is not None:
                        entry["count"] += 1
                    else:
                        record(api)
                elif first.startswith("cuda"):
                    mapped = map_device(first)
                    if mapped is not first:
                        args = (mapped, *args[1:])
                        record(api)
            elif kind is device_type or kind is int:
                mapped = map_device(first)
                if mapped is not first:
                    args = (mapped, *args[1:])
                    record(api)
        if kwargs and "device" in kwargs:  # x.to("cuda", non_blocking=True): no second call
            remap_device_kwarg(kwargs, api)
        return original(self, *args, **kwargs)

    functools.update_wrapper(to, original)
    return to


def _import_device_mode() -> Any:
    try:
        import torch.utils._device as device_mode
    except ImportError:
        return None
    return device_mode


def install() -> None:
    """Patch the tensor factories, ``Tensor``'s device methods and ``Module.to``/``.cuda``."""
    # ``with torch.device("meta"):`` fills in the device of the factories in a set torch builds on
    # first use (torch.utils._device._device_constructors, cached): built after the patches, it
    # held the wrappers, never the functions torch dispatches, and meta models landed on the CPU.
    device_mode = sys.modules.get("torch.utils._device") or _import_device_mode()
    constructors = getattr(device_mode, "_device_constructors", None)
    if constructors is not None:
        constructors()
    context = getattr(device_mode, "DeviceContext", None)
    if context is not None:  # ``with torch.device("cuda"):`` makes the target's device the default
        patch(context, "__init__", device_args(vars(context)["__init__"], 'with torch.device("cuda")'))
    tensor_to = torch.Tensor.to
    module_to = torch.nn.Module.to
    patch(torch.Tensor, "to", to_wrapper(tensor_to, "Tensor.to"))
    patch(torch.nn.Module, "to", to_wrapper(module_to, "Module.to"))

    mapped_strings = STATE.mapped

    def tensor_cuda(self: Any, device: Any = None, non_blocking: bool = False, **kwargs: Any) -> Any:
        # The hot path, x.cuda() every step: the current device, once mapped (kept on the CPU only,
        # where it does not change), counted in place as in to_wrapper.
        mapped = mapped_strings.get("cuda") if device is None else None
        if mapped is None:
            mapped = map_device("cuda") if device is None else target_device(index(device))
        entry = REPORT.entries.get("Tensor.cuda")
        if entry is not None:
            entry["count"] += 1
        else:
            record("Tensor.cuda")
        return tensor_to(self, mapped, non_blocking=non_blocking, **kwargs)

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
    pin_memory = torch.Tensor.pin_memory
    record_stream = torch.Tensor.record_stream

    def pin_memory_(self: Any, *args: Any, **kwargs: Any) -> Any:
        if on_cpu():
            record("Tensor.pin_memory", "noop", "no pinning on cpu")
            return self  # host memory is all there is
        args = tuple(map_device(a) for a in args)
        if "device" in kwargs:
            kwargs["device"] = map_device(kwargs["device"])
        return pin_memory(self, *args, **kwargs)

    def record_stream_(self: Any, stream: Any) -> None:
        if on_cpu():
            record("Tensor.record_stream", "noop", "one host stream on cpu")
            return None
        return record_stream(self, stream)

    functools.update_wrapper(pin_memory_, pin_memory)
    functools.update_wrapper(record_stream_, record_stream)
    patch(torch.Tensor, "pin_memory", pin_memory_)
    patch(torch.Tensor, "record_stream", record_stream_)
    _install_device_apis()
    set_default = torch.set_default_device

    def set_default_device(device: Any) -> None:
        mapped = map_device(device)
        if mapped is not device:
            record("torch.set_default_device")
        set_default(mapped)

    patch(torch, "set_default_device", set_default_device)
