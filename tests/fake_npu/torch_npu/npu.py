"""The stand-in's ``torch_npu.npu`` (``torch.npu``): the device-module API of the simulated devices.

Every public name here is one of the real ``torch_npu.npu``'s. Each is written with every
parameter any simulated release has (the newest signature); at import the package makes the
module the simulated release's (``_release.apply`` with ``releases.json``, generated from the
wheels): a name that release lacks is removed, and a differing signature is replaced by the
release's, so a call the release refuses raises TypeError. tests/test_fake_npu_surface.py reads
the real wheels and fails, per release, when a name or signature of ``torch.npu`` drifts from
them, or when a name runtime migration, the port tool's output or the examples use is missing.
The real names not simulated are listed, generated, in tests/fake_npu/NOT_SIMULATED.txt. Calls
that cannot be simulated on a CPU-backed device (graph capture, the caching allocator's raw
blocks) exist with the real signature and raise ``RuntimeError("fake npu: ... is not simulated")``.

State (current device, generators, memory figures) lives in the package (``torch_npu``), which
imports this module after creating it.
"""

from __future__ import annotations

import contextlib
import time
import types
from typing import Any

import torch

import torch_npu as _core

_state = _core._state  # lets tests read what npu_migrate asked the device to do
NpuTensor = _core.NpuTensor  # the tensor type of the simulated devices (not in the real torch.npu)
_fraction: dict[int, float] = {}
_sync_debug_mode = [0]


def _not_simulated(what: str) -> RuntimeError:
    return RuntimeError(f"fake npu: {what} is not simulated (tests/fake_npu simulates the device on the CPU)")


def _lazy_init() -> None:
    _core._count()


def _is_in_bad_fork() -> bool:
    return bool(_core._runtime.get("bad_fork"))


# --------------------------------------------------------------------------- devices


def is_initialized():
    return "count" in _core._runtime


def init():
    _core._count()


def is_available():
    return _core._count() > 0


def device_count():
    return _core._count()


def current_device():
    return _core._current.index


def set_device(device):
    _core._set_device(device)


def synchronize(device=None):
    _core._index(device)  # work is synchronous: nothing to wait for, but the device must exist


def can_device_access_peer(device_id, peer_device_id):
    _core._index(device_id), _core._index(peer_device_id)
    return True  # every simulated device reads the same host memory


def get_device_name(device_name=None):
    return f"FakeAscend910B (simulated {_core._index(device_name)})"


def get_device_properties(device_name=None):
    index = _core._index(device_name)
    return types.SimpleNamespace(name=get_device_name(index), total_memory=_total_memory(), cube_core_num=0,
                                 vector_core_num=0, L2_cache_size=0)


def get_device_capability(device=None):
    return None  # the real NPU answers None unless TORCH_NPU_DEVICE_CAPABILITY is set


def _total_memory() -> int:
    import os

    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def mem_get_info(device=None):
    index = _core._index(device)
    total = _total_memory()
    return max(total - _core._memory["allocated"][index], 0), total


def utilization(device=None):
    _core._index(device)
    return 0


def get_sync_debug_mode():
    return _sync_debug_mode[0]


def set_sync_debug_mode(debug_mode):
    _sync_debug_mode[0] = {"default": 0, "warn": 1, "error": 2}.get(debug_mode, debug_mode)


def current_blas_handle():
    raise _not_simulated("a BLAS handle")


def ipc_collect():
    pass


def is_bf16_supported(including_emulation=False):
    return True


def get_amp_supported_dtype():
    return [torch.float16, torch.bfloat16]


def is_autocast_enabled():
    return torch.is_autocast_enabled("npu")


def get_autocast_dtype():
    return torch.get_autocast_dtype("npu")


class device:
    """Context manager that makes ``device`` current, as ``torch.npu.device`` does."""

    def __init__(self, device):
        self.idx = -1 if device is None else _core._index(device)
        self.prev_idx = -1

    def __enter__(self):
        self.prev_idx = _core._exchange_device(self.idx)

    def __exit__(self, *exc: Any) -> None:
        _core._exchange_device(self.prev_idx)


class device_of(device):
    """The device of a tensor made current (no-op for a CPU tensor)."""

    def __init__(self, obj):
        super().__init__(obj.get_device() if obj.is_npu else None)


# --------------------------------------------------------------------------- random numbers


def manual_seed(seed):
    _core._manual_seed(seed)


def manual_seed_all(seed):
    _core._manual_seed_all(seed)


def seed():
    _core._manual_seed(torch.seed())


def seed_all():
    _core._manual_seed_all(torch.seed())


def initial_seed():
    return _core._generators[_core._current.index].initial_seed()


def get_rng_state(device='npu'):
    return _core._generators[_core._index(device)].get_state()


def set_rng_state(new_state, device='npu'):
    _core._generators[_core._index(device)].set_state(new_state)


def get_rng_state_all():
    return [g.get_state() for g in _core._generators[: _core._count()]]


def set_rng_state_all(new_states):
    for generator, state in zip(_core._generators, new_states):
        generator.set_state(state)


# --------------------------------------------------------------------------- memory figures
# Bytes of live npu tensors, per device: allocated and reserved are the same figure (no cache).


def memory_allocated(device=None):
    return _core._memory["allocated"][_core._index(device)]


def max_memory_allocated(device=None):
    return _core._memory["peak"][_core._index(device)]


def memory_reserved(device=None):
    return memory_allocated(device)


def max_memory_reserved(device=None):
    return max_memory_allocated(device)


def memory_cached(device=None):
    return memory_reserved(device)


def max_memory_cached(device=None):
    return max_memory_reserved(device)


def reset_peak_memory_stats(device=None):
    index = _core._index(device)
    _core._memory["peak"][index] = _core._memory["allocated"][index]


def reset_max_memory_allocated(device=None):
    reset_peak_memory_stats(device)


def reset_max_memory_cached(device=None):
    reset_peak_memory_stats(device)


def reset_accumulated_memory_stats(device=None):
    _core._index(device)


def memory_stats(device=None):
    index = _core._index(device)
    current, peak = _core._memory["allocated"][index], _core._memory["peak"][index]
    return {
        "allocated_bytes.all.current": current, "allocated_bytes.all.peak": peak,
        "reserved_bytes.all.current": current, "reserved_bytes.all.peak": peak,
    }


def memory_stats_as_nested_dict(device=None):
    nested: dict[str, Any] = {}
    for key, value in memory_stats(device).items():
        *path, last = key.split(".")
        node = nested
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    return nested


def memory_snapshot(mempool_id=None):
    return []


def memory_summary(device=None, abbreviated=False):
    stats = memory_stats(device)
    return "\n".join(f"{key}: {value}" for key, value in stats.items())


def empty_cache():
    pass


def get_per_process_memory_fraction(device=None):
    return _fraction.get(_core._index(device), 1.0)


def set_per_process_memory_fraction(fraction, device=None):
    if not 0 <= fraction <= 1:
        raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
    _fraction[_core._index(device)] = float(fraction)


def caching_allocator_alloc(size, device=None, stream=None):
    raise _not_simulated("caching_allocator_alloc (raw device memory)")


def caching_allocator_delete(mem_ptr):
    raise _not_simulated("caching_allocator_delete (raw device memory)")


def get_allocator_backend():
    return "native"


def change_current_allocator(allocator):
    raise _not_simulated("a pluggable allocator")


class MemPool:
    """A memory pool; the simulated devices have one pool, the host's."""

    def __init__(self, allocator=None, use_on_oom=False, no_split=False):
        self.allocator = allocator


class MemPoolContext:
    """Makes a pool the active one while it lives; the simulated devices have one pool, the host's."""

    def __init__(self, pool):
        self.pool = pool

    @staticmethod
    def active_pool():
        return None  # allocations go to the host's one pool


def use_mem_pool(pool, device=None):
    _core._index(device)
    return contextlib.nullcontext()


def host_memory_stats():
    return {}


def host_memory_stats_as_nested_dict():
    return {}


def reset_accumulated_host_memory_stats():
    pass


def reset_peak_host_memory_stats():
    pass


# --------------------------------------------------------------------------- legacy storage types
# Exist as on the real device module; tensors are made with device="npu" instead.


class _NotSimulatedStorage:
    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        raise _not_simulated(f"torch.npu.{cls.__name__}")


BoolStorage = type("BoolStorage", (_NotSimulatedStorage,), {})
ByteStorage = type("ByteStorage", (_NotSimulatedStorage,), {})
CharStorage = type("CharStorage", (_NotSimulatedStorage,), {})
ShortStorage = type("ShortStorage", (_NotSimulatedStorage,), {})
IntStorage = type("IntStorage", (_NotSimulatedStorage,), {})
LongStorage = type("LongStorage", (_NotSimulatedStorage,), {})
HalfStorage = type("HalfStorage", (_NotSimulatedStorage,), {})
FloatStorage = type("FloatStorage", (_NotSimulatedStorage,), {})
DoubleStorage = type("DoubleStorage", (_NotSimulatedStorage,), {})
BFloat16Storage = type("BFloat16Storage", (_NotSimulatedStorage,), {})


# --------------------------------------------------------------------------- streams and events


class Stream(torch.Stream):
    """A stream of a simulated device. Work is synchronous, so every wait is already satisfied."""

    def __new__(cls, device=None, priority=0, **kwargs):
        return super().__new__(cls, stream_id=0, device_index=_core._index(device),
                               device_type=int(_core._PRIVATEUSE1))

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
        self.priority = priority

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass

    def wait_stream(self, stream: Any) -> None:
        pass

    def record_event(self, event: Any = None) -> Event:
        event = event or Event()
        event.record(self)
        return event

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


class ExternalStream(Stream):
    """A stream made by another library; there is none to wrap here."""

    def __new__(cls, stream_ptr, device=None, **kwargs):
        raise _not_simulated("ExternalStream (streams of other libraries)")


class Event:
    """An event of a simulated device; ``record()`` reads the host clock (work is synchronous)."""

    def __new__(cls, enable_timing=False, blocking=False, interprocess=False):
        return super().__new__(cls)

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        self.enable_timing = enable_timing
        self._time: float | None = None

    def record(self, stream: Any = None) -> None:
        self._time = time.perf_counter()

    def elapsed_time(self, end_event: Event) -> float:
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError("Both events must be created with enable_timing=True to measure time.")
        if self._time is None or end_event._time is None:
            raise RuntimeError("Both events must be recorded before elapsed_time() is called.")
        return (end_event._time - self._time) * 1000.0

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def wait(self, stream: Any = None) -> None:
        pass


_current_streams: dict[int, Stream] = {}


def current_stream(device=None):
    index = _core._index(device)
    if index not in _current_streams:
        _current_streams[index] = Stream(index)
    return _current_streams[index]


def default_stream(device=None):
    return current_stream(device)


def set_stream(stream):
    if stream is not None:
        _current_streams[stream.device_index] = stream


class StreamContext:
    """Makes a stream current inside a ``with`` block."""

    def __init__(self, stream_ctx):
        self.stream = stream_ctx
        self.previous: Stream | None = None

    def __enter__(self) -> Stream | None:
        if self.stream is not None:
            self.previous = current_stream(self.stream.device_index)
            _current_streams[self.stream.device_index] = self.stream
        return self.stream

    def __exit__(self, *exc: Any) -> None:
        if self.stream is not None and self.previous is not None:
            _current_streams[self.stream.device_index] = self.previous


def stream(stream):
    return StreamContext(stream)


# --------------------------------------------------------------------------- graphs (not simulated)


class graph:
    """NPU graph capture: not simulated (a CPU-backed device has nothing to capture)."""

    def __init__(self, npu_graph, pool=None, stream=None, auto_dispatch_capture=False, capture_error_mode='global'):
        raise _not_simulated("NPU graph capture")


def graph_pool_handle():
    raise _not_simulated("NPU graph capture")


def is_current_stream_capturing():
    return False


def make_graphed_callables(callables, sample_args, num_warmup_iters=3, allow_unused_input=False, pool=None):
    raise _not_simulated("NPU graph capture")


# --------------------------------------------------------------------------- mstx, amp


class mstx:
    """torch_npu.npu.mstx: markers for the Ascend profiler, recorded in ``mstx.calls``."""

    calls: list[tuple[str, Any]] = []

    @staticmethod
    def mark(message, stream=None, domain='default'):
        mstx.calls.append(("mark", message))

    @staticmethod
    def range_start(message, stream=None, domain='default'):
        mstx.calls.append(("range_start", message))
        return len(mstx.calls)  # a range id; 0 means failure

    @staticmethod
    def range_end(range_id, domain='default'):
        mstx.calls.append(("range_end", range_id))


class _GradScaler(torch.amp.GradScaler):
    """torch_npu.npu.amp.GradScaler: torch's GradScaler on the npu device."""

    def __init__(self, init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000,
                 dynamic=True, enabled=True):
        super().__init__("npu", init_scale=init_scale, growth_factor=growth_factor, backoff_factor=backoff_factor,
                         growth_interval=growth_interval, enabled=enabled)


amp = types.ModuleType("torch_npu.npu.amp")
amp.GradScaler = type("GradScaler", (_GradScaler,), {"__module__": "torch_npu.npu.amp"})
