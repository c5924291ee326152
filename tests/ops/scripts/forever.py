"""Inference that never ends by itself (no optimizer): the audit's --seconds ends it."""
import torch

weight = torch.randn(16, 16, device="cuda")
with torch.inference_mode():
    while True:
        x = torch.randn(4, 16, device="cuda")
        y = x @ weight
