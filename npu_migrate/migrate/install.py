"""Switching runtime migration on and off: :func:`install`, :func:`uninstall`, :func:`enabled`.

Usage::

    from npu_migrate.migrate.install import enabled, install

    install(device="cpu", device_count=2, propagate=True)
    with enabled(device="cpu"):
        ...

:func:`install` chooses the target, fills :data:`npu_migrate.migrate.state.STATE` and applies
every area of :mod:`npu_migrate.migrate.patches`; :func:`uninstall` puts every original back.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from typing import Iterator

from npu_migrate import device as _device
from npu_migrate import failure_hints
from npu_migrate.registry import DEVICES, SOURCE_FAMILY, DeviceSpec
from npu_migrate.migrate import callers, environment
from npu_migrate.migrate.libraries import library_failure, libs_hook
from npu_migrate.migrate.mapping import map_environment
from npu_migrate.migrate.patches import AREAS
from npu_migrate.migrate.report import REPORT
from npu_migrate.migrate.sim import count_from_env
from npu_migrate.migrate.state import STATE, all_or_nothing, is_installed, patch, rollback, set_env


def install(device: str | None = None, device_count: int | None = None, propagate: bool = False,
            report_dir: str | None = None) -> str:
    """Switch runtime migration on in this process (idempotent).

    Args:
        device: target family; default: what the device layer picks (``NPU_MIGRATE_DEVICE``,
            else detection).
        device_count: on the CPU target, how many CUDA devices the script sees (default:
            ``NPU_MIGRATE_SIM_DEVICES``, else the count of ``CUDA_VISIBLE_DEVICES``, else 1).
        propagate: also switch it on in every Python process this one starts (see
            :func:`export_environment`).
        report_dir: write this process's report there at exit (``NPU_MIGRATE_REPORT_DIR``).

    Returns:
        The target family (``"npu"``, ``"cpu"``, or ``"cuda"``, where nothing changes).

    Raises:
        NpuMigrateError: a bad setting, or a failure part-way (then nothing stays patched).
    """
    with STATE.lock:
        if STATE.target is not None:
            return STATE.target.name
        with all_or_nothing():  # a failure part-way leaves nothing patched
            # Before anything asks the device for its count: torch_npu's runtime reads the mask once,
            # when it first starts, and choosing the family already starts it.
            early = _family_before_detection(device)
            if early is not None:
                map_environment(early)
            spec = _device.device_spec(device)
            if propagate:
                export_environment(spec.name, device_count, report_dir)
            elif report_dir:
                set_env(environment.ENV_REPORT_DIR, report_dir)
            REPORT.target = spec.name
            STATE.target = spec
            libs_hook.register()  # flash_attn, xformers, apex from npu_migrate.libs (off the CUDA target or missing)
            patch(libs_hook, "ACTIVE", True)
            if spec.name == SOURCE_FAMILY:
                return spec.name  # nothing to move
            callers.reset()
            # A script that stops at an installed library's CUDA check is told which --user-code fixes it.
            patch(failure_hints, "HINTERS", (*failure_hints.HINTERS, library_failure.hint))
            STATE.count = device_count if device_count is not None else (
                count_from_env() if not spec.is_accelerator else _device.device_count())
            STATE.current = 0
            if spec.is_accelerator:
                map_environment(spec)
            _dynamo_reads_the_real_cuda()
            for install_area in AREAS:
                install_area()
            return spec.name


def _dynamo_reads_the_real_cuda() -> None:
    """On torch 2.2 to 2.5, import dynamo's device interfaces before ``torch.cuda`` is patched.

    Their class bodies read ``torch.cuda.Event`` and ``Stream`` once, where a metaclass asserts that
    they derive from torch's C event and stream bases; imported after migration (building a DDP
    model imports dynamo), they got the target's classes and every such script failed with
    "DeviceInterface member Event should be inherit from _EventBase" (found by ``.ci/matrix`` on
    torch 2.3.1, 2.4.0 and 2.5.1). Torch 2.6 dropped the check; 2.1 has no such interface. Dynamo is
    torch's own code, which gets torch's real answers anyway. Costs one import of dynamo there.
    """
    import torch

    if "2.2" <= torch.__version__ < "2.6":
        import torch._dynamo.device_interface  # noqa: F401


def _family_before_detection(device: str | None) -> DeviceSpec | None:
    """The target family whose variables must be mapped before it starts, as far as it is known yet.

    The family named by ``device`` (or ``NPU_MIGRATE_DEVICE``); on ``auto``, the first family whose
    extension is installed (detection would try it first). ``None`` for the source family, which
    needs no mapping, and where nothing is known yet.
    """
    requested = (device or os.environ.get(_device.ENV_DEVICE) or "auto").strip().lower()
    if requested == "auto":
        spec = next((s for s in DEVICES.values()
                     if s.extension is not None and importlib.util.find_spec(s.extension) is not None), None)
    else:
        spec = DEVICES.get(requested)
    return spec if spec is not None and spec.is_accelerator and spec.name != SOURCE_FAMILY else None


def uninstall() -> None:
    """Switch runtime migration off: every patched attribute and variable gets its original back."""
    rollback()


def export_environment(device: str | None = None, device_count: int | None = None,
                       report_dir: str | None = None) -> None:
    """Make every Python process started from now on migrate too; :func:`uninstall` undoes it.

    Sets ``NPU_MIGRATE_MIGRATE=1``, puts ``npu_migrate/_bootstrap`` (a ``sitecustomize`` that arms
    the migration when torch is imported) first on ``PYTHONPATH``, and passes the target, the
    simulated device count and the report directory on.
    """
    environment.export_environment(device, device_count, report_dir, set_env=set_env)


def install_from_env() -> str:
    """Install with the settings exported by :func:`export_environment` (used by the start-up hook)."""
    return install()


@contextlib.contextmanager
def enabled(device: str | None = None, device_count: int | None = None, propagate: bool = False) -> Iterator[str]:
    """``with migrate.enabled(device="cpu", device_count=2):`` migration on inside, off after."""
    was_on = is_installed()
    name = install(device, device_count, propagate)
    try:
        yield name
    finally:
        if not was_on:
            uninstall()
