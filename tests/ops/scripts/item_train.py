"""Reads the loss with .item() every step (a host synchronisation per step)."""
import torch
import torch.nn as nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
model = nn.Linear(4, 1).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
losses = []
for step in range(100):
    x = torch.randn(8, 4, device=device)
    loss = model(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    losses.append(loss.item())
    optimizer.step()
