"""nn.MultiheadAttention without weights and nn.TransformerEncoderLayer call scaled_dot_product_attention
from inside F.multi_head_attention_forward: the release's SDPA kernel, not torch's CPU backends."""
import torch
import torch.nn as nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
attention = nn.MultiheadAttention(32, 4, batch_first=True).to(device)
layer = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True).to(device)
optimizer = torch.optim.SGD([*attention.parameters(), *layer.parameters()], lr=0.01)
for step in range(100):
    x = torch.randn(2, 8, 32, device=device)
    a, _ = attention(x, x, x, need_weights=False)
    loss = layer(a).square().mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
