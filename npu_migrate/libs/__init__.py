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
