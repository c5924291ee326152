"""cuda_torchrun.py written for the CPU by hand: the reference for numerical transparency."""

import json
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

dist.init_process_group(backend="gloo")
rank = dist.get_rank()
torch.manual_seed(1234)

model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 3))
model = DDP(model)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)

data = TensorDataset(torch.randn(96, 12), torch.randint(0, 3, (96,)))
sampler = DistributedSampler(data, shuffle=True, seed=7)
loader = DataLoader(data, batch_size=16, sampler=sampler)
for epoch in range(2):
    sampler.set_epoch(epoch)
    for x, y in loader:
        with torch.autocast("cpu"):
            loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

with open(os.path.join(os.environ["OUT_DIR"], f"rank{rank}.json"), "w") as fh:
    json.dump({"rank": rank, "params": [p.detach().flatten().tolist() for p in model.module.parameters()]}, fh)
dist.destroy_process_group()
