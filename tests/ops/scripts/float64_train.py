"""Trains a small MLP in float64 on the device (a risk on the NPU)."""
import torch
import torch.nn as nn

device = "cuda:0"
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1)).to(device, dtype=torch.float64)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(100):
    x = torch.randn(16, 4, dtype=torch.float64).cuda()
    loss = nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
