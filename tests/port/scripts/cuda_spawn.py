"""A CUDA-only DDP job that spawns its own workers (the mp.spawn style of Ascend's migration guide).

Usage (as written it needs NVIDIA GPUs; the port tests port it and run it on CPU)::

    python cuda_spawn.py --world-size 2 --rank 0 --port 29501 --out-dir out   # node 0
    python cuda_spawn.py --world-size 2 --rank 1 --port 29501 --out-dir out   # node 1

``--world-size`` counts nodes and ``--rank`` is this node's index; every node starts one worker per
GPU it has. Each worker writes its final parameters to OUT_DIR/rank{global rank}.json.
"""

import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP


def train(gpu, ngpus_per_node, opt):
    world_size = ngpus_per_node * opt.world_size  # all workers of all nodes
    rank = opt.rank * ngpus_per_node + gpu
    dist.init_process_group(backend="nccl", init_method=f"tcp://{opt.addr}:{opt.port}",
                            world_size=world_size, rank=rank)
    torch.cuda.set_device(gpu)
    device = torch.device(f"cuda:{gpu}")
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1).to(device)
    model = DDP(model, device_ids=[gpu])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.Generator().manual_seed(rank)
    for _ in range(opt.steps):
        x = torch.randn(8, 4, generator=data).to(device)
        loss = (model(x) - x.mean(dim=1, keepdim=True)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    params = [p.detach().cpu().flatten().tolist() for p in model.parameters()]
    with open(os.path.join(opt.out_dir, f"rank{rank}.json"), "w") as fh:
        json.dump({"rank": rank, "world_size": world_size, "params": params}, fh)
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--world-size", default=1, type=int, help="number of nodes")
    parser.add_argument("--rank", default=0, type=int, help="index of this node")
    parser.add_argument("--addr", default="127.0.0.1", type=str, help="master IP")
    parser.add_argument("--port", default=29501, type=int, help="master port")
    parser.add_argument("--steps", default=3, type=int)
    parser.add_argument("--out-dir", default=".")
    opt = parser.parse_args()
    ngpus_per_node = torch.cuda.device_count()
    mp.spawn(train, nprocs=ngpus_per_node, args=(ngpus_per_node, opt))
