"""``npu-migrate advise``: what to change for speed on the NPU, said from the operator audit's run on a laptop.

Usage::

    npu-migrate advise train.py --epochs 1
    npu-migrate advise --torch-npu 2.1.0.post17 --json advice.json --markdown advice.md train.py

The script runs as ``npu-migrate ops`` runs it (the same recorder, the same options); what the
recorder sees, and a few light patches beside it, become advice with the user's file:line, each
replacement read from the release itself. See docs/advise.md.

Modules, each owning one concept:

* :mod:`.fusion`: hand-written patterns (RMSNorm, rotary, SwiGLU/GeGLU, attention, add + norm) found
  by following the roles of tensors through a forward's recorded calls;
* :mod:`.replacements`: what a release offers in their place (its ``npu::`` operators, fused
  optimizer kernels, ``torch_npu.optim``), read from the release;
* :mod:`.watch`: the recorder's observer and the run's light patches (optimizers, DataLoaders,
  ``clip_grad_norm_``, ``empty_cache``, anomaly detection, host syncs per step);
* :mod:`.environment`: the environment variables to set, why, their trade-offs (torch-free);
* :mod:`.report`: the rules, the JSON and markdown advice, and the exit status;
* :mod:`.cli`: ``npu-migrate advise``.
"""

from __future__ import annotations
