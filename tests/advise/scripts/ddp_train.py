"""DDP with gradient accumulation and SyncBatchNorm: the all-reduces `npu-migrate advise` counts.

With the argument ``fixed``: BatchNorm per rank, and ``no_sync()`` for every micro-batch but the last.
"""

import contextlib
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

ACCUMULATE = 2


def main():
    dist.init_process_group("gloo")
    device = torch.device("cuda")
    net = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 1))
    fixed = sys.argv[1:] == ["fixed"]
    if not fixed:
        net = nn.SyncBatchNorm.convert_sync_batchnorm(net)  # advise: sync_batchnorm
    net = net.to(device)
    model = DDP(net)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    for step in range(4):
        for micro in range(ACCUMULATE):
            last = micro == ACCUMULATE - 1
            with model.no_sync() if fixed and not last else contextlib.nullcontext():
                loss = model(torch.randn(16, 8, device=device)).square().mean()  # advise: ddp_no_sync
                loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
