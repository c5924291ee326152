"""``torch.cuda.*``: every public callable answers for the target, is a documented no-op, or raises.

Usage::

    from npu_migrate.migrate.patches import cuda_namespace

    cuda_namespace.install()   # torch.cuda.device_count() -> the target's; CUDAGraph() -> MigrationError

On npu each name goes to ``torch.npu``'s function of the same name; on cpu to the simulated
devices (:mod:`npu_migrate.migrate.sim`, :mod:`.streams`). User code gets the migrated answer,
internal code (torch, libraries) torch's own (:mod:`npu_migrate.migrate.callers`). A name with no
equivalent raises :class:`~npu_migrate.errors.MigrationError` naming it and what to do instead.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

import torch

from npu_migrate import cuda_api
from npu_migrate.errors import MigrationError
from npu_migrate.migrate import sim
from npu_migrate.migrate.callers import caller_aware, switch_class
from npu_migrate.migrate.mapping import target_device
from npu_migrate.migrate.patches import data_amp, streams
from npu_migrate.migrate.signatures import answer, shaped
from npu_migrate.migrate.state import STATE, patch

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
CUDA_TABLE = {**sim.CUDA_TABLE, **streams.CUDA_TABLE}
CUDA_CLASSES = {**sim.CUDA_CLASSES, **streams.CUDA_CLASSES}


def unmapped(name: str) -> Any:
    """A stand-in for ``torch.cuda.<name>`` that raises MigrationError with advice."""
    spec = STATE.target
    where = spec.name if spec is not None else "the target"
    row = cuda_api.classify(f"torch.cuda.{name}")
    advice = ADVICE.get(name) or (row.note if row is not None and row.kind == "unsupported" and row.note else
                                  "remove the call, guard it so it runs only on CUDA, or port the script "
                                  "with `npu-migrate port`, which reports it")

    def fail() -> Any:
        raise MigrationError(f"torch.cuda.{name} has no {where} equivalent under runtime migration: {advice}.")

    return answer(fail)  # a call torch would reject still gets torch's TypeError


def _legacy_type(cpu_type: Any) -> Callable[..., Any]:
    def construct(*args: Any, **kwargs: Any) -> Any:
        return cpu_type(*args, **kwargs).to(target_device(None))

    return construct


def public_callables() -> list[tuple[str, Any]]:
    """The ``torch.cuda`` names :func:`install` patches, with their objects: public callables that
    are not modules, typing helpers or exception classes (those work unchanged on every family)."""
    cuda = torch.cuda
    out = []
    for name in dir(cuda):
        if name.startswith("_"):
            continue
        value = getattr(cuda, name)
        if inspect.ismodule(value) or not callable(value):
            continue
        if getattr(value, "__module__", "") in ("typing", "functools", "builtins") or name in ("Optional", "Any", "Callable", "NewType", "classproperty", "lru_cache", "cast"):
            continue
        if inspect.isclass(value) and issubclass(value, BaseException):
            continue  # exception classes: catching them works on every family
        out.append((name, value))
    return out


def redirected_to_device_module() -> list[str]:
    """The ``torch.cuda`` names :func:`install` sends to the accelerator's module (``torch.npu.X``)
    when it has them: every public callable except the legacy tensor types, built on the CPU."""
    return [name for name, _ in public_callables()
            if not ((row := cuda_api.classify(f"torch.cuda.{name}")) is not None
                    and row.runtime == "legacy_type" and hasattr(torch, name))]


def install() -> None:
    """Patch every public callable of ``torch.cuda`` and ``torch.cuda.amp``'s autocast, GradScaler, custom_fwd/bwd."""
    spec = STATE.require_target("cuda_namespace.install()")
    cuda = torch.cuda
    npu = getattr(torch, spec.name, None) if spec.is_accelerator else None
    for name, value in public_callables():
        row = cuda_api.classify(f"torch.cuda.{name}")
        if row is not None and row.runtime == "legacy_type" and hasattr(torch, name):
            # torch.cuda.FloatTensor(2): the CPU type's tensor, moved to the target.
            impl, kind, note = _legacy_type(getattr(torch, name)), "redirected", f"torch.{name}(...) on the target"
        elif npu is not None:
            impl = getattr(npu, name, None)
            kind, note = ("redirected", f"torch.{spec.name}.{name}") if impl is not None else ("unmapped", "")
        elif name in CUDA_TABLE:
            kind, impl, note = CUDA_TABLE[name]
        elif name in CUDA_CLASSES:
            kind, impl, note = CUDA_CLASSES[name]
        else:
            kind, impl, note = "unmapped", None, ""
        if impl is None:
            impl = unmapped(name)
        api = f"torch.cuda.{name}"
        impl = shaped(value, impl)
        stand_in = (switch_class if inspect.isclass(value) else caller_aware)(value, impl, api, kind, note)
        patch(cuda, name, stand_in)
        # The same object under torch.cuda's submodules (torch.cuda.memory.empty_cache).
        for sub in cuda_api.SUBMODULES:
            module = getattr(cuda, sub, None)
            # Not a class in the module that defines it: its instances pickle by that name.
            if inspect.ismodule(module) and getattr(module, name, None) is value and not (
                    inspect.isclass(value) and value.__module__ == module.__name__):
                patch(module, name, stand_in)
    # torch.cuda.amp: autocast and GradScaler land on the target's AMP.
    amp = cuda.amp
    for name, impl in (("autocast", data_amp.autocast), ("GradScaler", data_amp.cuda_grad_scaler)):
        original = getattr(amp, name)
        patch(amp, name, switch_class(original, impl, f"torch.cuda.amp.{name}", "redirected"))
    for name in ("custom_fwd", "custom_bwd"):
        if hasattr(amp, name) and hasattr(torch.amp, name):
            generic = getattr(torch.amp, name)

            def decorator(fwd: Any = None, *, cast_inputs: Any = None, _g: Any = generic, _n: str = name) -> Any:
                kwargs = {"device_type": spec.name}
                if _n == "custom_fwd":
                    kwargs["cast_inputs"] = cast_inputs
                return _g(fwd, **kwargs) if fwd is not None else functools.partial(_g, **kwargs)

            patch(amp, name, decorator)
