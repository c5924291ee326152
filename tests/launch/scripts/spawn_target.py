"""Function targets for npu_migrate.launch.spawn (module level, so workers can import them)."""

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

import npu_migrate as nm


def train(local_rank: int, out_dir: str, fail_rank: int = -1) -> None:
    info = nm.init_distributed()
    if info.rank == fail_rank:
        raise RuntimeError(f"train failed on rank {info.rank}")
    t = torch.ones(1) * (info.rank + 1)
    dist.all_reduce(t)
    Path(out_dir, f"rank{info.rank}.json").write_text(json.dumps(
        {"local_rank_arg": local_rank, "rank": info.rank, "env_rank": os.environ["RANK"], "sum": t.item()}))
    nm.destroy_distributed()
