"""An unmodified CUDA/NCCL DDP script, torchrun style (test fixture for runtime migration).

Writes $OUT_DIR/rank{RANK}.json with its final parameters. tests/migrate/scripts/cpu_torchrun.py
is the same script written for the CPU, for the numerical-transparency test.
"""

import json
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
dist.init_process_group(backend="nccl")
rank = dist.get_rank()
device = torch.device("cuda", local_rank)
torch.manual_seed(1234)
torch.cuda.manual_seed_all(1234)
torch.backends.cudnn.benchmark = True

model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 3)).cuda()
model = DDP(model, device_ids=[local_rank], output_device=local_rank)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
scaler = torch.cuda.amp.GradScaler()

data = TensorDataset(torch.randn(96, 12), torch.randint(0, 3, (96,)))
sampler = DistributedSampler(data, shuffle=True, seed=7)
loader = DataLoader(data, batch_size=16, sampler=sampler, pin_memory=True)
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
start.record()
for epoch in range(2):
    sampler.set_epoch(epoch)
    for x, y in loader:
        x, y = x.cuda(non_blocking=True), y.to(device, non_blocking=True)
        with torch.cuda.amp.autocast():
            loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
end.record()
torch.cuda.synchronize()

out = os.environ["OUT_DIR"]
ckpt_dir = os.path.join(out, "runs", "cuda_exp")  # a path that merely contains "cuda"
os.makedirs(ckpt_dir, exist_ok=True)
if rank == 0:
    torch.save({"model": model.module.state_dict(), "cuda_version": "12.1"}, os.path.join(ckpt_dir, "model.pt"))
dist.barrier(device_ids=[local_rank])
state = torch.load(os.path.join(ckpt_dir, "model.pt"), map_location="cuda:%d" % local_rank, weights_only=True)
report = {
    "rank": rank,
    "backend": dist.get_backend(),
    "cuda_available": torch.cuda.is_available(),
    "device_count": torch.cuda.device_count(),
    "current_device": torch.cuda.current_device(),
    "elapsed_ms_positive": start.elapsed_time(end) > 0,
    "checkpoint_keys": sorted(state),
    "cuda_version": state["cuda_version"],
    "params": [p.detach().cpu().flatten().tolist() for p in model.module.parameters()],
    "memory_allocated": torch.cuda.memory_allocated(),
}
with open(os.path.join(out, f"rank{rank}.json"), "w") as fh:
    json.dump(report, fh)
dist.destroy_process_group()
