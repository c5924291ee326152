"""The twin of naive_llama.py written the fused way: `npu-migrate advise` has nothing to say about it."""

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

DIM, HEADS, VOCAB, SEQ = 32, 4, 64, 16


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(DIM, 3 * DIM, bias=False)
        self.out = nn.Linear(DIM, DIM, bias=False)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, DIM))


class Block(nn.Module):
    """A parallel block (GPT-J): one LayerNorm feeds attention and the GELU MLP."""

    def __init__(self):
        super().__init__()
        self.norm, self.attn = nn.LayerNorm(DIM), Attention()
        self.mlp = nn.Sequential(nn.Linear(DIM, 64), nn.GELU(), nn.Linear(64, DIM))

    def forward(self, x):
        h = self.norm(x)
        return x + self.attn(h) + self.mlp(h)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.block, self.head = nn.Embedding(VOCAB, DIM), Block(), nn.Linear(DIM, VOCAB)

    def forward(self, tokens):
        return self.head(self.block(self.emb(tokens)))


def main():
    torch.manual_seed(0)
    device = torch.device("cuda")
    model = Model().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    data = TensorDataset(torch.randint(0, VOCAB, (16, SEQ)), torch.randint(0, VOCAB, (16, SEQ)))
    loader = DataLoader(data, batch_size=4, shuffle=True, num_workers=2, pin_memory=True, persistent_workers=True)
    losses = []
    for step in range(3):
        for tokens, targets in loader:
            tokens, targets = tokens.to(device, non_blocking=True), targets.to(device, non_blocking=True)
            loss = F.cross_entropy(model(tokens).flatten(0, 1), targets.flatten())
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(loss.detach())
    print("mean loss", torch.stack(losses).mean().item())


if __name__ == "__main__":
    main()
