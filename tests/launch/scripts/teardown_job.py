"""A rank that creates and destroys its process group ROUNDS times, each right after a collective.

Before torch 2.8, freeing a gloo group a moment after a collective finished could hang the process
for good (see npu_migrate/distributed.py); 20 rounds of this hung every 2-rank run on torch 2.1.2
before the fix. MODE says how the group is destroyed:

- ``nm``: ``nm.destroy_distributed()``, as the examples do;
- ``torch``: ``dist.destroy_process_group()`` after the launcher's own guard is installed;
- ``ddp``: the same, while a DDP model still holds the group, which is freed only when the
  model is.

Writes $OUT_DIR/rank{RANK}.json with the rounds done. Run with torchrun's variables set.
"""

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

import npu_migrate as nm
from npu_migrate.distributed import guard_destroy_process_group

ROUNDS = int(os.environ.get("ROUNDS", "20"))
MODE = os.environ["MODE"]
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
if MODE != "nm":
    guard_destroy_process_group()
store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, rank == 0)
sums = []
for round_ in range(ROUNDS):
    dist.init_process_group("gloo", store=dist.PrefixStore(f"round{round_}", store), rank=rank, world_size=world)
    model = None
    if MODE == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
        model(torch.ones(2, 4)).sum().backward()  # the gradient all-reduce is the last collective
    value = torch.ones(4)
    dist.all_reduce(value)
    sums.append(value.sum().item())
    del value  # the collective's tensor dies before the group does
    if MODE == "nm":
        nm.destroy_distributed()
    else:
        dist.destroy_process_group()
    del model  # DDP's hold on the group goes last
Path(os.environ["OUT_DIR"], f"rank{rank}.json").write_text(json.dumps({"rounds": len(sums), "sums": sums}))
