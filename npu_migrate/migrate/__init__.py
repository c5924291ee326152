"""Runtime migration: unmodified CUDA/NCCL scripts run on Ascend NPUs, and on CPU/gloo for tests.

Usage::

    npu-migrate run train.py --epochs 3                     # self-spawning scripts (seed 003)
    python -m npu_migrate.launch --migrate --device-num 2 train.py
    import npu_migrate.auto                                 # first line of a script

    from npu_migrate import migrate
    with migrate.enabled(device="cpu", device_count=2):     # tests and libraries
        ...

The target is the family the device layer picks. On ``npu`` CUDA device calls go to ``torch.npu``
and ``nccl`` becomes ``hccl``; on ``cpu`` they land on the CPU, ``nccl`` becomes ``gloo`` and the
script sees N simulated devices; on ``cuda`` nothing changes.

Design, and what it does differently from torch_npu's ``transfer_to_npu``:

* Only device values move. A device argument is rewritten when it *is* a CUDA device
  (``"cuda"``, ``"cuda:1"``, ``torch.device("cuda", 1)``, an int device index); strings that merely
  contain "cuda", like ``"runs/cuda_exp/model.pt"``, are never touched.
* Queries answer by caller. ``torch.cuda.is_available()``, ``device_count()``, ``Tensor.is_cuda``
  and the rest of the rows of :mod:`npu_migrate.cuda_api` answer for the target device when the caller is user code,
  and give torch's own answer to code in torch, the standard library, site-packages and
  npu_migrate. So optimizers, DataLoader and libraries never take CUDA-only paths on a machine
  without CUDA.
* Every patched attribute is recorded and :func:`uninstall` puts the originals back.
* Every redirection is counted per API with its first call site; CUDA APIs that cannot be
  mapped raise :class:`MigrationError` naming the call and what to do instead, unless
  their row in :mod:`npu_migrate.cuda_api` documents them as harmless no-ops.
* It follows the job into child processes through ``npu_migrate/_bootstrap/sitecustomize.py``
  on PYTHONPATH and ``NPU_MIGRATE_MIGRATE=1`` (see :func:`export_environment`).

Modules, each owning one concept (none imports this package's ``__init__``):

* :mod:`.callers`: who is calling (user code or torch/libraries), and caller-aware wrappers;
  :mod:`.usercode`: which files are the user's code, the roots it starts from.
* :mod:`.mapping`: device values, backends and environment variables mapped to the target.
* :mod:`.fit`: a ``torch.cuda`` call made to ``torch.npu``'s function with the arguments the
  torch-npu release's signature takes (renamed, dropped or refused in one line).
* :mod:`.sim`: the simulated CUDA devices of the CPU target and its ``torch.cuda`` answers.
* :mod:`.signatures`: stand-ins keep torch's signatures, so user code's calls are checked as torch's.
* :mod:`.patches`: the patches, one module per area of torch.
* :mod:`.libraries`: third-party libraries: the CUDA-only ones served from :mod:`npu_migrate.libs`
  (``libs_hook``), and an installed library's CUDA check (``library_failure``).
* :mod:`.state`: what is installed, and putting it back; :mod:`.install`: install/uninstall.
* :mod:`.report`: the per-process report and the merge of many.
* :mod:`.environment`: the variables that carry migration into child processes (torch-free).
* :mod:`.hook`: the start-up hook that arms migration in those processes (torch-free).
* :mod:`.lines`: whole, rank-prefixed lines from the processes an ``mp.spawn`` script starts.
* :mod:`.launch_feature`: ``--migrate``, ``--migrate-report`` and ``--user-code`` of the launcher.
* :mod:`.cli`: ``npu-migrate run``.

The table of what each ``torch.cuda`` API becomes is :mod:`npu_migrate.cuda_api`, shared with
``npu-migrate port``. This package imports its torch-dependent parts lazily, so importing
:mod:`npu_migrate.migrate.hook` or :mod:`npu_migrate.migrate.cli` does not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from npu_migrate.errors import MigrationError
from npu_migrate.migrate.environment import BOOTSTRAP_DIR, ENV_MIGRATE, ENV_REPORT_DIR, ENV_SIM_DEVICES

if TYPE_CHECKING:
    from npu_migrate.migrate.install import enabled, export_environment, install, install_from_env, uninstall
    from npu_migrate.migrate.state import is_installed, target

__all__ = [
    "BOOTSTRAP_DIR", "ENV_MIGRATE", "ENV_REPORT_DIR", "ENV_SIM_DEVICES", "MigrationError", "enabled",
    "export_environment", "install", "install_from_env", "is_installed", "target", "uninstall",
]

# Public names imported on first use (PEP 562): they need torch, the names above do not.
_LAZY = {
    "enabled": "install", "export_environment": "install", "install": "install", "install_from_env": "install",
    "uninstall": "install", "is_installed": "state", "target": "state",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    loaded = importlib.import_module(f"{__name__}.{module}")
    # Bind every name the module provides: importing the submodule ``install`` set the package's
    # attribute ``install`` to the module, which would hide the function of that name.
    globals().update({n: getattr(loaded, n) for n, m in _LAZY.items() if m == module})
    return globals()[name]


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
