"""The rows of ``torch.cuda``: every public name of it and its submodules, for port and runtime migration.

Usage::

    from npu_migrate.cuda_api.namespace import CUDA_API, classify

    classify("torch.cuda.memory.empty_cache").op   # "empty_cache"
    CUDA_API["synchronize"].cpu                     # "nothing": runtime migration's answer on cpu
    CUDA_API["synchronize"].runtime_kind            # "noop", and .why says why it is not "redirected"

Each row is a :class:`~npu_migrate.cuda_api.row.CudaApi`; the columns are documented there and in
docs/architecture.md ("Adding a CUDA API row"). Names outside the rows are classified by family
(legacy tensor and storage types, exception classes, constants) or as typing re-exports.
"""

from __future__ import annotations

import re
from typing import Optional

from npu_migrate.cuda_api.row import CudaApi, Row
from npu_migrate.cuda_api.row import drop as _drop
from npu_migrate.cuda_api.row import ignored as _i
from npu_migrate.cuda_api.row import mapped as _m
from npu_migrate.cuda_api.row import noop as _n
from npu_migrate.cuda_api.row import refuse as _refuse
from npu_migrate.cuda_api.row import unsupported as _u

# Submodules whose public names are part of the API (the rest of torch.cuda's submodules are
# implementation detail, re-exported at the top where they matter).
SUBMODULES: tuple[str, ...] = ("amp", "random", "memory", "streams", "graphs", "nvtx", "jiterator")
# Prefixes of the same API under other families' names, mapped onto torch.cuda by normalize().
FAMILY_PREFIXES: dict[str, str] = {"torch.npu.": "torch.cuda.", "torch_npu.npu.": "torch.cuda."}

_GRAPHS = "CUDA graphs are an optimization: run without capture, or guard it with a device-type check"
_ALLOC = "the CUDA caching allocator has no counterpart: remove the call or guard it with a device-type check"
_HOST = "host (pinned) memory statistics of the CUDA allocator: guard the call with a device-type check"
_SMI = "an NVML (nvidia-smi) reading: guard the call with a device-type check, or read npu-smi on Ascend"
_RNG = "per-device generator state: use torch.get_rng_state()/torch.random.fork_rng, or guard the call"

# Why runtime migration's kind on the cpu target differs from the port's (CudaApi.why).
_IDLE = ("the cpu target has no device queue, allocator or generator: the call answers as an idle device "
         "would, a no-op on cpu (torch.npu's function of the same name on npu)")
_RNG_CPU = ("no CUDA generator on cpu: seeding it must not reseed the cpu generator (the run stays the same "
            "script's on the CPU) and its state round-trips empty, so checkpointing code runs unchanged; "
            "torch.npu has these on npu, while a rewrite has no device-neutral call to write")
_CAP_CPU = ("nothing to cap on cpu: the host's memory is not a device allocator's; torch.npu has the call on "
            "npu, while a rewrite has no device-neutral call to write")
_ZERO_ON_CPU = {"cpu": "zero", "cpu_note": "0 on cpu", "cpu_kind": "noop", "why": _IDLE}  # memory counters
_CPU_SEEDED = "the cpu generator is seeded by torch.manual_seed"
_FRACTION = "caps the CUDA caching allocator: no device-neutral call; guard it with a device-type check"
_AMP_DECORATOR = ("runtime migration passes the target's device_type= to torch.amp's decorator; a rewrite leaves "
                  "that one-argument change to the porter, as the note says")
# torch.cuda's parameters that torch.npu's function of the same name lacks in some torch-npu
# release (runtime migration on npu: npu_migrate.migrate.fit; tests/migrate/test_fit.py finds
# them in every release's signatures and fails on one without a decision here).
_ANNOTATIONS = _drop("enable_annotations", "kernel annotations are CUDA's (cuda.bindings): the capture is the same "
                     "without them")

_SIMULATED = ("runtime migration simulates the device context on cpu (torch.npu has it on npu); a rewrite has "
              "no device-neutral context manager to write")

_ROWS: dict[str, Row] = {
    # availability and devices
    "is_available": _m("accelerator_available", cpu="true"),
    "device_count": _m("device_count", cpu="count"),
    "current_device": _m("current_device_index", cpu="current"),
    "set_device": _m("set_device", "device", cpu="set_device"),
    "get_device_name": _m("device_name", "device", cpu="name"),
    "get_device_capability": _m("device_capability", "device", note="(0, 0) off CUDA", cpu="capability"),
    "get_device_properties": _m("device_properties", "device", cpu="properties"),
    "is_bf16_supported": _m("is_bf16_supported", "including_emulation", cpu="true", cuda_only=(
        _drop("including_emulation", "the NPU's bfloat16 is native or absent: there is no emulated bfloat16 for it "
              "to count"),)),
    "is_initialized": _m("accelerator_available", cpu="true"),
    "init": _n("devices initialise on first use on every family", cpu="nothing"),
    "is_tf32_supported": _n("TF32 is an NVIDIA format: False off CUDA", cpu="false"),
    "can_device_access_peer": _u("peer access is a CUDA topology query: guard the call with a device-type check"),
    "device": _u("use nm.set_device(i), or guard `with torch.cuda.device(i)` with a device-type check",
                 cpu="device", cpu_kind="redirected", why=_SIMULATED),
    "device_of": _u("use tensor.device and nm.set_device()", cpu="device_of", cpu_kind="redirected", why=_SIMULATED),
    "get_arch_list": _n("CUDA architectures: [] off CUDA, as a torch built without CUDA answers",
                        cpu="empty_list"),
    "get_gencode_flags": _n("CUDA build flags: '' off CUDA, as a torch built without CUDA answers",
                            cpu="empty_str"),
    "current_blas_handle": _u("cuBLAS handles exist on CUDA only"),
    "current_solver_handle": _u("cuSOLVER handles exist on CUDA only"),
    "cudart": _u("call the CUDA runtime only on CUDA machines"),
    "check_error": _u("CUDA runtime error codes exist on CUDA only"),
    "cudaStatus": _u("CUDA runtime status codes exist on CUDA only"),
    "has_half": _i("a constant"),
    "has_magma": _i("a constant"),
    "default_generators": _u(_RNG),
    "GreenContext": _u("green contexts partition an NVIDIA GPU: guard with a device-type check"),
    # synchronisation, streams and events
    "synchronize": _m("synchronize", "device", cpu="nothing", cpu_note="cpu work is synchronous", cpu_kind="noop",
                       why=_IDLE),
    "Event": _m("Event", "enable_timing", "blocking", "interprocess", cpu="event", cuda_only=(
        _refuse("external", "an external event is a record or wait node of a captured graph, which the release's "
                "event cannot be (it would be an internal dependency of the capture)"),)),
    "Stream": _m("Stream", "device", "priority", cpu="stream_class"),
    "stream": _m("stream", "stream", cpu="stream"),
    "current_stream": _m("current_stream", "device", cpu="host_stream"),
    "default_stream": _m("current_stream", "device", note="the host stream off CUDA", cpu="host_stream"),
    "set_stream": _n("one host stream off CUDA", cpu="nothing"),
    "StreamContext": _m("stream", "stream", cpu="stream_context"),
    "ExternalStream": _u("streams from other CUDA libraries do not exist on the target"),
    "get_stream_from_external": _u("streams from other CUDA libraries do not exist on the target"),
    "set_sync_debug_mode": _n("a CUDA debugging switch", cpu="nothing"),
    "get_sync_debug_mode": _n("a CUDA debugging switch", cpu="zero"),
    "is_current_stream_capturing": _n("no CUDA graph capture runs off CUDA: False", cpu="false"),
    # random numbers
    "manual_seed": _m("manual_seed", "seed", cpu="nothing", cpu_note=_CPU_SEEDED, cpu_kind="noop", why=_IDLE),
    "manual_seed_all": _m("manual_seed_all", "seed", cpu="nothing", cpu_note=_CPU_SEEDED, cpu_kind="noop", why=_IDLE),
    "seed": _u(_RNG, cpu="nothing", cpu_kind="noop", why=_RNG_CPU),
    "seed_all": _u(_RNG, cpu="nothing", cpu_kind="noop", why=_RNG_CPU),
    "initial_seed": _u(_RNG, cpu="initial_seed", cpu_note="torch.initial_seed()", cpu_kind="redirected",
                        why="on cpu the cpu generator's initial seed is the true answer; " + _RNG_CPU),
    "get_rng_state": _u(_RNG, cpu="empty_state", cpu_note="empty state: no CUDA generator", cpu_kind="noop",
                         why=_RNG_CPU),
    "get_rng_state_all": _u(_RNG, cpu="empty_states", cpu_note="empty states", cpu_kind="noop", why=_RNG_CPU),
    "set_rng_state": _u(_RNG, cpu="nothing", cpu_kind="noop", why=_RNG_CPU),
    "set_rng_state_all": _u(_RNG, cpu="nothing", cpu_kind="noop", why=_RNG_CPU),
    # memory
    "memory_allocated": _m("memory_allocated", "device", **_ZERO_ON_CPU),
    "max_memory_allocated": _m("max_memory_allocated", "device", **_ZERO_ON_CPU),
    "memory_reserved": _m("memory_reserved", "device", **_ZERO_ON_CPU),
    "max_memory_reserved": _m("max_memory_reserved", "device", **_ZERO_ON_CPU),
    "memory_cached": _m("memory_reserved", "device", note="memory_cached is the old name of memory_reserved",
                       **_ZERO_ON_CPU),
    "max_memory_cached": _m("max_memory_reserved", "device", note="the old name of max_memory_reserved",
                           **_ZERO_ON_CPU),
    "reset_peak_memory_stats": _m("reset_peak_memory_stats", "device", cpu="nothing", cpu_kind="noop",
                                 why=_IDLE),
    "reset_max_memory_allocated": _m("reset_peak_memory_stats", "device", cpu="nothing", cpu_kind="noop",
                                    why=_IDLE),
    "reset_max_memory_cached": _m("reset_peak_memory_stats", "device", cpu="nothing", cpu_kind="noop",
                                 why=_IDLE),
    "memory_stats": _m("memory_stats", "device",
                       note="nm.memory_stats() returns only allocated/max_allocated/reserved/max_reserved",
                       cpu="empty_dict", cpu_note="{} on cpu", cpu_kind="noop", why=_IDLE),
    "empty_cache": _m("empty_cache", cpu="nothing", cpu_note="no device cache on cpu", cpu_kind="noop", why=_IDLE),
    "mem_get_info": _m("mem_get_info", "device", note="host memory off an accelerator", cpu="host_memory"),
    "reset_accumulated_memory_stats": _n("statistics of the CUDA caching allocator", cpu="nothing"),
    "memory_stats_as_nested_dict": _u(_ALLOC),
    "memory_summary": _n("a printed report of the CUDA caching allocator: '' off CUDA (torch.npu.memory_summary() on "
                         "Ascend)", cpu="empty_str", cpu_note="'' on cpu"),
    "memory_snapshot": _u(_ALLOC, cuda_only=(
        _refuse("mempool_id", "without it the snapshot would hold every pool's segments, not that pool's"),
        _drop("include_traces", "it asks for a lighter snapshot: the release's holds the same segments, with their "
              "traces"))),
    "list_gpu_processes": _u(_SMI),
    "ipc_collect": _n("CUDA IPC memory only", cpu="nothing"),
    "set_per_process_memory_fraction": _u(_FRACTION, cpu="nothing", cpu_kind="noop", why=_CAP_CPU),
    "get_per_process_memory_fraction": _u(_FRACTION, cpu="whole", cpu_kind="noop", why=_CAP_CPU),
    "caching_allocator_alloc": _u(_ALLOC),
    "caching_allocator_delete": _u(_ALLOC),
    "caching_allocator_enable": _u(_ALLOC),
    "caching_allocator_disabled": _u(_ALLOC),
    "change_current_allocator": _u(_ALLOC),
    "get_allocator_backend": _u(_ALLOC),
    "CUDAPluggableAllocator": _u(_ALLOC),
    "MemPool": _u(_ALLOC, cuda_only=(
        _refuse("use_on_oom", "the release's pool would not serve an allocation that runs out of memory outside "
                "it, so the script could fail where CUDA's goes on"),
        _refuse("no_split", "the release's pool would split its segments, which code that hands them whole to "
                "another library (a communication buffer) relies on not happening"))),
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
    "graph": _u(_GRAPHS, cuda_only=(
        _ANNOTATIONS,
        _drop("check_input_liveness", "a debugging check that raises when an input is freed before replay: the "
              "captured work is the same without it"))),
    "graphs": _u(_GRAPHS),
    "make_graphed_callables": _u("CUDA graphs are an optimization: call the module directly", cuda_only=(
        _ANNOTATIONS,
        _drop("capture_error_mode", "the release captures in its default mode ('global'), which can only refuse "
              "more actions during capture: an error, never another result"))),
    "graph_pool_handle": _u("CUDA graphs are an optimization: run without capture"),
    "export_dot": _u(_GRAPHS),
    "export_graph_data": _u(_GRAPHS),
    # amp
    "amp.autocast": _m("autocast", "enabled", "dtype", "cache_enabled", runtime="amp"),
    "amp.GradScaler": _m("grad_scaler", "init_scale", "growth_factor", "backoff_factor", "growth_interval",
                         "enabled", runtime="amp"),
    "amp.custom_fwd": _u("use torch.amp.custom_fwd(device_type=...)", runtime="amp", cpu_kind="redirected",
                          why=_AMP_DECORATOR),
    "amp.custom_bwd": _u("use torch.amp.custom_bwd(device_type=...)", runtime="amp", cpu_kind="redirected",
                          why=_AMP_DECORATOR),
    "amp.common": _i("a module"),
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

_LEGACY_RUNTIME = ("runtime migration builds the tensor with torch's CPU type of the same name and moves it to the "
                   "target; a rewrite should spell the dtype and device instead, as the note says")

# Whole families of names, checked after the rows: (pattern on the name, the row's columns).
_FAMILIES: tuple[tuple[re.Pattern[str], Row], ...] = (
    (re.compile(r"^(amp\.)?[A-Z][A-Za-z0-9]*Tensor$"),
     _u(_LEGACY, runtime="legacy_type", cpu_kind="redirected", why=_LEGACY_RUNTIME)),
    (re.compile(r"^(amp\.)?[A-Z][A-Za-z0-9]*Storage$"),
     _u("legacy CUDA storage type: use tensors, created with device=nm.get_device()")),
    (re.compile(r"^[A-Z][A-Za-z]*Error$"), _i("an exception class: catching it works on every family")),
    (re.compile(r"^[A-Z0-9_]+$"), _i("a constant")),
    (re.compile(r"^graphs\.register_graph_"), _u(_GRAPHS)),
)

# Re-exports from the standard library and typing that torch.cuda's namespaces happen to contain.
_NOT_API = frozenset({
    "Any", "Callable", "Iterable", "Literal", "NewType", "Optional", "OrderedDict", "ParamSpec", "Self", "Tensor",
    "TypeAlias", "TypeGuard", "TypeVar", "Union", "annotations", "cast", "classproperty", "contextmanager",
    "deprecated", "lru_cache", "overload", "signature", "Device", "TYPE_CHECKING", "warnings", "torch", "os", "sys",
})

CUDA_API: dict[str, CudaApi] = {name: CudaApi(name, **row) for name, row in _ROWS.items()}


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
    for pattern, row in _FAMILIES:
        if pattern.search(name):
            return CudaApi(name, **row)
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
