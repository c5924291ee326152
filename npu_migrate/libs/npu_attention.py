"""The NPU path of :func:`npu_migrate.libs.attention.attention`: ``torch_npu.npu_fusion_attention``.

Usage::

    from npu_migrate.libs.npu_attention import fusion_attention   # called by attention() for npu tensors

Every mapping, from torch_npu's own documentation of the operator (``torch_npu/_op_plugin_docs.py``
in the wheel; the signature is checked against the released wheel by tests/libs/test_fusion_reference.py):

* layout: flash-attn's ``[B, S, H, D]`` is ``input_layout="BSND"``; varlen ``[T, H, D]`` is ``"TND"``
  with ``actual_seq_qlen``/``actual_seq_kvlen`` = ``cu_seqlens[1:]`` (cumulative, without the leading 0);
  ``head_num`` is the number of query heads; grouped-query keys keep their own head count (the
  operator takes ``Nq / Nkv`` integer);
* ``scale``: always passed, because the operator's default is 1.0, not ``1 / sqrt(D)``;
* ``keep_prob = 1 - dropout_p``;
* causal: ``sparse_mode=2`` (leftUpCausal) for :attr:`Causal.TOP_LEFT`, ``3`` (rightDownCausal) for
  :attr:`Causal.BOTTOM_RIGHT`; a sliding window is ``sparse_mode=4`` (band, counted from the bottom-right
  corner) with ``pre_tockens=left`` and ``next_tockens=right``. All three read the compressed
  ``2048 x 2048`` upper-triangular mask (True = masked), which is ALWAYS passed: without ``atten_mask`` the
  operator ignores ``sparse_mode``, ``pre_tockens`` and ``next_tockens`` and computes full attention;
* a bias is ``pse``: the operator computes ``scale * (q @ k^T + pse)``, so ``pse = bias / scale``, broadcast
  to ``[B or 1, N, Sq, Skv]`` (BNSS / 1NSS); ALiBi slopes become such a bias;
* the log-sum-exp is ``softmax_max + log(softmax_sum)`` (outputs 2 and 3, 8 equal copies on the last axis);
  a row with ``softmax_sum == 0`` read no key: ``+inf``, as flash-attn.
"""

from __future__ import annotations

from typing import Any

import torch

from npu_migrate.errors import MigrationError
from npu_migrate.libs.masks import UNBOUNDED, Causal, alibi_bias

COMPRESSED_MASK_SIZE = 2048  # sparse modes 2, 3, 4 read a fixed 2048 x 2048 upper-triangular mask
TOKENS_UNBOUNDED = 2147483647  # the operator's default pre_tockens/next_tockens: no limit

_MASKS: dict[torch.device, torch.Tensor] = {}


def compressed_causal_mask(device: torch.device) -> torch.Tensor:
    """The ``2048 x 2048`` bool mask, True above the diagonal (masked), made once per device."""
    mask = _MASKS.get(device)
    if mask is None:
        mask = torch.ones(COMPRESSED_MASK_SIZE, COMPRESSED_MASK_SIZE, dtype=torch.bool, device=device).triu(1)
        _MASKS[device] = mask
    return mask


def sparse_arguments(causal: Causal, window: tuple[int, int] | None, device: torch.device) -> dict[str, Any]:
    """``sparse_mode``, ``atten_mask``, ``pre_tockens`` and ``next_tockens`` for a causal mode and window."""
    if window is not None:
        left, right = window
        return {"sparse_mode": 4, "atten_mask": compressed_causal_mask(device),
                "pre_tockens": TOKENS_UNBOUNDED if left == UNBOUNDED else left,
                "next_tockens": TOKENS_UNBOUNDED if right == UNBOUNDED else right}
    if causal is Causal.TOP_LEFT:
        return {"sparse_mode": 2, "atten_mask": compressed_causal_mask(device)}
    if causal is Causal.BOTTOM_RIGHT:
        return {"sparse_mode": 3, "atten_mask": compressed_causal_mask(device)}
    return {"sparse_mode": 0}


def _pse(bias: torch.Tensor | None, alibi_slopes: torch.Tensor | None, q: torch.Tensor, sq: int, skv: int,
         scale: float) -> torch.Tensor | None:
    if alibi_slopes is not None:
        alibi = alibi_bias(alibi_slopes, sq, skv)
        bias = alibi if bias is None else bias.float() + alibi
    if bias is None:
        return None
    if scale == 0:
        raise MigrationError("softmax_scale=0 with a bias cannot be expressed on the NPU (the operator adds the "
                             "bias before scaling); use a non-zero scale.")
    while bias.dim() < 4:
        bias = bias.unsqueeze(0)
    batch, heads = q.shape[0], q.shape[2]
    shape = (batch if bias.shape[0] != 1 else 1, heads, sq, skv)
    return (bias.float() / scale).to(q.dtype).expand(shape).contiguous()


def fusion_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: Causal,
                     window: tuple[int, int] | None, scale: float, dropout_p: float, bias: torch.Tensor | None,
                     alibi_slopes: torch.Tensor | None, cu_seqlens_q: torch.Tensor | None,
                     cu_seqlens_k: torch.Tensor | None,
                     return_lse: bool) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """:func:`~npu_migrate.libs.attention.attention` on the NPU; arguments already checked and normalised."""
    import torch_npu

    heads = q.shape[-2]
    kwargs: dict[str, Any] = dict(scale=scale, keep_prob=1.0 - dropout_p,
                                  **sparse_arguments(causal, window, q.device))
    if cu_seqlens_q is not None:
        if alibi_slopes is not None:
            raise MigrationError("alibi_slopes with varlen (cu_seqlens) has no equivalent on the NPU: "
                                 "npu_fusion_attention takes no position bias in the TND layout; pad the batch "
                                 "and call flash_attn_func instead.")
        kwargs["input_layout"] = "TND"
        kwargs["actual_seq_qlen"] = [int(x) for x in cu_seqlens_q[1:].tolist()]
        kwargs["actual_seq_kvlen"] = [int(x) for x in cu_seqlens_k[1:].tolist()]
    else:
        kwargs["input_layout"] = "BSND"
        pse = _pse(bias, alibi_slopes, q, q.shape[1], k.shape[1], scale)
        if pse is not None:
            kwargs["pse"] = pse
    # Contiguous inputs: flash-attn callers pass views (qkv.unbind(2)); the fused kernel reads dense BSND/TND.
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    out, softmax_max, softmax_sum = torch_npu.npu_fusion_attention(q, k, v, heads, **kwargs)[:3]
    if not return_lse:
        return out
    total = softmax_sum[..., 0]
    lse = (softmax_max[..., 0] + total.log()).masked_fill(total == 0, float("inf"))
    if cu_seqlens_q is not None:
        lse = lse.transpose(0, 1)  # [T, N] -> flash-attn's [N, T]
    return out, lse
