"""Compare two training runs: record them (``--probe``), then ``npu-migrate compare A B``.

Usage::

    from npu_migrate.compare import Probe, compare
    with Probe("runs/cpu", level="modules"):       # imports torch
        train()
    result = compare("runs/gpu", "runs/cpu")        # reading needs no torch
    result.passed, result.first_step, result.culprit

Names resolve on first use, so reading and comparing recordings never imports torch.

Recording, in the ranks (torch at import: the recorder; the rest standard library only):

* :mod:`.probe`: the recorder: torch's global hooks, each optimizer step, the seed checkpoint.
* :mod:`.module_hooks`: the probe's per-module hooks (``--probe-level modules``): names, selection, tensors.
* :mod:`.stats`: what is computed per tensor on its device, and how a step's statistics become records.
* :mod:`.writer`: appending the records to a rank's file: in order, whole lines, inline or from a thread.
* :mod:`.settings`: what a probe records and where: its flags, environment variables, directory checks.
* :mod:`._hook`: arms the probe in a new interpreter when ``NPU_MIGRATE_PROBE`` is set (torch-free).
* :mod:`.launch_feature`: ``--probe DIR`` and its filters as a launcher feature.

Between the two, :mod:`.records`: the file format, one JSON object per line in ``DIR/rank{R}.jsonl``,
and its reader.

Comparing, torch-free: :mod:`.reading` (sources, alignment, tolerance, verdicts, the report and the
plot), driven by :mod:`.cli` (``npu-migrate compare A B``; :mod:`.__main__` for ``python -m``).
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
