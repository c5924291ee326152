"""An unmodified DDP + AMP script written for ``torch.accelerator`` (test fixture for runtime migration).

As pytorch/examples' minGPT-DDP (2025) does it: a device check on ``torch.accelerator`` that
exits 0 without training where it fails, the backend from ``get_default_backend_for_device``,
``init_process_group(device_id=)``, DDP with ``device_ids``, float16 autocast and a GradScaler on
the accelerator's device type. Writes $OUT_DIR/rank{RANK}.json.
"""

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

if not (torch.accelerator.is_available() and torch.accelerator.device_count() >= 2):
    print("Unable to locate sufficient 2 gpus to run this example. Exiting.")
    sys.exit()

local_rank = int(os.environ["LOCAL_RANK"])
acc = torch.accelerator.current_accelerator()
device = torch.device(f"{acc}:{local_rank}")
torch.accelerator.set_device_index(local_rank)
dist.init_process_group(backend=dist.get_default_backend_for_device(device), device_id=device)
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1)).to(device), device_ids=[local_rank])
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
scaler = torch.amp.GradScaler(device.type)
data = torch.Generator().manual_seed(100 + rank)
losses = []
for _ in range(10):
    x = torch.randn(16, 8, generator=data).to(device)
    with torch.amp.autocast(device_type=device.type, dtype=torch.float16):
        loss = model(x).float().pow(2).mean()
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    losses.append(loss.item())
torch.accelerator.synchronize()
report = {
    "rank": rank, "backend": dist.get_backend(), "device": str(device), "count": torch.accelerator.device_count(),
    "current": torch.accelerator.current_device_index(), "first_loss": losses[0], "last_loss": losses[-1],
    "params": [round(v, 6) for v in next(model.parameters()).detach().flatten()[:8].tolist()],
}
with open(os.path.join(os.environ["OUT_DIR"], f"rank{rank}.json"), "w") as fh:
    json.dump(report, fh)
dist.destroy_process_group()
