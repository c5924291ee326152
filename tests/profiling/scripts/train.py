"""A tiny training script as users write them, unmodified: ``--cuda`` makes it a CUDA script (for --migrate).

Runs as one process (``npu-migrate run``) or as ranks under the launcher (``--ddp``): a small MLP,
SGD, ``--steps`` optimizer steps.
"""

import argparse
import os

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--cuda", action="store_true")
parser.add_argument("--ddp", action="store_true")
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--own-profile", type=int, default=0,
                    help="profile steps N to N+2 with the script's own torch.profiler, and print its event count")
args = parser.parse_args()

device = torch.device("cpu")
if args.cuda:
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
if args.ddp:
    dist.init_process_group("nccl" if args.cuda else "gloo")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).to(device)
if args.ddp:
    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if args.cuda else None)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
own = None
for step in range(1, args.steps + 1):
    if step == args.own_profile:
        own = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        own.start()
    loss = model(torch.randn(16, 32, device=device)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if own is not None and step == args.own_profile + 2:
        own.stop()
        print(f"own profile: {len(own.events())} events", flush=True)
if args.ddp:
    dist.destroy_process_group()
