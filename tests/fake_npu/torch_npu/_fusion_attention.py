"""Reference ``torch_npu.npu_fusion_attention`` for the simulated NPU, in plain PyTorch (differentiable).

Usage::

    out, softmax_max, softmax_sum, softmax_out, seed, offset, numel = torch_npu.npu_fusion_attention(
        q, k, v, head_num, "BSND", atten_mask=mask, scale=0.125, sparse_mode=3)

Written from the operator's documentation in the released wheel (``torch_npu/_op_plugin_docs.py``,
``npu_fusion_attention``) and its meta registration (output shapes); the parameter list is compared with
the wheel's declaration by tests/libs/test_fusion_reference.py. What it implements:

* ``attention = Dropout(Softmax(Mask(scale * (q @ k^T + pse), atten_mask)), keep_prob) @ v``;
* layouts ``BSH``, ``SBH``, ``BSND``, ``BNSD`` and ``TND`` (``actual_seq_qlen``/``actual_seq_kvlen``:
  cumulative lengths without the leading 0; trailing 0 entries drop batches);
* ``atten_mask``: True (or 1) = masked out; shapes ``SS``, ``11SS``, ``B1SS``, ``BNSS``;
* ``atten_mask=None``: no mask at all, whatever ``sparse_mode``, ``pre_tockens`` and ``next_tockens`` say;
* ``sparse_mode`` 0 (the given mask), 1 (the full given mask), 2 (leftUpCausal), 3 (rightDownCausal),
  4 (band from the bottom-right corner: keys ``i + Skv - Sq - pre_tockens .. i + Skv - Sq + next_tockens``);
  2, 3 and 4 require the compressed ``2048 x 2048`` upper-triangular mask, checked here so a caller that
  passes anything else fails; 5-8 (prefix, varlen split) raise ``NotImplementedError``;
* grouped-query heads (``Nq / Nkv`` integer); ``keep_prob`` (dropout keeps that fraction, scaled by
  ``1 / keep_prob``); ``sink`` (one extra logit per head);
* outputs: attention (query's dtype, value's head dim), ``softmax_max`` and ``softmax_sum`` (float32,
  ``[B, N, Sq, 8]``, ``[T, N, 8]`` for TND, the meta registration's shapes), an empty ``softmax_out`` and
  ``seed, offset, numels`` 0. A row with no key left gives 0 and ``softmax_sum`` 0.

What it cannot say: the operator's precision (fp16/bf16 accumulate in float32 here), its dropout
random stream, and the undocumented result of a mask inconsistent with ``pre_tockens``/``next_tockens``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_COMPRESSED = 2048
_LAYOUTS = ("BSH", "SBH", "BSND", "BNSD", "TND")


def _to_bnsd(x: torch.Tensor, layout: str, heads: int | None) -> torch.Tensor:
    if layout == "BNSD":
        return x
    if layout == "BSND":
        return x.transpose(1, 2)
    if layout == "BSH":
        b, s, h = x.shape
        return x.reshape(b, s, heads, h // heads).transpose(1, 2)
    s, b, h = x.shape  # SBH
    return x.reshape(s, b, heads, h // heads).permute(1, 2, 0, 3)


def _from_bnsd(x: torch.Tensor, layout: str) -> torch.Tensor:
    if layout == "BNSD":
        return x
    if layout == "BSND":
        return x.transpose(1, 2)
    b, n, s, d = x.shape
    if layout == "BSH":
        return x.transpose(1, 2).reshape(b, s, n * d)
    return x.permute(2, 0, 1, 3).reshape(s, b, n * d)  # SBH


def _check_compressed(mask: torch.Tensor, mode: int) -> None:
    if tuple(mask.shape) != (_COMPRESSED, _COMPRESSED):
        raise RuntimeError(f"sparse_mode={mode} expects the compressed {_COMPRESSED}x{_COMPRESSED} lower-triangular "
                           f"mask (True above the diagonal), got atten_mask of shape {tuple(mask.shape)} (fake npu)")
    expected = torch.ones(_COMPRESSED, _COMPRESSED, dtype=torch.bool).triu(1)
    if not torch.equal(mask.detach().cpu().bool(), expected):
        raise RuntimeError(f"sparse_mode={mode}: atten_mask is not the compressed upper-triangular mask "
                           "torch.ones(2048, 2048).triu(1).bool() (fake npu)")


def _masked(mode: int, mask: torch.Tensor | None, sq: int, skv: int, pre: int, nxt: int,
            device: torch.device) -> torch.Tensor | None:
    """Bool, True = masked, broadcastable to ``[B, N, Sq, Skv]``; None = nothing masked."""
    if mask is None:
        return None  # documented: without atten_mask, sparse_mode/pre_tockens/next_tockens do nothing
    if mode in (0, 1):
        return mask.bool().to(device)
    if mode not in (2, 3, 4):
        raise NotImplementedError(f"sparse_mode={mode} (prefix / varlen split) is not simulated by the fake npu")
    _check_compressed(mask, mode)
    i = torch.arange(sq, device=device).unsqueeze(1)
    j = torch.arange(skv, device=device).unsqueeze(0)
    if mode == 2:
        return j > i
    diagonal = i + (skv - sq)  # modes 3 and 4 count from the bottom-right corner
    if mode == 3:
        return j > diagonal
    return (j > diagonal + nxt) | (j < diagonal - pre)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pse: torch.Tensor | None, masked: torch.Tensor | None,
            scale: float, keep_prob: float, sink: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    """BNSD in, BNSD out plus per-row max and sum (float32)."""
    nq, nkv = q.shape[1], k.shape[1]
    if nkv == 0 or nq % nkv:
        raise RuntimeError(f"query heads {nq} must be an integer multiple of key/value heads {nkv} (fake npu)")
    if nq != nkv:
        k, v = k.repeat_interleave(nq // nkv, dim=1), v.repeat_interleave(nq // nkv, dim=1)
    scores = q.float() @ k.float().transpose(-1, -2)
    if pse is not None:
        scores = scores + pse.float()
    scores = scores * scale
    if masked is not None:
        scores = scores.masked_fill(masked, float("-inf"))
    row_max = scores.amax(-1, keepdim=True)
    if sink is not None:
        sink_logit = sink.float().view(1, -1, 1, 1).expand(*row_max.shape)
        row_max = torch.maximum(row_max, sink_logit)
    row_max = row_max.masked_fill(torch.isinf(row_max), 0.0)
    weights = torch.exp(scores - row_max)
    row_sum = weights.sum(-1, keepdim=True)
    if sink is not None:
        row_sum = row_sum + torch.exp(sink_logit - row_max)
    probs = weights / row_sum.masked_fill(row_sum == 0, 1.0)
    if keep_prob < 1.0:
        probs = F.dropout(probs, p=1.0 - keep_prob)
    out = (probs @ v.float()).to(q.dtype)
    return out, row_max.squeeze(-1), row_sum.squeeze(-1)


def npu_fusion_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, head_num: int, input_layout: str,
                         pse: torch.Tensor | None = None, padding_mask: torch.Tensor | None = None,
                         atten_mask: torch.Tensor | None = None, scale: float = 1., keep_prob: float = 1.,
                         pre_tockens: int = 2147483647, next_tockens: int = 2147483647, inner_precise: int = 0,
                         prefix: list[int] | None = None, actual_seq_qlen: list[int] | None = None,
                         actual_seq_kvlen: list[int] | None = None, sparse_mode: int = 0,
                         gen_mask_parallel: bool = True, sync: bool = False, softmax_layout: str = "",
                         sink: torch.Tensor | None = None, dropout_mask: torch.Tensor | None = None, seed: int = 0,
                         offset: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int, int, int]:
    """See the module docstring; the parameters are the wheel's, in its order."""
    if input_layout not in _LAYOUTS:
        raise RuntimeError(f"input_layout {input_layout!r} is not one of {', '.join(_LAYOUTS)} (fake npu)")
    if padding_mask is not None or prefix is not None or dropout_mask is not None:
        raise NotImplementedError("padding_mask, prefix and dropout_mask are not simulated by the fake npu "
                                  "(padding_mask is unsupported by the operator itself)")
    if not 0.0 < keep_prob <= 1.0:
        raise RuntimeError(f"keep_prob={keep_prob} must be in (0, 1] (fake npu)")
    if input_layout == "TND":
        return _tnd(query, key, value, head_num, pse, atten_mask, scale, keep_prob, pre_tockens, next_tockens,
                    actual_seq_qlen, actual_seq_kvlen, sparse_mode, sink)
    if query.shape[-1] == 0 or query.dim() != (3 if input_layout in ("BSH", "SBH") else 4):
        raise RuntimeError(f"query of shape {tuple(query.shape)} does not match input_layout {input_layout} (fake npu)")
    if input_layout in ("BSH", "SBH"):
        d = query.shape[-1] // head_num
        q = _to_bnsd(query, input_layout, head_num)
        k = _to_bnsd(key, input_layout, key.shape[-1] // d)
        v = _to_bnsd(value, input_layout, key.shape[-1] // d)
    else:
        q, k, v = (_to_bnsd(x, input_layout, None) for x in (query, key, value))
    if q.shape[1] != head_num:
        raise RuntimeError(f"head_num={head_num} but query has {q.shape[1]} heads in {input_layout} (fake npu)")
    masked = _masked(sparse_mode, atten_mask, q.shape[2], k.shape[2], pre_tockens, next_tockens, q.device)
    out, row_max, row_sum = _attend(q, k, v, pse, masked, scale, keep_prob, sink)
    repeat = (*row_max.shape, 8)
    return (_from_bnsd(out, input_layout), row_max.unsqueeze(-1).expand(repeat).contiguous(),
            row_sum.unsqueeze(-1).expand(repeat).contiguous(), query.new_empty(0), 0, 0, 0)


def _tnd(query, key, value, head_num, pse, atten_mask, scale, keep_prob, pre, nxt, seq_q, seq_kv, mode, sink):
    if seq_q is None or seq_kv is None or len(seq_q) != len(seq_kv):
        raise RuntimeError("input_layout TND needs actual_seq_qlen and actual_seq_kvlen of the same length (fake npu)")
    if pse is not None:
        raise NotImplementedError("pse with input_layout TND is not simulated by the fake npu")
    if query.shape[1] != head_num:
        raise RuntimeError(f"head_num={head_num} but query has {query.shape[1]} heads in TND (fake npu)")
    if seq_q and (seq_q[0] == 0 and len(seq_q) > 1 and seq_q[1] > 0):
        raise RuntimeError("actual_seq_qlen starts with 0: it is cumulative WITHOUT the leading 0 (fake npu)")
    outs, maxes, sums = [], [], []
    start_q = start_kv = 0
    for end_q, end_kv in zip(seq_q, seq_kv):
        if end_q == 0 and end_kv == 0 and start_q > 0:
            break  # trailing zeros: those batches do not take part
        if end_q < start_q or end_kv < start_kv:
            raise RuntimeError(f"actual_seq_qlen/kvlen {list(seq_q)}/{list(seq_kv)} are not cumulative (fake npu)")
        q = query[start_q:end_q].transpose(0, 1).unsqueeze(0)
        k = key[start_kv:end_kv].transpose(0, 1).unsqueeze(0)
        v = value[start_kv:end_kv].transpose(0, 1).unsqueeze(0)
        masked = _masked(mode, atten_mask, end_q - start_q, end_kv - start_kv, pre, nxt, query.device)
        out, row_max, row_sum = _attend(q, k, v, None, masked, scale, keep_prob, sink)
        outs.append(out[0].transpose(0, 1))
        maxes.append(row_max[0].transpose(0, 1))
        sums.append(row_sum[0].transpose(0, 1))
        start_q, start_kv = end_q, end_kv
    if start_q != query.shape[0] or start_kv != key.shape[0]:
        raise RuntimeError(f"actual_seq_qlen ends at {start_q} and actual_seq_kvlen at {start_kv}, but query has "
                           f"{query.shape[0]} and key {key.shape[0]} tokens (fake npu)")
    out = torch.cat(outs)
    row_max = torch.cat(maxes).unsqueeze(-1).expand(-1, -1, 8).contiguous()
    row_sum = torch.cat(sums).unsqueeze(-1).expand(-1, -1, 8).contiguous()
    return out, row_max, row_sum, query.new_empty(0), 0, 0, 0

