"""The attention helper's argument types: causal corners, sliding windows, their masks, ALiBi biases.

Usage::

    from npu_migrate.libs.masks import Causal, keep_mask, normalize_window

    causal, window = normalize_window((128, 0), Causal.NONE)   # (Causal.NONE, (128, 0)); (-1, 0) -> BOTTOM_RIGHT
    keep = keep_mask(4, 6, causal, window)                     # bool [Sq, Skv]: True where i may read j

Shared by :mod:`.attention` (SDPA on every device) and :mod:`.npu_attention` (torch_npu's fused
kernel), which both read flash-attn's conventions the same way (see :mod:`.attention`'s docstring).
"""

from __future__ import annotations

import enum
from typing import Sequence

import torch

from npu_migrate.errors import MigrationError

UNBOUNDED = -1  # flash-attn's spelling of "no limit" in window_size


class Causal(enum.Enum):
    """Which corner the causal diagonal starts from when the query and key lengths differ."""

    NONE = "none"
    TOP_LEFT = "top_left"  # key j <= query i (torch SDPA is_causal, xformers LowerTriangularMask)
    BOTTOM_RIGHT = "bottom_right"  # key j <= i + Skv - Sq (flash-attn >= 2.1 causal=True)


def reject(argument: str, value: object, fix: str) -> MigrationError:
    """The error for an argument that has no equivalent: names it, its value and what to do."""
    return MigrationError(f"{argument}={value!r} has no equivalent outside CUDA kernels; {fix}")


def normalize_window(window: Sequence[int] | None, causal: Causal) -> tuple[Causal, tuple[int, int] | None]:
    """The causal mode and ``(left, right)`` window (``-1`` unbounded) that say the same with the least masking.

    Causal bottom-right folds into the window as ``right = 0``; a window that is only ``(-1, 0)`` is
    bottom-right causal (SDPA's ``is_causal`` or the NPU's ``sparse_mode=3``, no band); ``(-1, -1)`` is
    no window.

    Raises:
        MigrationError: a window with a top-left causal mask (no library API means that).
        ValueError: not two integers >= -1.
    """
    if window is None:
        return causal, None
    left, right = (int(w) for w in window)
    if left < UNBOUNDED or right < UNBOUNDED:
        raise ValueError(f"window_size={tuple(window)!r} is not valid: expected two integers >= -1 (-1 = unbounded).")
    if causal is Causal.BOTTOM_RIGHT:
        right = 0
    elif causal is Causal.TOP_LEFT and (left, right) != (UNBOUNDED, UNBOUNDED):
        raise reject("window_size", tuple(window), "a sliding window is aligned bottom-right (flash-attn, xformers' "
                     "LocalAttentionFromBottomRightMask); use Causal.BOTTOM_RIGHT with it.")
    if (left, right) == (UNBOUNDED, UNBOUNDED):
        return causal, None
    if (left, right) == (UNBOUNDED, 0):
        return Causal.BOTTOM_RIGHT, None
    return causal, (left, right)


def keep_mask(sq: int, skv: int, causal: Causal, window: tuple[int, int] | None,
              device: torch.device | str = "cpu") -> torch.Tensor | None:
    """Boolean ``[Sq, Skv]``, True where query ``i`` may read key ``j``; ``None`` when every pair is kept."""
    if causal is Causal.NONE and window is None:
        return None
    if causal is Causal.TOP_LEFT and window is None:
        return torch.ones(sq, skv, dtype=torch.bool, device=device).tril()
    offset = skv - sq  # the bottom-right diagonal: query i sits at key i + offset
    left, right = window if window is not None else (UNBOUNDED, 0)
    i = torch.arange(sq, device=device).unsqueeze(1) + offset
    j = torch.arange(skv, device=device).unsqueeze(0)
    keep = torch.ones(sq, skv, dtype=torch.bool, device=device)
    if right != UNBOUNDED:
        keep &= j <= i + right
    if left != UNBOUNDED:
        keep &= j >= i - left
    return keep


def alibi_bias(slopes: torch.Tensor, sq: int, skv: int) -> torch.Tensor:
    """flash-attn's ALiBi: ``-slope[h] * |i + Skv - Sq - j|`` as a float32 bias ``[B or 1, H, Sq, Skv]``."""
    i = torch.arange(sq, device=slopes.device).unsqueeze(1) + (skv - sq)
    j = torch.arange(skv, device=slopes.device).unsqueeze(0)
    distance = (i - j).abs().float()
    slopes = slopes.float()
    if slopes.dim() == 1:
        slopes = slopes.unsqueeze(0)
    return -slopes[:, :, None, None] * distance
