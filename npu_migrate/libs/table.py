"""The one table of CUDA-only libraries: what npu_migrate serves for each, and the advice where it does not.

Usage::

    from npu_migrate.libs.table import LIBRARIES, MODULES

    LIBRARIES["apex"].served      # "npu_migrate.libs.apex": runtime migration keeps apex's imports working
    LIBRARIES["triton"].advice    # what to do instead: the same text in `npu-migrate ops` and `port`
    MODULES["apex.amp"]           # "npu_migrate.libs.apex_amp": the module serving that import

Read by the three tools that meet these libraries, so their answers agree:

* runtime migration's import hook (:mod:`npu_migrate.migrate.libraries.libs_hook`) serves
  :data:`MODULES` under the libraries' own names;
* ``npu-migrate port`` rewrites imports of :data:`MODULES` (the library's ``rewrite`` rule) and reports
  the rest with :attr:`Library.advice` as the fix (its ``report`` rule);
* ``npu-migrate ops`` (:mod:`npu_migrate.ops.cuda_only`) lists each import of a :data:`LIBRARIES`
  name by user code with :attr:`Library.advice`, noting when ``npu-migrate run`` serves it.

Torch-free: the port, which never imports torch, reads it. The advice is ours, not a fact of a release.
"""

from __future__ import annotations

from dataclasses import dataclass

SHIM_NOTE = " (npu-migrate run serves a shim)"
"""What ``npu-migrate ops`` adds to the advice of a library that :attr:`Library.served` names."""


@dataclass(frozen=True)
class Library:
    """One CUDA-only library.

    Attributes:
        name: its import name (``flash_attn``; ``deepspeed.ops`` for a part of a package).
        served: the npu_migrate module that keeps its imports working under runtime migration
            (:data:`MODULES` lists every module name it answers for); ``""``: not served.
        advice: what to do instead of its CUDA kernels: ``ops``' row and ``port``'s fix for the parts not ported.
        rewrite: the port rule that rewrites its imports to :attr:`served` (``""``: none).
        report: the port rule that reports its uses with :attr:`advice` as the fix (``""``: none; the
            rewrite rule reports the parts it cannot port itself).
    """

    name: str
    served: str
    advice: str
    rewrite: str = ""
    report: str = ""

    @property
    def kept_working(self) -> bool:
        """Whether runtime migration serves it (else the script needs the advice)."""
        return bool(self.served)


LIBRARIES: dict[str, Library] = {lib.name: lib for lib in (
    Library("flash_attn", "npu_migrate.libs.flash_attn",
            "use torch.nn.functional.scaled_dot_product_attention, which torch_npu runs natively",
            rewrite="NM030"),
    Library("xformers", "npu_migrate.libs.xformers",
            "use torch.nn.functional.scaled_dot_product_attention instead of xformers.ops", rewrite="NM031"),
    Library("apex", "npu_migrate.libs.apex",
            "use torch.amp (autocast, GradScaler), torch.optim, torch.nn.LayerNorm and torch.nn.SyncBatchNorm "
            "instead of apex's kernels (or Ascend's apex fork)", rewrite="NM032", report="NM102"),
    Library("bitsandbytes", "", "its quantised optimizers and layers have no NPU build: use torch.optim and "
            "full-precision layers"),
    Library("deepspeed.ops", "", "DeepSpeed's CUDA ops: build them for the NPU with DeepSpeed's npu accelerator, "
            "or use the torch.optim equivalents"),
    Library("triton", "", "Triton kernels are compiled for CUDA: write the kernel with torch operations, or keep "
            "an eager PyTorch fallback beside it (Triton-Ascend support is separate)", report="NM104"),
    Library("cupy", "", "use torch tensors, or numpy on the host", report="NM103"),
)}

# Each module name of a served library -> the npu_migrate module that provides its public names
# ("" = a package that only holds submodules). The import hook serves exactly these; the port rewrites
# imports of exactly these.
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
