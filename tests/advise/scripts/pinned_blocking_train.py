"""A DataLoader with workers and pinned memory whose batches are copied without non_blocking=True."""
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    device = torch.device("cuda")
    model = nn.Linear(8, 1).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1, fused=True)
    data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    loader = DataLoader(data, batch_size=8, num_workers=2, pin_memory=True)
    for x, y in loader:
        x, y = x.to(device), y.to(device, non_blocking=True)  # advise: non_blocking
        loss = (model(x) - y).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
