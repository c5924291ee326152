"""The simulated CUDA of the CPU target: N devices, a current device, and torch.cuda's CPU answers.

Usage::

    from npu_migrate.migrate import sim

    sim.set_device(1)            # torch.cuda.set_device(1) on the CPU target
    sim.CPU["count"]             # (<answers STATE.count>, ""): torch.cuda.device_count's row names it
    sim.count_from_env()         # NPU_MIGRATE_SIM_DEVICES, else CUDA_VISIBLE_DEVICES' count, else 1

On the CPU target the script sees ``STATE.count`` CUDA devices; :data:`CPU` holds the answers
``torch.cuda``'s functions and classes give there, by name. Which API gets which answer is a
column of its row in :mod:`npu_migrate.cuda_api` (``cpu``), not a table here.
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


Implementation = tuple[Callable[..., Any], str]
"""A cpu answer of runtime migration: a function with torch's signature, or an :func:`answer` that
ignores its arguments and takes torch's (:mod:`npu_migrate.migrate.signatures`); and what the
migration report says of it when the row says nothing (``CudaApi.cpu_note``)."""

# The cpu answers of torch.cuda, by the names the rows of npu_migrate.cuda_api give them (a row's
# ``cpu`` column); which API gets which answer, and its kind, is the row's. Streams and events:
# npu_migrate.migrate.patches.streams.CPU.
CPU: dict[str, Implementation] = {
    "true": (answer(lambda: True), ""),
    "false": (answer(lambda: False), ""),
    "zero": (answer(lambda: 0), ""),
    "whole": (answer(lambda: 1.0), ""),
    "nothing": (answer(lambda: None), ""),
    "empty_str": (answer(lambda: ""), ""),
    "empty_list": (answer(lambda: []), ""),
    "empty_dict": (answer(lambda: {}), ""),
    "count": (answer(lambda: STATE.count), ""),
    "current": (answer(lambda: STATE.current), ""),
    "set_device": (set_device, ""),
    "name": (name, ""),
    "properties": (properties, CAPABILITY_NOTE),
    "capability": (capability, CAPABILITY_NOTE),
    "host_memory": (answer(host_memory), "host memory"),
    "initial_seed": (answer(lambda: torch.initial_seed()), "torch.initial_seed()"),
    "empty_state": (answer(lambda: torch.ByteTensor()), "empty state"),
    "empty_states": (answer(lambda: [torch.ByteTensor() for _ in range(STATE.count)]), "empty states"),
    "device": (SimDevice, ""),
    "device_of": (device_of, ""),
}
