"""``apex.amp``'s common entry points on torch.autocast and a dynamic loss scaler with apex's rules.

Usage::

    from npu_migrate.libs import apex_amp as amp

    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()                       # skipped, as apex does, when the gradients overflowed

What each ``opt_level`` becomes:

* ``O0``: nothing (float32);
* ``O1``: the model's ``forward`` runs under ``torch.autocast`` of the tensors' device in float16
  (bfloat16 on the CPU, whose autocast is bfloat16 in every torch this supports), and float16 gets
  apex's dynamic loss scaling: initial scale ``2**16``, halved on overflow (that step skipped),
  doubled after ``2000`` good steps; ``loss_scale=<number>`` gives a static scale;
* ``O2``/``O3`` (float16 model weights, with or without float32 master weights) raise
  :class:`~npu_migrate.errors.MigrationError`: use ``O1`` or torch.amp.

``master_params(optimizer)``, ``state_dict()`` and ``load_state_dict()`` work as apex's do.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Iterator

import torch

from npu_migrate.errors import MigrationError

__all__ = ["initialize", "load_state_dict", "master_params", "scale_loss", "state_dict"]

INIT_SCALE = 2.0 ** 16  # apex's dynamic loss scaler starts here
SCALE_WINDOW = 2000  # good steps before apex doubles the scale
SCALE_FACTOR = 2.0


class LossScaler:
    """apex's ``LossScaler``: dynamic unless a static scale is given."""

    def __init__(self, loss_scale: float | str = "dynamic") -> None:
        self.dynamic = loss_scale == "dynamic"
        self.scale = INIT_SCALE if self.dynamic else float(loss_scale)
        self.good_steps = 0
        self.skip_next = False

    def unscale_and_check(self, optimizer: torch.optim.Optimizer) -> None:
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        finite = all(bool(torch.isfinite(g).all()) for g in grads)
        for g in grads:
            g.mul_(1.0 / self.scale)
        if not self.dynamic:
            return
        if not finite:
            self.scale /= SCALE_FACTOR
            self.good_steps = 0
            self.skip_next = True
            return
        self.good_steps += 1
        if self.good_steps == SCALE_WINDOW:
            self.scale *= SCALE_FACTOR
            self.good_steps = 0


class _Amp:
    def __init__(self) -> None:
        self.scaler: LossScaler | None = None
        self.enabled = False


_AMP = _Amp()


def _autocast_forward(module: torch.nn.Module) -> None:
    forward = module.forward

    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        params = list(module.parameters())
        device = params[0].device.type if params else "cpu"
        dtype = torch.bfloat16 if device == "cpu" else torch.float16
        with torch.autocast(device_type=device, dtype=dtype):
            return forward(*args, **kwargs)

    module.forward = run


def initialize(models: Any, optimizers: Any = None, enabled: bool = True, opt_level: str = "O1",
               cast_model_type: Any = None, patch_torch_functions: Any = None, keep_batchnorm_fp32: Any = None,
               master_weights: Any = None, loss_scale: Any = None, cast_model_outputs: Any = None,
               num_losses: int = 1, verbosity: int = 1, min_loss_scale: Any = None,
               max_loss_scale: float = 2.0 ** 24) -> Any:
    """``apex.amp.initialize``: returns ``models`` (and ``optimizers``) as given, set up for ``opt_level``."""
    if opt_level not in ("O0", "O1", "O2", "O3"):
        raise ValueError(f"opt_level={opt_level!r} is not one of O0, O1, O2, O3 (letter O, not zero).")
    if opt_level in ("O2", "O3") and enabled:
        raise MigrationError(f"apex amp opt_level={opt_level!r} (float16 model weights) has no equivalent; use "
                             "opt_level='O1' (autocast with loss scaling), or torch.amp.autocast with nm.grad_scaler().")
    _AMP.enabled = enabled and opt_level == "O1"
    if _AMP.enabled:
        for model in models if isinstance(models, (list, tuple)) else [models]:
            _autocast_forward(model)
        _AMP.scaler = LossScaler("dynamic" if loss_scale in (None, "dynamic") else loss_scale)
        for optimizer in optimizers if isinstance(optimizers, (list, tuple)) else [optimizers]:
            if optimizer is not None:
                _skip_on_overflow(optimizer)
    return models if optimizers is None else (models, optimizers)


def _skip_on_overflow(optimizer: torch.optim.Optimizer) -> None:
    step = optimizer.step

    @functools.wraps(step)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        if _AMP.scaler is not None and _AMP.scaler.skip_next:
            _AMP.scaler.skip_next = False  # apex: "Gradient overflow. Skipping step"
            return None
        return step(*args, **kwargs)

    optimizer.step = guarded


def _uses_half(loss: torch.Tensor) -> bool:
    return loss.device.type != "cpu"  # O1 on the CPU autocasts to bfloat16, which needs no scaling


@contextlib.contextmanager
def scale_loss(loss: torch.Tensor, optimizers: Any, loss_id: int = 0, model: Any = None,
               delay_unscale: bool = False, delay_overflow_check: bool = False) -> Iterator[torch.Tensor]:
    """``apex.amp.scale_loss``: yields ``loss * scale``; on exit unscales the gradients and checks overflow."""
    scaler = _AMP.scaler
    if not _AMP.enabled or scaler is None or not _uses_half(loss):
        yield loss
        return
    yield loss * scaler.scale
    if delay_unscale:
        return
    for optimizer in optimizers if isinstance(optimizers, (list, tuple)) else [optimizers]:
        scaler.unscale_and_check(optimizer)


def master_params(optimizer: torch.optim.Optimizer) -> Iterator[torch.Tensor]:
    """``apex.amp.master_params``: the optimizer's parameters (they are the master weights under O1)."""
    for group in optimizer.param_groups:
        yield from group["params"]


def state_dict() -> dict[str, Any]:
    """``apex.amp.state_dict``: the loss scaler's state, in apex's keys."""
    scaler = _AMP.scaler
    if scaler is None:
        return {}
    return {"loss_scaler0": {"loss_scale": scaler.scale, "unskipped": scaler.good_steps}}


def load_state_dict(state: dict[str, Any]) -> None:
    """``apex.amp.load_state_dict``."""
    entry = state.get("loss_scaler0")
    if entry and _AMP.scaler is not None:
        _AMP.scaler.scale = float(entry["loss_scale"])
        _AMP.scaler.good_steps = int(entry["unskipped"])
