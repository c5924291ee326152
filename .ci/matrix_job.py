"""A rank of .ci/matrix's launcher jobs (1 node, 2 nodes): join, train 3 DDP steps, all-reduce once.

Run under the launcher (torchrun's variables set); writes $OUT_DIR/rank{RANK}.json with what the
rank saw and its final parameters, which .ci/matrix compares across ranks.
"""

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import npu_migrate as nm

info = nm.init_distributed()
torch.manual_seed(0)
model = DDP(torch.nn.Linear(4, 1).to(info.device), device_ids=info.device_ids)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.Generator().manual_seed(info.rank)  # every rank its own batches
for _ in range(3):
    x = torch.randn(8, 4, generator=data).to(info.device)
    loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
total = torch.tensor([float(info.rank + 1)], device=info.device)
dist.all_reduce(total)
report = {
    "rank": info.rank,
    "world_size": info.world_size,
    "node_rank": info.node_rank,
    "backend": str(dist.get_backend()),
    "all_reduce_sum": total.item(),
    "params": [p.detach().cpu().flatten().tolist() for p in model.module.parameters()],
}
nm.destroy_distributed()
Path(os.environ["OUT_DIR"], f"rank{info.rank}.json").write_text(json.dumps(report))
