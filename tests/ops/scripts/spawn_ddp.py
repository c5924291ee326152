"""DDP over NCCL started with mp.spawn on every CUDA device (the classic tutorial's shape)."""
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def worker(rank: int, world_size: int, out: str) -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("nccl", rank=rank, world_size=world_size)
    torch.cuda.set_device(rank)
    with open(out, "a") as fh:
        fh.write(f"{dist.get_rank()}/{dist.get_world_size()}\n")
    model = DDP(nn.Linear(4, 2).cuda(rank), device_ids=[rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(100):
        loss = model(torch.randn(8, 4).cuda(rank)).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    world_size = torch.cuda.device_count()
    mp.spawn(worker, args=(world_size, sys.argv[1]), nprocs=world_size)
