"""Seed 003's pattern: one process per device started with torch.multiprocessing.spawn.

The worker lives at module level so spawn can pickle it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

import npu_migrate as nm


def worker(local_rank: int, nproc: int, port: int, out_dir: str) -> None:
    os.environ.update(
        RANK=str(local_rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(nproc),
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
    )
    info = nm.init_distributed()
    ranks = [None] * info.world_size
    dist.all_gather_object(ranks, info.rank)
    t = torch.ones(3) * (info.rank + 1)
    dist.all_reduce(t)
    Path(out_dir, f"rank{info.rank}.json").write_text(
        json.dumps({"rank": info.rank, "backend": info.backend, "ranks": ranks, "sum": t.tolist()})
    )
    nm.destroy_distributed()
