"""nn.MultiheadAttention asked for its weights (need_weights=True, the default) runs the math path;
without them, and in nn.TransformerEncoderLayer, scaled_dot_product_attention."""
import torch
import torch.nn as nn


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.weighted = nn.MultiheadAttention(32, 4, batch_first=True)
        self.plain = nn.MultiheadAttention(32, 4, batch_first=True)
        self.layer = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True)

    def forward(self, x, mask):
        a, _ = self.weighted(x, x, x, attn_mask=mask)  # advise: mha_need_weights
        b, _ = self.plain(a, a, a, attn_mask=mask, need_weights=False)
        return self.layer(b)  # advise: add_layer_norm (inside nn.TransformerEncoderLayer)


def main():
    device = torch.device("cuda")
    model = Encoder().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), fused=True)
    mask = torch.triu(torch.ones(8, 8, dtype=torch.bool), 1).to(device)
    for _ in range(4):
        loss = model(torch.randn(2, 8, 32, device=device), mask).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
