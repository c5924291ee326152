"""Moves tensors to devices read from tensors, as torch's clip_grad_norm_ does and as users write
(x.to(y.device), torch.zeros(..., device=x.device)): on the NPU none of them is a host copy. One
explicit copy to torch.device("cpu") a step is."""
import torch
import torch.nn as nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
model = nn.Linear(4, 4).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(100):
    x = torch.randn(8, 4, device=device)
    bias = torch.zeros(4, device=x.device)
    loss = (model(x) + bias).pow(2).mean().to(x.device)
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    kept = loss.detach().to(torch.device("cpu"))
    optimizer.step()
