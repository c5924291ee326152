"""The operator audit: which operators of a training step the NPU runs, decomposes, or sends to the host.

Usage::

    npu-migrate ops train.py --epochs 1                      # 2 optimizer steps, report on the console
    npu-migrate ops --torch-npu 2.1.0.post17 --json ops.json train.py
    npu-migrate ops --op-list ops.yaml --markdown ops.md train.py

Modules, each owning one concept:

* :mod:`.verdict`: one verdict per aten overload for one release (the release's list and torch's
  own knowledge of composites and structured delegates);
* :mod:`.record`: the dispatch and function modes, phases, call sites and steps;
* :mod:`.follow`: running the composite kernel the NPU runs for an operator the release lacks, so
  that what it calls is recorded;
* :mod:`.hooks`: what the recorder hooks into torch while it records: phases, steps, the device's
  modules, fast paths;
* :mod:`.meta`: ``--meta``: the device's tensors live on torch's ``meta`` device (shapes, no storage);
* :mod:`.cuda_only`: CUDA-only libraries and run-time CUDA extensions the script meets (the advice is
  :mod:`npu_migrate.libs.table`'s);
* :mod:`.report`: the JSON and markdown reports and the exit status;
* :mod:`.launch_feature`: ``--strict-ops`` of the launcher, and the summary of torch_npu's operator lines;
* :mod:`.cli`: ``npu-migrate ops``.

The operator lists themselves are read by :mod:`npu_migrate.releases.operators`.
"""

from __future__ import annotations
