"""xformers' ``memory_efficient_attention`` and its common attention biases, on :func:`~npu_migrate.libs.attention.attention`.

Usage::

    from npu_migrate.libs.xformers import LowerTriangularMask, memory_efficient_attention

    out = memory_efficient_attention(q, k, v, attn_bias=LowerTriangularMask())   # q: [B, M, H, K]
    bias, packed = BlockDiagonalMask.from_tensor_list([x1, x2])                   # varlen

Under runtime migration ``xformers.ops`` (and ``xformers.ops.fmha``, ``xformers.ops.fmha.attn_bias``) give
these names (:mod:`npu_migrate.migrate.libraries.libs_hook`). Kept from xformers: the ``[B, M, H, K]`` layout (3-D
``[B, M, K]`` is one head; 5-D ``[B, M, G, H, K]`` groups heads, keys may be expanded over ``H``),
``scale=None`` meaning ``1/sqrt(K)``, ``p`` dropout, a tensor ``attn_bias`` added after scaling,
``LowerTriangularMask`` aligned top-left and ``LowerTriangularFromBottomRightMask`` bottom-right,
``BlockDiagonalMask`` (and its causal variants) for packed sequences of a batch of 1, and
``LowerTriangularMaskWithTensorBias`` (``LowerTriangularMask().add_bias(t)``). Other bias classes and
``op=`` choices other than None raise :class:`~npu_migrate.errors.MigrationError`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from npu_migrate.libs.attention import Causal, attention, reject

__all__ = [
    "AttentionBias", "BlockDiagonalCausalFromBottomRightMask", "BlockDiagonalCausalMask", "BlockDiagonalMask",
    "LowerTriangularFromBottomRightMask", "LowerTriangularMask", "LowerTriangularMaskWithTensorBias",
    "memory_efficient_attention",
]


class AttentionBias:
    """Base of xformers' structured biases."""

    causal = Causal.NONE

    def materialize(self, shape: Sequence[int], dtype: torch.dtype = torch.float32,
                    device: str | torch.device = "cpu") -> torch.Tensor:
        """The additive bias as a dense tensor (0 kept, -inf masked), as xformers' ``materialize``."""
        from npu_migrate.libs.attention import keep_mask

        keep = keep_mask(shape[-2], shape[-1], self.causal, None, device)
        dense = torch.zeros(shape[-2:], dtype=dtype, device=device)
        if keep is not None:
            dense = dense.masked_fill(~keep, float("-inf"))
        return dense.expand(shape)


class LowerTriangularMask(AttentionBias):
    """Causal, top-left aligned: query ``i`` reads keys ``j <= i``."""

    causal = Causal.TOP_LEFT

    def add_bias(self, bias: torch.Tensor) -> "LowerTriangularMaskWithTensorBias":
        return LowerTriangularMaskWithTensorBias(bias)


class LowerTriangularFromBottomRightMask(AttentionBias):
    """Causal, bottom-right aligned: query ``i`` reads keys ``j <= i + Skv - Sq``."""

    causal = Causal.BOTTOM_RIGHT


class LowerTriangularMaskWithTensorBias(LowerTriangularMask):
    """Top-left causal plus an additive tensor."""

    def __init__(self, bias: torch.Tensor) -> None:
        self._bias = bias

    def materialize(self, shape: Sequence[int], dtype: torch.dtype = torch.float32,
                    device: str | torch.device = "cpu") -> torch.Tensor:
        return super().materialize(shape, dtype, device) + self._bias.to(dtype)


@dataclass
class _SeqLenInfo:
    seqstart_py: list[int]
    seqstart: torch.Tensor = field(init=False)

    def __post_init__(self) -> None:
        self.seqstart = torch.tensor(self.seqstart_py, dtype=torch.int32)

    @classmethod
    def from_seqlens(cls, seqlens: Sequence[int]) -> "_SeqLenInfo":
        starts = [0]
        for n in seqlens:
            starts.append(starts[-1] + int(n))
        return cls(starts)

    @property
    def seqlens(self) -> list[int]:
        return [b - a for a, b in zip(self.seqstart_py, self.seqstart_py[1:])]


class BlockDiagonalMask(AttentionBias):
    """Packed sequences (batch of 1): each query block reads only its own key block."""

    def __init__(self, q_seqinfo: _SeqLenInfo, k_seqinfo: _SeqLenInfo) -> None:
        self.q_seqinfo, self.k_seqinfo = q_seqinfo, k_seqinfo

    @classmethod
    def from_seqlens(cls, q_seqlen: Sequence[int], kv_seqlen: Sequence[int] | None = None) -> "BlockDiagonalMask":
        if kv_seqlen is not None and len(kv_seqlen) != len(q_seqlen):
            raise ValueError(f"q_seqlen has {len(q_seqlen)} sequences and kv_seqlen {len(kv_seqlen)}; expected "
                             "the same number.")
        q = _SeqLenInfo.from_seqlens(q_seqlen)
        return cls(q, q if kv_seqlen is None else _SeqLenInfo.from_seqlens(kv_seqlen))

    @classmethod
    def from_tensor_list(cls, tensors: Sequence[torch.Tensor]) -> tuple["BlockDiagonalMask", torch.Tensor]:
        """Concatenate ``[1, M_i, ...]`` tensors along M; returns the mask and the packed tensor."""
        mask = cls.from_seqlens([t.shape[1] for t in tensors])
        return mask, torch.cat([t.reshape(1, t.shape[1], *t.shape[2:]) for t in tensors], dim=1)

    def split(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        starts = self.q_seqinfo.seqstart_py
        return [tensor[:, a:b] for a, b in zip(starts, starts[1:])]

    def make_causal(self) -> "BlockDiagonalCausalMask":
        return BlockDiagonalCausalMask(self.q_seqinfo, self.k_seqinfo)

    def make_causal_from_bottomright(self) -> "BlockDiagonalCausalFromBottomRightMask":
        return BlockDiagonalCausalFromBottomRightMask(self.q_seqinfo, self.k_seqinfo)

    def materialize(self, shape: Sequence[int], dtype: torch.dtype = torch.float32,
                    device: str | torch.device = "cpu") -> torch.Tensor:
        from npu_migrate.libs.attention import keep_mask

        dense = torch.full(shape[-2:], float("-inf"), dtype=dtype, device=device)
        for (qa, qb), (ka, kb) in zip(zip(self.q_seqinfo.seqstart_py, self.q_seqinfo.seqstart_py[1:]),
                                      zip(self.k_seqinfo.seqstart_py, self.k_seqinfo.seqstart_py[1:])):
            keep = keep_mask(qb - qa, kb - ka, self.causal, None, device)
            dense[qa:qb, ka:kb] = 0 if keep is None else torch.zeros(qb - qa, kb - ka, dtype=dtype,
                                                                     device=device).masked_fill(~keep, float("-inf"))
        return dense.expand(shape)


class BlockDiagonalCausalMask(BlockDiagonalMask):
    """Packed sequences, each causal from its top-left corner."""

    causal = Causal.TOP_LEFT


class BlockDiagonalCausalFromBottomRightMask(BlockDiagonalMask):
    """Packed sequences, each causal from its bottom-right corner."""

    causal = Causal.BOTTOM_RIGHT


def _heads_last(x: torch.Tensor) -> torch.Tensor:
    """``[B, M, K]`` -> ``[B, M, 1, K]``; ``[B, M, G, H, K]`` -> ``[B, M, G*H, K]``; 4-D unchanged."""
    if x.dim() == 3:
        return x.unsqueeze(2)
    if x.dim() == 5:
        return x.flatten(2, 3)
    return x


def memory_efficient_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                               attn_bias: AttentionBias | torch.Tensor | None = None, p: float = 0.0,
                               scale: float | None = None, *, op: Any = None,
                               output_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``xformers.ops.memory_efficient_attention``: ``[B, M, H, K]`` in and out."""
    if op is not None:
        raise reject("op", op, "xformers' kernel choice has no meaning here; drop op= (SDPA or the NPU's fused "
                     "attention run instead).")
    if output_dtype is not None:
        raise reject("output_dtype", output_dtype, "drop output_dtype and cast the result.")
    dims = query.dim()
    if dims == 5 and key.shape[3] != query.shape[3]:
        raise ValueError("5-D (BMGHK) keys must be expanded over H as xformers requires: key.expand(B, M, G, H, K).")
    q, k, v = (_heads_last(x) for x in (query, key, value))
    if dims == 5:  # the keys of a group, expanded over H, are one key head of grouped-query attention
        k, v = key[:, :, :, 0], value[:, :, :, 0]
    kwargs: dict[str, Any] = dict(scale=scale, dropout_p=p)
    if isinstance(attn_bias, torch.Tensor):
        kwargs["bias"] = attn_bias.flatten(1, 2) if attn_bias.dim() == 5 else attn_bias  # [B, G, H, Mq, Mkv]
    elif isinstance(attn_bias, BlockDiagonalMask):
        if q.shape[0] != 1:
            raise ValueError(f"BlockDiagonalMask needs a batch of 1 (sequences packed along M); got batch {q.shape[0]}.")
        kwargs.update(causal=attn_bias.causal, cu_seqlens_q=attn_bias.q_seqinfo.seqstart.to(q.device),
                      cu_seqlens_k=attn_bias.k_seqinfo.seqstart.to(q.device))
        out = attention(q[0], k[0], v[0], **kwargs).unsqueeze(0)
        return out.reshape(*query.shape[:-1], value.shape[-1])
    elif isinstance(attn_bias, LowerTriangularMaskWithTensorBias):
        bias = attn_bias._bias
        kwargs.update(causal=attn_bias.causal, bias=bias.flatten(1, 2) if bias.dim() == 5 else bias)
    elif isinstance(attn_bias, (LowerTriangularMask, LowerTriangularFromBottomRightMask)):
        kwargs["causal"] = attn_bias.causal
    elif attn_bias is not None:
        raise reject("attn_bias", type(attn_bias).__name__, "use LowerTriangularMask, "
                     "LowerTriangularFromBottomRightMask, BlockDiagonalMask (and its causal variants) or a tensor.")
    out = attention(q, k, v, **kwargs)
    return out.reshape(*query.shape[:-1], value.shape[-1])
