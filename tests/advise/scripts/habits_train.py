"""Habits that slow an NPU step down, each marked with the rule `npu-migrate advise` gives it."""

import torch
import torch.nn as nn

torch.autograd.set_detect_anomaly(True)  # advise: anomaly_detection


def main():
    device = torch.device("cuda")
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)  # advise: fused_optimizer
    for step in range(4):
        x = torch.randn(32, 8, device=device)
        scale = torch.ones(32, 1, dtype=torch.float64, device=device)  # advise: float64
        loss = (model(x).double() * scale).mean()  # advise: float64
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=False)  # advise: clip_grad_norm
        optimizer.step()
        torch.cuda.empty_cache()  # advise: empty_cache


if __name__ == "__main__":
    main()
