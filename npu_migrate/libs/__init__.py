"""CUDA-only libraries kept working on every family: flash-attn, xformers and apex.

Usage::

    from npu_migrate.libs.attention import Causal, attention      # the one attention helper
    from npu_migrate.libs.flash_attn import flash_attn_func         # flash-attn's API
    from npu_migrate.libs.xformers import memory_efficient_attention
    from npu_migrate.libs.apex import FusedAdam, FusedRMSNorm

* :mod:`.attention`: softmax attention with flash-attn's and xformers' semantics; SDPA off the NPU.
* :mod:`.npu_attention`: the NPU path through ``torch_npu.npu_fusion_attention`` and its mappings.
* :mod:`.flash_attn`, :mod:`.xformers`: those libraries' Python APIs on :mod:`.attention`.
* :mod:`.apex`: apex's fused optimizers, norms and ``amp`` entry points on torch's own.

Runtime migration serves them under the libraries' own names (:mod:`npu_migrate.migrate.libs_hook`);
``npu-migrate port`` rewrites imports to them (rules NM030-NM032). The table of what maps to what is
docs/cuda-libraries.md.
"""

from __future__ import annotations

# The one table of what is served: each CUDA library module name -> the npu_migrate module that
# provides its public names ("" = a package that only holds submodules). Read by runtime migration's
# import hook (npu_migrate.migrate.libs_hook) and the port rules (npu_migrate.port.matchers.libs).
MODULES: dict[str, str] = {
    "flash_attn": "npu_migrate.libs.flash_attn",
    "flash_attn.flash_attn_interface": "npu_migrate.libs.flash_attn",
    "xformers": "",
    "xformers.ops": "npu_migrate.libs.xformers",
    "xformers.ops.fmha": "npu_migrate.libs.xformers",
    "xformers.ops.fmha.attn_bias": "npu_migrate.libs.xformers",
    "apex": "",
    "apex.optimizers": "npu_migrate.libs.apex",
    "apex.normalization": "npu_migrate.libs.apex",
    "apex.normalization.fused_layer_norm": "npu_migrate.libs.apex",
    "apex.amp": "npu_migrate.libs.apex_amp",
}
