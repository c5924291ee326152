"""Inference with nn.TransformerEncoderLayer in eval mode: its fast path (_transformer_encoder_layer_fwd)."""
import torch
import torch.nn as nn

device = "cuda"
torch.manual_seed(0)
layer = nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32, batch_first=True).cuda().eval()
with torch.no_grad():
    for _ in range(3):
        out = layer(torch.randn(2, 5, 16, device=device))
print("output", tuple(out.shape))
