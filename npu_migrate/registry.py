"""The device table: each family's name, backend, extension and variables, readable without torch.

Usage::

    from npu_migrate.registry import DEVICES, FAMILY_CHOICES

    DEVICES["npu"].backend        # "hccl"
    FAMILY_CHOICES                # ("auto", "npu", "cuda", "cpu"): what --device accepts

Everything a family needs is one row of :data:`DEVICES`: the device layer, ``import torch``'s
autoload guard (:mod:`npu_migrate.autoload`), ``npu-migrate env``, the launcher's interface variables
(:mod:`npu_migrate.launch.setup.cluster`) and runtime migration read the row, never the family's name.
This module imports nothing heavy, so the command line can offer the families (``--device``
choices) before torch is imported; :mod:`npu_migrate.device` does the choosing and the device calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ENV_DEVICE = "NPU_MIGRATE_DEVICE"
"""Environment variable that forces a device family (``npu``, ``cuda``, ``cpu`` or ``auto``)."""


@dataclass(frozen=True)
class Toolkit:
    """The vendor software stack under a family's extension, set up by sourcing a script.

    Attributes:
        name: what its users call it (``CANN``); ``npu-migrate env`` reports ``<name>_version``.
        set_env: the script to source before training.
        home_env: variables that script exports: any one set means the stack was sourced.
        default_home: where its installer puts it (read when none of ``home_env`` is set).
        version_files: globs under the home of files that hold a ``version=...`` line.
        libraries: the shared libraries it provides, as an import failure names them.
    """

    name: str
    set_env: str
    home_env: tuple[str, ...]
    default_home: str
    version_files: tuple[str, ...] = ()
    libraries: str = ""


@dataclass(frozen=True)
class DeviceSpec:
    """How one device family maps onto torch and torch.distributed.

    Attributes:
        name: torch's device type string.
        backend: torch.distributed backend used when torch cannot tell us (torch < 2.6).
        extension: module that adds the device to torch and must be imported first; ``None`` for a
            family built into torch (forcing one turns torch's autoload of extensions off).
        pip_name: distribution that provides ``extension``.
        visible_devices_env: variable that masks the devices a process sees.
        alloc_conf_env: variable that configures the caching allocator.
        env_prefixes: prefixes of the variables that configure this family's stack,
            shown by ``npu-migrate env``.
        amp_dtype_name: name of the default dtype for autocast (``torch.<name>``).
        torch_build: attribute of ``torch.version`` that is ``None`` in a torch built without the
            family (``cuda``: a CPU-only wheel); ``None`` where any torch build will do.
        toolkit: the vendor stack the extension needs, or ``None``.
        interface_env: variables that choose the backend's network interface; one set by the user
            wins, and the launcher sets the first where the user set none.
    """

    name: str
    backend: str
    extension: str | None = None
    pip_name: str | None = None
    visible_devices_env: str | None = None
    alloc_conf_env: str | None = None
    env_prefixes: tuple[str, ...] = ()
    amp_dtype_name: str = "float16"
    torch_build: str | None = None
    toolkit: Toolkit | None = None
    interface_env: tuple[str, ...] = ()

    @property
    def is_accelerator(self) -> bool:
        """True for every family but the host CPU."""
        return self.name != HOST_FAMILY

    @property
    def built_in(self) -> bool:
        """True for a family torch supports without an extension (``import torch`` needs no plugin)."""
        return self.extension is None

    @property
    def amp_dtype(self) -> Any:
        """The default autocast dtype as a ``torch.dtype`` (imports torch)."""
        import torch

        return getattr(torch, self.amp_dtype_name)


HOST_FAMILY = "cpu"
"""The family of the host CPU: always usable; its backend (gloo) carries every family's CPU groups."""

SOURCE_FAMILY = "cuda"
"""The family the scripts were written for: its names (``cuda``, ``nccl``, ``CUDA_VISIBLE_DEVICES``)
are what runtime migration and ``port`` translate from, and a job on it needs no migration."""

# Dict order is detection order. NPU comes before CUDA: torch_npu's transfer_to_npu makes
# torch.cuda report NPUs (huggingface/accelerate#3020), so asking CUDA first would pick the
# wrong family on an Ascend host.
DEVICES: dict[str, DeviceSpec] = {
    "npu": DeviceSpec(
        "npu", "hccl", extension="torch_npu", pip_name="torch-npu",
        visible_devices_env="ASCEND_RT_VISIBLE_DEVICES", alloc_conf_env="PYTORCH_NPU_ALLOC_CONF",
        env_prefixes=("ASCEND_", "HCCL_", "CANN_"), amp_dtype_name="float16",
        toolkit=Toolkit(
            "CANN", "/usr/local/Ascend/ascend-toolkit/set_env.sh", ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH"),
            "/usr/local/Ascend/ascend-toolkit/latest",
            ("*/ascend_toolkit_install.info", "ascend_toolkit_install.info"), "libascend*",
        ),
        # HCCL_IF_IP names an address rather than an interface; the user may choose either.
        interface_env=("HCCL_SOCKET_IFNAME", "HCCL_IF_IP"),
    ),
    "cuda": DeviceSpec(
        "cuda", "nccl", visible_devices_env="CUDA_VISIBLE_DEVICES", alloc_conf_env="PYTORCH_CUDA_ALLOC_CONF",
        env_prefixes=("CUDA_", "NCCL_"), amp_dtype_name="float16", torch_build="cuda",
        interface_env=("NCCL_SOCKET_IFNAME",),
    ),
    # CPU autocast supports bfloat16 on every torch we support; float16 came later (2.4).
    "cpu": DeviceSpec("cpu", "gloo", env_prefixes=("GLOO_",), amp_dtype_name="bfloat16",
                      interface_env=("GLOO_SOCKET_IFNAME",)),
}

FAMILY_CHOICES: tuple[str, ...] = ("auto", *DEVICES)
"""What ``--device`` accepts: ``auto`` (detect) or a family."""

BUILT_IN: tuple[str, ...] = tuple(name for name, spec in DEVICES.items() if spec.built_in)
"""Families that need no extension (``cuda``, ``cpu``)."""


def by_extension(module: str) -> DeviceSpec | None:
    """The family whose extension is ``module`` (``torch_npu`` -> npu), or ``None``."""
    return next((spec for spec in DEVICES.values() if spec.extension == module), None)


def by_backend(backend: str) -> DeviceSpec | None:
    """The family whose backend is ``backend`` (``hccl`` -> npu), or ``None``."""
    return next((spec for spec in DEVICES.values() if spec.backend == backend), None)
