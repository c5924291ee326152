"""Compare two training runs: record them (``--probe``), then ``npu-migrate compare A B``.

Usage::

    from npu_migrate.compare import Probe, compare
    with Probe("runs/cpu", level="modules"):       # imports torch
        train()
    result = compare("runs/gpu", "runs/cpu")        # reading needs no torch
    result.passed, result.first_step, result.culprit

Names resolve on first use, so reading and comparing recordings never imports torch.

Modules:

* :mod:`.recording`: what runs in the ranks to record a run (the probe, its per-module hooks, the
  statistics, the writer, the settings, the start-up hook); torch at import for the recorder only.
* :mod:`.reading`: the torch-free readers that compare two runs (sources, alignment, tolerance,
  verdicts, the report and the plot).
* :mod:`.launch_feature`: ``--probe DIR`` and its filters as a launcher feature.
* :mod:`.records`: between the two, the file format (one JSON object per line in
  ``DIR/rank{R}.jsonl``) and its reader.
* :mod:`.cli`: ``npu-migrate compare A B``; :mod:`.__main__` runs it for ``python -m``.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Probe": "npu_migrate.compare.recording.probe",
    "ProbeSettings": "npu_migrate.compare.recording.settings",
    "ProbeError": "npu_migrate.compare.recording.settings",
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
