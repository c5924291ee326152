"""The one table of what each ``torch.cuda`` API becomes on another device family.

Usage::

    from npu_migrate.cuda_api import classify

    api = classify("torch.cuda.get_device_capability")
    api.kind      # "mapped"
    api.op        # "device_capability": the device-neutral operation `npu-migrate port` writes
    classify("torch.cuda.graph").note   # what to do instead

Every public name of ``torch.cuda`` and its submodules (amp, random, memory, streams, graphs, nvtx,
jiterator) has one :class:`CudaApi` row, found by :func:`classify`:

* ``mapped``: has a device-neutral equivalent; ``op`` names it in
  :data:`npu_migrate.port.targets.TARGETS` and ``params`` lists torch.cuda's parameter names,
  in order, so keyword arguments can be renamed to the target's.
* ``noop``: harmless to skip off CUDA (profiling marks, cache tuning, debug switches).
* ``unsupported``: no equivalent; ``note`` says what to do instead.
* ``ignored``: not a device API (exception classes, typing re-exports, constants).

The same API under Ascend's names (``torch.npu.X``, ``torch_npu.npu.X``) reads the same row:
:func:`normalize` maps those names onto ``torch.cuda.X``.

The rest of torch that reaches CUDA has rows too (:data:`TORCH_API`, :func:`classify_torch`):
every torch function, class and Tensor method that takes a ``device`` (found by
:func:`device_apis` in torch's operator schemas, signatures and docstrings), and every Tensor
method about CUDA (:func:`tensor_cuda_apis`: ``cuda``, ``is_cuda``, ``pin_memory``,
``record_stream``...). A ``device`` parameter typed as a torch Device classifies itself (the
argument is mapped); anything else needs a row. Where runtime migration does more than a rewrite
can (it simulates ``torch.cuda.device``, builds legacy ``torch.cuda.FloatTensor`` on the target),
``runtime`` names what it does; ``npu_migrate.migrate`` generates its patches from these rows.

This module imports nothing from torch, so ``npu-migrate port`` and ``check`` stay torch-free.
:func:`public_names` (used by the tests) imports torch lazily and lists what torch itself exports,
so a torch release that adds an API fails a test until the API has a row here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, Optional

Kind = Literal["mapped", "noop", "unsupported", "ignored"]

# Submodules whose public names are part of the API (the rest of torch.cuda's submodules are
# implementation detail, re-exported at the top where they matter).
SUBMODULES: tuple[str, ...] = ("amp", "random", "memory", "streams", "graphs", "nvtx", "jiterator")
# Prefixes of the same API under other families' names, mapped onto torch.cuda by normalize().
FAMILY_PREFIXES: dict[str, str] = {"torch.npu.": "torch.cuda.", "torch_npu.npu.": "torch.cuda."}


@dataclass(frozen=True)
class CudaApi:
    """What one ``torch.cuda`` API becomes.

    Attributes:
        name: the name under ``torch.cuda`` (``"set_device"``, ``"amp.autocast"``).
        kind: ``"mapped"``, ``"noop"``, ``"unsupported"`` or ``"ignored"``.
        op: for ``mapped``: the device-neutral operation (a key of the port's TARGETS).
        params: torch.cuda's parameter names in order, for renaming keyword arguments.
        note: why (noop), what to do instead (unsupported), or a caveat of the mapping.
        runtime: how runtime migration handles it where that differs from what ``op`` says
            (``"legacy_type"``: built on the CPU, then moved to the target), or ``""``.
    """

    name: str
    kind: Kind
    op: Optional[str] = None
    params: tuple[str, ...] = ()
    note: str = ""
    runtime: str = ""


def _m(op: str, *params: str, note: str = "") -> tuple[Kind, Optional[str], tuple[str, ...], str]:
    return ("mapped", op, params, note)


def _n(note: str) -> tuple[Kind, Optional[str], tuple[str, ...], str]:
    return ("noop", None, (), note)


def _u(note: str) -> tuple[Kind, Optional[str], tuple[str, ...], str]:
    return ("unsupported", None, (), note)


_GRAPHS = "CUDA graphs are an optimization: run without capture, or guard the capture with a device-type check"
_ALLOC = "the CUDA caching allocator has no counterpart: remove the call or guard it with a device-type check"
_HOST = "host (pinned) memory statistics of the CUDA allocator: guard the call with a device-type check"
_SMI = "an NVML (nvidia-smi) reading: guard the call with a device-type check, or read npu-smi on Ascend"
_RNG = "per-device generator state: use torch.get_rng_state()/torch.random.fork_rng, or guard the call"

_ROWS: dict[str, tuple[Kind, Optional[str], tuple[str, ...], str]] = {
    # availability and devices
    "is_available": _m("accelerator_available"),
    "device_count": _m("device_count"),
    "current_device": _m("current_device_index"),
    "set_device": _m("set_device", "device"),
    "get_device_name": _m("device_name", "device"),
    "get_device_capability": _m("device_capability", "device", note="(0, 0) off CUDA"),
    "get_device_properties": _m("device_properties", "device"),
    "is_bf16_supported": _m("is_bf16_supported", "including_emulation"),
    "is_initialized": _m("accelerator_available"),
    "init": _n("devices initialise on first use on every family"),
    "is_tf32_supported": _u("TF32 is an NVIDIA format: guard the check with a device-type check"),
    "can_device_access_peer": _u("peer access is a CUDA topology query: guard the call with a device-type check"),
    "device": _u("use nm.set_device(i), or guard `with torch.cuda.device(i)` with a device-type check"),
    "device_of": _u("use tensor.device and nm.set_device()"),
    "get_arch_list": _u("CUDA architectures: guard the call with a device-type check"),
    "get_gencode_flags": _u("CUDA build flags: guard the call with a device-type check"),
    "current_blas_handle": _u("cuBLAS handles exist on CUDA only"),
    "current_solver_handle": _u("cuSOLVER handles exist on CUDA only"),
    "cudart": _u("call the CUDA runtime only on CUDA machines"),
    "check_error": _u("CUDA runtime error codes exist on CUDA only"),
    "cudaStatus": _u("CUDA runtime status codes exist on CUDA only"),
    "has_half": ("ignored", None, (), "a constant"),
    "has_magma": ("ignored", None, (), "a constant"),
    "default_generators": _u(_RNG),
    "GreenContext": _u("green contexts partition an NVIDIA GPU: guard with a device-type check"),
    # synchronisation, streams and events
    "synchronize": _m("synchronize", "device"),
    "Event": _m("Event", "enable_timing", "blocking", "interprocess"),
    "Stream": _m("Stream", "device", "priority"),
    "stream": _m("stream", "stream"),
    "current_stream": _m("current_stream", "device"),
    "default_stream": _m("current_stream", "device", note="the host stream off CUDA"),
    "set_stream": _n("one host stream off CUDA"),
    "StreamContext": _m("stream", "stream"),
    "ExternalStream": _u("streams from other CUDA libraries do not exist on the target"),
    "get_stream_from_external": _u("streams from other CUDA libraries do not exist on the target"),
    "set_sync_debug_mode": _n("a CUDA debugging switch"),
    "get_sync_debug_mode": _n("a CUDA debugging switch"),
    "is_current_stream_capturing": _u(_GRAPHS),
    # random numbers
    "manual_seed": _m("manual_seed", "seed"),
    "manual_seed_all": _m("manual_seed_all", "seed"),
    "seed": _u(_RNG),
    "seed_all": _u(_RNG),
    "initial_seed": _u(_RNG),
    "get_rng_state": _u(_RNG),
    "get_rng_state_all": _u(_RNG),
    "set_rng_state": _u(_RNG),
    "set_rng_state_all": _u(_RNG),
    # memory
    "memory_allocated": _m("memory_allocated", "device"),
    "max_memory_allocated": _m("max_memory_allocated", "device"),
    "memory_reserved": _m("memory_reserved", "device"),
    "max_memory_reserved": _m("max_memory_reserved", "device"),
    "memory_cached": _m("memory_reserved", "device", note="memory_cached is the old name of memory_reserved"),
    "max_memory_cached": _m("max_memory_reserved", "device", note="the old name of max_memory_reserved"),
    "reset_peak_memory_stats": _m("reset_peak_memory_stats", "device"),
    "reset_max_memory_allocated": _m("reset_peak_memory_stats", "device"),
    "reset_max_memory_cached": _m("reset_peak_memory_stats", "device"),
    "memory_stats": _m("memory_stats", "device",
                       note="nm.memory_stats() returns only allocated/max_allocated/reserved/max_reserved"),
    "empty_cache": _m("empty_cache"),
    "mem_get_info": _m("mem_get_info", "device", note="host memory off an accelerator"),
    "reset_accumulated_memory_stats": _n("statistics of the CUDA caching allocator"),
    "memory_stats_as_nested_dict": _u(_ALLOC),
    "memory_summary": _u(_ALLOC),
    "memory_snapshot": _u(_ALLOC),
    "list_gpu_processes": _u(_SMI),
    "ipc_collect": _n("CUDA IPC memory only"),
    "set_per_process_memory_fraction": _u(_ALLOC),
    "get_per_process_memory_fraction": _u(_ALLOC),
    "caching_allocator_alloc": _u(_ALLOC),
    "caching_allocator_delete": _u(_ALLOC),
    "caching_allocator_enable": _u(_ALLOC),
    "caching_allocator_disabled": _u(_ALLOC),
    "change_current_allocator": _u(_ALLOC),
    "get_allocator_backend": _u(_ALLOC),
    "CUDAPluggableAllocator": _u(_ALLOC),
    "MemPool": _u(_ALLOC),
    "MemPoolContext": _u(_ALLOC),
    "use_mem_pool": _u(_ALLOC),
    "host_memory_stats": _u(_HOST),
    "host_memory_stats_as_nested_dict": _u(_HOST),
    "reset_accumulated_host_memory_stats": _u(_HOST),
    "reset_peak_host_memory_stats": _u(_HOST),
    "device_memory_used": _u(_SMI),
    "memory_usage": _u(_SMI),
    "utilization": _u(_SMI),
    "temperature": _u(_SMI),
    "power_draw": _u(_SMI),
    "clock_rate": _u(_SMI),
    # graphs
    "CUDAGraph": _u(_GRAPHS),
    "graph": _u(_GRAPHS),
    "graphs": _u(_GRAPHS),
    "make_graphed_callables": _u(_GRAPHS),
    "graph_pool_handle": _u(_GRAPHS),
    "export_dot": _u(_GRAPHS),
    "export_graph_data": _u(_GRAPHS),
    # amp
    "amp.autocast": _m("autocast", "enabled", "dtype", "cache_enabled"),
    "amp.GradScaler": _m("grad_scaler", "init_scale", "growth_factor", "backoff_factor", "growth_interval",
                         "enabled"),
    "amp.custom_fwd": _u("use torch.amp.custom_fwd(device_type=...)"),
    "amp.custom_bwd": _u("use torch.amp.custom_bwd(device_type=...)"),
    "amp.common": ("ignored", None, (), "a module"),
    "amp.amp_definitely_not_available": _u("use nm.accelerator_available()"),
    # nvtx
    "nvtx": _n("NVIDIA profiler ranges: use torch.profiler.record_function"),
    "nvtx.range_push": _n("NVIDIA profiler ranges: use torch.profiler.record_function"),
    "nvtx.range_pop": _n("NVIDIA profiler ranges: use torch.profiler.record_function"),
    "nvtx.range_start": _n("NVIDIA profiler ranges: use torch.profiler.record_function"),
    "nvtx.range_end": _n("NVIDIA profiler ranges: use torch.profiler.record_function"),
    "nvtx.range": _n("NVIDIA profiler ranges: use torch.profiler.record_function"),
    "nvtx.mark": _n("NVIDIA profiler ranges: use torch.profiler.record_function"),
    # jiterator, nccl, misc.
    "jiterator": _u("jiterator compiles CUDA kernels: write the function with torch operators"),
    "nccl": _u("use torch.distributed collectives, which run on hccl or gloo"),
    "comm": _u("use torch.distributed collectives"),
    "sparse": _u("CUDA sparse kernels: use torch.sparse"),
    "tunable": _u("CUDA GEMM tuning: guard with a device-type check"),
    "gds": _u("GPUDirect Storage is NVIDIA only"),
}

_LEGACY = "legacy CUDA tensor type: use torch.tensor(..., dtype=..., device=nm.get_device())"

# Whole families of names, checked after the rows: (pattern on the name, kind, note, runtime).
_FAMILIES: tuple[tuple[re.Pattern[str], Kind, str, str], ...] = (
    (re.compile(r"^(amp\.)?[A-Z][A-Za-z0-9]*Tensor$"), "unsupported", _LEGACY, "legacy_type"),
    (re.compile(r"^(amp\.)?[A-Z][A-Za-z0-9]*Storage$"), "unsupported",
     "legacy CUDA storage type: use tensors, created with device=nm.get_device()", ""),
    (re.compile(r"^[A-Z][A-Za-z]*Error$"), "ignored", "an exception class: catching it works on every family", ""),
    (re.compile(r"^[A-Z0-9_]+$"), "ignored", "a constant", ""),
    (re.compile(r"^graphs\.register_graph_"), "unsupported", _GRAPHS, ""),
)

# Re-exports from the standard library and typing that torch.cuda's namespaces happen to contain.
_NOT_API = frozenset({
    "Any", "Callable", "Iterable", "Literal", "NewType", "Optional", "OrderedDict", "ParamSpec", "Self", "Tensor",
    "TypeAlias", "TypeGuard", "TypeVar", "Union", "annotations", "cast", "classproperty", "contextmanager",
    "deprecated", "lru_cache", "overload", "signature", "Device", "TYPE_CHECKING", "warnings", "torch", "os", "sys",
})

CUDA_API: dict[str, CudaApi] = {name: CudaApi(name, *row) for name, row in _ROWS.items()}


def normalize(qualname: str) -> Optional[str]:
    """``torch.cuda.X`` for ``torch.cuda.X``, ``torch.npu.X`` and ``torch_npu.npu.X``; ``None`` otherwise."""
    if qualname.startswith("torch.cuda."):
        return qualname
    for prefix, cuda in FAMILY_PREFIXES.items():
        if qualname.startswith(prefix):
            return cuda + qualname[len(prefix):]
    return None


def classify(qualname: str) -> Optional[CudaApi]:
    """The row for a ``torch.cuda`` (or ``torch.npu``) name, or ``None`` when it has none.

    Args:
        qualname: ``torch.cuda.X``, ``torch.cuda.amp.X``, ``torch.npu.X``...; the submodules
            random, memory, streams and graphs are the same API as the top level
            (``torch.cuda.memory.empty_cache`` is ``torch.cuda.empty_cache``).
    """
    full = normalize(qualname)
    if full is None:
        return None
    name = full[len("torch.cuda."):]
    head, _, rest = name.partition(".")
    if head in ("random", "memory", "streams") and rest:
        name = rest
    elif head == "graphs" and rest and rest in CUDA_API:
        name = rest
    for alias in (name, name.replace("amp.grad_scaler.", "amp.").replace("amp.autocast_mode.", "amp.")):
        if alias in CUDA_API:
            return CUDA_API[alias]
    if name.rpartition(".")[2] in _NOT_API:
        return CudaApi(name, "ignored", note="not a device API")
    for pattern, kind, note, runtime in _FAMILIES:
        if pattern.search(name):
            return CudaApi(name, kind, note=note, runtime=runtime)
    return None


def public_names() -> list[str]:
    """Every public name of ``torch.cuda`` and :data:`SUBMODULES`, as ``torch.cuda[.sub].name``.

    Imports torch. A name is public when it does not start with ``_``, is not a module, and its
    object is not a re-export from the standard library (typing, functools...).
    """
    import importlib
    import inspect

    out = []
    for sub in ("",) + SUBMODULES:
        module_name = "torch.cuda" + (f".{sub}" if sub else "")
        try:
            module = importlib.import_module(module_name)
        except ImportError:  # a submodule this torch release does not have
            continue
        for name in dir(module):
            if name.startswith("_"):
                continue
            value = getattr(module, name)
            if inspect.ismodule(value):
                continue
            origin = getattr(value, "__module__", None) or ""
            if origin.split(".")[0] in ("typing", "typing_extensions", "functools", "collections", "contextlib",
                                         "inspect", "warnings", "abc", "dataclasses"):
                continue
            out.append(f"{module_name}.{name}")
    return out


# --------------------------------------------------------------------------- the rest of torch

# How a row of TORCH_API is applied at run time (its ``op``):
#   device_arg: a CUDA ``device`` argument (keyword, or positional where the signature allows it)
#       becomes the target's device; the call is otherwise unchanged.
#   device_query: the same, for the user's code only (torch's own code gets torch's answer).
#   to / cuda / is_cuda / set_default_device / grad_scaler: their own mapping in npu_migrate.migrate.
#   pin_memory / record_stream: a no-op on the CPU target (host memory is all there is), the
#       target's own on an accelerator.
_DEVICE_ARG = "its device argument is mapped to the target's device"
_ROWS_TORCH: dict[str, tuple[Kind, Optional[str], tuple[str, ...], str]] = {
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
    "torch.Tensor.xpu": ("ignored", None, (), "moves to an Intel GPU: not a CUDA API"),
    "torch.Tensor.ipu": ("ignored", None, (), "moves to a Graphcore IPU: not a CUDA API"),
    "torch.Tensor.mtia": ("ignored", None, (), "moves to a Meta MTIA device: not a CUDA API"),
}
# Families of torch names, checked after the rows: (pattern, kind, op, note).
_TORCH_FAMILIES: tuple[tuple[re.Pattern[str], Kind, Optional[str], str], ...] = (
    # torch.FloatStorage(..., device=), torch.TypedStorage(...): all construct through
    # TypedStorage.__new__, which runtime migration patches (the classes stay, so checkpoints
    # that name them still pickle and load).
    (re.compile(r"^torch\.\w*Storage$"), "mapped", "storage", _DEVICE_ARG),
)
TORCH_API: dict[str, CudaApi] = {name: CudaApi(name, *row) for name, row in _ROWS_TORCH.items()}
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
