"""How users write the patterns besides naive_llama.py: an RMSNorm in one line, T5's with sqrt and
div, SwiGLU through an nn.SiLU module (transformers' LlamaMLP), SwiGLU and GeGLU on chunks of one
Linear, and Adam(fused=True), whose fused kernel torch-npu 2.1.0.post17 does not register."""
import torch
import torch.nn as nn
import torch.nn.functional as F

D = 32


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))  # advise: rms_norm


class T5LayerNorm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return self.weight * (x / torch.sqrt(torch.mean(x * x, dim=-1, keepdim=True) + 1e-6))  # advise: rms_norm


class LlamaMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_proj = nn.Linear(D, 2 * D, bias=False)
        self.up_proj = nn.Linear(D, 2 * D, bias=False)
        self.down_proj = nn.Linear(2 * D, D, bias=False)
        self.act_fn = nn.SiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))  # advise: swiglu


class ChunkedGLU(nn.Module):
    def __init__(self):
        super().__init__()
        self.w12 = nn.Linear(D, 4 * D)
        self.w3 = nn.Linear(2 * D, D)
        self.wg = nn.Linear(D, 4 * D)
        self.wo = nn.Linear(2 * D, D)

    def forward(self, x):
        a, b = self.w12(x).chunk(2, dim=-1)
        y = self.w3(F.silu(a) * b)  # advise: swiglu
        g, h = self.wg(x).chunk(2, dim=-1)
        return y + self.wo(F.gelu(g) * h)  # advise: geglu


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.n1 = RMSNorm(D)
        self.n2 = T5LayerNorm(D)
        self.mlp = LlamaMLP()
        self.glu = ChunkedGLU()

    def forward(self, x):
        return self.glu(self.n2(self.mlp(self.n1(x))))


def main():
    device = torch.device("cuda")
    model = Net().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)  # (2.1.0.post17: fused_optimizer)
    for _ in range(4):
        x = torch.randn(2, 8, D, device=device)
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
