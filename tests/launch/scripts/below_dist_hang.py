"""Collectives a rank waits in below ``torch.distributed.*`` (fixture of the hang-detection tests).

``--mode async``: an ``all_reduce(async_op=True)`` returns at once; rank 0 then blocks in
``Work.wait()`` while rank 1 never issues it. ``--mode buffers``: a DDP model with BatchNorm
buffers, which DDP broadcasts from rank 0 (in C++) at each forward; rank 0 stops before its third
forward and rank 1 waits for the buffers. (The second forward rebuilds DDP's buckets, another
broadcast from C++ that is not recorded.)
"""

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--mode", choices=("async", "buffers"), required=True)
mode = parser.parse_args().mode
dist.init_process_group("gloo")
rank = dist.get_rank()
if mode == "async":
    dist.all_reduce(torch.ones(1))
    if rank == 1:
        print("rank 1 stops before its asynchronous all_reduce", flush=True)
        time.sleep(3600)
    work = dist.all_reduce(torch.ones(1), async_op=True)
    work.wait()
else:
    model = DDP(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)))
    for _ in range(2):
        model(torch.randn(8, 4)).sum().backward()
    if rank == 0:
        print("rank 0 stops before its third forward", flush=True)
        time.sleep(3600)
    model(torch.randn(8, 4)).sum().backward()
