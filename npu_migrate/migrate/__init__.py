"""Runtime migration: unmodified CUDA/NCCL scripts run on Ascend NPUs, and on CPU/gloo for tests.

Usage::

    npu-migrate run train.py --epochs 3                     # self-spawning scripts (seed 003)
    python -m npu_migrate.launch --migrate --device-num 2 train.py
    import npu_migrate.auto                                 # first line of a script

    from npu_migrate import migrate
    with migrate.enabled(device="cpu", device_count=2):     # tests and libraries
        ...

The target is the family the device layer picks. On ``npu`` CUDA device calls go to ``torch.npu``
and ``nccl`` becomes ``hccl``; on ``cpu`` they land on the CPU, ``nccl`` becomes ``gloo`` and the
script sees N simulated devices; on ``cuda`` nothing changes.

Design, and what it does differently from torch_npu's ``transfer_to_npu``:

* Only device values move. A device argument is rewritten when it *is* a CUDA device
  (``"cuda"``, ``"cuda:1"``, ``torch.device("cuda", 1)``, an int device index); strings that merely
  contain "cuda", like ``"runs/cuda_exp/model.pt"``, are never touched.
* Queries answer by caller. ``torch.cuda.is_available()``, ``device_count()``, ``Tensor.is_cuda``
  and the rest of :data:`CUDA_TABLE` answer for the target device when the caller is user code,
  and give torch's own answer to code in torch, the standard library, site-packages and
  npu_migrate. So optimizers, DataLoader and libraries never take CUDA-only paths on a machine
  without CUDA.
* Every patched attribute is recorded and :func:`uninstall` puts the originals back.
* Every redirection is counted per API with its first call site; CUDA APIs that cannot be
  mapped raise :class:`MigrationError` naming the call and what to do instead, unless
  :data:`CUDA_TABLE` documents them as harmless no-ops.
* It follows the job into child processes through ``npu_migrate/_bootstrap/sitecustomize.py``
  on PYTHONPATH and ``NPU_MIGRATE_MIGRATE=1`` (see :func:`export_environment`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import platform
import re
import sys
import sysconfig
import threading
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Callable, Iterator

import torch

from npu_migrate import device as _device
from npu_migrate.errors import NpuMigrateError
from npu_migrate import _migrate_hook
from npu_migrate._migrate_hook import BOOTSTRAP_DIR, ENV_MIGRATE, ENV_REPORT_DIR, ENV_SIM_DEVICES
from npu_migrate.migrate._report import REPORT

__all__ = [
    "BOOTSTRAP_DIR", "ENV_MIGRATE", "ENV_REPORT_DIR", "ENV_SIM_DEVICES", "MigrationError", "enabled",
    "export_environment", "install", "install_from_env", "is_installed", "target", "uninstall",
]


class MigrationError(NpuMigrateError, RuntimeError):
    """A CUDA API that runtime migration cannot map to the target device."""


# --------------------------------------------------------------------------- who is calling


def _internal_prefixes() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    prefixes = {
        os.path.dirname(os.path.abspath(torch.__file__)),
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))),  # npu_migrate
        *(paths.get(k, "") for k in ("stdlib", "platstdlib", "purelib", "platlib")),
    }
    try:
        import site

        prefixes.update(site.getsitepackages())
        prefixes.add(site.getusersitepackages())
    except (AttributeError, ImportError):
        pass
    return tuple(sorted(os.path.join(os.path.realpath(p), "") for p in prefixes if p))


_CLASSIFIED: dict[str, bool] = {}


def _is_internal(filename: str) -> bool:
    """True for code whose questions about CUDA must get torch's true answer."""
    known = _CLASSIFIED.get(filename)
    if known is None:
        if filename.startswith("<frozen") or filename.startswith("<__array_function__"):
            known = True
        elif filename.startswith("<"):  # <string>, <stdin>: the user's own code
            known = False
        else:
            known = os.path.realpath(filename).startswith(_STATE.internal_prefixes)
        _CLASSIFIED[filename] = known
    return known


def _user_site(depth: int = 2) -> str:
    frame = sys._getframe(depth)
    while frame is not None and _is_internal(frame.f_code.co_filename):
        frame = frame.f_back
    return f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else "?"


def _record(api: str, kind: str = "redirected", detail: str = "") -> None:
    entry = REPORT.entries.get(api)
    if entry is not None:
        entry["count"] += 1
    else:
        REPORT.record(api, kind, _user_site(3), detail)


# --------------------------------------------------------------------------- state


@dataclass
class _State:
    target: _device.DeviceSpec | None = None
    count: int = 1
    current: int = 0
    patches: list[tuple[Any, str, bool, Any]] = field(default_factory=list)
    env_before: dict[str, str | None] = field(default_factory=dict)
    internal_prefixes: tuple[str, ...] = ()
    lock: threading.Lock = field(default_factory=threading.Lock)


_STATE = _State()
_CUDA_RE = re.compile(r"^cuda(?::(\d+))?$")


def is_installed() -> bool:
    """Whether runtime migration is active in this process."""
    return _STATE.target is not None


def target() -> str | None:
    """The family CUDA calls are sent to, or None when migration is off."""
    return None if _STATE.target is None else _STATE.target.name


def _on_cpu() -> bool:
    return _STATE.target is not None and not _STATE.target.is_accelerator


def _target_device(index: int | None) -> torch.device:
    spec = _STATE.target
    assert spec is not None
    if not spec.is_accelerator:
        return torch.device("cpu")
    # "cuda" with no index means the current device: name it, rather than leave the target's
    # index-less device to whatever the backend resolves it to.
    return torch.device(spec.name, _device.current_device_index() if index is None else index)


def _map_device(value: Any) -> Any:
    """A CUDA device value becomes the target's; anything else comes back as it is."""
    kind = type(value)
    if kind is str:
        if not value.startswith("cuda"):
            return value
        match = _CUDA_RE.match(value)
        if match is None:
            return value
        return _target_device(int(match.group(1)) if match.group(1) else None)
    if kind is torch.device:
        return _target_device(value.index) if value.type == "cuda" else value
    if kind is int:
        return _target_device(value)
    return value


def _map_backend(value: Any) -> Any:
    """``nccl`` -> the target's backend; ``cuda:nccl,cpu:gloo`` -> ``npu:hccl,cpu:gloo`` or ``cpu:gloo``."""
    if not isinstance(value, str) or "nccl" not in value.lower():
        return value
    spec = _STATE.target
    assert spec is not None
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
    by_device = {}
    for dev, name in pairs:
        by_device.setdefault(dev, name)
    return ",".join(f"{d}:{n}" for d, n in by_device.items())


# --------------------------------------------------------------------------- patching


def _patch(owner: Any, name: str, new: Any) -> None:
    had = name in vars(owner)
    old = vars(owner)[name] if had else getattr(owner, name, None)
    _STATE.patches.append((owner, name, had, old))
    setattr(owner, name, new)


def _caller_aware(original: Callable[..., Any], replacement: Callable[..., Any], api: str, kind: str,
                  detail: str = "") -> Callable[..., Any]:
    """Torch and libraries get ``original``; user code gets ``replacement`` (and is counted)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        if _is_internal(sys._getframe(1).f_code.co_filename):
            return original(*args, **kwargs)
        _record(api, kind, detail)
        return replacement(*args, **kwargs)

    functools.update_wrapper(call, original)
    call.__wrapped_by_npu_migrate__ = True  # type: ignore[attr-defined]
    return call


class _SwitchMeta(type):
    """A class stand-in: user code constructs ``_impl``, torch constructs ``_orig``; isinstance sees both."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if _is_internal(sys._getframe(1).f_code.co_filename):
            return cls._orig(*args, **kwargs)
        _record(cls._api, cls._kind, cls._detail)
        return cls._impl(*args, **kwargs)

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, cls._types)

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, cls._types)


def _switch_class(original: type, impl: Callable[..., Any], api: str, kind: str, detail: str = "") -> type:
    types = tuple(t for t in (original, impl) if isinstance(t, type))
    return _SwitchMeta(original.__name__, (), {
        "_orig": original, "_impl": impl, "_api": api, "_kind": kind, "_detail": detail,
        "_types": types, "__doc__": original.__doc__, "__module__": original.__module__,
    })


# --------------------------------------------------------------------------- the simulated CUDA of the CPU target


class _SimDevice:
    """``with torch.cuda.device(i):`` on the CPU target."""

    def __init__(self, device: Any) -> None:
        self.index = _index(device)
        self.prev = 0

    def __enter__(self) -> None:
        self.prev = _STATE.current
        if self.index is not None and self.index >= 0:
            _sim_set_device(self.index)

    def __exit__(self, *exc: Any) -> None:
        _STATE.current = self.prev


def _index(device: Any) -> int | None:
    if device is None:
        return None
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        return device.index if device.index is not None else _STATE.current
    return None


def _sim_set_device(device: Any) -> None:
    index = _index(device)
    if index is None or index < 0:
        return
    if index >= _STATE.count:
        raise MigrationError(
            f"torch.cuda.set_device({index}) but the script sees {_STATE.count} simulated cuda device(s) on cpu. "
            f"Start it with --device-num {index + 1} (or set {ENV_SIM_DEVICES})."
        )
    _STATE.current = index


def _sim_name(device: Any = None) -> str:
    index = _STATE.current if _index(device) is None else _index(device)
    return f"{platform.processor() or platform.machine() or 'CPU'} (cuda:{index} simulated on cpu by npu_migrate)"


def _host_memory() -> tuple[int, int]:
    try:
        page, total, free = os.sysconf("SC_PAGE_SIZE"), os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_AVPHYS_PAGES")
        return int(free * page), int(total * page)
    except (ValueError, OSError, AttributeError):
        return 0, 0


def _sim_properties(device: Any = None) -> SimpleNamespace:
    return SimpleNamespace(
        name=_sim_name(device), major=0, minor=0, total_memory=_host_memory()[1],
        multi_processor_count=os.cpu_count() or 1, is_integrated=True, is_multi_gpu_board=False,
        uuid="", L2_cache_size=0,
    )


def _zero(*args: Any, **kwargs: Any) -> int:
    return 0


def _none(*args: Any, **kwargs: Any) -> None:
    return None


def _sim_autocast(enabled: bool = True, dtype: torch.dtype | None = None, cache_enabled: bool = True) -> Any:
    return torch.autocast(_STATE.target.name, dtype=dtype or _STATE.target.amp_dtype,  # type: ignore[union-attr]
                          enabled=enabled, cache_enabled=cache_enabled)


def _sim_grad_scaler(*args: Any, **kwargs: Any) -> Any:
    kwargs.pop("device", None)
    if args and isinstance(args[0], str):
        args = args[1:]
    return _new_grad_scaler(*args, **kwargs)


def _new_grad_scaler(*args: Any, **kwargs: Any) -> Any:
    spec = _STATE.target
    assert spec is not None
    if spec.amp_dtype != torch.float16:  # bfloat16 autocast needs no loss scaling
        kwargs["enabled"] = False
    if "amp.GradScaler" in _ORIGINALS:  # torch >= 2.3: one class with a device argument
        return _ORIGINALS["amp.GradScaler"](spec.name, *args, **kwargs)
    # torch < 2.3: a class per device module (torch_npu's torch.npu.amp.GradScaler). The CPU has
    # none, and needs none (bfloat16): CUDA's own class, disabled, is a pass-through that never
    # touches CUDA. Its module attribute is not the patched torch.cuda.amp.GradScaler.
    own = getattr(getattr(getattr(torch, spec.name, None), "amp", None), "GradScaler", None)
    if own is None:
        from torch.cuda.amp import grad_scaler

        own = grad_scaler.GradScaler
    return own(*args, **kwargs)


_HOST_STREAM = _device.HostStream()

# One table of what maps where. For every public callable of torch.cuda:
#   key: the name; value: (kind, CPU implementation, note)
#   kind "redirected": answered for the target device (on npu by torch.npu's function of that name)
#   kind "noop": harmless on the target and documented as such
# Names not in the table are "unmapped": a user call raises MigrationError, unless the npu target
# has a function of the same name.
CUDA_TABLE: dict[str, tuple[str, Callable[..., Any], str]] = {
    "is_available": ("redirected", lambda: True, ""),
    "device_count": ("redirected", lambda: _STATE.count, ""),
    "current_device": ("redirected", lambda: _STATE.current, ""),
    "set_device": ("redirected", _sim_set_device, ""),
    "get_device_name": ("redirected", _sim_name, ""),
    "get_device_properties": ("redirected", _sim_properties, ""),
    "get_device_capability": ("redirected", lambda device=None: (0, 0), "(0, 0) on cpu"),
    "is_bf16_supported": ("redirected", lambda *a, **k: True, ""),
    "is_tf32_supported": ("redirected", lambda *a, **k: False, ""),
    "is_initialized": ("redirected", lambda: True, ""),
    "init": ("noop", _none, ""),
    "synchronize": ("noop", _none, "cpu work is synchronous"),
    "empty_cache": ("noop", _none, "no device cache on cpu"),
    "ipc_collect": ("noop", _none, ""),
    "memory_allocated": ("noop", _zero, "0 on cpu"),
    "max_memory_allocated": ("noop", _zero, "0 on cpu"),
    "memory_reserved": ("noop", _zero, "0 on cpu"),
    "max_memory_reserved": ("noop", _zero, "0 on cpu"),
    "memory_cached": ("noop", _zero, "0 on cpu"),
    "max_memory_cached": ("noop", _zero, "0 on cpu"),
    "reset_peak_memory_stats": ("noop", _none, ""),
    "reset_max_memory_allocated": ("noop", _none, ""),
    "reset_max_memory_cached": ("noop", _none, ""),
    "reset_accumulated_memory_stats": ("noop", _none, ""),
    "memory_stats": ("noop", lambda *a, **k: {}, "{} on cpu"),
    "memory_summary": ("noop", lambda *a, **k: "", "'' on cpu"),
    "mem_get_info": ("redirected", lambda *a, **k: _host_memory(), "host memory"),
    "set_per_process_memory_fraction": ("noop", _none, ""),
    "get_per_process_memory_fraction": ("noop", lambda *a, **k: 1.0, ""),
    # The CPU generator is not the CUDA one: seeding "CUDA" must not reseed it, or the run would
    # differ from the same script written for the CPU.
    "manual_seed": ("noop", _none, "the cpu generator is seeded by torch.manual_seed"),
    "manual_seed_all": ("noop", _none, "the cpu generator is seeded by torch.manual_seed"),
    "seed": ("noop", _none, ""),
    "seed_all": ("noop", _none, ""),
    "initial_seed": ("redirected", lambda: torch.initial_seed(), "torch.initial_seed()"),
    "get_rng_state": ("noop", lambda *a, **k: torch.ByteTensor(), "empty state: no CUDA generator"),
    "get_rng_state_all": ("noop", lambda: [torch.ByteTensor() for _ in range(_STATE.count)], "empty states"),
    "set_rng_state": ("noop", _none, ""),
    "set_rng_state_all": ("noop", _none, ""),
    "get_arch_list": ("noop", lambda: [], ""),
    "get_gencode_flags": ("noop", lambda: "", ""),
    "current_stream": ("redirected", lambda *a, **k: _HOST_STREAM, "host stream"),
    "default_stream": ("redirected", lambda *a, **k: _HOST_STREAM, "host stream"),
    "set_stream": ("noop", _none, ""),
    "stream": ("redirected", lambda s=None: contextlib.nullcontext(s), ""),
    "is_current_stream_capturing": ("noop", lambda: False, ""),
    "get_sync_debug_mode": ("noop", _zero, ""),
    "set_sync_debug_mode": ("noop", _none, ""),
}
# Classes of torch.cuda, as (kind, CPU implementation, note).
CUDA_CLASSES: dict[str, tuple[str, Callable[..., Any], str]] = {
    "Event": ("redirected", _device.HostEvent, "host event: measures time"),
    "Stream": ("redirected", _device.HostStream, "host stream"),
    "device": ("redirected", _SimDevice, ""),
    "device_of": ("redirected", lambda obj: contextlib.nullcontext(), ""),
    "StreamContext": ("redirected", lambda stream: contextlib.nullcontext(stream), ""),
}
# What to do instead, for the CUDA features that cannot be migrated.
ADVICE = {
    "CUDAGraph": "CUDA graphs are an optimization: run without capture, or guard it with a device-type check",
    "graph": "CUDA graphs are an optimization: run without capture, or guard it with a device-type check",
    "make_graphed_callables": "CUDA graphs are an optimization: call the module directly",
    "graph_pool_handle": "CUDA graphs are an optimization: run without capture",
    "ExternalStream": "streams from other CUDA libraries do not exist on the target",
    "jiterator": "jiterator compiles CUDA kernels: write the function with torch operators",
    "nccl": "use torch.distributed collectives, which migrate to hccl or gloo",
    "cudart": "call the CUDA runtime only on CUDA machines",
}
# torch.cuda.nvtx ranges only annotate profiles: harmless no-ops on the target.
NVTX = ("range_push", "range_pop", "range_start", "range_end", "mark", "range")


def _unmapped(name: str) -> Callable[..., Any]:
    spec = _STATE.target
    where = spec.name if spec is not None else "the target"
    advice = ADVICE.get(name, "remove the call, guard it so it runs only on CUDA, or port the script "
                              "with `npu-migrate port`, which reports it")

    def fail(*args: Any, **kwargs: Any) -> Any:
        raise MigrationError(f"torch.cuda.{name} has no {where} equivalent under runtime migration: {advice}.")

    return fail


# --------------------------------------------------------------------------- the patches

_ORIGINALS: dict[str, Any] = {}

FACTORIES = (
    "tensor", "as_tensor", "asarray", "zeros", "ones", "empty", "full", "rand", "randn", "randint",
    "randperm", "arange", "range", "linspace", "logspace", "eye", "zeros_like", "ones_like",
    "empty_like", "full_like", "rand_like", "randn_like", "randint_like", "empty_strided",
    "scalar_tensor", "tril_indices", "triu_indices", "normal", "frombuffer",
)
TENSOR_NEW = ("new_tensor", "new_zeros", "new_ones", "new_empty", "new_full", "new_empty_strided")


def _remap_device_kwarg(kwargs: dict[str, Any], api: str) -> None:
    dev = kwargs.get("device")
    if dev is not None:
        mapped = _map_device(dev)
        if mapped is not dev:
            kwargs["device"] = mapped
            _record(api)


def _device_kwarg(original: Callable[..., Any], api: str) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        if kwargs:
            _remap_device_kwarg(kwargs, api)
        return original(*args, **kwargs)

    functools.update_wrapper(call, original)
    return call


def _to_wrapper(original: Callable[..., Any], api: str) -> Callable[..., Any]:
    def to(self: Any, *args: Any, **kwargs: Any) -> Any:
        if args:
            first = args[0]
            if type(first) in (str, torch.device, int):
                mapped = _map_device(first)
                if mapped is not first:
                    args = (mapped, *args[1:])
                    _record(api)
        if kwargs:
            _remap_device_kwarg(kwargs, api)
        return original(self, *args, **kwargs)

    functools.update_wrapper(to, original)
    return to


def _install_tensor_and_module() -> None:
    tensor_to = torch.Tensor.to
    module_to = torch.nn.Module.to
    _patch(torch.Tensor, "to", _to_wrapper(tensor_to, "Tensor.to"))
    _patch(torch.nn.Module, "to", _to_wrapper(module_to, "Module.to"))

    def tensor_cuda(self: Any, device: Any = None, non_blocking: bool = False, **kwargs: Any) -> Any:
        _record("Tensor.cuda")
        return tensor_to(self, _target_device(_index(device)), non_blocking=non_blocking, **kwargs)

    def module_cuda(self: Any, device: Any = None) -> Any:
        _record("Module.cuda")
        return module_to(self, _target_device(_index(device)))

    _patch(torch.Tensor, "cuda", tensor_cuda)
    _patch(torch.nn.Module, "cuda", module_cuda)
    # torch < 2.2 names the C base class _TensorBase.
    tensor_base = torch._C.TensorBase if hasattr(torch._C, "TensorBase") else torch._C._TensorBase
    is_cuda = tensor_base.is_cuda
    name = _STATE.target.name  # type: ignore[union-attr]

    def get_is_cuda(self: Any) -> bool:
        if _is_internal(sys._getframe(1).f_code.co_filename):
            return is_cuda.__get__(self)
        _record("Tensor.is_cuda")
        return self.device.type == name

    _patch(torch.Tensor, "is_cuda", property(get_is_cuda))
    for fname in FACTORIES:
        if hasattr(torch, fname):
            _patch(torch, fname, _device_kwarg(getattr(torch, fname), f"torch.{fname}(device=)"))
    for fname in TENSOR_NEW:
        if hasattr(torch.Tensor, fname):
            _patch(torch.Tensor, fname, _device_kwarg(getattr(torch.Tensor, fname), f"Tensor.{fname}(device=)"))
    set_default = torch.set_default_device

    def set_default_device(device: Any) -> None:
        mapped = _map_device(device)
        if mapped is not device:
            _record("torch.set_default_device")
        set_default(mapped)

    _patch(torch, "set_default_device", set_default_device)


def _install_load() -> None:
    load = torch.load
    from torch.serialization import default_restore_location

    def restore(storage: Any, location: str) -> Any:
        return default_restore_location(storage, str(_map_device(location)))

    def torch_load(*args: Any, **kwargs: Any) -> Any:
        if len(args) >= 2:
            kwargs["map_location"] = args[1]
            args = args[:1]
        where = kwargs.get("map_location")
        if where is None:
            mapped: Any = restore  # a CUDA checkpoint must not try to restore onto CUDA
        elif isinstance(where, dict):
            mapped = {k: (str(_map_device(v)) if isinstance(v, str) else _map_device(v)) for k, v in where.items()}
        elif callable(where):
            mapped = where
        else:
            mapped = _map_device(where)
        if mapped is not where and where is not None:
            _record("torch.load(map_location=)")
        kwargs["map_location"] = mapped
        return load(*args, **kwargs)

    functools.update_wrapper(torch_load, load)
    _patch(torch, "load", torch_load)


def _install_distributed() -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    init = dist.init_process_group

    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        if args:
            mapped = _map_backend(args[0])
            if mapped is not args[0]:
                args = (mapped, *args[1:])
                _record("init_process_group(backend=)")
        if "backend" in kwargs:
            mapped = _map_backend(kwargs["backend"])
            if mapped is not kwargs["backend"]:
                kwargs["backend"] = mapped
                _record("init_process_group(backend=)")
        if kwargs.get("device_id") is not None:
            mapped = _map_device(kwargs["device_id"])
            kwargs["device_id"] = None if _on_cpu() else mapped
        return init(*args, **kwargs)

    functools.update_wrapper(init_process_group, init)
    _patch(dist, "init_process_group", init_process_group)
    new_group = dist.new_group

    def new_group_(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("backend") is not None:
            kwargs["backend"] = _map_backend(kwargs["backend"])
        return new_group(*args, **kwargs)

    functools.update_wrapper(new_group_, new_group)
    _patch(dist, "new_group", new_group_)
    barrier = dist.barrier

    def barrier_(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("device_ids") is not None and _on_cpu():
            kwargs["device_ids"] = None  # gloo has no devices to name
            _record("dist.barrier(device_ids=)")
        return barrier(*args, **kwargs)

    functools.update_wrapper(barrier_, barrier)
    _patch(dist, "barrier", barrier_)
    ddp_init = DDP.__init__

    def ddp(self: Any, module: Any, device_ids: Any = None, output_device: Any = None, *args: Any, **kwargs: Any) -> None:
        if device_ids is not None or output_device is not None:
            if _on_cpu():
                device_ids, output_device = None, None  # DDP wants None for CPU modules
            else:
                device_ids = [_map_device(d) for d in device_ids] if device_ids is not None else None
                output_device = _map_device(output_device)
            _record("DistributedDataParallel(device_ids=, output_device=)")
        ddp_init(self, module, device_ids, output_device, *args, **kwargs)

    functools.update_wrapper(ddp, ddp_init)
    _patch(DDP, "__init__", ddp)

    sync_forward = torch.nn.SyncBatchNorm.forward
    batchnorm_forward = torch.nn.modules.batchnorm._BatchNorm.forward

    if _on_cpu():
        def sync_bn_forward(self: Any, input: Any) -> Any:
            if input.device.type == "cpu":
                _record("SyncBatchNorm.forward", "noop", "statistics stay per rank on cpu")
                return batchnorm_forward(self, input)
            return sync_forward(self, input)

        _patch(torch.nn.SyncBatchNorm, "forward", sync_bn_forward)

        def convert_sync_batchnorm(module: Any, process_group: Any = None) -> Any:
            _record("SyncBatchNorm.convert_sync_batchnorm", "noop", "BatchNorm kept: statistics stay per rank on cpu")
            return module

        _patch(torch.nn.SyncBatchNorm, "convert_sync_batchnorm", staticmethod(convert_sync_batchnorm))


def _install_data_and_amp() -> None:
    from torch.utils.data import DataLoader

    loader_init = DataLoader.__init__
    accepts_device = "pin_memory_device" in loader_init.__code__.co_varnames

    def data_loader(self: Any, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("pin_memory"):
            if _on_cpu():
                kwargs["pin_memory"] = False  # nothing to pin for: the batches stay on the CPU
                _record("DataLoader(pin_memory=True)", "noop", "no pinning on cpu")
            elif accepts_device and not kwargs.get("pin_memory_device"):
                kwargs["pin_memory_device"] = _STATE.target.name  # type: ignore[union-attr]
                _record("DataLoader(pin_memory=True)")
        loader_init(self, *args, **kwargs)

    functools.update_wrapper(data_loader, loader_init)
    _patch(DataLoader, "__init__", data_loader)

    autocast_init = torch.amp.autocast_mode.autocast.__init__

    def autocast(self: Any, device_type: str, dtype: Any = None, *args: Any, **kwargs: Any) -> None:
        if device_type == "cuda" and not _is_internal(sys._getframe(1).f_code.co_filename):
            device_type = _STATE.target.name  # type: ignore[union-attr]
            dtype = dtype if dtype is not None else _STATE.target.amp_dtype  # type: ignore[union-attr]
            _record('torch.autocast(device_type="cuda")')
        autocast_init(self, device_type, dtype, *args, **kwargs)

    functools.update_wrapper(autocast, autocast_init)
    _patch(torch.amp.autocast_mode.autocast, "__init__", autocast)

    scaler = getattr(torch.amp, "GradScaler", None)
    if scaler is not None:
        _ORIGINALS["amp.GradScaler"] = scaler

        class GradScaler(scaler):  # type: ignore[misc, valid-type]
            def __init__(self, device: str = "cuda", *args: Any, **kwargs: Any) -> None:
                if device == "cuda" and not _is_internal(sys._getframe(1).f_code.co_filename):
                    device = _STATE.target.name  # type: ignore[union-attr]
                    if _STATE.target.amp_dtype != torch.float16:  # type: ignore[union-attr]
                        kwargs["enabled"] = False
                    _record('torch.amp.GradScaler("cuda")')
                super().__init__(device, *args, **kwargs)

        GradScaler.__qualname__ = GradScaler.__name__ = "GradScaler"
        _patch(torch.amp, "GradScaler", GradScaler)
        _patch(torch.amp.grad_scaler, "GradScaler", GradScaler)


def _install_cuda_namespace() -> None:
    import inspect

    spec = _STATE.target
    assert spec is not None
    cuda = torch.cuda
    npu = getattr(torch, spec.name, None) if spec.is_accelerator else None
    for name in dir(cuda):
        if name.startswith("_"):
            continue
        value = getattr(cuda, name)
        if inspect.ismodule(value) or not callable(value):
            continue
        if getattr(value, "__module__", "") in ("typing", "functools", "builtins") or name in ("Optional", "Any", "Callable", "NewType", "classproperty", "lru_cache", "cast"):
            continue
        if inspect.isclass(value) and (name.endswith("Tensor") or name.endswith("Storage") or issubclass(value, BaseException)):
            continue  # legacy tensor types and exception classes are left alone
        if npu is not None:
            impl = getattr(npu, name, None)
            kind, note = ("redirected", f"torch.{spec.name}.{name}") if impl is not None else ("unmapped", "")
        elif name in CUDA_TABLE:
            kind, impl, note = CUDA_TABLE[name]
        elif name in CUDA_CLASSES:
            kind, impl, note = CUDA_CLASSES[name]
        else:
            kind, impl, note = "unmapped", None, ""
        if impl is None:
            impl = _unmapped(name)
        api = f"torch.cuda.{name}"
        if inspect.isclass(value):
            _patch(cuda, name, _switch_class(value, impl, api, kind, note))
        else:
            _patch(cuda, name, _caller_aware(value, impl, api, kind, note))
    # torch.cuda.amp: autocast and GradScaler land on the target's AMP.
    amp = cuda.amp
    for name, impl in (("autocast", _sim_autocast), ("GradScaler", _sim_grad_scaler)):
        original = getattr(amp, name)
        _patch(amp, name, _switch_class(original, impl, f"torch.cuda.amp.{name}", "redirected"))
    for name in ("custom_fwd", "custom_bwd"):
        if hasattr(amp, name) and hasattr(torch.amp, name):
            generic = getattr(torch.amp, name)

            def decorator(fwd: Any = None, *, cast_inputs: Any = None, _g: Any = generic, _n: str = name) -> Any:
                kwargs = {"device_type": spec.name}
                if _n == "custom_fwd":
                    kwargs["cast_inputs"] = cast_inputs
                return _g(fwd, **kwargs) if fwd is not None else functools.partial(_g, **kwargs)

            _patch(amp, name, decorator)
    # nvtx ranges only annotate profiles.
    nvtx = cuda.nvtx
    for name in NVTX:
        if hasattr(nvtx, name):
            impl = contextlib.nullcontext if name == "range" else _none
            if npu is not None and hasattr(getattr(npu, "nvtx", None), name):
                impl = getattr(npu.nvtx, name)
            _patch(nvtx, name, _caller_aware(getattr(nvtx, name), lambda *a, _i=impl, **k: _i(), f"torch.cuda.nvtx.{name}",
                                             "noop", "profiling annotation"))


def _map_environment(spec: _device.DeviceSpec) -> None:
    """CUDA_VISIBLE_DEVICES and PYTORCH_CUDA_ALLOC_CONF take their Ascend names on npu."""
    cuda = _device.DEVICES["cuda"]
    for attr in ("visible_devices_env", "alloc_conf_env"):
        theirs, ours = getattr(cuda, attr), getattr(spec, attr)
        if ours and theirs in os.environ and ours not in os.environ:
            _STATE.env_before.setdefault(ours, None)
            os.environ[ours] = os.environ[theirs]
            REPORT.record(f"${theirs}", "redirected", "environment", f"copied to {ours}")


def _sim_count() -> int:
    value = os.environ.get(ENV_SIM_DEVICES)
    if value:
        return max(1, int(value))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        return max(1, len([d for d in visible.split(",") if d.strip()]))
    return 1


# --------------------------------------------------------------------------- public API


def install(device: str | None = None, device_count: int | None = None, propagate: bool = False,
            report_dir: str | None = None) -> str:
    """Switch runtime migration on in this process (idempotent).

    Args:
        device: target family; default: what the device layer picks (``NPU_MIGRATE_DEVICE``,
            else detection).
        device_count: on the CPU target, how many CUDA devices the script sees (default:
            ``NPU_MIGRATE_SIM_DEVICES``, else the count of ``CUDA_VISIBLE_DEVICES``, else 1).
        propagate: also switch it on in every Python process this one starts (see
            :func:`export_environment`).
        report_dir: write this process's report there at exit (``NPU_MIGRATE_REPORT_DIR``).

    Returns:
        The target family (``"npu"``, ``"cpu"``, or ``"cuda"``, where nothing changes).
    """
    with _STATE.lock:
        if _STATE.target is not None:
            return _STATE.target.name
        # Before anything asks the device for its count: torch_npu's runtime reads the mask once,
        # when it first starts, and choosing the family already starts it.
        requested = (device or os.environ.get(_device.ENV_DEVICE) or "auto").strip().lower()
        if requested == "npu" or (requested == "auto" and _find_spec("torch_npu")):
            _map_environment(_device.DEVICES["npu"])
        spec = _device.device_spec(device)
        if propagate:
            export_environment(spec.name, device_count, report_dir)
        elif report_dir:
            _set_env(ENV_REPORT_DIR, report_dir)
        REPORT.target = spec.name
        _STATE.target = spec
        if spec.name == "cuda":
            return spec.name  # nothing to move
        _STATE.internal_prefixes = _internal_prefixes()
        _CLASSIFIED.clear()
        _STATE.count = device_count if device_count is not None else (_sim_count() if not spec.is_accelerator else _device.device_count())
        _STATE.current = 0
        if spec.is_accelerator:
            _map_environment(spec)
        _install_tensor_and_module()
        _install_load()
        _install_distributed()
        _install_data_and_amp()
        _install_cuda_namespace()
        _install_process_hooks()
        return spec.name


def _find_spec(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def _install_process_hooks() -> None:
    import atexit
    import multiprocessing.process as mpp

    # A forked child (a DataLoader worker, a launcher worker) reports only its own calls.
    if not getattr(_install_process_hooks, "registered", False):
        os.register_at_fork(after_in_child=REPORT.reset)
        atexit.register(REPORT.dump)
        _install_process_hooks.registered = True  # type: ignore[attr-defined]
    bootstrap = mpp.BaseProcess._bootstrap

    def _bootstrap(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return bootstrap(self, *args, **kwargs)
        finally:
            REPORT.dump()  # multiprocessing children leave with os._exit: no atexit

    _patch(mpp.BaseProcess, "_bootstrap", _bootstrap)


def uninstall() -> None:
    """Switch runtime migration off: every patched attribute and variable gets its original back."""
    with _STATE.lock:
        while _STATE.patches:
            owner, name, had, old = _STATE.patches.pop()
            if had:
                setattr(owner, name, old)
            else:
                try:
                    delattr(owner, name)
                except AttributeError:
                    pass
        for key, value in _STATE.env_before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        _STATE.env_before.clear()
        _STATE.target = None
        _ORIGINALS.clear()


def _set_env(key: str, value: str) -> None:
    _STATE.env_before.setdefault(key, os.environ.get(key))
    os.environ[key] = value


def export_environment(device: str | None = None, device_count: int | None = None,
                       report_dir: str | None = None) -> None:
    """Make every Python process started from now on migrate too; :func:`uninstall` undoes it.

    Sets ``NPU_MIGRATE_MIGRATE=1``, puts ``npu_migrate/_bootstrap`` (a ``sitecustomize`` that arms
    the migration when torch is imported) first on ``PYTHONPATH``, and passes the target, the
    simulated device count and the report directory on.
    """
    _migrate_hook.export_environment(device, device_count, report_dir, set_env=_set_env)


def install_from_env() -> str:
    """Install with the settings exported by :func:`export_environment` (used by the start-up hook)."""
    return install()


@contextlib.contextmanager
def enabled(device: str | None = None, device_count: int | None = None, propagate: bool = False) -> Iterator[str]:
    """``with migrate.enabled(device="cpu", device_count=2):`` migration on inside, off after."""
    was_on = is_installed()
    name = install(device, device_count, propagate)
    try:
        yield name
    finally:
        if not was_on:
            uninstall()
