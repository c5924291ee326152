"""Trains through composite kernels whose callees the releases lack: logcumsumexp (its kernel calls
aten::_logcumsumexp, forward and backward), huber_loss's backward (huber_loss_backward.out) and
bitwise_left_shift by a number (its .Tensor overload: not registered by 2.1.0.post17)."""
import torch
import torch.nn as nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
model = nn.Linear(8, 8).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(100):
    x = torch.rand(4, 8).to(device)
    scores = torch.logcumsumexp(model(x), dim=1)
    shifted = torch.bitwise_left_shift((x * 8).long(), 2)
    loss = nn.functional.huber_loss(scores, shifted.float() / 32)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
