"""NVIDIA apex's fused optimizers and norms on torch's own, with apex's defaults kept.

Usage::

    from npu_migrate.libs.apex import FusedAdam, FusedRMSNorm

    opt = FusedAdam(model.parameters(), lr=1e-3)      # AdamW with weight_decay=0, as apex's default
    norm = FusedRMSNorm(1024)                          # eps=1e-5, as apex's default

Under runtime migration ``apex.optimizers``, ``apex.normalization`` and ``apex.amp`` give these
(:mod:`npu_migrate.migrate.libraries.libs_hook`); ``npu-migrate port`` rewrites the imports to this module.

The traps a plain swap falls into, kept here:

* ``FusedAdam``'s default ``adam_w_mode=True`` is AdamW (decoupled decay) with ``weight_decay=0``, while
  ``torch.optim.AdamW`` defaults to ``1e-2``; ``adam_w_mode=False`` is Adam with L2 added to the gradient;
* ``FusedAdam`` sets gradients to None on ``zero_grad()`` (``set_grad_none=True``), ``FusedSGD`` zeroes them
  (``set_grad_none=False``);
* ``FusedRMSNorm``/``FusedLayerNorm`` default to ``eps=1e-5``; ``torch.nn.RMSNorm``'s ``eps=None`` means the
  dtype's machine epsilon. torch < 2.4 has no ``nn.RMSNorm``: the fallback computes the same
  (``x * rsqrt(mean(x^2) + eps) * weight`` in float32, cast back). On the NPU ``torch_npu.npu_rms_norm``.

No equivalent, so :class:`~npu_migrate.errors.MigrationError`: ``bias_correction=False``, ``amsgrad=True``,
``capturable``/``master_weights``, ``FusedSGD(wd_after_momentum=True)``, ``FusedLAMB`` (torch has no LAMB) and
8-bit optimizers. ``apex.amp`` is :mod:`npu_migrate.libs.apex_amp`.
"""

from __future__ import annotations

import numbers
from typing import Any, Iterable

import torch

from npu_migrate.errors import MigrationError

__all__ = ["FusedAdam", "FusedLAMB", "FusedLayerNorm", "FusedRMSNorm", "FusedSGD"]


def _refuse(cls: str, argument: str, value: object, fix: str) -> MigrationError:
    return MigrationError(f"apex {cls}({argument}={value!r}) has no equivalent in torch.optim; {fix}")


class FusedAdam(torch.optim.AdamW):
    """``apex.optimizers.FusedAdam``: AdamW (``adam_w_mode=True``) or Adam with L2, ``weight_decay=0``."""

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, bias_correction: bool = True,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, adam_w_mode: bool = True,
                 weight_decay: float = 0.0, amsgrad: bool = False, set_grad_none: bool = True,
                 capturable: bool = False, master_weights: bool = False) -> None:
        if not bias_correction:
            raise _refuse("FusedAdam", "bias_correction", False, "torch's Adam always corrects the moments' bias; "
                          "keep bias_correction=True, or write the uncorrected update as your own torch.optim.Optimizer.")
        if amsgrad:
            raise _refuse("FusedAdam", "amsgrad", True, "apex itself rejects it; use torch.optim.AdamW(amsgrad=True) "
                          "if AMSGrad is what you meant.")
        for name, value in (("capturable", capturable), ("master_weights", master_weights)):
            if value:
                raise _refuse("FusedAdam", name, value, "drop it: CUDA-graph capture and fp32 master weights inside "
                              "the optimizer are apex kernel features; keep parameters in float32 and use torch.amp.")
        self.adam_w_mode = adam_w_mode
        self.set_grad_none = set_grad_none
        # Adam with L2 is AdamW without decoupled decay plus wd * p in the gradient (apex's mode 0).
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay if adam_w_mode else 0.0)
        for group in self.param_groups:
            group.setdefault("l2", 0.0 if adam_w_mode else weight_decay)

    def zero_grad(self, set_to_none: bool | None = None) -> None:
        super().zero_grad(set_to_none=self.set_grad_none if set_to_none is None else set_to_none)

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        swapped: list[tuple[torch.Tensor, torch.Tensor]] = []
        for group in self.param_groups:
            if group.get("l2"):
                for p in group["params"]:
                    if p.grad is not None:
                        swapped.append((p, p.grad))
                        p.grad = p.grad + group["l2"] * p  # the user's gradient stays as it was
        try:
            return super().step(closure)
        finally:
            for p, grad in swapped:
                p.grad = grad


class FusedSGD(torch.optim.SGD):
    """``apex.optimizers.FusedSGD``: ``torch.optim.SGD`` with apex's ``set_grad_none=False``."""

    def __init__(self, params: Iterable[Any], lr: float, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, wd_after_momentum: bool = False,
                 materialize_master_grads: bool = True, set_grad_none: bool = False) -> None:
        if wd_after_momentum:
            raise _refuse("FusedSGD", "wd_after_momentum", True, "torch.optim.SGD applies weight decay before "
                          "momentum; drop the flag (the default) or write the update yourself.")
        self.set_grad_none = set_grad_none
        super().__init__(params, lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                         nesterov=nesterov)

    def zero_grad(self, set_to_none: bool | None = None) -> None:
        super().zero_grad(set_to_none=self.set_grad_none if set_to_none is None else set_to_none)


class FusedLAMB:
    """``apex.optimizers.FusedLAMB``: torch has no LAMB, so constructing one says what to do."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise MigrationError("apex FusedLAMB has no equivalent in torch.optim (torch has no LAMB); use "
                             "torch.optim.AdamW with a warm-up, or a LAMB implemented with torch ops "
                             "(e.g. the torch-optimizer package's Lamb), and check the trust ratio it applies.")


class FusedLayerNorm(torch.nn.LayerNorm):
    """``apex.normalization.FusedLayerNorm``: ``torch.nn.LayerNorm`` (the same defaults)."""

    def __init__(self, normalized_shape: Any, eps: float = 1e-5, elementwise_affine: bool = True) -> None:
        super().__init__(normalized_shape, eps=eps, elementwise_affine=elementwise_affine)


def rms_norm(x: torch.Tensor, normalized_shape: tuple[int, ...], weight: torch.Tensor | None,
             eps: float) -> torch.Tensor:
    """``x * rsqrt(mean(x^2 over normalized_shape) + eps) * weight``, accumulated in float32, in x's dtype."""
    if weight is not None and x.device.type == "npu":
        import torch_npu

        npu_rms_norm = getattr(torch_npu, "npu_rms_norm", None)
        if npu_rms_norm is not None:  # torch_npu's fused kernel: returns (y, rstd)
            return npu_rms_norm(x, weight.to(x.dtype), epsilon=eps)[0]
    dims = tuple(range(-len(normalized_shape), 0))
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(dims, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.float()
    return y.to(x.dtype)


class FusedRMSNorm(torch.nn.Module):
    """``apex.normalization.FusedRMSNorm``: weight initialised to ones, ``eps=1e-5``."""

    def __init__(self, normalized_shape: Any, eps: float = 1e-5, elementwise_affine: bool = True) -> None:
        super().__init__()
        if isinstance(normalized_shape, numbers.Integral):
            normalized_shape = (int(normalized_shape),)
        self.normalized_shape = tuple(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = torch.nn.Parameter(torch.ones(self.normalized_shape))
        else:
            self.register_parameter("weight", None)

    def reset_parameters(self) -> None:
        if self.weight is not None:
            torch.nn.init.ones_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"
