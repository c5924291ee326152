"""How each device-neutral operation is spelled in each output style of ``npu-migrate port``.

Usage::

    from npu_migrate.port.targets import TARGETS

    TARGETS["set_device"].template("npu_migrate")   # "nm.set_device(ARGS)"
    TARGETS["set_device"].template("torch")         # "_accelerator_module().set_device(ARGS)"

Templates are Python expressions. ``ARGS`` (or ``**ARGS`` after a keyword) stands for the call's
original arguments, kept as written, and ``ARG0`` for the first argument's value. ``nm`` is
replaced by the alias ``npu_migrate`` is imported as. The matchers ask for operations by key; which
``torch.cuda`` API maps to which key is :mod:`npu_migrate.cuda_api`'s table.

Helpers (:data:`HELPERS`) are small functions the output needs where one expression is not
enough; the transformer inserts each one once per module, after the imports, and never ports
them again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Mapping, Optional

Style = Literal["npu_migrate", "torch"]
STYLES: tuple[str, ...] = ("npu_migrate", "torch")

NM_ALIAS = "nm"
NM_MODULE = "npu_migrate"


@dataclass(frozen=True)
class Target:
    """One device-neutral operation, spelled once per output style.

    Attributes:
        npu_migrate: template for ``--style npu_migrate`` (``import npu_migrate as nm``).
        torch: template for ``--style torch`` (torch >= 2.6, no npu_migrate: the plain torch calls it
            writes directly all exist in 2.6, newer ones go through a helper with a fallback);
            ``None``: no spelling.
        nm_helpers: names from :data:`HELPERS` the npu_migrate template calls.
        torch_helpers: names from :data:`HELPERS` the torch template calls.
        torch_missing: why the torch style has no template, for the finding.
        nm_keywords: keyword renames for the npu_migrate style (torch.cuda's name -> the target's).
        torch_keywords: keyword renames for the torch style.
    """

    npu_migrate: Optional[str]
    torch: Optional[str]
    nm_helpers: tuple[str, ...] = ()
    torch_helpers: tuple[str, ...] = ()
    torch_missing: str = ""
    nm_keywords: Mapping[str, str] = field(default_factory=dict)
    torch_keywords: Mapping[str, str] = field(default_factory=dict)

    def template(self, style: str) -> Optional[str]:
        """The template of ``style``."""
        return self.npu_migrate if style == "npu_migrate" else self.torch

    def helpers(self, style: str) -> tuple[str, ...]:
        """The helpers the template of ``style`` calls."""
        return self.nm_helpers if style == "npu_migrate" else self.torch_helpers

    def keywords(self, style: str) -> Mapping[str, str]:
        """Keyword renames for ``style``."""
        return self.nm_keywords if style == "npu_migrate" else self.torch_keywords


_DEV = ("_accelerator_device",)
_MOD = ("_accelerator_device", "_accelerator_module")
_INDEX = {"device": "index"}
_ACC_INDEX = {"device": ""}  # torch.accelerator's memory functions take the device positionally only
_MEM = _MOD + ("_accelerator_memory",)

TARGETS: dict[str, Target] = {
    # A device with an explicit index ("cuda:1", .cuda(1)); without one this is LOCAL_RANK's device.
    "get_device": Target("nm.get_device(ARGS)", "_accelerator_device(ARGS)", torch_helpers=_DEV),
    # "cuda" and .cuda() without an index: the *current* device, as CUDA means it.
    "current_device": Target("torch.device(nm.device_type())", "_accelerator_device()", torch_helpers=_DEV),
    "device_str": Target("str(nm.get_device(ARGS))", "str(_accelerator_device(ARGS))", torch_helpers=_DEV),
    "device_type": Target("nm.device_type()", "_accelerator_device().type", torch_helpers=_DEV),
    "accelerator_available": Target("nm.accelerator_available()", "torch.accelerator.is_available()"),
    # assert/exit guards: "the family this run uses is there", which is also true on the CPU.
    "selected_available": Target(
        "nm.is_available(nm.device_type())",
        '(torch.accelerator.is_available() or _accelerator_device().type == "cpu")', torch_helpers=_DEV,
    ),
    "device_count": Target("nm.device_count()", "_accelerator_module().device_count()", torch_helpers=_MOD),
    "set_device": Target("nm.set_device(ARGS)", "_accelerator_module().set_device(ARGS)", torch_helpers=_MOD,
                         nm_keywords=_INDEX),
    "current_device_index": Target(
        "nm.current_device_index()",
        "(torch.accelerator.current_device_index() if torch.accelerator.is_available() else 0)",
    ),
    "synchronize": Target("nm.synchronize()", "_accelerator_module().synchronize()", torch_helpers=_MOD),
    # torch.cuda.manual_seed(_all) seeds the device generators only, never the CPU's.
    "manual_seed": Target("nm.manual_seed_all(ARGS)", "_manual_seed_accelerator(ARGS)",
                          torch_helpers=_MOD + ("_manual_seed_accelerator",)),
    "manual_seed_all": Target("nm.manual_seed_all(ARGS)", "_manual_seed_accelerator(ARGS)",
                              torch_helpers=_MOD + ("_manual_seed_accelerator",)),
    # torch.accelerator's memory functions are newer than torch 2.7.1 (which lacks them): a helper falls back.
    "memory_allocated": Target("nm.memory_allocated(ARGS)", '_accelerator_memory("memory_allocated", ARGS)',
                               nm_keywords=_INDEX, torch_keywords=_ACC_INDEX, torch_helpers=_MEM),
    "max_memory_allocated": Target("nm.max_memory_allocated(ARGS)", '_accelerator_memory("max_memory_allocated", ARGS)',
                                   nm_keywords=_INDEX, torch_keywords=_ACC_INDEX, torch_helpers=_MEM),
    "memory_reserved": Target("nm.memory_reserved(ARGS)", '_accelerator_memory("memory_reserved", ARGS)',
                              nm_keywords=_INDEX, torch_keywords=_ACC_INDEX, torch_helpers=_MEM),
    "max_memory_reserved": Target("nm.max_memory_reserved(ARGS)", '_accelerator_memory("max_memory_reserved", ARGS)',
                                  nm_keywords=_INDEX, torch_keywords=_ACC_INDEX, torch_helpers=_MEM),
    "reset_peak_memory_stats": Target(
        "nm.reset_peak_memory_stats(ARGS)", '_accelerator_memory("reset_peak_memory_stats", ARGS)',
        nm_keywords=_INDEX, torch_keywords=_ACC_INDEX, torch_helpers=_MEM,
    ),
    "memory_stats": Target("nm.memory_stats(ARGS)", '_accelerator_memory("memory_stats", ARGS)',
                           nm_keywords=_INDEX, torch_keywords=_ACC_INDEX, torch_helpers=_MEM),
    "empty_cache": Target("nm.empty_cache()", '_accelerator_memory("empty_cache")', torch_helpers=_MEM),
    "mem_get_info": Target("_mem_get_info(ARGS)", "_mem_get_info(ARGS)", nm_helpers=("_mem_get_info",),
                           torch_helpers=_DEV + ("_mem_get_info",)),
    "device_capability": Target("_device_capability(ARGS)", "_device_capability(ARGS)",
                                nm_helpers=("_device_capability",), torch_helpers=_DEV + ("_device_capability",)),
    "device_properties": Target("_device_properties(ARGS)", "_device_properties(ARGS)",
                                nm_helpers=("_device_properties",), torch_helpers=_DEV + ("_device_properties",)),
    "is_bf16_supported": Target(
        '(nm.device_type() == "cpu" or getattr(torch, nm.device_type()).is_bf16_supported())',
        '(_accelerator_device().type == "cpu" or _accelerator_module().is_bf16_supported())',
        torch_helpers=_MOD,
    ),
    "Event": Target(
        "nm.Event(ARGS)", None,
        torch_missing="torch.cpu.Event takes no arguments and cannot time, so plain torch has no "
        "CPU fallback for timing events",
    ),
    "Stream": Target("nm.Stream(ARGS)", "_accelerator_module().Stream(ARGS)", torch_helpers=_MOD),
    "stream": Target("nm.stream(ARGS)", "_accelerator_module().stream(ARGS)", torch_helpers=_MOD,
                     nm_keywords={"stream": "s"}),
    "current_stream": Target("nm.current_stream(ARGS)", "_accelerator_module().current_stream(ARGS)",
                             torch_helpers=_MOD, nm_keywords=_INDEX),
    "device_name": Target(
        "nm.device_name(ARGS)", None, nm_keywords=_INDEX,
        torch_missing="torch.accelerator has no device name and torch.cpu has no get_device_name",
    ),
    "autocast": Target(
        "torch.amp.autocast(device_type=nm.device_type(), **ARGS)",
        "torch.amp.autocast(device_type=_accelerator_device().type, **ARGS)", torch_helpers=_DEV,
    ),
    "grad_scaler": Target("nm.grad_scaler(ARGS)", "torch.amp.GradScaler(_accelerator_device().type, ARGS)",
                          torch_helpers=_DEV),
    "default_backend": Target(
        "nm.default_backend()", "torch.distributed.get_default_backend_for_device(_accelerator_device())",
        torch_helpers=_DEV,
    ),
    "device_ids": Target("nm.device_ids(ARG0)", "[ARG0] if torch.accelerator.is_available() else None"),
    "output_device": Target("nm.output_device(ARG0)", "ARG0 if torch.accelerator.is_available() else None"),
    "visible_devices_env": Target(
        "nm.visible_devices_env()", None,
        torch_missing="torch has no API for the variable that masks devices",
    ),
}

# ``{family}`` in a helper is the current family's torch module name, spelled per style.
_FAMILY = {"npu_migrate": "nm.device_type()", "torch": "_accelerator_device().type"}

HELPERS: dict[str, str] = {
    # torch.accelerator.is_available / current_accelerator exist from torch 2.6 (current_accelerator's
    # check_available= only from 2.7). torch.accelerator.device_count() is never called: on torch 2.7 a
    # CUDA build without a driver raises "Found no NVIDIA driver" there instead of returning 0
    # (fixed upstream by pytorch/pytorch#149924, which delegates to torch.cuda.device_count).
    "_accelerator_device": '''\
def _accelerator_device(index=None):
    """This process's accelerator (torch.accelerator), or the CPU where there is none."""
    if not torch.accelerator.is_available():
        return torch.device("cpu")
    return torch.device(torch.accelerator.current_accelerator().type, index)
''',
    "_accelerator_module": '''\
def _accelerator_module():
    """The torch module of the accelerator in use (torch.npu, ...), or torch.cpu where there is none."""
    return torch.get_device_module(_accelerator_device())
''',
    "_manual_seed_accelerator": '''\
def _manual_seed_accelerator(seed):
    """Seed the accelerator's generators only, never the CPU's (as CUDA's manual_seed_all does)."""
    if torch.accelerator.is_available():
        _accelerator_module().manual_seed_all(seed)
''',
    "_accelerator_memory": '''\
def _accelerator_memory(name, device=None):
    """torch.accelerator's memory function NAME (torch > 2.7); before that the accelerator module's."""
    function = getattr(torch.accelerator, name, None)
    if function is None:
        function = getattr(_accelerator_module(), name, None)
    if function is None:  # the CPU, as torch.accelerator answers there
        return {"memory_stats": {}, "empty_cache": None, "reset_peak_memory_stats": None}.get(name, 0)
    return function() if device is None else function(device)
''',
    "_device_capability": '''\
def _device_capability(device=None):
    """The compute capability, as CUDA reports it: (0, 0) where the device is not CUDA."""
    family = {family}
    if family != "cuda":
        return (0, 0)
    return getattr(torch, family).get_device_capability(device)
''',
    "_device_properties": '''\
def _device_properties(device=None):
    """The device's properties on any family; the host's name and memory on the CPU."""
    import os
    import platform
    import types

    family = {family}
    if family != "cpu":
        module = getattr(torch, family)
        if hasattr(module, "get_device_properties"):
            return module.get_device_properties(device)
    pages = os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 0
    return types.SimpleNamespace(
        name=platform.processor() or platform.machine() or "cpu", major=0, minor=0,
        total_memory=pages * os.sysconf("SC_PAGE_SIZE") if pages else 0,
        multi_processor_count=os.cpu_count() or 1,
    )
''',
    "_mem_get_info": '''\
def _mem_get_info(device=None):
    """(free, total) bytes of the device; the host's memory on the CPU."""
    import os

    family = {family}
    module = getattr(torch, family)
    if family != "cpu" and hasattr(module, "mem_get_info"):
        return module.mem_get_info(device)
    if not hasattr(os, "sysconf"):
        return (0, 0)
    page = os.sysconf("SC_PAGE_SIZE")
    return (os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page)
''',
}


def helper_source(name: str, style: str) -> str:
    """The source of helper ``name`` for ``style``."""
    return HELPERS[name].replace("{family}", _FAMILY[style])
