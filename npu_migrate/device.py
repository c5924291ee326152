"""Device families, the choice between them, and the device calls the rest of the toolkit uses.

Usage::

    import npu_migrate as nm

    spec = nm.device_spec()            # DeviceSpec(name="npu", backend="hccl", ...)
    dev = nm.get_device(local_rank)    # torch.device("npu", 3); torch.device("cpu") on CPU
    nm.set_device(local_rank)
    with nm.autocast(enabled=args.amp):
        loss = model(x).sum()
    scaler = nm.grad_scaler(enabled=args.amp)

The family is chosen in this order: the explicit argument, then ``NPU_MIGRATE_DEVICE``, then
the first row of :data:`DEVICES` that is available on this machine. Everything a family needs
is one row of that table; code below reaches the device through ``getattr(torch, spec.name)``
(or ``torch.accelerator`` where torch has it), never through per-device branches.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
import logging
import os
import platform
import random
import re
import sys
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from npu_migrate import autoload
from npu_migrate.errors import DeviceUnavailableError, UnknownDeviceError
from npu_migrate.registry import DEVICES, DeviceSpec

if "torch" not in sys.modules:
    autoload.check_versions()  # torch >= 2.5 would import a mismatched torch_npu, which can abort
try:
    import torch
except RuntimeError as _exc:  # torch's autoload of a broken torch_npu: no retry is possible
    _line = autoload.explain(_exc)
    if _line is None:
        raise
    raise DeviceUnavailableError(_line) from _exc

logger = logging.getLogger(__name__)

from npu_migrate.registry import ENV_DEVICE  # noqa: E402 - re-exported

CANN_SET_ENV = "/usr/local/Ascend/ascend-toolkit/set_env.sh"


SOURCES = ("argument", ENV_DEVICE, "detected")


@dataclass(frozen=True)
class Selection:
    """The chosen family and why it was chosen.

    Attributes:
        spec: the chosen family.
        source: ``"argument"``, ``"NPU_MIGRATE_DEVICE"`` or ``"detected"``.
        skipped: one line per family that detection passed over for a reason worth
            telling the user (for example a torch_npu that fails to import).
    """

    spec: DeviceSpec
    source: str
    skipped: tuple[str, ...] = ()


# --------------------------------------------------------------------------- selection


def _normalize(name: str, origin: str) -> str | None:
    """Return the family name for ``name``, ``None`` for auto, or raise with the choices."""
    key = name.strip().lower()
    if key in ("", "auto"):
        return None
    if key not in DEVICES:
        raise UnknownDeviceError(
            f"Unknown device {name!r} from {origin}. Expected one of: auto, {', '.join(DEVICES)}. "
            f"Pass --device or set {ENV_DEVICE}."
        )
    return key


def resolve_device(device: str | None = None) -> Selection:
    """Choose the device family: argument, then ``NPU_MIGRATE_DEVICE``, then detection.

    A family named by the argument or the variable must be usable, or this raises: a forced
    family never falls back silently to another one.

    Args:
        device: a family name, ``"auto"`` or ``None``.

    Returns:
        The chosen family and the source of the choice.

    Raises:
        UnknownDeviceError: the name is not a family.
        DeviceUnavailableError: the named family cannot be used here.
    """
    for value, source in ((device, "argument"), (os.environ.get(ENV_DEVICE), ENV_DEVICE)):
        if value is None:
            continue
        origin = "--device" if source == "argument" else f"{ENV_DEVICE}={value}"
        name = _normalize(value, origin)
        if name is not None:
            require(DEVICES[name])
            return Selection(DEVICES[name], source)
    return _detect()


@functools.lru_cache(maxsize=None)
def _detect() -> Selection:
    skipped = []
    for spec in DEVICES.values():
        reason = unavailable_reason(spec)
        if reason is None:
            return Selection(spec, "detected", tuple(skipped))
        # An installed extension that cannot be used is worth a warning: its owner most likely
        # meant to run on that family. A CUDA build of torch on a laptop is not.
        if spec.extension is not None and importlib.util.find_spec(spec.extension) is not None:
            skipped.append(reason)
    raise DeviceUnavailableError("No device family is usable, not even cpu.")  # pragma: no cover


def _clear_caches() -> None:
    """Forget detection and extension imports (for tests that change the environment)."""
    _detect.cache_clear()
    _load_extension.cache_clear()
    _unavailable.cache_clear()
    _accelerator_works.cache_clear()


def device_spec(device: str | None = None) -> DeviceSpec:
    """Return the chosen family's :class:`DeviceSpec` (see :func:`resolve_device`)."""
    return resolve_device(device).spec


def device_type(device: str | None = None) -> str:
    """Return the chosen family's torch device type: ``"npu"``, ``"cuda"`` or ``"cpu"``."""
    return device_spec(device).name


def default_backend(spec: DeviceSpec | None = None) -> str:
    """Return the torch.distributed backend for a family (``hccl``, ``nccl``, ``gloo``).

    torch >= 2.6 knows the default backend of every registered device, including the one
    torch_npu registers; older torch falls back to the table.
    """
    spec = spec or device_spec()
    get_default = getattr(torch.distributed, "get_default_backend_for_device", None)
    if get_default is not None:
        try:
            return str(get_default(spec.name))
        except (RuntimeError, ValueError):
            pass  # device not registered with torch.distributed (yet)
    return spec.backend


# --------------------------------------------------------------------------- extensions


def _release_tuple(version: str) -> tuple[int, ...]:
    """``2.1.2+cpu`` -> ``(2, 1)``: the torch release line of a version."""
    match = re.match(r"(\d+)\.(\d+)", version)
    return tuple(int(p) for p in match.groups()) if match else ()


def _install_hint(spec: DeviceSpec) -> str:
    """How to install the extension release that declares the installed torch.

    The release is read from a cached wheel's METADATA (:mod:`npu_migrate.releases.pairs`);
    without one, ``npu-migrate env --releases`` looks it up on the package index.
    """
    from npu_migrate.releases import pairs

    found = pairs.pairing(torch.__version__)
    if found is not None:
        return f"pip install {spec.pip_name}=={found.version}, whose METADATA declares {found.requires_torch}"
    line = pairs.same_line(torch.__version__)
    if line is not None and line.requires_torch:  # the release of this torch line wants another build
        return (f"{pairs.install_torch(line.requires_torch)} then pip install {spec.pip_name}=={line.version}, "
                f"whose METADATA declares {line.requires_torch} (torch {torch.__version__} is another build)")
    return (f"the {spec.pip_name} release whose Requires-Dist accepts torch {torch.__version__} "
            f"(`npu-migrate env --releases` names it)")


def _mismatch(spec: DeviceSpec, ext_version: str) -> str | None:
    """The one-line refusal of an extension built for another torch release, else ``None``.

    Decided from the extension's declared requirement on torch (its METADATA); another build or
    patch of the same release is not refused here (``npu-migrate env`` warns about it).
    """
    from npu_migrate.releases import pairs

    requires = None
    try:
        requires = pairs.requirement_of_metadata(importlib.metadata.requires(spec.pip_name or "") or [])
    except importlib.metadata.PackageNotFoundError:
        pass  # built from source or on PYTHONPATH: its version is all there is
    pair = pairs.check(torch.__version__, ext_version, requires)
    if not pair.fatal:
        return None
    return autoload.fatal_message(pair)


@functools.lru_cache(maxsize=None)
def _load_extension(module_name: str) -> ModuleType | str:
    """Import a device extension once; return the module or the one-line reason it failed."""
    spec = next(s for s in DEVICES.values() if s.extension == module_name)
    if importlib.util.find_spec(module_name) is None:
        return (
            f"{spec.name} needs {module_name}, which is not installed. Install the release that "
            f"declares torch {torch.__version__}: {_install_hint(spec)} (and the CANN toolkit it needs)."
        )
    try:
        dist_version = importlib.metadata.version(spec.pip_name or module_name)
    except importlib.metadata.PackageNotFoundError:
        dist_version = None  # built from source or on PYTHONPATH: check __version__ after import
    if dist_version is not None and (reason := _mismatch(spec, dist_version)):
        return reason  # importing a mismatched build can abort the interpreter, so stop here
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any failure of a broken install is reported as one line
        detail = " ".join(str(exc).split()) or type(exc).__name__
        return (
            f"{module_name} is installed but failed to import: {detail}. If a libascend*/CANN "
            f"library is missing, source the CANN environment first (source {CANN_SET_ENV}) "
            f"and check that the CANN version matches {module_name}."
        )
    if dist_version is None and (reason := _mismatch(spec, str(getattr(module, "__version__", "")))):
        return reason
    return module


def extension_version(spec: DeviceSpec) -> str | None:
    """Return the installed version of a family's extension without importing it."""
    if spec.extension is None:
        return None
    try:
        return importlib.metadata.version(spec.pip_name or spec.extension)
    except importlib.metadata.PackageNotFoundError:
        if importlib.util.find_spec(spec.extension) is None:
            return None
        module = _load_extension(spec.extension)
        return None if isinstance(module, str) else str(getattr(module, "__version__", None))


def _torch_built_for(spec: DeviceSpec) -> bool:
    if spec.name == "cuda":
        return torch.version.cuda is not None
    return True


def unavailable_reason(spec: DeviceSpec) -> str | None:
    """Return why ``spec`` cannot be used here as one line, or ``None`` when it can.

    The answer is computed once per process: availability does not change while it runs.
    """
    return _unavailable(spec.name)


@functools.lru_cache(maxsize=None)
def _unavailable(name: str) -> str | None:
    spec = DEVICES[name]
    if spec.extension is not None:
        module = _load_extension(spec.extension)
        if isinstance(module, str):
            return module
    if not spec.is_accelerator:
        return None
    if not _torch_built_for(spec):
        return (
            f"{spec.name} is not supported by this torch build ({torch.__version__}). Install a "
            f"{spec.name} build of torch, or choose another family with --device or {ENV_DEVICE}."
        )
    mod = getattr(torch, spec.name, None)
    if mod is None or not mod.is_available() or mod.device_count() < 1:
        visible = os.environ.get(spec.visible_devices_env or "")
        mask = f", {spec.visible_devices_env}={visible!r}" if visible is not None else ""
        return (
            f"No {spec.name} device is visible (torch.{spec.name}.is_available() is False{mask}). "
            f"Check the driver and the device mask, or choose another family with --device or {ENV_DEVICE}."
        )
    return None


def require(spec: DeviceSpec) -> None:
    """Raise :class:`DeviceUnavailableError` with a one-line reason unless ``spec`` is usable."""
    reason = unavailable_reason(spec)
    if reason is not None:
        raise DeviceUnavailableError(reason)


def is_available(name: str) -> bool:
    """Return whether the family ``name`` can be used here; never raises for a known family.

    ``name`` is read as ``--device`` reads it: case and surrounding spaces are ignored, and
    ``"auto"`` (or an empty name) asks whether detection finds a usable family, which it does
    wherever torch runs (cpu is always usable).

    Raises:
        UnknownDeviceError: ``name`` is neither a family nor ``"auto"`` (the line lists the choices).
    """
    key = _normalize(name, "is_available()")
    if key is None:
        try:
            _detect()
        except DeviceUnavailableError:  # pragma: no cover - cpu is always usable
            return False
        return True
    return unavailable_reason(DEVICES[key]) is None


# --------------------------------------------------------------------------- device calls


def _module(spec: DeviceSpec) -> ModuleType:
    return getattr(torch, spec.name)


def _accelerator(spec: DeviceSpec) -> ModuleType | None:
    """Return ``torch.accelerator`` when torch has it and it speaks for ``spec``'s family."""
    return torch.accelerator if spec.is_accelerator and _accelerator_works(spec.name) else None


@functools.lru_cache(maxsize=None)
def _accelerator_works(name: str) -> bool:
    acc = getattr(torch, "accelerator", None)  # torch >= 2.6
    if acc is None:
        return False
    try:
        try:
            current = acc.current_accelerator(check_available=True)
        except TypeError:  # torch 2.6 has no check_available
            current = acc.current_accelerator()
        if current is None or current.type != name:
            return False
        # A device registered from Python only (no C++ device guard) passes the checks above
        # but fails here with "PyTorch is not linked with support for ... devices".
        (getattr(acc, "current_device_index", None) or acc.current_device_idx)()
    except RuntimeError:
        return False
    return True


def _local_rank_env() -> int | None:
    value = os.environ.get("LOCAL_RANK")
    return int(value) if value not in (None, "") else None


def device_count() -> int:
    """Return how many devices of the chosen family this process sees.

    On CPU: the devices the job simulates, one per rank the launcher (or torchrun) started on this
    node (``LOCAL_WORLD_SIZE``), else 1. A ported guard such as
    ``assert local_rank < nm.device_count()`` then holds on CPU as it does on a node with one
    device per rank.
    """
    return _count(device_spec())


def _count(spec: DeviceSpec) -> int:
    """:func:`device_count` for ``spec``, whatever the environment chooses."""
    if not spec.is_accelerator:
        local = os.environ.get("LOCAL_WORLD_SIZE", "").strip()
        return int(local) if local.isdigit() and int(local) >= 1 else 1
    acc = _accelerator(spec)
    return int(acc.device_count() if acc is not None else _module(spec).device_count())


def current_device_index() -> int:
    """Return the index of this process's current device (0 on CPU)."""
    return _current_index(device_spec())


def _current_index(spec: DeviceSpec) -> int:
    if not spec.is_accelerator:
        return 0
    acc = _accelerator(spec)
    if acc is not None:
        fn = getattr(acc, "current_device_index", None) or acc.current_device_idx
        return int(fn())
    return int(_module(spec).current_device())


def get_device(local_rank: int | None = None) -> torch.device:
    """Return the device for a local rank.

    Args:
        local_rank: index on this node; defaults to ``LOCAL_RANK`` or, outside a job, the
            current device.

    Returns:
        ``torch.device(family, local_rank)`` on an accelerator, ``torch.device("cpu")`` on CPU.
    """
    spec = device_spec()
    if not spec.is_accelerator:
        return torch.device("cpu")
    if local_rank is None:
        local_rank = _local_rank_env()
    if local_rank is None:
        local_rank = current_device_index()
    return torch.device(spec.name, local_rank)


def set_device(index: int | torch.device) -> None:
    """Make ``index`` the current device of this process (nothing to do on CPU)."""
    spec = device_spec()
    if not spec.is_accelerator:
        return
    if isinstance(index, torch.device):
        index = 0 if index.index is None else index.index
    acc = _accelerator(spec)
    if acc is not None:
        (getattr(acc, "set_device_index", None) or acc.set_device_idx)(index)
    else:
        _module(spec).set_device(index)


def synchronize() -> None:
    """Wait for all work queued on the current device (nothing to do on CPU)."""
    spec = device_spec()
    if not spec.is_accelerator:
        return
    acc = _accelerator(spec)
    (acc if acc is not None else _module(spec)).synchronize()


def device_name(index: int | None = None) -> str:
    """Return a human-readable name of a device, such as ``"Ascend910B"``."""
    return _name(device_spec(), index)


def _name(spec: DeviceSpec, index: int | None = None) -> str:
    """:func:`device_name` for ``spec``, whatever the environment chooses."""
    if not spec.is_accelerator:
        return platform.processor() or platform.machine() or "cpu"
    return str(_module(spec).get_device_name(_current_index(spec) if index is None else index))


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy (when installed), torch and every device of the chosen family."""
    random.seed(seed)
    try:
        import numpy as np
    except ImportError:
        pass
    else:
        np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds CUDA and a registered PrivateUse1 device lazily
    spec = device_spec()
    if spec.is_accelerator:
        seed_all = getattr(_module(spec), "manual_seed_all", None)
        if seed_all is not None:
            seed_all(seed)


def autocast(enabled: bool = True, dtype: torch.dtype | None = None) -> AbstractContextManager[Any]:
    """Return ``torch.autocast`` for the chosen family with its default dtype.

    Args:
        enabled: turn mixed precision on; ``False`` gives a context that changes nothing.
        dtype: override the family's default (float16 on npu and cuda, bfloat16 on cpu).
    """
    spec = device_spec()
    return torch.autocast(device_type=spec.name, dtype=dtype or spec.amp_dtype, enabled=enabled)


def grad_scaler(enabled: bool = True, dtype: torch.dtype | None = None, **kwargs: Any) -> Any:
    """Return a gradient scaler that fits :func:`autocast` on the chosen family.

    Loss scaling is only needed for float16; with bfloat16 (the CPU default) the scaler is
    returned disabled, so ``scaler.scale(loss).backward(); scaler.step(opt); scaler.update()``
    works unchanged everywhere.

    Args:
        enabled: whether mixed precision is on at all.
        dtype: the autocast dtype in use; defaults to the family's.
        **kwargs: passed to the scaler (``init_scale``, ``growth_interval``...).
    """
    spec = device_spec()
    enabled = bool(enabled) and (dtype or spec.amp_dtype) == torch.float16
    amp = getattr(torch, "amp", None)
    if amp is not None and hasattr(amp, "GradScaler"):  # torch >= 2.3: one class, device argument
        return amp.GradScaler(spec.name, enabled=enabled, **kwargs)
    legacy = getattr(getattr(_module(spec), "amp", None), "GradScaler", None)
    if legacy is None:
        if enabled:
            raise DeviceUnavailableError(
                f"float16 loss scaling on {spec.name} needs torch >= 2.3 (torch {torch.__version__} "
                "is installed). Use bfloat16 autocast or upgrade torch."
            )
        legacy = torch.cuda.amp.GradScaler  # disabled: a pass-through that never touches CUDA
    return legacy(enabled=enabled, **kwargs)


def empty_cache() -> None:
    """Release cached device memory back to the driver (nothing to do on CPU)."""
    spec = device_spec()
    if not spec.is_accelerator:
        return
    acc = _accelerator(spec)
    target = acc if acc is not None and hasattr(acc, "empty_cache") else _module(spec)
    target.empty_cache()


def memory_stats(index: int | None = None) -> dict[str, int] | None:
    """Return allocator figures in bytes for a device, or ``None`` where the family has none.

    Keys: ``allocated``, ``max_allocated``, ``reserved``, ``max_reserved``.
    """
    spec = device_spec()
    if not spec.is_accelerator:
        return None
    mod = _module(spec)
    index = current_device_index() if index is None else index
    names = {
        "allocated": "memory_allocated",
        "max_allocated": "max_memory_allocated",
        "reserved": "memory_reserved",
        "max_reserved": "max_memory_reserved",
    }
    stats = {key: int(getattr(mod, fn)(index)) for key, fn in names.items() if hasattr(mod, fn)}
    return stats or None


def reset_peak_memory_stats(index: int | None = None) -> None:
    """Reset the peak figures of :func:`memory_stats` (nothing to do on CPU)."""
    spec = device_spec()
    if spec.is_accelerator and hasattr(_module(spec), "reset_peak_memory_stats"):
        _module(spec).reset_peak_memory_stats(current_device_index() if index is None else index)


def _memory_figure(fn: str, index: int | None) -> int:
    spec = device_spec()
    if not spec.is_accelerator:
        return 0
    return int(getattr(_module(spec), fn)(current_device_index() if index is None else index))


def memory_allocated(index: int | None = None) -> int:
    """Bytes held by tensors on a device, like ``torch.cuda.memory_allocated`` (0 on CPU)."""
    return _memory_figure("memory_allocated", index)


def max_memory_allocated(index: int | None = None) -> int:
    """Peak of :func:`memory_allocated` since start or the last reset (0 on CPU)."""
    return _memory_figure("max_memory_allocated", index)


def memory_reserved(index: int | None = None) -> int:
    """Bytes held by the caching allocator, like ``torch.cuda.memory_reserved`` (0 on CPU)."""
    return _memory_figure("memory_reserved", index)


def max_memory_reserved(index: int | None = None) -> int:
    """Peak of :func:`memory_reserved` (0 on CPU)."""
    return _memory_figure("max_memory_reserved", index)


def manual_seed_all(seed: int) -> None:
    """Seed the random generators of every device of the family, like ``torch.cuda.manual_seed_all``.

    Only device generators: on CPU, where ``torch.cuda.manual_seed_all`` does nothing either,
    nothing happens. Use :func:`seed_everything` to seed Python, NumPy and torch as well.
    """
    spec = device_spec()
    if spec.is_accelerator:
        _module(spec).manual_seed_all(seed)


def accelerator_available() -> bool:
    """True when the chosen family is an accelerator: the portable ``torch.cuda.is_available()``."""
    return device_spec().is_accelerator


def device_ids(local_rank: int | None = None) -> list[int] | None:
    """DDP's ``device_ids`` for a local rank: ``[index]`` on an accelerator, ``None`` on CPU."""
    index = get_device(local_rank).index
    return None if index is None else [index]


def output_device(local_rank: int | None = None) -> int | None:
    """DDP's ``output_device`` for a local rank: the index on an accelerator, ``None`` on CPU."""
    return get_device(local_rank).index


def visible_devices_env() -> str:
    """Name of the variable that masks the family's devices (``ASCEND_RT_VISIBLE_DEVICES``...).

    On CPU, which has none, ``CUDA_VISIBLE_DEVICES`` is returned: setting it hides nothing the
    job uses, so code that writes it keeps working.
    """
    return device_spec().visible_devices_env or DEVICES["cuda"].visible_devices_env or ""


class HostEvent:
    """An event for the CPU family that measures time, where ``torch.cpu.Event`` does not.

    Work on CPU is synchronous, so ``record()`` marks the moment it is called.
    """

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False,
                 external: bool = False) -> None:
        self.enable_timing = enable_timing
        self.blocking = blocking
        self.interprocess = interprocess
        self._time: float | None = None

    def record(self, stream: Any = None) -> None:
        self._time = time.perf_counter()

    def elapsed_time(self, end_event: HostEvent) -> float:
        """Milliseconds between this event and ``end_event``, as ``torch.cuda.Event`` reports."""
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


class HostStream:
    """A stream for the CPU family: work is already in order, so every wait is immediate."""

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
        self.device = torch.device("cpu")
        self.priority = priority

    @staticmethod
    def priority_range() -> tuple[int, int]:
        """``(lowest, highest)`` priority, as ``torch.cuda.Stream.priority_range()``: one level on CPU."""
        return (0, 0)

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def wait_stream(self, stream: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass

    def record_event(self, event: HostEvent | None = None) -> HostEvent:
        event = event or HostEvent()
        event.record(self)
        return event

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HostStream)

    def __hash__(self) -> int:
        return hash(HostStream)


def Event(enable_timing: bool = False, **kwargs: Any) -> Any:  # noqa: N802 - mirrors torch.cuda.Event
    """Return the family's event class instance, like ``torch.cuda.Event(enable_timing=True)``."""
    spec = device_spec()
    if not spec.is_accelerator:
        return HostEvent(enable_timing=enable_timing, **kwargs)
    return _module(spec).Event(enable_timing=enable_timing, **kwargs)


def Stream(*args: Any, **kwargs: Any) -> Any:  # noqa: N802 - mirrors torch.cuda.Stream
    """Return a new stream of the family, like ``torch.cuda.Stream()``."""
    spec = device_spec()
    if not spec.is_accelerator:
        return HostStream(*args, **kwargs)
    return _module(spec).Stream(*args, **kwargs)


_HOST_STREAM = HostStream()


def current_stream(index: int | None = None) -> Any:
    """Return the current stream of a device, like ``torch.cuda.current_stream()``."""
    spec = device_spec()
    if not spec.is_accelerator:
        return _HOST_STREAM
    return _module(spec).current_stream(index)


def stream(s: Any) -> AbstractContextManager[Any]:
    """Return a context that makes ``s`` current, like ``torch.cuda.stream(s)``."""
    spec = device_spec()
    if not spec.is_accelerator:
        return nullcontext(s)
    return _module(spec).stream(s)
