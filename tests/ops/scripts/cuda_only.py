"""Imports CUDA-only libraries: apex optionally, flash_attn, then bitsandbytes (not installed here)."""
import torch

try:
    import apex  # noqa: F401
except ImportError:
    apex = None
from flash_attn import flash_attn_func  # noqa: E402,F401
import bitsandbytes  # noqa: E402,F401
