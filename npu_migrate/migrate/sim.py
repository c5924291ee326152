"""The simulated CUDA of the CPU target: N devices, a current device, and torch.cuda's CPU answers.

Usage::

    from npu_migrate.migrate import sim

    sim.set_device(1)            # torch.cuda.set_device(1) on the CPU target
    sim.CUDA_TABLE["device_count"]   # ("redirected", <answers STATE.count>, "")
    sim.count_from_env()         # NPU_MIGRATE_SIM_DEVICES, else CUDA_VISIBLE_DEVICES' count, else 1

On the CPU target the script sees ``STATE.count`` CUDA devices; :data:`CUDA_TABLE` and
:data:`CUDA_CLASSES` hold what each ``torch.cuda`` function and class does there.
"""

from __future__ import annotations

import contextlib
import os
import platform
from types import SimpleNamespace
from typing import Any, Callable

import torch

from npu_migrate.errors import MigrationError, UsageError
from npu_migrate.migrate.environment import ENV_SIM_DEVICES
from npu_migrate.migrate.signatures import answer
from npu_migrate.migrate.state import STATE


SIM_CAPABILITY = (8, 0)
"""The compute capability simulated devices report: an A100's.

Scripts gate features on it: ``torch.compile`` on ``>= (7, 0)``, bfloat16 and flash attention on
``>= (8, 0)``, FP8 (``torch._scaled_mm``) on ``>= (8, 9)``. (8, 0) keeps every gate a current GPU
passes on its path, all of which the CPU runs (compile, bfloat16, SDPA), and keeps scripts off
FP8 paths whose kernels the CPU lacks. ``(0, 0)`` sent such scripts to their "no GPU" exit.
"""
CAPABILITY_NOTE = f"{SIM_CAPABILITY} on cpu, an A100's: capability gates take their current-GPU path"


def index(device: Any) -> int | None:
    """The CUDA device index ``device`` names (``"cuda"`` alone: the current one), or None."""
    if device is None:
        return None
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        return device.index if device.index is not None else STATE.current
    return None


class SimDevice:
    """``with torch.cuda.device(i):`` on the CPU target."""

    def __init__(self, device: Any) -> None:
        self.index = index(device)
        self.prev = 0

    def __enter__(self) -> None:
        self.prev = STATE.current
        if self.index is not None and self.index >= 0:
            set_device(self.index)

    def __exit__(self, *exc: Any) -> None:
        STATE.current = self.prev


def set_device(device: Any) -> None:
    """``torch.cuda.set_device`` on the CPU target: checks the index against the simulated count."""
    i = index(device)
    if i is None or i < 0:
        return
    if i >= STATE.count:
        raise MigrationError(
            f"torch.cuda.set_device({i}) but the script sees {STATE.count} simulated cuda device(s) on cpu. "
            f"Start it with --device-num {i + 1} (or set {ENV_SIM_DEVICES})."
        )
    STATE.current = i


def name(device: Any = None) -> str:
    """``torch.cuda.get_device_name`` on the CPU target."""
    i = STATE.current if index(device) is None else index(device)
    return f"{platform.processor() or platform.machine() or 'CPU'} (cuda:{i} simulated on cpu by npu_migrate)"


def host_memory() -> tuple[int, int]:
    """``(free, total)`` bytes of host memory, or ``(0, 0)`` where the OS does not say."""
    try:
        page, total, free = os.sysconf("SC_PAGE_SIZE"), os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_AVPHYS_PAGES")
        return int(free * page), int(total * page)
    except (ValueError, OSError, AttributeError):
        return 0, 0


def properties(device: Any = None) -> SimpleNamespace:
    """``torch.cuda.get_device_properties`` on the CPU target."""
    return SimpleNamespace(
        name=name(device), major=SIM_CAPABILITY[0], minor=SIM_CAPABILITY[1], total_memory=host_memory()[1],
        multi_processor_count=os.cpu_count() or 1, is_integrated=True, is_multi_gpu_board=False,
        uuid="", L2_cache_size=0,
    )


def capability(device: Any = None) -> tuple[int, int]:
    """``torch.cuda.get_device_capability`` on the CPU target: :data:`SIM_CAPABILITY`."""
    return SIM_CAPABILITY


def device_of(obj: Any) -> Any:
    """``torch.cuda.device_of(obj)`` on the CPU target: every tensor is on the one host device."""
    return contextlib.nullcontext()


def count_from_env() -> int:
    """How many CUDA devices the script sees on cpu: NPU_MIGRATE_SIM_DEVICES, CUDA_VISIBLE_DEVICES, or 1.

    Raises:
        UsageError: NPU_MIGRATE_SIM_DEVICES is set but not a whole number of 1 or more.
    """
    value = os.environ.get(ENV_SIM_DEVICES)
    if value:
        if not value.strip().isdigit() or int(value) < 1:
            raise UsageError(
                f"{ENV_SIM_DEVICES}={value!r} is not a number of devices: expected a whole number, 1 or more. "
                "Set it to how many cuda devices the script should see on cpu, or unset it."
            )
        return int(value)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        return max(1, len([d for d in visible.split(",") if d.strip()]))
    return 1


# One table of what maps where on the CPU target. For every public callable of torch.cuda:
#   key: the name; value: (kind, CPU implementation, note); an implementation is a function with
#   torch's signature, or an answer() that ignores its arguments and takes torch's (signatures.py)
#   kind "redirected": answered for the target device (on npu by torch.npu's function of that name)
#   kind "noop": harmless on the target and documented as such
# Names not in the table are "unmapped": a user call raises MigrationError, unless the npu target
# has a function of the same name. Streams and events: npu_migrate.migrate.patches.streams.
CUDA_TABLE: dict[str, tuple[str, Any, str]] = {
    "is_available": ("redirected", answer(lambda: True), ""),
    "device_count": ("redirected", answer(lambda: STATE.count), ""),
    "current_device": ("redirected", answer(lambda: STATE.current), ""),
    "set_device": ("redirected", set_device, ""),
    "get_device_name": ("redirected", name, ""),
    "get_device_properties": ("redirected", properties, CAPABILITY_NOTE),
    "get_device_capability": ("redirected", capability, CAPABILITY_NOTE),
    "is_bf16_supported": ("redirected", answer(lambda: True), ""),
    "is_tf32_supported": ("redirected", answer(lambda: False), ""),
    "is_initialized": ("redirected", answer(lambda: True), ""),
    "init": ("noop", answer(lambda: None), ""),
    "synchronize": ("noop", answer(lambda: None), "cpu work is synchronous"),
    "empty_cache": ("noop", answer(lambda: None), "no device cache on cpu"),
    "ipc_collect": ("noop", answer(lambda: None), ""),
    "memory_allocated": ("noop", answer(lambda: 0), "0 on cpu"),
    "max_memory_allocated": ("noop", answer(lambda: 0), "0 on cpu"),
    "memory_reserved": ("noop", answer(lambda: 0), "0 on cpu"),
    "max_memory_reserved": ("noop", answer(lambda: 0), "0 on cpu"),
    "memory_cached": ("noop", answer(lambda: 0), "0 on cpu"),
    "max_memory_cached": ("noop", answer(lambda: 0), "0 on cpu"),
    "reset_peak_memory_stats": ("noop", answer(lambda: None), ""),
    "reset_max_memory_allocated": ("noop", answer(lambda: None), ""),
    "reset_max_memory_cached": ("noop", answer(lambda: None), ""),
    "reset_accumulated_memory_stats": ("noop", answer(lambda: None), ""),
    "memory_stats": ("noop", answer(lambda: {}), "{} on cpu"),
    "memory_summary": ("noop", answer(lambda: ""), "'' on cpu"),
    "mem_get_info": ("redirected", answer(host_memory), "host memory"),
    "set_per_process_memory_fraction": ("noop", answer(lambda: None), ""),
    "get_per_process_memory_fraction": ("noop", answer(lambda: 1.0), ""),
    # The CPU generator is not the CUDA one: seeding "CUDA" must not reseed it, or the run would
    # differ from the same script written for the CPU.
    "manual_seed": ("noop", answer(lambda: None), "the cpu generator is seeded by torch.manual_seed"),
    "manual_seed_all": ("noop", answer(lambda: None), "the cpu generator is seeded by torch.manual_seed"),
    "seed": ("noop", answer(lambda: None), ""),
    "seed_all": ("noop", answer(lambda: None), ""),
    "initial_seed": ("redirected", answer(lambda: torch.initial_seed()), "torch.initial_seed()"),
    "get_rng_state": ("noop", answer(lambda: torch.ByteTensor()), "empty state: no CUDA generator"),
    "get_rng_state_all": ("noop", answer(lambda: [torch.ByteTensor() for _ in range(STATE.count)]), "empty states"),
    "set_rng_state": ("noop", answer(lambda: None), ""),
    "set_rng_state_all": ("noop", answer(lambda: None), ""),
    "get_arch_list": ("noop", answer(lambda: []), ""),
    "get_gencode_flags": ("noop", answer(lambda: ""), ""),
    "get_sync_debug_mode": ("noop", answer(lambda: 0), ""),
    "set_sync_debug_mode": ("noop", answer(lambda: None), ""),
}
# Classes of torch.cuda, as (kind, CPU implementation, note).
CUDA_CLASSES: dict[str, tuple[str, Callable[..., Any], str]] = {
    "device": ("redirected", SimDevice, ""),
    "device_of": ("redirected", device_of, ""),
}
