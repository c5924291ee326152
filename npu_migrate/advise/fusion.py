"""Fusion opportunities in a module's forward: hand-written RMSNorm, rotary, SwiGLU/GeGLU, attention.

Usage::

    from npu_migrate.advise.fusion import Matcher

    matcher = Matcher(module_of=lambda: "Attention")   # the class of the innermost module running
    matcher.op("aten::pow", "Tensor_Scalar", site, function, inputs, outputs)   # forward calls, in order
    matcher.found          # {("rms_norm", "model.py:17", "RMSNorm"): Match(count=4, evidence=[...])}

msprof-analyze matches its fusion patterns (``advisor/rules/timeline_fusion_ops.yaml``) against the
operator names of an NPU timeline, for torch up to 2.1. Here the same patterns are matched on the
recorded aten calls of torch 2.x, following the data: each tensor a matched call makes carries a role
(``sq``: a square, ``ms``: its mean, ``scores``: a matmul's result, ``probs``: their softmax, ...)
and a pattern is found when a call completes a chain of roles:

==================  ============================================================  =========================
rule                chain (aten names, without ``aten::``)                        reported at
==================  ============================================================  =========================
``rms_norm``        ``pow``/``mul(x, x)`` → ``mean`` → [``add`` eps] → ``rsqrt``   the square's line
                    (or ``sqrt`` → ``div``/``reciprocal``)
``add_rms_norm``    the same, squaring the result of a residual ``add``            the add's line
``add_layer_norm``  ``layer_norm``/``native_layer_norm`` of a residual ``add``     the add's line
``rotary``          ``slice``/``split`` → ``neg`` → ``cat`` → ``mul`` → ``add``    the add's line (where the
                                                                                   rotation is applied)
``swiglu``          ``silu`` → ``mul`` with a tensor of the same shape             the mul's line
``geglu``           ``gelu`` → ``mul`` with a tensor of the same shape             the mul's line
``attention``       ``matmul``/``bmm`` → [scale, mask, view] → ``softmax`` →       the first matmul's line
                    [dropout] → ``matmul``/``bmm``
==================  ============================================================  =========================

A residual ``add`` is an ``add.Tensor`` of two tensors of one shape. Calls made inside a fused torch
function the user called (``scaled_dot_product_attention``, ``layer_norm``, ``rms_norm``: their math
kernels on a backend without one) are not the user's hand-written pattern, and are skipped.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Callable

from torch.utils.weak import WeakIdKeyDictionary

RULES = ("rms_norm", "add_rms_norm", "add_layer_norm", "rotary", "swiglu", "geglu", "attention")

_MATMUL = frozenset(("matmul", "bmm", "mm", "baddbmm", "einsum"))
_SOFTMAX = frozenset(("softmax", "_softmax", "_safe_softmax"))
_SPLIT = frozenset(("slice", "split", "split_with_sizes", "chunk", "narrow", "unbind", "select"))
# Calls through which a role of the attention chain passes: views, scaling, masks, dropout, casts.
_PASS_ATTENTION = frozenset((
    "view", "_unsafe_view", "reshape", "_reshape_alias", "expand", "clone", "contiguous", "transpose",
    "permute", "alias", "unsqueeze", "squeeze", "_to_copy", "to", "type_as", "div", "mul", "masked_fill",
    "add", "sub", "where", "dropout", "native_dropout", "detach", "view_as", "expand_as"))
# Calls through which a square's or a mean's role passes: views and casts.
_PASS_VIEW = frozenset(("view", "_unsafe_view", "reshape", "_to_copy", "to", "type_as", "float", "detach"))
_FUSED_FUNCTIONS = frozenset(("scaled_dot_product_attention", "layer_norm", "rms_norm", "group_norm",
                              "multi_head_attention_forward", "batch_norm", "instance_norm"))


@dataclass
class Match:
    """One pattern at one site in one module class: how often it ran, and the calls that made it."""

    count: int = 0
    evidence: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Start:
    """Where a chain began: the site, the module class, a token unique to this instance of the chain,
    the calls so far (``"pow at model.py:17"``), and the residual add it started from, if any."""

    site: str
    module: str
    token: int
    calls: tuple[str, ...]
    residual: "_Start | None" = None

    def then(self, call: str) -> "_Start":
        return _Start(self.site, self.module, self.token, (*self.calls, call), self.residual)


def _short(site: str) -> str:
    path, _, line = site.rpartition(":")
    return f"{path.rsplit('/', 1)[-1]}:{line}"


class Matcher:
    """Follows the roles of tensors through one forward's calls and collects the patterns found."""

    def __init__(self, module_of: Callable[[], str], in_mha: Callable[[], bool] = lambda: False) -> None:
        self.module_of = module_of
        self.in_mha = in_mha  # whether torch's nn.MultiheadAttention is running
        self.roles: Any = WeakIdKeyDictionary()  # tensor -> {role: _Start}
        self.found: dict[tuple[str, str, str], Match] = {}
        self._tokens = itertools.count()
        self._emitted: set[tuple[str, int]] = set()

    # -- the chains ---------------------------------------------------------------------------------
    def _start(self, site: str, call: str, residual: _Start | None = None) -> _Start:
        return _Start(site, self.module_of(), next(self._tokens), (call,), residual)

    def _emit(self, rule: str, start: _Start, site: str | None = None, call: str | None = None) -> None:
        if (rule, start.token) in self._emitted:
            return
        self._emitted.add((rule, start.token))
        # Named at the call that completes it (the mul of silu(a) * b), the module is the one running
        # there: silu ran inside nn.SiLU, the line that multiplies is the MLP's.
        key = (rule, site or start.site, self.module_of() if site else start.module)
        match = self.found.get(key)
        if match is None:
            calls = (*start.calls, call) if call else start.calls
            match = self.found[key] = Match(evidence=list(calls))
        match.count += 1

    def op(self, name: str, overload: str, site: str, function: str, inputs: list[Any], outputs: list[Any]) -> None:
        """One call of the forward, in order (``name``: ``aten::pow``)."""
        short = name.rpartition("::")[2]
        called = function.rpartition(".")[2]
        if short in ("softmax", "_softmax") and self.in_mha() and inputs and inputs[0].dim() == 3:
            # nn.MultiheadAttention asked for its weights (need_weights=True, the default) takes the
            # math path: bmm, softmax over (batch x heads, L, S), bmm. Without them it calls
            # scaled_dot_product_attention, whose CPU math kernel softmaxes (batch, heads, L, S)
            # (_safe_softmax on torch 2.5+): not the NPU's.
            self._emit("mha_need_weights", self._start(site, f"{short} at {_short(site)} in MultiheadAttention"))
            return
        if called in _FUSED_FUNCTIONS and short not in (called, f"native_{called}", f"_{called}"):
            return  # the math kernel of a fused function the user called
        roles: dict[str, _Start] = {}
        for tensor in inputs:
            found = self.roles.get(tensor)
            if found:
                for role, start in found.items():
                    roles.setdefault(role, start)
        call = f"{short} at {_short(site)}"
        out = self._next(short, overload, site, call, roles, inputs, outputs)
        if out:
            for tensor in outputs:
                self.roles[tensor] = out

    def _next(self, short: str, overload: str, site: str, call: str, roles: dict[str, _Start],
              inputs: list[Any], outputs: list[Any]) -> dict[str, _Start]:
        out: dict[str, _Start] = {}
        # RMSNorm: x² → mean → (+ eps) → rsqrt; add + RMSNorm where x is a residual sum.
        square = short == "pow" or (short == "mul" and len(inputs) == 2 and inputs[0] is inputs[1])
        if square:
            out["sq"] = self._start(site, call, roles.get("add"))
        elif short == "mean" and "sq" in roles:
            out["ms"] = roles["sq"].then(call)
        elif short in ("add", "add_") and "ms" in roles:
            out["ms"] = roles["ms"]
        elif short in ("rsqrt", "sqrt") and "ms" in roles:
            chain = roles["ms"].then(call)
            if short == "sqrt":
                out["std"] = chain
            else:
                self._rms(chain)
        elif short in ("div", "reciprocal") and "std" in roles:
            self._rms(roles["std"].then(call))
        for role in ("sq", "ms"):
            if role in roles and short in _PASS_VIEW:
                out[role] = roles[role]
        # add + layer_norm
        if short in ("layer_norm", "native_layer_norm") and "add" in roles:
            self._emit("add_layer_norm", roles["add"], call=call)
        # residual add
        if short in ("add", "add_") and overload == "Tensor" and len(inputs) == 2 and "ms" not in roles:
            a, b = inputs
            if a.shape == b.shape and a.dim() >= 2 and a.is_floating_point():
                out["add"] = self._start(site, call)
        # rotary: slice → neg → cat → mul → add
        if short in _SPLIT:
            out["half"] = self._start(site, call)
        elif short == "neg" and "half" in roles:
            out["neg"] = roles["half"].then(call)
        elif short in ("cat", "stack") and "neg" in roles:
            out["rot"] = roles["neg"].then(call)
        elif short == "mul" and "rot" in roles:
            out["rotmul"] = roles["rot"].then(call)
        elif short in ("add", "add_") and "rotmul" in roles:
            self._emit("rotary", roles["rotmul"], site=site, call=call)
        # SwiGLU / GeGLU: act(x W) * (x V)
        if short in ("silu", "silu_", "gelu", "gelu_"):
            out["silu" if short.startswith("silu") else "gelu"] = self._start(site, call)
        elif short == "mul" and len(inputs) == 2 and inputs[0].shape == inputs[1].shape:
            for role, rule in (("silu", "swiglu"), ("gelu", "geglu")):
                if role in roles and sum(1 for t in inputs if role in (self.roles.get(t) or {})) == 1:
                    self._emit(rule, roles[role], site=site, call=call)
        # attention: matmul → softmax → matmul
        if short in _MATMUL:
            if "probs" in roles:
                self._emit("attention", roles["probs"], call=call)
            else:
                out["scores"] = self._start(site, call)
        elif short in _SOFTMAX and "scores" in roles:
            out["probs"] = roles["scores"].then(call)
        elif short in _PASS_ATTENTION:
            for role in ("scores", "probs"):
                if role in roles and role not in out:
                    out[role] = roles[role]
        return out

    def _rms(self, chain: _Start) -> None:
        self._emit("rms_norm", chain)
        if chain.residual is not None:
            self._emit("add_rms_norm", chain.residual, call=chain.calls[-1])
