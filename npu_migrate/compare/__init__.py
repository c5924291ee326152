"""Compare two training runs: record them (``--probe``), then ``npu-migrate compare A B``.

Usage::

    from npu_migrate.compare import Probe, compare
    with Probe("runs/cpu", level="modules"):       # imports torch
        train()
    result = compare("runs/gpu", "runs/cpu")        # reading needs no torch
    result.passed, result.first_step, result.culprit

Names resolve on first use, so reading and comparing recordings never imports torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Probe": "npu_migrate.compare.probe",
    "ProbeSettings": "npu_migrate.compare.settings",
    "ProbeError": "npu_migrate.compare.settings",
    "compare": "npu_migrate.compare.reading.verdict",
    "Comparison": "npu_migrate.compare.reading.verdict",
    "Tolerance": "npu_migrate.compare.reading.tolerance",
    "load_run": "npu_migrate.compare.reading.sources",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
