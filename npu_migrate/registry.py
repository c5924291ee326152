"""The device table: each family's name, backend, extension and variables, readable without torch.

Usage::

    from npu_migrate.registry import DEVICES, FAMILY_CHOICES

    DEVICES["npu"].backend        # "hccl"
    FAMILY_CHOICES                # ("auto", "npu", "cuda", "cpu"): what --device accepts

Everything a family needs is one row of :data:`DEVICES`. This module imports nothing heavy, so the
command line can offer the families (``--device`` choices) before torch is imported;
:mod:`npu_migrate.device` does the choosing and the device calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ENV_DEVICE = "NPU_MIGRATE_DEVICE"
"""Environment variable that forces a device family (``npu``, ``cuda``, ``cpu`` or ``auto``)."""


@dataclass(frozen=True)
class DeviceSpec:
    """How one device family maps onto torch and torch.distributed.

    Attributes:
        name: torch's device type string.
        backend: torch.distributed backend used when torch cannot tell us (torch < 2.6).
        extension: module that adds the device to torch and must be imported first.
        pip_name: distribution that provides ``extension``.
        visible_devices_env: variable that masks the devices a process sees.
        alloc_conf_env: variable that configures the caching allocator.
        env_prefixes: prefixes of the variables that configure this family's stack,
            shown by ``npu-migrate env``.
        amp_dtype_name: name of the default dtype for autocast (``torch.<name>``).
    """

    name: str
    backend: str
    extension: str | None = None
    pip_name: str | None = None
    visible_devices_env: str | None = None
    alloc_conf_env: str | None = None
    env_prefixes: tuple[str, ...] = ()
    amp_dtype_name: str = "float16"

    @property
    def is_accelerator(self) -> bool:
        """True for every family but the host CPU."""
        return self.name != "cpu"

    @property
    def amp_dtype(self) -> Any:
        """The default autocast dtype as a ``torch.dtype`` (imports torch)."""
        import torch

        return getattr(torch, self.amp_dtype_name)


# Dict order is detection order. NPU comes before CUDA: torch_npu's transfer_to_npu makes
# torch.cuda report NPUs (huggingface/accelerate#3020), so asking CUDA first would pick the
# wrong family on an Ascend host.
DEVICES: dict[str, DeviceSpec] = {
    "npu": DeviceSpec(
        "npu", "hccl", "torch_npu", "torch-npu", "ASCEND_RT_VISIBLE_DEVICES",
        "PYTORCH_NPU_ALLOC_CONF", ("ASCEND_", "HCCL_", "CANN_"), "float16",
    ),
    "cuda": DeviceSpec(
        "cuda", "nccl", None, None, "CUDA_VISIBLE_DEVICES",
        "PYTORCH_CUDA_ALLOC_CONF", ("CUDA_", "NCCL_"), "float16",
    ),
    # CPU autocast supports bfloat16 on every torch we support; float16 came later (2.4).
    "cpu": DeviceSpec("cpu", "gloo", env_prefixes=("GLOO_",), amp_dtype_name="bfloat16"),
}

FAMILY_CHOICES: tuple[str, ...] = ("auto", *DEVICES)
"""What ``--device`` accepts: ``auto`` (detect) or a family."""
