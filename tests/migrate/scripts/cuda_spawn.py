"""Seed 003's self-spawning CUDA/NCCL pattern, unmodified (test fixture for `npu-migrate run`).

--world-size is the number of nodes, --rank this node's index; one worker per CUDA device.
"""

import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def train(gpu, ngpus_per_node, opt):
    world_size = ngpus_per_node * opt.world_size
    rank = opt.rank * ngpus_per_node + gpu
    dist.init_process_group(backend="nccl", init_method=f"tcp://{opt.addr}:{opt.port}",
                            world_size=world_size, rank=rank)
    torch.cuda.set_device(gpu)
    torch.manual_seed(0)
    model = DDP(nn.Linear(6, 2).cuda(gpu), device_ids=[gpu])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    for _ in range(4):
        x = torch.randn(8, 6, generator=g).cuda(gpu)
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    # A DataLoader worker started with spawn is a fresh interpreter: it must migrate too.
    loader = torch.utils.data.DataLoader(list(range(4)), num_workers=1, multiprocessing_context="spawn",
                                         worker_init_fn=_record_worker)
    seen = [int(b) for batch in loader for b in batch]
    with open(os.path.join(opt.out, f"rank{rank}.json"), "w") as fh:
        json.dump({"rank": rank, "world_size": world_size, "backend": dist.get_backend(),
                   "device_count": torch.cuda.device_count(), "seen": seen,
                   "params": [p.detach().cpu().flatten().tolist() for p in model.module.parameters()]}, fh)
    dist.destroy_process_group()


def _record_worker(worker_id):
    with open(os.path.join(os.environ["OUT_DIR"], f"worker-{os.getpid()}.json"), "w") as fh:
        json.dump({"cuda_available": torch.cuda.is_available(), "device_count": torch.cuda.device_count()}, fh)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--world-size", default=1, type=int, help="number of nodes")
    parser.add_argument("--rank", default=0, type=int, help="index of this node")
    parser.add_argument("--addr", default="127.0.0.1")
    parser.add_argument("--port", default=29501, type=int)
    parser.add_argument("--out", default=os.environ.get("OUT_DIR", "."))
    opt = parser.parse_args()
    ngpus_per_node = torch.cuda.device_count()
    mp.spawn(train, nprocs=ngpus_per_node, args=(ngpus_per_node, opt))
