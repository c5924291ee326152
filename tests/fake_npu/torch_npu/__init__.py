"""Test-only stand-in for Huawei's torch_npu. NEVER installed; tests put tests/fake_npu on sys.path.

It does what the real torch_npu does at import, as far as npu_migrate and ordinary training code
can see, so NPU code paths run for real on a machine without an NPU. Simulated devices are
CPU-backed: a tensor on ``npu:i`` holds CPU memory, every op computes with torch's CPU kernels,
and results stay on ``npu:i``.

What it simulates:

* the ``npu`` device: PrivateUse1 renamed to ``npu``, ``torch.npu`` with FAKE_NPU_DEVICE_COUNT
  devices (default 8, masked by ASCEND_RT_VISIBLE_DEVICES like the real runtime), a current
  device per thread that ``torch.npu.set_device`` and ``torch.accelerator.set_device_index`` change and
  record in ``torch.npu._state``, ``Tensor.npu()``/``is_npu``/``Module.npu()``; the runtime starts
  at the first device query and, as a real one, refuses to start again in a child forked after
  that (``FAKE_NPU_EVENTS=FILE`` records which process imported it and which started it);
* ``torch.npu.mstx`` (``mark``, ``range_start``, ``range_end``): the profiler markers, recorded
  in ``torch.npu.mstx.calls``;
* ``torch_npu.profiler`` (``profiler.py``): torch-npu's profiler API, recording with torch's CPU
  profiler and writing the ``*_ascend_pt`` layout torch-npu's analysis writes;
* tensors on it: :class:`NpuTensor`, a wrapper subclass holding a CPU tensor. Factories
  (``torch.zeros(..., device="npu:1")``), ``.to("npu:1")``, views, in-place and ``out=`` ops,
  autograd, ``.cpu()``, ``.item()``, ``.tolist()``, printing, ``copy.deepcopy`` and
  ``torch.save``/``torch.load`` (with or without ``map_location``) behave as on a device.
  Ops refuse tensors on two different npu devices, like a real device does;
* ``hccl``: a real gloo group. Collectives on npu tensors hand their CPU memory to gloo, so
  all_reduce/broadcast/all_gather and DDP's reducer really communicate between processes;
* one torch-npu release at a time (``_release.py``): the one that pairs with the running torch
  (``torch_npu.__version__`` is it), or ``FAKE_NPU_RELEASE=VERSION``'s; ``releases.json``,
  generated from the released wheels, gives each release's ``torch.npu`` names and signatures,
  and ``torch.npu`` takes them: a name the release lacks is missing, and a call it would refuse
  raises TypeError. A torch no release of the table was built for cannot import the stand-in;
* ``torch.npu`` (``npu.py``): every name runtime migration, the port tool's output and the
  examples use, with the simulated release's signatures (tests/test_fake_npu_surface.py checks
  each release's against its wheel; the real names left out are in ``NOT_SIMULATED.txt``):
  ``Event(enable_timing=True)`` (host clock), ``Stream``, ``stream()``, ``current_stream()``,
  ``synchronize``, per-device random generators (``manual_seed(_all)``, ``get_rng_state``),
  memory figures (bytes of live npu tensors), ``get_amp_supported_dtype``, ``is_bf16_supported``;
  autocast(``"npu"``) and ``GradScaler("npu")`` use torch's own PrivateUse1 autocast and AMP kernels.

What it cannot simulate: NPU kernels, precision and speed (results are CPU results, bitwise);
NPU-only ops and APIs (``torch_npu.npu_*`` fused ops, ``torch_npu.contrib``, ``transfer_to_npu``,
``torch.compile`` backends), device time in the profiler; real streams and asynchrony (everything is synchronous);
device memory limits (an npu tensor can be as large as host memory). Also: tensor storages are
not real (``untyped_storage()``/``data_ptr()`` of an npu tensor are meaningless, so
``set_(storage)`` and storage sharing between processes do not work), ``torch.Generator(device=
"npu")`` is unsupported, dropout draws from the CPU generator, autograd's backward runs in the
calling thread, and DDP warns that it collects no time stats for npu.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any

import torch
import torch.utils.backend_registration
import torch.distributed as dist
from torch.utils._pytree import tree_map

if not hasattr(torch._C, "_acc") or not hasattr(torch.utils.backend_registration, "_setup_privateuseone_for_python_backend"):
    # The simulation registers its device from Python, which older torch cannot do; the real
    # torch_npu registers from C++ and has no such limit. tests/conftest.py skips the tier there.
    raise ImportError(
        f"the torch_npu stand-in needs torch._C._acc and backend_registration._setup_privateuseone_for_python_backend, "
        f"which torch {torch.__version__} lacks"
    )

# The torch-npu release simulated: the one that pairs with this torch (FAKE_NPU_RELEASE picks
# another), from releases.json, generated from the released wheels. torch.npu takes its names and
# signatures below; a torch no release was built for is refused, as the real package refuses it.
from torch_npu import _release  # noqa: E402

_simulated = _release.pick(torch.__version__, _release.load(), os.environ.get(_release.ENV))
__version__ = _simulated.version  # as the real package's: the release (2.7.1.post11)

_runtime: dict[str, int] = {}
_SLOTS = 64  # per-device state is kept for this many indices


def _note(event: str) -> None:
    """Append ``event pid`` to $FAKE_NPU_EVENTS, so a test can see which process did what."""
    path = os.environ.get("FAKE_NPU_EVENTS")
    if path:
        with open(path, "a", encoding="ascii") as fh:
            fh.write(f"{event} {os.getpid()}\n")


def _after_fork_in_child() -> None:
    # The real runtime (like CUDA's) cannot be used in a child forked after it started.
    if "count" in _runtime:
        _runtime.clear()
        _runtime["bad_fork"] = 1


os.register_at_fork(after_in_child=_after_fork_in_child)
_note("import")


def _count() -> int:
    """Devices this process sees, fixed when the runtime first starts, as torch_npu's lazy init does.

    ASCEND_RT_VISIBLE_DEVICES masks FAKE_NPU_DEVICE_COUNT devices (default 8). It is read at the
    first device query, not at import: torch >= 2.5 imports torch_npu inside ``import torch``,
    before a launcher or runtime migration can set the variable. A process forked after its
    parent started the runtime cannot start it again, as on a real NPU.
    """
    if "count" not in _runtime:
        if _runtime.get("bad_fork"):
            raise RuntimeError("Cannot re-initialize NPU in forked subprocess. To use NPU with multiprocessing, "
                               "you must use the 'spawn' start method (fake npu)")
        _note("init")
        visible = os.environ.get("ASCEND_RT_VISIBLE_DEVICES")
        if visible is not None:
            _runtime["count"] = len([d for d in visible.split(",") if d.strip()])
        else:
            _runtime["count"] = int(os.environ.get("FAKE_NPU_DEVICE_COUNT", "8"))
    return _runtime["count"]


class _Current(threading.local):
    """The current device is per thread, as on the real runtime (and CUDA): a new thread starts on 0."""

    index = 0


_current = _Current()
_state: dict[str, Any] = {"set_device_calls": [], "seed": None}
_PRIVATEUSE1 = torch._C._autograd.DeviceType.PrivateUse1
_DEFAULT_SEED = 67280421310721  # what torch.cuda's generators start from


def _check(index: Any) -> int:
    index = int(index.index if isinstance(index, torch.device) else index)
    if not 0 <= index < _count():
        raise RuntimeError(f"fake npu: invalid device index {index}, {_count()} device(s) visible")
    return index


def _index(device: Any = None) -> int:
    """The device index ``device`` (int, str, torch.device or None for current) names."""
    if device is None:
        return _current.index
    if isinstance(device, int):
        return _check(device)
    device = torch.device(device)
    if device.type != "npu":
        raise ValueError(f"fake npu: expected an npu device, got {device}")
    return _current.index if device.index is None else _check(device.index)


def _set_device(index: Any) -> None:
    _current.index = _index(index)
    _state["set_device_calls"].append(_current.index)


def _exchange_device(index: int) -> int:
    previous = _current.index
    if index >= 0:
        _current.index = _check(index)
    return previous


# --------------------------------------------------------------------------- random numbers

_generators = [torch.Generator().manual_seed(_DEFAULT_SEED) for _ in range(_SLOTS)]


def _manual_seed(seed: int) -> None:
    _generators[_current.index].manual_seed(int(seed))


def _manual_seed_all(seed: int) -> None:
    _state["seed"] = int(seed)
    for gen in _generators:
        gen.manual_seed(int(seed))


# --------------------------------------------------------------------------- memory figures

_memory = {"allocated": [0] * _SLOTS, "peak": [0] * _SLOTS}
_live: dict[int, list[int]] = {}  # CPU storage address -> [device index, bytes, live wrappers]
_memory_lock = threading.Lock()


def _track(inner: torch.Tensor, index: int) -> tuple[int, int] | None:
    storage = inner.untyped_storage()
    key, nbytes = storage.data_ptr(), storage.nbytes()
    if key == 0 or nbytes == 0:
        return None
    with _memory_lock:
        entry = _live.get(key)
        if entry is None:
            _live[key] = [index, nbytes, 1]
            _memory["allocated"][index] += nbytes
            _memory["peak"][index] = max(_memory["peak"][index], _memory["allocated"][index])
        else:
            entry[2] += 1
    return key, index


def _untrack(key: int) -> None:
    with _memory_lock:
        entry = _live.get(key)
        if entry is None:
            return
        entry[2] -= 1
        if entry[2] == 0:
            del _live[key]
            _memory["allocated"][entry[0]] -= entry[1]


# --------------------------------------------------------------------------- tensors

aten = torch.ops.aten

# Ops that legitimately take tensors on different devices (copies between devices).
_CROSS_DEVICE = {
    aten._to_copy.default, aten.copy_.default, aten.copy.default, aten._copy_from.default,
    aten._copy_from_and_resize.default, aten.lift_fresh.default, aten.lift_fresh_copy.default,
}
# Ops that take CPU index tensors next to device tensors, as on CUDA.
_CPU_INDICES = {
    aten.index.Tensor, aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default,
}
_NO_OP = {aten.record_stream.default}
_generator_ops: dict[Any, bool] = {}


def _takes_generator(func: Any) -> bool:
    known = _generator_ops.get(func)
    if known is None:
        known = _generator_ops[func] = any(a.name == "generator" for a in func._schema.arguments)
    return known


class NpuTensor(torch.Tensor):
    """A tensor on a simulated ``npu:i`` device: a wrapper around the CPU tensor ``_inner``."""

    _inner: torch.Tensor

    @staticmethod
    def __new__(cls, inner: torch.Tensor, device: torch.device) -> NpuTensor:
        if isinstance(inner, NpuTensor):
            raise TypeError("fake npu: nested NpuTensor")
        if inner.layout != torch.strided:
            raise NotImplementedError(f"fake npu: {inner.layout} tensors are not simulated on npu")
        wrapper = torch.Tensor._make_wrapper_subclass(
            cls, inner.size(), strides=inner.stride(), storage_offset=inner.storage_offset(),
            dtype=inner.dtype, layout=inner.layout, device=device, requires_grad=False,
        )
        wrapper._inner = inner
        tracked = _track(inner, device.index)
        if tracked is not None:
            weakref.finalize(wrapper, _untrack, tracked[0])
        return wrapper

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN206
        return _dispatch(func, args, kwargs or {})

    # `.data = other` swaps the TensorImpl's metadata but not our Python attribute.
    @property
    def data(self) -> torch.Tensor:
        return torch._C.TensorBase.data.__get__(self)

    @data.setter
    def data(self, new: torch.Tensor) -> None:
        torch._C.TensorBase.data.__set__(self, new)
        if isinstance(new, NpuTensor):
            self._inner = new._inner

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        # torch prints subclasses as "NpuTensor(...)"; a tensor on a real NPU prints "tensor(...)".
        text = torch._tensor_str._str(self, tensor_contents=tensor_contents)
        is_param = getattr(self, "_is_param", False)
        if is_param and text.startswith("Parameter(") and text.endswith(")"):
            text = text[len("Parameter("):-1]
        name = type(self).__name__ + "("
        if text.startswith(name):
            text = "tensor(" + text[len(name):].replace("\n" + " " * len(name), "\n" + " " * len("tensor("))
        return "Parameter containing:\n" + text if is_param else text

    def tolist(self) -> Any:
        return self.detach().cpu().tolist()

    def __format__(self, spec: str) -> str:
        if self.dim() == 0:
            return self.item().__format__(spec)
        return super().__format__(spec)

    def __reduce_ex__(self, proto: int) -> Any:
        # What torch does for a backend without storages: pickle a CPU copy and the device, and
        # rebuild with .to(map_location or device), so the file loads with map_location="cpu"
        # (and weights_only=True) where there is no NPU.
        if getattr(self, "_is_param", False):
            return (torch._utils._rebuild_parameter, (self.detach(), self.requires_grad, {}))
        return (
            torch._utils._rebuild_device_tensor_from_cpu_tensor,
            (self._inner.detach().clone(), self.dtype, str(self.device), self.requires_grad),
        )

    def __deepcopy__(self, memo: dict) -> NpuTensor:
        if id(self) in memo:
            return memo[id(self)]
        if not self.is_leaf:
            raise RuntimeError("Only Tensors created explicitly by the user (graph leaves) support the deepcopy protocol")
        with torch.no_grad():
            new = NpuTensor(self._inner.clone(), self.device)
        new.requires_grad_(self.requires_grad)
        for key, value in self.__dict__.items():
            if key != "_inner":
                setattr(new, key, value)
        if self.grad is not None:
            new.grad = self.grad.__deepcopy__(memo)
        memo[id(self)] = new
        return new


def _device_of(value: Any) -> torch.device | None:
    if value is None:
        return None
    device = torch.device(value)
    if device.type == "npu":
        return torch.device("npu", _index(device))
    return device


def _wrap_outputs(out: Any, device: torch.device | None, originals: dict[int, NpuTensor]) -> Any:
    def wrap(value: Any) -> Any:
        if not isinstance(value, torch.Tensor) or isinstance(value, NpuTensor):
            return value
        original = originals.get(id(value))
        if original is not None:
            return original  # in-place and out= ops return the tensor they were given
        if device is None or device.type != "npu":
            return value
        return NpuTensor(value, device)

    return tree_map(wrap, out)


_CPU_KEYSET = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)


def _sync_metadata(wrapper: NpuTensor) -> None:
    """After an op resized or re-strided the CPU tensor in place (out=, resize_, unsqueeze_...),
    give the wrapper the same geometry. The CPU set_ kernel only rewrites the wrapper's metadata
    and grows its placeholder storage (which allocates nothing: its data pointer stays null)."""
    inner = wrapper._inner
    if (wrapper.shape, wrapper.stride(), wrapper.storage_offset()) != (
        inner.shape, inner.stride(), inner.storage_offset()
    ):
        aten.set_.source_Storage_storage_offset.redispatch(
            _CPU_KEYSET, wrapper, wrapper.untyped_storage(), inner.storage_offset(), inner.size(), inner.stride()
        )


def _dispatch(func: Any, args: tuple, kwargs: dict) -> Any:
    if func in _NO_OP:
        return None
    originals: dict[int, NpuTensor] = {}
    devices: list[torch.device] = []

    def unwrap(value: Any) -> Any:
        if isinstance(value, NpuTensor):
            originals[id(value._inner)] = value
            if value.device not in devices:
                devices.append(value.device)
            return value._inner
        return value

    args, kwargs = tree_map(unwrap, (args, kwargs))
    collective = func.namespace in ("c10d", "_c10d_functional")
    if func not in _CROSS_DEVICE and not collective:
        # Like a real device: no mixing of npu:i and npu:j, nor of npu and a CPU tensor that is
        # not a 0-dim scalar (CPU index tensors are fine for indexing ops).
        if func not in _CPU_INDICES:
            cpu = next((v for v in torch.utils._pytree.tree_leaves((args, kwargs))
                        if type(v) is torch.Tensor and v.device.type == "cpu" and v.dim() > 0
                        and id(v) not in originals), None)
            if cpu is not None:
                devices.append(cpu.device)
        if len(devices) > 1:
            raise RuntimeError(
                f"Expected all tensors to be on the same device, but found at least two devices, "
                f"{devices[0]} and {devices[1]}! (when checking arguments for {func})"
            )
    target = devices[0] if devices else None
    if "device" in kwargs and kwargs["device"] is not None:
        target = _device_of(kwargs["device"])
        if target.type == "npu":
            kwargs["device"] = torch.device("cpu")
    if target is not None and target.type == "npu" and not collective and _takes_generator(func):
        if kwargs.get("generator") is None:
            kwargs["generator"] = _generators[target.index]
    out = func(*args, **kwargs)
    for wrapper in originals.values():
        _sync_metadata(wrapper)
    return _wrap_outputs(out, target, originals)


def _privateuse1_fallback(op: Any, *args: Any, **kwargs: Any) -> Any:
    """Kernel of the ops that reach the npu backend with no NpuTensor argument: factories, empty*.

    (Ops on NpuTensors go to __torch_dispatch__, or to the per-op kernels registered below where
    torch turns Python dispatch off.)"""
    target = _device_of(kwargs.get("device"))
    if target is None or target.type != "npu":
        raise NotImplementedError(f"fake npu: {op} reached the npu backend without an npu device")
    kwargs["device"] = torch.device("cpu")
    if _takes_generator(op) and kwargs.get("generator") is None:
        kwargs["generator"] = _generators[target.index]
    return _wrap_outputs(op(*args, **kwargs), target, {})


# --------------------------------------------------------------------------- the torch.npu module

# torch_npu.npu, as in the real package: the device-module API, in npu.py, made the simulated
# release's (its names and signatures: tests/test_fake_npu_surface.py compares them with the
# wheels). It reads the state above.
from torch_npu import npu  # noqa: E402

_release.apply(npu, _simulated)


class _Hooks(torch._C._acc.PrivateUse1Hooks):
    def is_available(self) -> bool:
        return _count() > 0

    def has_primary_context(self, index: int) -> bool:
        return True

    def is_built(self) -> bool:
        return True


class _DeviceGuard(torch._C._acc.DeviceGuard):
    def type_(self) -> Any:
        return _PRIVATEUSE1


# Renames PrivateUse1, generates Tensor.npu()/is_npu/Module.npu(), registers torch.npu and the
# hooks and device guard torch's C++ side asks a backend for.
torch.utils.backend_registration._setup_privateuseone_for_python_backend(
    rename="npu", backend_module=npu, hook=_Hooks(), device_guard=_DeviceGuard()
)

# A device guard written in Python always answers "device 0, 1 device" to C++ (torch/csrc/acc),
# so torch.accelerator's device-index calls are pointed at the simulated runtime instead, as
# torch_npu's C++ guard would answer them. CPU work is synchronous: synchronize has nothing to do.
torch._C._accelerator_getDeviceIndex = lambda: _current.index
torch._C._accelerator_setDeviceIndex = lambda index: _set_device(index) if index >= 0 else None
torch._C._accelerator_exchangeDevice = _exchange_device
torch._C._accelerator_maybeExchangeDevice = _exchange_device
torch._C._accelerator_synchronizeDevice = lambda index=None: None
torch._C._accelerator_getStream = lambda index: npu.current_stream(index)

# The C++ guard reports one device, so autograd has one device thread; running backward in the
# calling thread (as for CPU) keeps npu:1..7 working.
torch._C._set_multithreading_enabled(False)

_lib = torch.library.Library("_", "IMPL")  # kept alive for the interpreter's lifetime
_lib.fallback(_privateuse1_fallback, dispatch_key="PrivateUse1")

# torch.tensor(data, device=...) copies into the new npu tensor with Python dispatch turned off,
# so copy_ & co. reach the npu backend with an NpuTensor argument. A Python *fallback* cannot
# take those (torch looks up a per-op Python kernel for tensors with the Python key), so these
# ops get per-op npu kernels that do what __torch_dispatch__ does.
_backend_lib = torch.library.Library("aten", "IMPL")
for _name in ("copy_", "_copy_from", "_copy_from_and_resize", "_to_copy", "detach", "alias",
              "view", "as_strided", "lift_fresh", "clone", "fill_.Scalar", "zero_"):
    _packet_name, _, _overload = _name.partition(".")
    _op = getattr(getattr(torch.ops.aten, _packet_name), _overload or "default")
    _backend_lib.impl(_name, (lambda op: lambda *a, **k: _dispatch(op, a, k))(_op), "PrivateUse1")


# torch.load(..., map_location="npu:0") moves every *storage* to the map location before tensors
# are rebuilt; npu storages cannot hold data here, so storages stay on the CPU. Tensors saved from
# npu tensors are rebuilt from their CPU copy with .to(map_location) and so still land on npu.
torch.serialization.register_package(
    9, lambda obj: None, lambda obj, location: obj if location.startswith("npu") else None
)


# --------------------------------------------------------------------------- autocast
# ATen has autocast kernels for CUDA, CPU, XPU... but not for PrivateUse1: torch_npu registers
# its own in C++, with CUDA's op lists. These are those lists' common part, written in Python.

_LOWER_PRECISION = (
    "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d",
    "conv_transpose2d.input", "conv_transpose3d.input", "convolution", "prelu", "addmm", "addmv",
    "addr", "matmul", "einsum", "mm", "mv", "linear", "addbmm", "baddbmm", "bmm", "chain_matmul",
    "linalg_multi_dot", "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell",
    "scaled_dot_product_attention",
)
_FP32 = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p",
    "reciprocal", "rsqrt", "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar",
    "softplus", "layer_norm", "native_layer_norm", "group_norm", "frobenius_norm.dim",
    "nuclear_norm", "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss",
    "nll_loss2d", "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss",
    "mse_loss", "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss",
    "triplet_margin_loss", "multi_margin_loss", "binary_cross_entropy_with_logits", "dist",
    "pdist", "cdist", "renorm", "logsumexp",
)
_FP32_SET_DTYPE = (
    "prod", "prod.dim_int", "softmax.int", "log_softmax.int", "cumprod", "cumsum",
    "linalg_vector_norm", "sum", "sum.dim_IntList",
)
_PROMOTE = (
    "addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler",
    "index_put", "tensordot", "scatter_add", "cat", "stack", "index_copy",
)
_AUTOCAST_KEY = torch._C.DispatchKey.AutocastPrivateUse1


def _eligible(value: Any) -> bool:
    return (
        isinstance(value, torch.Tensor) and value.is_floating_point()
        and value.device.type == "npu" and value.dtype != torch.float64
    )


def _cast_to(dtype: torch.dtype) -> Any:
    return lambda v: v.to(dtype) if _eligible(v) and v.dtype != dtype else v


def _autocast_kernel(op: Any, policy: str) -> Any:
    dtype_index = next((i for i, a in enumerate(op._schema.arguments) if a.name == "dtype"), None)

    def kernel(*args: Any, **kwargs: Any) -> Any:
        with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(_AUTOCAST_KEY)):
            if policy == "lower":
                args, kwargs = tree_map(_cast_to(torch.get_autocast_dtype("npu")), (args, kwargs))
            elif policy == "fp32":
                args, kwargs = tree_map(_cast_to(torch.float32), (args, kwargs))
            elif policy == "fp32_set_dtype" and args and _eligible(args[0]):
                if dtype_index is not None and len(args) > dtype_index:
                    if args[dtype_index] is None:
                        args = (*args[:dtype_index], torch.float32, *args[dtype_index + 1:])
                elif kwargs.get("dtype") is None:
                    kwargs = {**kwargs, "dtype": torch.float32}
            elif policy == "promote":
                found = [v.dtype for v in torch.utils._pytree.tree_leaves((args, kwargs)) if _eligible(v)]
                if found:
                    widest = found[0]
                    for dtype in found[1:]:
                        widest = torch.promote_types(widest, dtype)
                    args, kwargs = tree_map(_cast_to(widest), (args, kwargs))
            return op(*args, **kwargs)

    return kernel


def _banned(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError(
        "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
        "Many models use a sigmoid layer right before the binary cross entropy layer. Use "
        "torch.nn.functional.binary_cross_entropy_with_logits or torch.nn.BCEWithLogitsLoss "
        "instead; they are safe to autocast."
    )


_autocast_lib = torch.library.Library("aten", "IMPL")
for _policy, _names in (("lower", _LOWER_PRECISION), ("fp32", _FP32),
                        ("fp32_set_dtype", _FP32_SET_DTYPE), ("promote", _PROMOTE)):
    for _name in _names:
        _packet_name, _, _overload = _name.partition(".")
        _op = getattr(getattr(torch.ops.aten, _packet_name), _overload or "default")
        _autocast_lib.impl(_name, _autocast_kernel(_op, _policy), "AutocastPrivateUse1")
_autocast_lib.impl("binary_cross_entropy", _banned, "AutocastPrivateUse1")
_lib.fallback(torch.library.fallthrough_kernel, dispatch_key="AutocastPrivateUse1")


# --------------------------------------------------------------------------- hccl


def _create_hccl(store, rank, world_size, timeout):  # noqa: ANN001, ANN202
    # Collectives on npu tensors reach NpuTensor.__torch_dispatch__ first, which hands their CPU
    # memory to this gloo group (see _dispatch); CPU tensors go straight to it.
    return dist.ProcessGroupGloo(store, rank, world_size, timeout)


# The real torch_npu registers devices=["npu"]; "cpu" is added because gloo runs the collectives
# on the CPU tensors inside npu tensors.
dist.Backend.register_backend("hccl", _create_hccl, devices=["npu", "cpu"])


# --------------------------------------------------------------------------- pinned memory

# Page-locked host memory is a driver feature; a CPU-backed device has nothing to lock. torch asks
# the C++ hooks for a pinned allocator, which a Python backend cannot register, so pinning for the
# simulated npu returns an ordinary copy (is_pinned() stays False). DataLoader(pin_memory=True) runs.
_pin_memory = torch.Tensor.pin_memory


def _pin_memory_for_npu(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    try:
        return _pin_memory(self, *args, **kwargs)
    except (NotImplementedError, RuntimeError) as exc:
        if "PrivateUse1" not in str(exc):
            raise
        return self.clone()


torch.Tensor.pin_memory = _pin_memory_for_npu  # type: ignore[method-assign]


# --------------------------------------------------------------------------- autoload


def _autoload() -> None:
    """The real wheel's ``torch.backends`` entry point: torch >= 2.5 calls it at ``import torch``.

    Importing this module already did everything, as importing the real torch_npu does.
    """


from torch_npu._fusion_attention import npu_fusion_attention  # noqa: E402,F401 - the reference operator (helper F)
