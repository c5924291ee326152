"""``torch.cuda.*``: every public callable answers for the target, is a documented no-op, or raises.

Usage::

    from npu_migrate.migrate.patches import cuda_namespace

    cuda_namespace.install()   # torch.cuda.device_count() -> the target's; CUDAGraph() -> MigrationError

On npu each name goes to ``torch.npu``'s function of the same name, called with the arguments
the torch-npu release's signature takes (:mod:`npu_migrate.migrate.fit`); on cpu to the simulated
devices (:mod:`npu_migrate.migrate.sim`, :mod:`.streams`). User code gets the migrated answer,
internal code (torch, libraries) torch's own (:mod:`npu_migrate.migrate.callers`). A name with no
equivalent raises :class:`~npu_migrate.errors.MigrationError` naming it and what to do instead.
"""

from __future__ import annotations

import functools
import inspect
import sys
from typing import Any, Callable, Optional

import torch

from npu_migrate import cuda_api
from npu_migrate.errors import MigrationError
from npu_migrate.migrate import fit, sim
from npu_migrate.migrate.callers import caller_aware, switch_class
from npu_migrate.migrate.mapping import target_device
from npu_migrate.migrate.patches import data_amp, streams
from npu_migrate.migrate.signatures import answer, shaped
from npu_migrate.migrate.state import STATE, patch
from npu_migrate.registry import DeviceSpec

GENERIC_ADVICE = ("remove the call, guard it so it runs only on CUDA, or port the script with `npu-migrate port`, "
                  "which reports it")
"""What an unmapped name without a row (a torch release newer than the table) says to do."""

CPU = {**sim.CPU, **streams.CPU}
"""Runtime migration's answers on the cpu target, by the names the rows' ``cpu`` column uses."""


def unmapped(name: str, row: Optional[cuda_api.CudaApi] = None) -> Any:
    """A stand-in for ``torch.cuda.<name>`` that raises MigrationError with the row's advice."""
    spec = STATE.target
    where = spec.name if spec is not None else "the target"
    advice = row.note if row is not None and row.kind == "unsupported" and row.note else GENERIC_ADVICE

    def fail() -> Any:
        raise MigrationError(f"torch.cuda.{name} has no {where} equivalent under runtime migration: {advice}.")

    return answer(fail)  # a call torch would reject still gets torch's TypeError


def _legacy_type(cpu_type: Any) -> Callable[..., Any]:
    def construct(*args: Any, **kwargs: Any) -> Any:
        return cpu_type(*args, **kwargs).to(target_device(None))

    return construct


def public_callables() -> list[tuple[str, Any]]:
    """The ``torch.cuda`` names :func:`install` patches, with their objects: the public names of
    :func:`npu_migrate.cuda_api.public_names` that are callable and not ``ignored`` by their row
    (exception classes, typing helpers: those work unchanged on every family)."""
    out = []
    for qualname in cuda_api.public_names():
        module, _, name = qualname.rpartition(".")
        if module != "torch.cuda":
            continue
        value = getattr(torch.cuda, name)
        row = cuda_api.classify(qualname)
        if callable(value) and not (row is not None and row.kind == "ignored"):
            out.append((name, value))
    return out


def redirected_to_device_module() -> list[str]:
    """The ``torch.cuda`` names :func:`install` sends to the accelerator's module (``torch.npu.X``)
    when it has them: every public callable except the legacy tensor types, built on the CPU."""
    return [name for name, _ in public_callables()
            if not ((row := cuda_api.classify(f"torch.cuda.{name}")) is not None
                    and row.runtime == "legacy_type" and hasattr(torch, name))]


def plan(name: str, row: Optional[cuda_api.CudaApi], spec: DeviceSpec) -> tuple[str, Any, str]:
    """What :func:`install` does with ``torch.cuda.<name>`` on ``spec``: (kind, implementation, report note).

    The implementation is ``None`` where the name is unmapped (:func:`unmapped` raises with advice).
    All of it is read from the name's row: the legacy types are built on the CPU type on every
    target; an accelerator answers with its device module's function of the same name, or, for a
    no-op row, the row's own answer; the cpu target with the row's ``cpu`` answer, of the row's
    :attr:`~npu_migrate.cuda_api.CudaApi.runtime_kind`.
    """
    if row is not None and row.runtime == "legacy_type" and hasattr(torch, name):
        # torch.cuda.FloatTensor(2): the CPU type's tensor, moved to the target.
        return "redirected", _legacy_type(getattr(torch, name)), f"torch.{name}(...) on the target"
    if spec.is_accelerator:
        found = getattr(getattr(torch, spec.name, None), name, None)
        if found is not None:
            return "redirected", found, f"torch.{spec.name}.{name}"
        if row is not None and row.kind == "noop" and row.cpu:
            # Harmless off CUDA by its row, and the device module lacks it: the row's answer.
            return "noop", CPU[row.cpu][0], row.note
        return "unmapped", None, ""
    if row is None or not row.cpu or row.runtime_kind in (None, "unmapped"):
        return "unmapped", None, ""
    impl, note = CPU[row.cpu]
    return row.runtime_kind, impl, row.cpu_note or note


def release(spec: DeviceSpec) -> str:
    """The package release that provides ``spec``'s device module, for messages (``"torch-npu 2.9.1"``)."""
    package = spec.pip_name or spec.extension or "torch"
    module = sys.modules.get(spec.extension) if spec.extension else torch
    version = getattr(module, "__version__", None)
    return f"{package} {version}" if version else package


def fitted(name: str, value: Any, impl: Any, row: Optional[cuda_api.CudaApi], spec: DeviceSpec) -> Any:
    """``impl`` as ``torch.cuda.<name>`` (``value``) is called, where ``impl`` is the device module's own
    (:func:`npu_migrate.migrate.fit.fitted`); anything else is returned as it is."""
    module = getattr(torch, spec.name, None)
    if not spec.is_accelerator or impl is None or getattr(module, name, None) is not impl:
        return impl
    return fit.fitted(f"torch.cuda.{name}", value, impl, row.cuda_only if row is not None else (),
                      f"torch.{spec.name}.{name}", release(spec))


def install() -> None:
    """Patch every public callable of ``torch.cuda`` and ``torch.cuda.amp``'s autocast, GradScaler, custom_fwd/bwd."""
    spec = STATE.require_target("cuda_namespace.install()")
    cuda = torch.cuda
    for name, value in public_callables():
        row = cuda_api.classify(f"torch.cuda.{name}")
        kind, impl, note = plan(name, row, spec)
        if impl is None:
            impl = unmapped(name, row)
        api = f"torch.cuda.{name}"
        impl = shaped(value, impl)
        make = fitted(name, value, impl, row, spec)  # what user code calls: impl, or impl taking CUDA's calls
        if inspect.isclass(value):
            stand_in = switch_class(value, impl, api, kind, note, make=make)
        else:
            stand_in = caller_aware(value, make, api, kind, note)
        patch(cuda, name, stand_in)
        # The same object under torch.cuda's submodules (torch.cuda.memory.empty_cache).
        for sub in cuda_api.SUBMODULES:
            module = getattr(cuda, sub, None)
            # Not a class in the module that defines it: its instances pickle by that name.
            if inspect.ismodule(module) and getattr(module, name, None) is value and not (
                    inspect.isclass(value) and value.__module__ == module.__name__):
                patch(module, name, stand_in)
    # torch.cuda.amp: the rows sent to the target's AMP (runtime "amp"), on every target.
    amp = cuda.amp
    for row in cuda_api.CUDA_API.values():
        name = row.name.partition(".")[2]
        if row.runtime != "amp" or not hasattr(amp, name):
            continue
        if name in AMP_CLASSES:
            original = getattr(amp, name)
            patch(amp, name, switch_class(original, AMP_CLASSES[name], f"torch.cuda.{row.name}",
                                          row.runtime_kind or "redirected"))
        elif hasattr(torch.amp, name):
            patch(amp, name, _amp_decorator(getattr(torch.amp, name), spec.name, with_cast=name == "custom_fwd"))


AMP_CLASSES: dict[str, Callable[..., Any]] = {"autocast": data_amp.autocast, "GradScaler": data_amp.cuda_grad_scaler}
"""What the ``amp`` rows' classes become on every target; their decorators (custom_fwd, custom_bwd)
become torch.amp's with the target's ``device_type``."""


def _amp_decorator(generic: Callable[..., Any], device_type: str, with_cast: bool) -> Callable[..., Any]:
    """``torch.cuda.amp.custom_fwd``/``custom_bwd`` as torch.amp's decorator for ``device_type``."""
    def decorator(fwd: Any = None, *, cast_inputs: Any = None) -> Any:
        kwargs = {"device_type": device_type}
        if with_cast:
            kwargs["cast_inputs"] = cast_inputs
        return generic(fwd, **kwargs) if fwd is not None else functools.partial(generic, **kwargs)

    return decorator
