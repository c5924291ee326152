"""``torch.accelerator`` (torch >= 2.6) and the device-type arguments of FSDP2, DeviceMesh and DTensor.

Usage::

    from npu_migrate.migrate.patches import accelerator

    accelerator.install()   # torch.accelerator.device_count() in user code: the simulated devices

Scripts written since torch 2.6 ask ``torch.accelerator`` where older ones asked ``torch.cuda``
(pytorch/examples' minGPT-DDP and FSDP2: ``is_available() and device_count() >= 2``, else "Unable
to locate sufficient 2 gpus" and exit 0). User code gets the answers ``torch.cuda`` gives it under
migration, torch and libraries get torch's own (:mod:`npu_migrate.migrate.callers`): torch's Adam
asks ``torch.accelerator`` too, and must not be sent to a CUDA runtime that is not there.

* On the CPU target the accelerator is the simulated ``cuda`` (:data:`ACCELERATOR_TABLE`):
  ``current_accelerator()`` is ``device("cuda")``, so ``torch.device(f"{acc}:{rank}")`` is a CUDA
  device that every other patch maps to the CPU.
* On npu ``torch.accelerator`` already answers for the NPU (torch_npu registers it): user calls
  are counted, and get torch's answer.

Whatever the caller, a ``"cuda"`` device type given to ``init_device_mesh``, ``DeviceMesh``,
``get_default_backend_for_device`` and ``Module.to_empty(device=)`` becomes the target's: FSDP2's
default mesh asks torch for the accelerator, which on a CUDA build without a GPU says ``cuda``.
"""

from __future__ import annotations

import collections
import functools
import inspect
from typing import Any

import torch

from npu_migrate.migrate import sim
from npu_migrate.migrate.callers import caller_aware, record, switch_class
from npu_migrate.migrate.mapping import map_device
from npu_migrate.migrate.patches import streams
from npu_migrate.migrate.signatures import answer, shaped
from npu_migrate.migrate.state import STATE, on_cpu, patch

SUBMODULES = ("memory", "random", "graphs")
"""Submodules of ``torch.accelerator`` whose public callables are part of the API (torch >= 2.9)."""

ADVICE = {
    "Graph": "accelerator graphs are an optimization: run without capture, or guard it with a device-type check",
}

def _dtypes() -> set[torch.dtype]:
    return {v for v in vars(torch).values() if isinstance(v, torch.dtype)}


def set_device_index(device: Any, /) -> None:
    """``torch.accelerator.set_device_index`` on the CPU target: checked against the simulated count."""
    sim.set_device(device)


class DeviceIndex(sim.SimDevice):
    """``with torch.accelerator.device_index(i):`` on the CPU target (``None``: no change)."""

    def __init__(self, device: Any, /) -> None:
        super().__init__(device)


# The cpu answers torch.cuda's rows name (npu_migrate.cuda_api), shared where torch.accelerator asks the same.
_CPU = {name: impl for name, (impl, _note) in {**sim.CPU, **streams.CPU}.items()}

# What each public callable of torch.accelerator does on the CPU target, as (kind, implementation,
# note): a function with torch's signature, or an answer() that ignores its arguments and takes
# torch's (npu_migrate.migrate.signatures). A name missing here raises MigrationError in user code,
# and tests/migrate/test_accelerator.py fails when torch adds one.
ACCELERATOR_TABLE: dict[str, tuple[str, Any, str]] = {
    "is_available": ("redirected", _CPU["true"], ""),
    "device_count": ("redirected", _CPU["count"], "the simulated devices"),
    "current_accelerator": ("redirected", answer(lambda: torch.device("cuda")), "the simulated cuda"),
    "current_device_index": ("redirected", _CPU["current"], ""),
    "current_device_idx": ("redirected", _CPU["current"], ""),
    "set_device_index": ("redirected", set_device_index, ""),
    "set_device_idx": ("redirected", set_device_index, ""),
    "device_index": ("redirected", DeviceIndex, ""),
    "synchronize": ("noop", _CPU["nothing"], "cpu work is synchronous"),
    "current_stream": ("redirected", _CPU["host_stream"], "host stream"),
    "set_stream": ("noop", _CPU["nothing"], "one host stream on cpu"),
    "get_device_capability": ("redirected", answer(lambda: {"supported_dtypes": _dtypes()}), "every dtype torch has"),
    "empty_cache": ("noop", _CPU["nothing"], "no device cache on cpu"),
    "empty_host_cache": ("noop", _CPU["nothing"], "no host cache to empty"),
    "memory_allocated": ("noop", _CPU["zero"], "0 on cpu"),
    "max_memory_allocated": ("noop", _CPU["zero"], "0 on cpu"),
    "memory_reserved": ("noop", _CPU["zero"], "0 on cpu"),
    "max_memory_reserved": ("noop", _CPU["zero"], "0 on cpu"),
    "reset_peak_memory_stats": ("noop", _CPU["nothing"], ""),
    "reset_accumulated_memory_stats": ("noop", _CPU["nothing"], ""),
    "memory_stats": ("noop", answer(collections.OrderedDict), "{} on cpu"),
    "get_memory_info": ("redirected", _CPU["host_memory"], "host memory"),
    "get_rng_state": ("noop", _CPU["empty_state"], "empty state: no accelerator generator"),
    "get_rng_state_all": ("noop", _CPU["empty_states"], "empty states"),
    "initial_seed": ("redirected", _CPU["initial_seed"], "torch.initial_seed()"),
}


def public_callables() -> dict[str, Any]:
    """``name -> object`` for every public callable torch.accelerator defines (itself or a submodule)."""
    acc = getattr(torch, "accelerator", None)
    if acc is None:
        return {}
    found: dict[str, Any] = {}
    for module in (acc, *(getattr(acc, s, None) for s in SUBMODULES)):
        if not inspect.ismodule(module):
            continue
        for name in dir(module):
            value = getattr(module, name)
            if name.startswith("_") or inspect.ismodule(value) or not callable(value):
                continue
            if str(getattr(value, "__module__", "")).startswith("torch.accelerator"):
                found.setdefault(name, value)
    return found


def _unmapped(name: str) -> Any:
    from npu_migrate.errors import MigrationError

    advice = ADVICE.get(name, "remove the call, or guard it so it runs only on a real accelerator")

    def fail() -> Any:
        raise MigrationError(f"torch.accelerator.{name} has no cpu equivalent under runtime migration: {advice}.")

    return answer(fail)


def _install_namespace() -> None:
    spec = STATE.require_target("the torch.accelerator patches")
    acc = torch.accelerator
    for name, value in public_callables().items():
        if on_cpu():
            kind, impl, note = ACCELERATOR_TABLE.get(name, ("unmapped", _unmapped(name), ""))
        else:  # torch_npu registers the NPU as torch's accelerator: torch's answer is the target's
            kind, impl, note = "redirected", value, f"answered by torch for {spec.name}"
        api = f"torch.accelerator.{name}"
        impl = shaped(value, impl)
        stand_in = (switch_class if inspect.isclass(value) else caller_aware)(value, impl, api, kind, note)
        for module in (acc, *(getattr(acc, s, None) for s in SUBMODULES)):
            if inspect.ismodule(module) and getattr(module, name, None) is value:
                patch(module, name, stand_in)


def _map_device_type(value: Any, api: str) -> Any:
    """``"cuda"`` (a device type, not a device) becomes the target's type; anything else stays."""
    if value == "cuda":
        record(api)
        return STATE.target.name  # type: ignore[union-attr]
    return value


def _install_mesh() -> None:
    try:
        from torch.distributed import device_mesh as mesh_module
    except ImportError:  # torch < 2.2: DeviceMesh is private (torch.distributed._tensor), and importing
        return           # it imports dynamo and inductor (seconds); nothing of FSDP2 runs there anyway
    mesh_class = mesh_module.DeviceMesh
    mesh_init = mesh_class.__init__

    def device_mesh_init(self: Any, device_type: str, *args: Any, **kwargs: Any) -> None:
        mesh_init(self, _map_device_type(device_type, 'DeviceMesh("cuda")'), *args, **kwargs)

    functools.update_wrapper(device_mesh_init, mesh_init)
    patch(mesh_class, "__init__", device_mesh_init)
    init = getattr(mesh_module, "init_device_mesh", None)
    if init is None:
        return

    def init_device_mesh(device_type: str, *args: Any, **kwargs: Any) -> Any:
        return init(_map_device_type(device_type, 'init_device_mesh("cuda")'), *args, **kwargs)

    functools.update_wrapper(init_device_mesh, init)
    import torch.distributed as dist

    for owner in (mesh_module, dist, getattr(dist, "device_mesh", None)):
        if owner is not None and getattr(owner, "init_device_mesh", None) is init:
            patch(owner, "init_device_mesh", init_device_mesh)


def _install_backend_for_device() -> None:
    import torch.distributed as dist

    original = getattr(dist, "get_default_backend_for_device", None)
    if original is None:  # torch < 2.6
        return

    def get_default_backend_for_device(device: Any) -> str:
        mapped = map_device(device)
        if mapped is not device:
            record("get_default_backend_for_device(cuda)")
        return original(mapped)

    functools.update_wrapper(get_default_backend_for_device, original)
    for owner in (dist, dist.distributed_c10d):
        if getattr(owner, "get_default_backend_for_device", None) is original:
            patch(owner, "get_default_backend_for_device", get_default_backend_for_device)


def _install_to_empty() -> None:
    module = torch.nn.Module
    to_empty = module.to_empty

    def to_empty_(self: Any, *, device: Any, recurse: bool = True) -> Any:
        mapped = map_device(device)
        if mapped is not device:
            record("Module.to_empty(device=)")
        return to_empty(self, device=mapped, recurse=recurse)

    functools.update_wrapper(to_empty_, to_empty)
    patch(module, "to_empty", to_empty_)


def install() -> None:
    """Patch ``torch.accelerator`` (where torch has it), DeviceMesh, the backend lookup and ``to_empty``."""
    if hasattr(torch, "accelerator"):
        _install_namespace()
    _install_mesh()
    _install_backend_for_device()
    _install_to_empty()
