"""Imports CUDA-only libraries: apex optionally, flash_attn unconditionally (it is not installed here)."""
import torch

try:
    import apex  # noqa: F401
except ImportError:
    apex = None
from flash_attn import flash_attn_func  # noqa: E402,F401
