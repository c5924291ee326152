"""Trains a layer whose output goes through torch.special.entr (no NPU kernel in 2.1.0.post17 or 2.14.0)."""
import torch
import torch.nn as nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
model = nn.Linear(8, 8).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(100):
    x = torch.rand(4, 8).to(device)
    loss = torch.special.entr(torch.sigmoid(model(x))).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
