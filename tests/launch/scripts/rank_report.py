"""A rank of a test job: join through npu_migrate, all-reduce once, report what it saw.

Writes $OUT_DIR/rank{RANK}.json. Run with torchrun's variables set (tests/conftest.run_ranks).
"""

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

import npu_migrate as nm

info = nm.init_distributed()
again = nm.init_distributed()  # idempotent: same answer, same group
value = torch.tensor([float(info.rank + 1)])
dist.all_reduce(value)
npu = getattr(torch, "npu", None)
report = {
    "rank": info.rank,
    "local_rank": info.local_rank,
    "world_size": info.world_size,
    "node_rank": info.node_rank,
    "device_type": info.device_type,
    "backend": info.backend,
    "group_backend": str(dist.get_backend()),
    "device": str(info.device),
    "current_device_index": nm.current_device_index(),
    "same_on_second_call": again == info,
    "all_reduce_sum": value.item(),
    "npu_set_device_calls": npu._state["set_device_calls"] if npu is not None and hasattr(npu, "_state") else None,
}
nm.destroy_distributed()
Path(os.environ["OUT_DIR"], f"rank{info.rank}.json").write_text(json.dumps(report))
