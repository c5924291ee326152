"""apex shims step for step equal to apex's documented update rules, written here; defaults included.

apex's rules (apex/optimizers/fused_adam.py and csrc/multi_tensor_adam.cu, fused_sgd.py,
normalization/fused_layer_norm.py) are restated in plain tensor code and compared with the shims
for several steps and seeds, on every torch tier this runs on.
"""

from __future__ import annotations

import math

import pytest
import torch

from npu_migrate.errors import MigrationError
from npu_migrate.libs import apex as ax
from npu_migrate.libs import apex_amp as amp


def _params(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(4, 3, generator=g).requires_grad_(), torch.randn(5, generator=g).requires_grad_()]


def _grads(seed: int, step: int, params: list[torch.Tensor]) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed * 100 + step)
    return [torch.randn(p.shape, generator=g) for p in params]


def apex_adam(params, grads_per_step, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, adam_w_mode=True):
    """apex FusedAdam (bias_correction=True): mode 1 = decoupled decay, mode 0 = L2 in the gradient."""
    p = [x.detach().clone() for x in params]
    m = [torch.zeros_like(x) for x in p]
    v = [torch.zeros_like(x) for x in p]
    b1, b2 = betas
    for t, grads in enumerate(grads_per_step, 1):
        for i, g in enumerate(grads):
            if not adam_w_mode:
                g = g + weight_decay * p[i]
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            update = (m[i] / (1 - b1 ** t)) / ((v[i] / (1 - b2 ** t)).sqrt() + eps)
            if adam_w_mode:
                update = update + weight_decay * p[i]
            p[i] = p[i] - lr * update
    return p


def apex_sgd(params, grads_per_step, lr, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False):
    """apex FusedSGD (wd_after_momentum=False): decay, momentum (first step: buf = d_p), Nesterov."""
    p = [x.detach().clone() for x in params]
    buf: list[torch.Tensor | None] = [None] * len(p)
    for grads in grads_per_step:
        for i, g in enumerate(grads):
            d = g + weight_decay * p[i]
            if momentum:
                buf[i] = d.clone() if buf[i] is None else momentum * buf[i] + (1 - dampening) * d
                d = d + momentum * buf[i] if nesterov else buf[i]
            p[i] = p[i] - lr * d
    return p


def run(optimizer_cls, seed: int, steps: int, **kwargs):
    params = _params(seed)
    opt = optimizer_cls(params, **kwargs)
    history = []
    for step in range(steps):
        grads = _grads(seed, step, params)
        for p, g in zip(params, grads):
            p.grad = g.clone()
        opt.step()
        history.append(grads)
    return params, history


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("kwargs", [{}, {"weight_decay": 0.1}, {"weight_decay": 0.1, "adam_w_mode": False},
                                    {"lr": 0.01, "betas": (0.8, 0.99), "eps": 1e-6}], ids=str)
def test_fused_adam_follows_apex_step_for_step(seed: int, kwargs: dict) -> None:
    params, history = run(ax.FusedAdam, seed, 6, **kwargs)
    for got, want in zip(params, apex_adam(_params(seed), history, **kwargs)):
        torch.testing.assert_close(got.detach(), want)


def test_fused_adam_defaults_are_apex_not_torch_adamw() -> None:
    opt = ax.FusedAdam(_params(0))
    group = opt.param_groups[0]
    assert group["weight_decay"] == 0.0 and group["lr"] == 1e-3 and group["eps"] == 1e-8  # AdamW's default is 1e-2
    assert isinstance(opt, torch.optim.AdamW)
    params, _ = run(ax.FusedAdam, 0, 1)
    opt = ax.FusedAdam(params)
    for p in params:
        p.grad = torch.ones_like(p)
    opt.zero_grad()
    assert all(p.grad is None for p in params)  # set_grad_none=True


def test_fused_adam_l2_mode_leaves_the_users_gradient_alone() -> None:
    params = _params(0)
    opt = ax.FusedAdam(params, weight_decay=0.5, adam_w_mode=False)
    grads = [torch.ones_like(p) for p in params]
    for p, g in zip(params, grads):
        p.grad = g.clone()
    opt.step()
    assert all(torch.equal(p.grad, g) for p, g in zip(params, grads))


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("kwargs", [{"lr": 0.1}, {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.01},
                                    {"lr": 0.05, "momentum": 0.9, "nesterov": True},
                                    {"lr": 0.05, "momentum": 0.5, "dampening": 0.1}], ids=str)
def test_fused_sgd_follows_apex_step_for_step(seed: int, kwargs: dict) -> None:
    params, history = run(ax.FusedSGD, seed, 5, **kwargs)
    for got, want in zip(params, apex_sgd(_params(seed), history, **kwargs)):
        torch.testing.assert_close(got.detach(), want)
    opt = ax.FusedSGD(params, lr=0.1)
    for p in params:
        p.grad = torch.ones_like(p)
    opt.zero_grad()
    assert all(p.grad is not None and not p.grad.any() for p in params)  # set_grad_none=False


@pytest.mark.parametrize("make,match", [
    (lambda p: ax.FusedAdam(p, bias_correction=False), r"FusedAdam\(bias_correction=False\) has no equivalent"),
    (lambda p: ax.FusedAdam(p, amsgrad=True), r"amsgrad=True"),
    (lambda p: ax.FusedAdam(p, master_weights=True), r"master_weights=True"),
    (lambda p: ax.FusedSGD(p, lr=0.1, wd_after_momentum=True), r"wd_after_momentum=True"),
    (lambda p: ax.FusedLAMB(p), r"FusedLAMB has no equivalent.*torch has no LAMB"),
], ids=["bias_correction", "amsgrad", "master_weights", "wd_after_momentum", "lamb"])
def test_arguments_without_equivalent_are_refused(make, match: str) -> None:
    with pytest.raises(MigrationError, match=match):
        make(_params(0))


def apex_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """apex FusedRMSNorm: x / sqrt(mean(x^2) + eps) * weight over the normalized dims, accumulated in float."""
    xf = x.double()
    return (xf / torch.sqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.double()).to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_rms_norm_is_apexs_formula_and_torchs_rmsnorm(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    norm = ax.FusedRMSNorm(8)
    assert norm.eps == 1e-5 and torch.equal(norm.weight, torch.ones(8))
    with torch.no_grad():
        norm.weight.copy_(torch.randn(8))
    x = torch.randn(3, 5, 8).to(dtype)
    y = norm(x)
    assert y.dtype == dtype
    torch.testing.assert_close(y, apex_rms_norm(x, norm.weight, 1e-5))
    if hasattr(torch.nn, "RMSNorm"):  # torch >= 2.4: the same numbers as torch's own (eps given: its None differs)
        ref = torch.nn.RMSNorm(8, eps=1e-5)
        with torch.no_grad():
            ref.weight.copy_(norm.weight)
        torch.testing.assert_close(y, ref.to(dtype)(x) if dtype == torch.float32 else ref(x.float()).to(dtype))


def test_fused_layer_norm_is_layer_norm_with_apex_defaults() -> None:
    norm = ax.FusedLayerNorm((4, 8))
    assert isinstance(norm, torch.nn.LayerNorm) and norm.eps == 1e-5 and norm.elementwise_affine
    x = torch.randn(2, 4, 8)
    torch.testing.assert_close(norm(x), torch.nn.functional.layer_norm(x, (4, 8), norm.weight, norm.bias, 1e-5))


def test_amp_o1_scales_unscales_and_skips_overflowing_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = amp.initialize(model, opt, opt_level="O1")
    assert model(torch.randn(2, 3)).dtype == torch.bfloat16  # CPU autocast
    monkeypatch.setattr(amp, "_uses_half", lambda loss: True)  # exercise the float16 loss scaler on CPU
    before = [p.detach().clone() for p in model.parameters()]
    loss = model(torch.randn(2, 3)).float().sum()
    with amp.scale_loss(loss, opt) as scaled:
        assert math.isclose(scaled.item(), loss.item() * 2 ** 16, rel_tol=1e-6)
        scaled.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    opt.step()
    for p, b, g in zip(model.parameters(), before, grads):
        torch.testing.assert_close(p.detach(), b - 0.1 * g)  # gradients were unscaled
    opt.zero_grad()
    loss = model(torch.randn(2, 3)).float().sum() * float("inf")
    with amp.scale_loss(loss, opt) as scaled:
        scaled.backward()
    after_overflow = [p.detach().clone() for p in model.parameters()]
    opt.step()
    assert all(torch.equal(p, a) for p, a in zip(model.parameters(), after_overflow))  # step skipped
    assert amp.state_dict()["loss_scaler0"]["loss_scale"] == 2 ** 15
    assert list(amp.master_params(opt)) == list(model.parameters())


def test_amp_o2_is_refused() -> None:
    with pytest.raises(MigrationError, match=r"opt_level='O2'.*use opt_level='O1'"):
        amp.initialize(torch.nn.Linear(2, 2), opt_level="O2")
