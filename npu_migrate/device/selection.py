"""Which device family a process uses, why, and whether a family is usable on this machine.

Usage::

    from npu_migrate.device import selection

    selection.resolve_device("auto")     # Selection(spec=DEVICES["cpu"], source="detected", skipped=(...))
    selection.unavailable_reason(DEVICES["npu"])   # one line, or None when it can be used
    selection.default_backend()          # "hccl", "nccl" or "gloo"

The family is chosen in this order: the explicit argument, then ``NPU_MIGRATE_DEVICE``, then the
first row of :data:`~npu_migrate.registry.DEVICES` that is usable here. A forced family never falls
back silently to another one. Answers are computed once per process (``npu_migrate.device._clear_caches``).
"""

from __future__ import annotations

import functools
import importlib.util
import os
from dataclasses import dataclass

import torch

from npu_migrate.device.extension import _load_extension
from npu_migrate.errors import DeviceUnavailableError, UnknownDeviceError
from npu_migrate.registry import DEVICES, ENV_DEVICE, DeviceSpec

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


def _torch_built_for(spec: DeviceSpec) -> bool:
    """Whether this torch build supports ``spec`` at all (a CPU-only wheel has no CUDA)."""
    return spec.torch_build is None or getattr(torch.version, spec.torch_build, None) is not None


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
