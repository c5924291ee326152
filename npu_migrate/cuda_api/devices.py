"""The rest of torch that reaches CUDA: torch functions, classes and Tensor methods that take a device.

Usage::

    from npu_migrate.cuda_api import classify_torch, device_apis

    classify_torch("torch.Tensor.cuda").op          # "cuda": runtime migration's own mapping
    classify_torch("torch.zeros", "Optional[Device]").op   # "device_arg": the argument is mapped
    device_apis()["torch.hann_window"]              # DeviceParam("Optional[Device]", False, "schema")

Every torch function, class and Tensor method that takes a ``device`` (found by
:func:`device_apis` in torch's operator schemas, signatures and docstrings), and every Tensor
method about CUDA (:func:`tensor_cuda_apis`: ``cuda``, ``is_cuda``, ``pin_memory``,
``record_stream``...) has a row here (:data:`TORCH_API`) or is classified by rule: a ``device``
parameter typed as a torch Device classifies itself (the argument is mapped); anything else needs a
row. :mod:`npu_migrate.migrate.patches.tensors` patches what these rows say.

Nothing is imported from torch at import; :func:`device_apis` and :func:`tensor_cuda_apis` import
it when called (the tests and runtime migration call them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from npu_migrate.cuda_api.row import CudaApi, Kind, Row
from npu_migrate.cuda_api.row import ignored as _i
from npu_migrate.cuda_api.row import mapped as _m
from npu_migrate.cuda_api.row import noop as _n


# How a row of TORCH_API is applied at run time (its ``op``):
#   device_arg: a CUDA ``device`` argument (keyword, or positional where the signature allows it)
#       becomes the target's device; the call is otherwise unchanged.
#   device_query: the same, for the user's code only (torch's own code gets torch's answer).
#   to / cuda / is_cuda / set_default_device / grad_scaler: their own mapping in npu_migrate.migrate.
#   pin_memory / record_stream: a no-op on the CPU target (host memory is all there is), the
#       target's own on an accelerator.
_DEVICE_ARG = "its device argument is mapped to the target's device"
_ROWS_TORCH: dict[str, Row] = {
    "torch.Tensor.to": _m("to", note="a CUDA device, positional or keyword, becomes the target's"),
    "torch.nn.Module.to": _m("to", note="a CUDA device, positional or keyword, becomes the target's"),
    "torch.Tensor.cuda": _m("cuda", "device", "non_blocking", note="moves to the target's current (or given) device"),
    "torch.nn.Module.cuda": _m("cuda", "device", note="moves to the target's current (or given) device"),
    "torch.Tensor.is_cuda": _m("is_cuda", note="True on the target's device, for the user's code"),
    "torch.Tensor.pin_memory": _m("pin_memory", note="no-op on cpu (host memory is all there is); the target's "
                                  "pinned memory on an accelerator"),
    "torch.Tensor.is_pinned": _m("device_arg", note=_DEVICE_ARG),
    "torch.Tensor.record_stream": _m("record_stream", "stream", note="no-op on cpu (one host stream); the target's "
                                     "on an accelerator"),
    "torch.Tensor.__cuda_array_interface__": _n("torch's own answer: a tensor on the target has none (AttributeError), "
                                                "so CuPy/Numba take their non-CUDA path"),
    "torch.set_default_device": _m("set_default_device", "device", note=_DEVICE_ARG),
    "torch.GradScaler": _m("grad_scaler", "device", note="a scaler for the target (disabled where AMP is bfloat16)"),
    # A question, not a placement: torch.accelerator asks it about CUDA and must get the truth.
    "torch.get_device_module": _m("device_query", "device", note="the target's device module, for the user's code"),
    # Classes with a device argument whose metadata is a docstring line ("Stream(device, *, priority)").
    "torch.Stream": _m("device_arg", "device", note=_DEVICE_ARG),
    "torch.Event": _m("device_arg", "device", note=_DEVICE_ARG),
    "torch.Generator": _m("device_arg", "device", note=_DEVICE_ARG),
    "torch.asarray": _m("device_arg", "device", note=_DEVICE_ARG),
    "torch.Tensor.new_tensor": _m("device_arg", "device", note=_DEVICE_ARG),
    # Other vendors' devices: not CUDA, so nothing to migrate.
    "torch.Tensor.xpu": _i("moves to an Intel GPU: not a CUDA API"),
    "torch.Tensor.ipu": _i("moves to a Graphcore IPU: not a CUDA API"),
    "torch.Tensor.mtia": _i("moves to a Meta MTIA device: not a CUDA API"),
}
# Families of torch names, checked after the rows: (pattern, kind, op, note).
_TORCH_FAMILIES: tuple[tuple[re.Pattern[str], Kind, Optional[str], str], ...] = (
    # torch.FloatStorage(..., device=), torch.TypedStorage(...): all construct through
    # TypedStorage.__new__, which runtime migration patches (the classes stay, so checkpoints
    # that name them still pickle and load).
    (re.compile(r"^torch\.\w*Storage$"), "mapped", "storage", _DEVICE_ARG),
)
TORCH_API: dict[str, CudaApi] = {name: CudaApi(name, **row) for name, row in _ROWS_TORCH.items()}
# A device parameter of one of these types (a torch schema's, or a signature's annotation) is a
# device the call runs on: mapping it is the whole migration.
_DEVICE_TYPE = re.compile(r"^(Optional\[)?(Device|DeviceLikeType|torch\.device|_device|device)(\])?$|"
                          r"^(Union\[)?.*\b(Device|DeviceLikeType|torch\.device)\b")
# Tensor methods about CUDA, found by name: cuda, is_cuda, pin_memory, is_pinned, record_stream, ...
_TENSOR_CUDA = re.compile(r"cuda|(^|_)pin(ned)?(_|$)|stream")


def classify_torch(qualname: str, device_type: Optional[str] = None) -> Optional[CudaApi]:
    """The row for a torch function, class or Tensor method that takes a device or is about CUDA.

    Args:
        qualname: ``torch.X``, ``torch.Tensor.X`` or ``torch.nn.Module.X``.
        device_type: the type of its ``device`` parameter, as :func:`device_apis` reports it
            (``"Optional[Device]"``), or None. A Device-typed parameter classifies the API by rule.

    Returns:
        The row, or ``None``: the API needs one.
    """
    row = TORCH_API.get(qualname)
    if row is not None:
        return row
    if device_type is not None and _DEVICE_TYPE.search(device_type):
        return CudaApi(qualname, "mapped", "device_arg", note=_DEVICE_ARG)
    for pattern, kind, op, note in _TORCH_FAMILIES:
        if pattern.search(qualname):
            return CudaApi(qualname, kind, op, note=note)
    return None


@dataclass(frozen=True)
class DeviceParam:
    """The ``device`` parameter of one torch API, from torch's own metadata.

    Attributes:
        type: its type as the metadata spells it (``"Optional[Device]"``; ``"doc"`` when read
            from a docstring's signature line, where ``device`` alone is the evidence).
        positional: whether it may be passed positionally (``x.pin_memory("cuda")``).
        source: ``"schema"`` (an aten operator), ``"signature"`` or ``"doc"``.
    """

    type: str
    positional: bool
    source: str


def device_apis() -> dict[str, DeviceParam]:
    """Every public torch function, class and Tensor method that takes a ``device``, from torch itself.

    Imports torch. Sources, in order: the aten operator schemas (``torch._C._jit_get_all_schemas``)
    whose name is a public attribute of ``torch`` or ``torch.Tensor``; ``inspect.signature`` of the
    rest of ``torch``'s and ``torch.Tensor``'s public callables; the signature line of a docstring
    where there is no signature (``torch.asarray``, ``torch.Stream``, ``Tensor.new_tensor``).
    Exceptions are left out.
    """
    import inspect

    import torch

    found: dict[str, DeviceParam] = {}
    for schema in torch._C._jit_get_all_schemas():
        if not schema.name.startswith("aten::"):
            continue
        op = schema.name[len("aten::"):]
        if op.startswith("_"):
            continue
        for arg in schema.arguments:
            if arg.name != "device":
                continue
            for owner, prefix in ((torch, "torch."), (torch.Tensor, "torch.Tensor.")):
                if hasattr(owner, op):
                    old = found.get(prefix + op)
                    positional = not arg.kwarg_only or (old is not None and old.positional)
                    found[prefix + op] = DeviceParam(str(arg.type), positional, "schema")
    doc_line = re.compile(r"^\s*(\w+)\((.*)\)")
    for owner, prefix in ((torch, "torch."), (torch.Tensor, "torch.Tensor.")):
        for name in dir(owner):
            if name.startswith("_") or prefix + name in found:
                continue
            value = getattr(owner, name, None)
            if inspect.ismodule(value) or not callable(value):
                continue
            if inspect.isclass(value) and issubclass(value, BaseException):
                continue
            try:
                param = inspect.signature(value).parameters.get("device")
            except (TypeError, ValueError):
                doc = value.__doc__ if isinstance(getattr(value, "__doc__", None), str) else ""
                match = doc_line.match(doc.lstrip("\n").splitlines()[0]) if doc.strip() else None
                if match and match.group(1) == name and re.search(r"(^|[\s,(*])device\b", match.group(2)):
                    args = match.group(2)
                    kw_only = "*" in args.split("device")[0]
                    annotation = re.search(r"device\s*:\s*([\w\[\]., ]+?)\s*(=|,|$)", args)
                    found[prefix + name] = DeviceParam(annotation.group(1) if annotation else "doc", not kw_only, "doc")
                continue
            if param is not None:
                annotation = param.annotation
                text = "" if annotation is inspect.Parameter.empty else (
                    annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation)))
                found[prefix + name] = DeviceParam(text or "untyped", param.kind is not inspect.Parameter.KEYWORD_ONLY,
                                                   "signature")
    return dict(sorted(found.items()))


def tensor_cuda_apis() -> list[str]:
    """Every ``torch.Tensor`` attribute about CUDA, by name (``cuda``, ``is_cuda``, ``pin_memory``...). Imports torch."""
    import torch

    return [f"torch.Tensor.{n}" for n in dir(torch.Tensor) if _TENSOR_CUDA.search(n) and n != "pinverse"]
