"""A finished job that leaves its process group for the interpreter to finalize.

CASE says how:

- ``never``: torchrun-style; imports npu_migrate (as ported code does), all-reduces and exits
  without destroying its group;
- ``ddp``: the same, then trains a DDP step and destroys its group with torch's
  ``dist.destroy_process_group()`` while the DDP model still holds it.

Each rank writes $OUT_DIR/rank{RANK}.json before it exits; the test checks the exit status too,
which is where an abort during interpreter finalization shows (SIGABRT, "terminate called").
"""

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

import npu_migrate  # noqa: F401 - what ported code imports; installs the exit hook

dist.init_process_group("gloo")
rank = dist.get_rank()
value = torch.ones(3)
dist.all_reduce(value)
if os.environ["CASE"] == "ddp":  # DDP imports torch._dynamo: 2.5 s of CPU a rank, only where it is the case
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3, 3))
    model(torch.ones(2, 3)).sum().backward()
    dist.destroy_process_group()
Path(os.environ["OUT_DIR"], f"rank{rank}.json").write_text(json.dumps({"rank": rank, "sum": value.sum().item()}))
