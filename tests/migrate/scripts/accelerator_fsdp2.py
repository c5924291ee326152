"""An unmodified FSDP2 script as written since torch 2.6 (test fixture for runtime migration).

It asks ``torch.accelerator`` for its devices, builds a DeviceMesh on the accelerator's type,
shards a meta-device model with ``fully_shard`` and a bfloat16 ``MixedPrecisionPolicy``,
materialises it with ``to_empty(device=)``, trains, saves a distributed checkpoint
(``torch.distributed.checkpoint``), reloads it into a fresh model and checks every shard came
back. Writes $OUT_DIR/rank{RANK}.json. With STOP_BEFORE_BACKWARD=R, rank R stops (sleeps) before
its first backward: the hang-detection test.
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

if not (torch.accelerator.is_available() and torch.accelerator.device_count() >= 2):
    print("Unable to locate sufficient 2 gpus to run this example. Exiting.")
    sys.exit()

local_rank = int(os.environ["LOCAL_RANK"])
acc = torch.accelerator.current_accelerator()
device = torch.device(f"{acc}:{local_rank}")
torch.accelerator.set_device_index(local_rank)
dist.init_process_group(backend=dist.get_default_backend_for_device(device), device_id=device)
rank, world = dist.get_rank(), dist.get_world_size()
mesh = init_device_mesh(acc.type, (world,))


def build() -> nn.Module:
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    model.to_empty(device=device)
    torch.manual_seed(0)
    for layer in model:
        if isinstance(layer, nn.Linear):
            layer.reset_parameters()
    return model


model = build()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
generator = torch.Generator().manual_seed(100 + rank)
target = distribute_tensor(torch.ones(4, 4), mesh, [Shard(0)])  # a DTensor the script made itself
losses = []
for step in range(8):
    x = torch.randn(8, 16, generator=generator).to(device)
    loss = model(x).float().pow(2).mean()
    if step == 0 and os.environ.get("STOP_BEFORE_BACKWARD") == str(rank):
        print(f"rank {rank} stops before its backward", flush=True)
        time.sleep(3600)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    losses.append(loss.item())

ckpt = os.path.join(os.environ["OUT_DIR"], "dcp")
dcp.save({"model": model.state_dict()}, checkpoint_id=ckpt)
fresh = build()
state = {"model": fresh.state_dict()}
dcp.load(state, checkpoint_id=ckpt)
fresh.load_state_dict(state["model"])
same = all(torch.equal(a.to_local(), b.to_local()) for a, b in zip(model.state_dict().values(), fresh.state_dict().values()))
params = next(iter(model.parameters()))
report = {
    "rank": rank, "world": world, "backend": dist.get_backend(), "mesh_device": mesh.device_type,
    "param_device": params.to_local().device.type, "dtensor": isinstance(params, DTensor) and isinstance(target, DTensor),
    "first_loss": losses[0], "last_loss": losses[-1], "reloaded_equal": same,
    "full": [round(v, 6) for v in params.full_tensor().flatten()[:8].tolist()],
}
with open(os.path.join(os.environ["OUT_DIR"], f"rank{rank}.json"), "w") as fh:
    json.dump(report, fh)
dist.destroy_process_group()
