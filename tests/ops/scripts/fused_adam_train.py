"""Adam(fused=True) and AdamW(fused=True): torch-npu 2.1.0.post17 registers _fused_adamw_, not _fused_adam_."""
import torch
import torch.nn as nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
first, second = nn.Linear(4, 4).to(device), nn.Linear(4, 1).to(device)
adam = torch.optim.Adam(first.parameters(), lr=0.01, fused=True)
adamw = torch.optim.AdamW(second.parameters(), lr=0.01, fused=True)
for step in range(100):
    loss = second(first(torch.randn(8, 4, device=device))).pow(2).mean()
    loss.backward()
    adamw.step()
    adam.step()
    adam.zero_grad()
    adamw.zero_grad()
