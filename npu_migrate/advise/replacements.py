"""What a torch-npu release offers in place of a pattern: fused functions and fused optimizers, read from it.

Usage::

    from npu_migrate.advise.replacements import Offer

    offer = Offer(operators)                 # the audit's npu_migrate.releases.operators.OperatorList
    offer.fusion("rms_norm")                 # ("torch_npu.npu_rms_norm(x, weight, epsilon=eps)[0]", "...")
    offer.optimizer("AdamW")                 # ("torch.optim.AdamW(..., fused=True)", "...") or None

Nothing here says which release has what. The map from a pattern to the name of the function that
fuses it (``rms_norm`` → ``npu_rms_norm``) is this module's; whether the release has that function is
read from the release: its ``npu::`` operators (the ``custom`` section of its codegen YAML, read by
:mod:`npu_migrate.releases.operators`, or the ``npu::`` lines of ``--op-list``), its aten overloads
(``_fused_adamw_``, ``scaled_dot_product_attention``, ``_foreach_norm.Scalar``) and, for
``torch_npu.optim``'s classes, the ``__all__`` of its ``torch_npu/optim/__init__.py``. A pattern
whose replacement the release does not have gets no advice.
"""

from __future__ import annotations

import ast
import functools
from typing import Any

# pattern -> (npu:: operator exposed as torch_npu.<name>, how to call it, why)
_FUSIONS: dict[str, tuple[str, str, str]] = {
    "rms_norm": ("npu_rms_norm", "torch_npu.npu_rms_norm(x, weight, epsilon=eps)[0]",
                 "a hand-written RMSNorm runs 5-6 kernels (pow, mean, add, rsqrt, mul, mul) and keeps their "
                 "results for the backward; the fused kernel is one, forward and backward"),
    "add_rms_norm": ("npu_add_rms_norm", "torch_npu.npu_add_rms_norm(x, residual, weight, epsilon=eps)",
                     "the residual add and the RMSNorm of its sum in one kernel (returns the norm and the sum)"),
    "add_layer_norm": ("npu_add_layer_norm", "torch_npu.npu_add_layer_norm(x, residual, weight, bias, eps)",
                       "the residual add and the LayerNorm of its sum in one kernel"),
    "rotary": ("npu_rotary_mul", "torch_npu.npu_rotary_mul(x, cos, sin)",
               "rotate_half (slice, neg, cat) and x*cos + rotate_half(x)*sin are 6 kernels and as many copies "
               "of q and k; the fused kernel reads each once"),
    "swiglu": ("npu_swiglu", "torch_npu.npu_swiglu(torch.cat((x @ w1, x @ w3), -1), dim=-1)",
               "silu(x W1) * (x W3) as one kernel; with W1 and W3 in one Linear, one matmul too"),
    # npu_geglu activates the right half and uses tanh's approximation unless told (activate_left,
    # approximate: every release's schema, 2.1.0.post17 to 2.14.0): the call below is F.gelu's maths.
    "geglu": ("npu_geglu", "torch_npu.npu_geglu(torch.cat((x @ w1, x @ w3), -1), dim=-1, approximate=0, "
                           "activate_left=True)[0] (approximate=1 for F.gelu(..., approximate='tanh'))",
              "gelu(x W1) * (x W3) as one kernel; with W1 and W3 in one Linear, one matmul too"),
    "attention": ("npu_fusion_attention",
                  "torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=..., is_causal=...) "
                  "(torch_npu.npu_fusion_attention underneath)",
                  "matmul, scale, mask, softmax, dropout, matmul materialise the whole (seq x seq) score matrix "
                  "in device memory, forward and backward; the flash kernel never does"),
    "mha_need_weights": ("npu_fusion_attention",
                         "nn.MultiheadAttention(...)(query, key, value, ..., need_weights=False) "
                         "(scaled_dot_product_attention, torch_npu.npu_fusion_attention underneath)",
                         "need_weights=True (the default) returns the attention weights, so torch takes the math "
                         "path: the whole (seq x seq) score matrix is materialised, forward and backward; "
                         "without the weights it calls scaled_dot_product_attention"),
}
_OPTIMIZERS = {"AdamW": "_fused_adamw_", "Adam": "_fused_adam_", "SGD": "_fused_sgd_", "Adagrad": "_fused_adagrad_"}
_OPTIM_INIT = "torch_npu/optim/__init__.py"


class Offer:
    """What one release (an :class:`npu_migrate.releases.operators.OperatorList`) offers."""

    def __init__(self, operators: Any) -> None:
        self.operators = operators
        self.release = operators.release

    def _source(self) -> str:
        if self.operators.source == "file":
            return f"the npu:: lines of --op-list {self.release}"
        return f"torch-npu {self.release}'s codegen YAML (custom section)"

    def fusion(self, rule: str) -> tuple[str, str, str] | None:
        """``(replace_with, why, evidence)`` for a pattern, or None where the release lacks the kernel."""
        name, call, why = _FUSIONS[rule]
        if name not in self.operators.custom:
            return None
        evidence = f"npu::{name} in {self._source()}"
        if rule == "attention" and self.operators.registers("aten::scaled_dot_product_attention", "default"):
            evidence += "; aten::scaled_dot_product_attention registered"
        return call, why, evidence

    def optimizer(self, kind: str) -> tuple[str, str] | None:
        """``(replace_with, evidence)`` for a non-fused optimizer of class ``kind``, or None."""
        kernel = _OPTIMIZERS.get(kind)
        if kernel is not None and kernel in self.operators.aten:
            return (f"torch.optim.{kind}(..., fused=True)",
                    f"aten::{kernel} registered by torch-npu {self.release}")
        fused = f"NpuFused{kind}"
        if fused in self.optim_classes():
            lacks = f"aten::{kernel} not registered; " if kernel else f"torch.optim.{kind} has no fused kernel; "
            return (f"torch_npu.optim.{fused}(...)", f"{lacks}{fused} in torch-npu {self.release}'s {_OPTIM_INIT}")
        return None

    def unregistered_fused(self, kind: str) -> tuple[str, str] | None:
        """For a ``fused=True`` optimizer of class ``kind`` whose fused kernel the release does not
        register (it runs on the host, or fails): ``(replace_with, evidence)``; None where it is fine."""
        kernel = _OPTIMIZERS.get(kind)
        if kernel is None or self.operators.source == "file" and not self.operators.aten or kernel in self.operators.aten:
            return None
        fused = f"NpuFused{kind}"
        replace_with = (f"torch_npu.optim.{fused}(...)" if fused in self.optim_classes()
                        else f"torch.optim.{kind}(..., foreach=True)")
        return replace_with, f"aten::{kernel} not registered by torch-npu {self.release}"

    def foreach_norm(self) -> bool:
        """Whether the release registers the foreach norm ``clip_grad_norm_(foreach=True)`` uses."""
        return self.operators.registers("aten::_foreach_norm", "Scalar")

    def optim_classes(self) -> tuple[str, ...]:
        """``torch_npu.optim.__all__`` of the release (``()`` for ``--op-list`` or without the file)."""
        return () if self.operators.source == "file" else _optim_classes(self.release)


@functools.lru_cache(maxsize=8)
def _optim_classes(release: str) -> tuple[str, ...]:
    """``__all__`` of ``torch_npu/optim/__init__.py`` in ``release`` (read once per process)."""
    try:
        from npu_migrate.releases import find

        text = find(release, allow_download=False).read_text(_OPTIM_INIT)
    except Exception:  # not cached, no such file: nothing to offer
        return ()
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets):
            try:
                return tuple(str(v) for v in ast.literal_eval(node.value))
            except ValueError:
                return ()
    return ()
