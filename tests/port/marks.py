"""Markers shared by the port tests."""

from __future__ import annotations

import pytest
import torch

# --style torch writes torch.accelerator / torch.get_device_module code, which torch < 2.6 lacks.
torch_style_runs = pytest.mark.skipif(
    not (hasattr(torch, "accelerator") and hasattr(torch.accelerator, "current_accelerator")
         and hasattr(torch, "get_device_module")),
    reason=f"--style torch output calls torch.accelerator.current_accelerator and torch.get_device_module, "
           f"which torch {torch.__version__} lacks (torch >= 2.6)",
)
