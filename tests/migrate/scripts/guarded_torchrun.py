"""A CUDA DDP script with the guards torchrun scripts carry (input of the ported-guard test).

Its device-count assertion is ported to ``nm.device_count()``, which on CPU counts the ranks the
launcher started on the node. Writes $OUT_DIR/rank{RANK}.json.
"""

import json
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

local_rank = int(os.environ["LOCAL_RANK"])
assert torch.cuda.is_available(), "this script needs a GPU"
assert local_rank < torch.cuda.device_count(), (local_rank, torch.cuda.device_count())
torch.cuda.set_device(local_rank)
dist.init_process_group("nccl")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(torch.nn.Linear(4, 2).cuda(), device_ids=[local_rank])
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.Generator().manual_seed(10 + rank)
for _ in range(3):
    loss = model(torch.randn(8, 4, generator=data).cuda()).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
report = {"rank": rank, "device_count": torch.cuda.device_count(),
          "params": [round(v, 6) for v in model.module.weight.detach().flatten().tolist()]}
with open(os.path.join(os.environ["OUT_DIR"], f"rank{rank}.json"), "w") as fh:
    json.dump(report, fh)
dist.destroy_process_group()
