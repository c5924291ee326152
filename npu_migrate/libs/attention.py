"""One attention helper with flash_attn's and xformers' semantics, for every device family.

Usage::

    from npu_migrate.libs.attention import Causal, attention

    out = attention(q, k, v, causal=Causal.BOTTOM_RIGHT)             # q: [B, Sq, Hq, D] (flash layout)
    out = attention(q, k, v, window=(128, 0), scale=0.1)             # sliding window, bottom-right aligned
    out, lse = attention(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, return_lse=True)  # q: [Tq, Hq, D]

Semantics, exactly as flash-attn 2.x documents them (``flash_attn_interface.py``):

* layout ``[batch, seq, heads, head_dim]``; varlen batches are packed ``[total, heads, head_dim]``
  with ``cu_seqlens`` (cumulative lengths starting at 0, length batch + 1);
* grouped-query heads: ``Hq`` a multiple of ``Hkv``; query head ``h`` reads key head ``h // (Hq // Hkv)``;
* ``scale`` defaults to ``1 / sqrt(head_dim)``; ``bias`` (any shape that broadcasts to
  ``[B, Hq, Sq, Skv]``) is added after scaling, as xformers' ``attn_bias``;
* :class:`Causal`: ``TOP_LEFT`` keeps key ``j <= i`` (SDPA's ``is_causal``, xformers'
  ``LowerTriangularMask``); ``BOTTOM_RIGHT`` keeps ``j <= i + Skv - Sq`` (flash-attn >= 2.1's ``causal=True``);
  they differ only when ``Sq != Skv``;
* ``window=(left, right)`` keeps ``i + Skv - Sq - left <= j <= i + Skv - Sq + right`` (bottom-right aligned,
  ``-1`` = unbounded), as flash-attn's ``window_size``;
* a query row with no key left gives output 0 and log-sum-exp ``+inf``, as flash-attn does;
* ``return_lse``: also the log-sum-exp of the scaled scores, float32, ``[B, Hq, Sq]`` (``[Hq, Tq]`` varlen).

Tensors on the NPU go to ``torch_npu.npu_fusion_attention`` (:mod:`npu_migrate.libs.npu_attention`,
which documents each mapping); every other device to ``torch.nn.functional.scaled_dot_product_attention``.
Arguments without an equivalent (flash-attn's ``softcap``) raise
:class:`~npu_migrate.errors.MigrationError` naming the argument and the fix.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F

from npu_migrate.libs.masks import (  # noqa: F401 (re-exported: the helper's argument types)
    UNBOUNDED, Causal, alibi_bias, keep_mask, normalize_window, reject,
)



def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: Causal = Causal.NONE,
              window: Sequence[int] | None = None, scale: float | None = None, dropout_p: float = 0.0,
              bias: torch.Tensor | None = None, alibi_slopes: torch.Tensor | None = None,
              cu_seqlens_q: torch.Tensor | None = None, cu_seqlens_k: torch.Tensor | None = None,
              return_lse: bool = False, softcap: float = 0.0) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention in flash-attn's layout, on whatever device the tensors are on.

    Args:
        q: ``[B, Sq, Hq, D]``, or ``[Tq, Hq, D]`` with ``cu_seqlens_q``.
        k: ``[B, Skv, Hkv, D]`` (``[Tkv, Hkv, D]``); ``Hq`` a multiple of ``Hkv``.
        v: as ``k``, head dim may differ.
        causal: see :class:`Causal`.
        window: ``(left, right)`` sliding window, bottom-right aligned; ``-1`` unbounded.
        scale: multiplies ``q @ k^T``; default ``1 / sqrt(D)``.
        dropout_p: probability of dropping an attention weight (0 in eval).
        bias: added to the scaled scores; broadcasts to ``[B, Hq, Sq, Skv]`` (not with varlen).
        alibi_slopes: ``[Hq]`` or ``[B, Hq]`` float32 (flash-attn's ALiBi).
        cu_seqlens_q: int32 ``[B + 1]`` cumulative query lengths (varlen).
        cu_seqlens_k: the same for keys and values.
        return_lse: also return the log-sum-exp, float32.
        softcap: flash-attn's tanh soft-capping; only 0 (off) is supported.

    Returns:
        The output in ``q``'s layout with ``v``'s head dim, and the log-sum-exp when asked.

    Raises:
        MigrationError: ``softcap`` is not 0, or an argument combination the target cannot express.
        ValueError: shapes that flash-attn would refuse too.
    """
    if softcap:
        raise reject("softcap", softcap, "drop softcap (tanh capping of the scores, Gemma-2) or apply it in an "
                     "eager attention written with torch ops; neither SDPA nor npu_fusion_attention caps scores.")
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    if varlen and (cu_seqlens_q is None or cu_seqlens_k is None):
        raise ValueError("varlen attention needs both cu_seqlens_q and cu_seqlens_k (cumulative lengths from 0).")
    if varlen and bias is not None:
        raise ValueError("a bias tensor cannot be combined with cu_seqlens; pass a per-sequence bias through "
                         "xformers' BlockDiagonalMask or pad the batch.")
    expected = 3 if varlen else 4
    if q.dim() != expected or k.dim() != expected or v.dim() != expected:
        raise ValueError(f"q, k, v have {q.dim()}, {k.dim()}, {v.dim()} dimensions; expected {expected} "
                         f"({'[total, heads, head_dim] with cu_seqlens' if varlen else '[batch, seq, heads, head_dim]'}).")
    hq, hkv = q.shape[-2], k.shape[-2]
    if hkv == 0 or hq % hkv or v.shape[-2] != hkv:
        raise ValueError(f"{hq} query heads and {hkv}/{v.shape[-2]} key/value heads: the query heads must be a "
                         "multiple of the key heads, and keys and values must have the same heads.")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p={dropout_p!r} is not a probability in [0, 1).")
    causal, win = normalize_window(window, causal)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    if q.device.type == "npu":
        from npu_migrate.libs import npu_attention

        return npu_attention.fusion_attention(q, k, v, causal=causal, window=win, scale=scale, dropout_p=dropout_p,
                                              bias=bias, alibi_slopes=alibi_slopes, cu_seqlens_q=cu_seqlens_q,
                                              cu_seqlens_k=cu_seqlens_k, return_lse=return_lse)
    if varlen:
        return _varlen_sdpa(q, k, v, causal, win, scale, dropout_p, alibi_slopes, cu_seqlens_q, cu_seqlens_k,
                            return_lse)
    return _sdpa(q, k, v, causal, win, scale, dropout_p, bias, alibi_slopes, return_lse)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: Causal, window: tuple[int, int] | None,
          scale: float, dropout_p: float, bias: torch.Tensor | None, alibi_slopes: torch.Tensor | None,
          return_lse: bool) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The non-NPU path: one ``scaled_dot_product_attention`` call on ``[B, H, S, D]`` views."""
    sq, skv = q.shape[1], k.shape[1]
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if kt.shape[1] != qt.shape[1]:  # grouped-query heads: key head h serves query heads h*g .. h*g+g-1
        groups = qt.shape[1] // kt.shape[1]
        kt, vt = kt.repeat_interleave(groups, dim=1), vt.repeat_interleave(groups, dim=1)
    if alibi_slopes is not None:
        alibi = alibi_bias(alibi_slopes, sq, skv).to(q.dtype)
        bias = alibi if bias is None else bias + alibi
    is_causal = bias is None and window is None and (
        causal is Causal.TOP_LEFT or (causal is Causal.BOTTOM_RIGHT and sq == skv))
    keep = None if is_causal else keep_mask(sq, skv, causal, window, q.device)
    empty_rows = None
    if keep is not None:
        has_key = keep.any(-1, keepdim=True)
        if not bool(has_key.all()):
            # A row with no key would be 0/0 = NaN in SDPA, and its NaN reaches every gradient; let it
            # read every key, then zero its output (flash-attn's answer) so nothing flows back from it.
            keep = keep | ~has_key
            empty_rows = ~has_key
    mask: torch.Tensor | None = keep
    if bias is not None:
        mask = bias.to(q.dtype) if keep is None else bias.to(q.dtype).masked_fill(~keep, float("-inf"))
    out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal,
                                         scale=scale)
    if empty_rows is not None:
        out = out.masked_fill(empty_rows, 0.0)
    out = out.transpose(1, 2)
    if not return_lse:
        return out
    return out, _lse(qt, kt, scale, mask, is_causal, empty_rows)


@torch.no_grad()
def _lse(qt: torch.Tensor, kt: torch.Tensor, scale: float, mask: torch.Tensor | None, is_causal: bool,
         empty_rows: torch.Tensor | None) -> torch.Tensor:
    """Log-sum-exp of the scaled, masked scores in float32, ``[B, H, Sq]``; ``+inf`` for rows with no key."""
    scores = (qt.float() @ kt.float().transpose(-1, -2)) * scale
    if is_causal:
        scores = scores.masked_fill(~torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).tril(),
                                    float("-inf"))
    elif mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask.float()
    lse = scores.logsumexp(-1)
    if empty_rows is not None:
        lse = lse.masked_fill(empty_rows.squeeze(-1), float("inf"))
    return lse


def _varlen_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: Causal, window: tuple[int, int] | None,
                 scale: float, dropout_p: float, alibi_slopes: torch.Tensor | None, cu_seqlens_q: torch.Tensor,
                 cu_seqlens_k: torch.Tensor, return_lse: bool) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Packed sequences: each one is its own batch of 1 (SDPA has no varlen kernel)."""
    starts_q, starts_k = [int(x) for x in cu_seqlens_q.tolist()], [int(x) for x in cu_seqlens_k.tolist()]
    if len(starts_q) != len(starts_k) or starts_q[0] != 0 or starts_k[0] != 0:
        raise ValueError(f"cu_seqlens_q has {len(starts_q)} entries and cu_seqlens_k {len(starts_k)}: both must "
                         "start at 0 and have batch + 1 entries.")
    outs, lses = [], []
    for b in range(len(starts_q) - 1):
        qb = q[starts_q[b]:starts_q[b + 1]].unsqueeze(0)
        kb, vb = k[starts_k[b]:starts_k[b + 1]].unsqueeze(0), v[starts_k[b]:starts_k[b + 1]].unsqueeze(0)
        slopes = alibi_slopes[b] if alibi_slopes is not None and alibi_slopes.dim() == 2 else alibi_slopes
        result = _sdpa(qb, kb, vb, causal, window, scale, dropout_p, None, slopes, return_lse)
        if return_lse:
            outs.append(result[0][0])
            lses.append(result[1][0])
        else:
            outs.append(result[0])
    out = torch.cat(outs) if outs else q.new_empty((0, q.shape[1], v.shape[-1]))
    if not return_lse:
        return out
    return out, torch.cat(lses, dim=-1)
