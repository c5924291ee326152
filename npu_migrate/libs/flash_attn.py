"""flash-attn's Python API (2.x), kept exactly, on :func:`npu_migrate.libs.attention.attention`.

Usage::

    from npu_migrate.libs.flash_attn import flash_attn_func, flash_attn_varlen_func

    out = flash_attn_func(q, k, v, causal=True)                       # q: [B, Sq, Hq, D]
    out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True)

Under runtime migration ``import flash_attn`` (and ``flash_attn.flash_attn_interface``) gives these
functions (:mod:`npu_migrate.migrate.libraries.libs_hook`); ``npu-migrate port`` rewrites the import to this module.

Kept from flash-attn: bottom-right ``causal`` (since 2.1), ``window_size=(left, right)``, grouped-query
heads, ``softmax_scale=None`` meaning ``1/sqrt(D)``, ``alibi_slopes``, varlen through ``cu_seqlens``,
dropout only while ``dropout_p > 0`` (flash-attn applies it in eval too; so do these), and
``return_attn_probs=True`` returning ``(out, softmax_lse, None)``: the third value, flash-attn's
testing-only ``S_dmask``, is not computed. ``softcap != 0``, ``block_table`` and the KV-cache
function raise :class:`~npu_migrate.errors.MigrationError`; ``deterministic`` is accepted (these paths
are deterministic up to dropout).
"""

from __future__ import annotations

from typing import Any

import torch

from npu_migrate.libs.attention import Causal, attention, reject

__version__ = "2.7.4"  # the flash-attn API these functions follow (transformers and others check it)

__all__ = [
    "flash_attn_func", "flash_attn_kvpacked_func", "flash_attn_qkvpacked_func", "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func", "flash_attn_varlen_qkvpacked_func", "flash_attn_with_kvcache",
]


def _finish(result: Any, return_attn_probs: bool) -> Any:
    if return_attn_probs:
        out, lse = result
        return out, lse, None
    return result


def flash_attn_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = 0.0,
                    softmax_scale: float | None = None, causal: bool = False,
                    window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                    alibi_slopes: torch.Tensor | None = None, deterministic: bool = False,
                    return_attn_probs: bool = False) -> Any:
    """``flash_attn.flash_attn_func``: q ``[B, Sq, Hq, D]``, k/v ``[B, Skv, Hkv, D]``."""
    return _finish(attention(q, k, v, causal=Causal.BOTTOM_RIGHT if causal else Causal.NONE, window=window_size,
                             scale=softmax_scale, dropout_p=dropout_p, alibi_slopes=alibi_slopes,
                             return_lse=return_attn_probs, softcap=softcap), return_attn_probs)


def flash_attn_qkvpacked_func(qkv: torch.Tensor, dropout_p: float = 0.0, softmax_scale: float | None = None,
                              causal: bool = False, window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                              alibi_slopes: torch.Tensor | None = None, deterministic: bool = False,
                              return_attn_probs: bool = False) -> Any:
    """``flash_attn.flash_attn_qkvpacked_func``: qkv ``[B, S, 3, H, D]``."""
    q, k, v = qkv.unbind(2)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs)


def flash_attn_kvpacked_func(q: torch.Tensor, kv: torch.Tensor, dropout_p: float = 0.0,
                             softmax_scale: float | None = None, causal: bool = False,
                             window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                             alibi_slopes: torch.Tensor | None = None, deterministic: bool = False,
                             return_attn_probs: bool = False) -> Any:
    """``flash_attn.flash_attn_kvpacked_func``: q ``[B, Sq, Hq, D]``, kv ``[B, Skv, 2, Hkv, D]``."""
    k, v = kv.unbind(2)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs)


def flash_attn_varlen_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                           cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, dropout_p: float = 0.0,
                           softmax_scale: float | None = None, causal: bool = False,
                           window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                           alibi_slopes: torch.Tensor | None = None, deterministic: bool = False,
                           return_attn_probs: bool = False, block_table: torch.Tensor | None = None) -> Any:
    """``flash_attn.flash_attn_varlen_func``: q ``[Tq, Hq, D]``, k/v ``[Tkv, Hkv, D]``, ``cu_seqlens`` int32."""
    if block_table is not None:
        raise reject("block_table", "<tensor>", "paged KV caches are a CUDA kernel feature; gather the cache "
                     "into contiguous k/v tensors first.")
    return _finish(attention(q, k, v, causal=Causal.BOTTOM_RIGHT if causal else Causal.NONE, window=window_size,
                             scale=softmax_scale, dropout_p=dropout_p, alibi_slopes=alibi_slopes,
                             cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, return_lse=return_attn_probs,
                             softcap=softcap), return_attn_probs)


def flash_attn_varlen_qkvpacked_func(qkv: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
                                     dropout_p: float = 0.0, softmax_scale: float | None = None,
                                     causal: bool = False, window_size: tuple[int, int] = (-1, -1),
                                     softcap: float = 0.0, alibi_slopes: torch.Tensor | None = None,
                                     deterministic: bool = False, return_attn_probs: bool = False) -> Any:
    """``flash_attn.flash_attn_varlen_qkvpacked_func``: qkv ``[T, 3, H, D]``."""
    q, k, v = qkv.unbind(1)
    return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p, softmax_scale,
                                  causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs)


def flash_attn_varlen_kvpacked_func(q: torch.Tensor, kv: torch.Tensor, cu_seqlens_q: torch.Tensor,
                                    cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int,
                                    dropout_p: float = 0.0, softmax_scale: float | None = None,
                                    causal: bool = False, window_size: tuple[int, int] = (-1, -1),
                                    softcap: float = 0.0, alibi_slopes: torch.Tensor | None = None,
                                    deterministic: bool = False, return_attn_probs: bool = False) -> Any:
    """``flash_attn.flash_attn_varlen_kvpacked_func``: kv ``[Tkv, 2, Hkv, D]``."""
    k, v = kv.unbind(1)
    return flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                                  softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                                  return_attn_probs)


def flash_attn_with_kvcache(*args: Any, **kwargs: Any) -> Any:
    """``flash_attn.flash_attn_with_kvcache``: in-place KV-cache update inside the kernel; not provided."""
    raise reject("flash_attn_with_kvcache", "...", "update the cache with torch ops (k_cache[:, pos] = k) and call "
                 "flash_attn_func on the filled part (causal=True keeps the bottom-right alignment).")
