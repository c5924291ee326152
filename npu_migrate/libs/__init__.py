"""CUDA-only libraries kept working on every family: flash-attn, xformers and apex.

Usage::

    from npu_migrate.libs.attention import Causal, attention      # the one attention helper
    from npu_migrate.libs.flash_attn import flash_attn_func         # flash-attn's API
    from npu_migrate.libs.xformers import memory_efficient_attention
    from npu_migrate.libs.apex import FusedAdam, FusedRMSNorm

* :mod:`.attention`: softmax attention with flash-attn's and xformers' semantics; SDPA off the NPU.
* :mod:`.npu_attention`: the NPU path through ``torch_npu.npu_fusion_attention`` and its mappings.
* :mod:`.flash_attn`, :mod:`.xformers`: those libraries' Python APIs on :mod:`.attention`.
* :mod:`.masks`: the attention helpers' argument types: causal corners, sliding windows, their masks, ALiBi.
* :mod:`.apex`: apex's fused optimizers and norms on torch's own; :mod:`.apex_amp`: apex's ``amp`` entry points.
* :mod:`.table`: the one table of CUDA-only libraries: what is served (:data:`~.table.MODULES`) and the
  advice for each (:data:`~.table.LIBRARIES`), read by ``ops``, ``port`` and the import hook.

Runtime migration serves them under the libraries' own names (:mod:`npu_migrate.migrate.libraries.libs_hook`);
``npu-migrate port`` rewrites imports to them (rules NM030-NM032). Which libraries are served, and
the advice for the others, is :mod:`.table`; what maps to what is docs/cuda-libraries.md.
"""
