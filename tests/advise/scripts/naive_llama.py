"""A tiny LLaMA-style model written the naive way: every line `npu-migrate advise` should flag is marked."""

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

DIM, HEADS, VOCAB, SEQ = 32, 4, 64, 16


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(dim))

    def forward(self, x):
        variance = x.pow(2).mean(-1, keepdim=True)  # advise: rms_norm
        return self.weight * (x * torch.rsqrt(variance + self.eps))


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(DIM, 3 * DIM, bias=False)
        self.out = nn.Linear(DIM, DIM, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
        q = q * cos + rotate_half(q) * sin  # advise: rotary
        k = k * cos + rotate_half(k) * sin  # advise: rotary
        scores = q @ k.transpose(-2, -1) / (DIM // HEADS) ** 0.5  # advise: attention
        mask = torch.full((t, t), float("-inf"), device=x.device).triu(1)
        probs = F.softmax(scores + mask, dim=-1)
        return self.out((probs @ v).transpose(1, 2).reshape(b, t, DIM))


class SwiGLU(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1, self.w2, self.w3 = nn.Linear(DIM, 64, bias=False), nn.Linear(64, DIM, bias=False), nn.Linear(DIM, 64, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))  # advise: swiglu


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.attn, self.norm2, self.mlp = RMSNorm(DIM), Attention(), RMSNorm(DIM), SwiGLU()

    def forward(self, x, cos, sin):
        h = x + self.attn(self.norm1(x), cos, sin)  # advise: add_rms_norm
        return h + self.mlp(self.norm2(h))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.block, self.head = nn.Embedding(VOCAB, DIM), Block(), nn.Linear(DIM, VOCAB)
        freqs = torch.outer(torch.arange(SEQ).float(), 1.0 / 10000 ** (torch.arange(0, DIM // HEADS, 2) / (DIM // HEADS)))
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, tokens):
        return self.head(self.block(self.emb(tokens), self.cos, self.sin))


def main():
    torch.manual_seed(0)
    device = torch.device("cuda")
    model = Model().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)  # advise: fused_optimizer
    data = TensorDataset(torch.randint(0, VOCAB, (16, SEQ)), torch.randint(0, VOCAB, (16, SEQ)))
    loader = DataLoader(data, batch_size=4, shuffle=True)  # advise: dataloader_workers, dataloader_pin_memory
    for step in range(3):
        for tokens, targets in loader:
            tokens, targets = tokens.to(device), targets.to(device)
            loss = F.cross_entropy(model(tokens).flatten(0, 1), targets.flatten())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            print(f"step {step} loss {loss.item():.4f}")  # advise: host_sync


if __name__ == "__main__":
    main()
