"""A script that starts its own ranks with ``torch.multiprocessing.spawn`` (no launcher, no RANK): 2 ranks, gloo."""

import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank: int, port: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(4):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(worker, args=(os.environ["PORT"],), nprocs=2)
