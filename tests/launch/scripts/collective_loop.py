"""A training-script stand-in that is always inside a collective: all-reduce in a loop until ended.

Every rank joins the group, writes $OUT_DIR/rank{RANK}.json once it has all-reduced, then
all-reduces again and again; only the launcher (or a lost peer) ends it. A peer that disappears
makes the next all-reduce fail with the backend's connection error, which names the peer's address.
"""

import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

import npu_migrate as nm

info = nm.init_distributed()
value = torch.ones(1)
dist.all_reduce(value)
out = Path(os.environ["OUT_DIR"])
tmp = out / f".rank{info.rank}.json.tmp"
tmp.write_text(json.dumps({"rank": info.rank, "pid": os.getpid(), "sum": value.item()}))
tmp.replace(out / f"rank{info.rank}.json")
PACE_S = 0.05
"""A pause between all-reduces so that four ranks do not take a shared CI machine's cores."""
while True:
    dist.all_reduce(torch.ones(1))
    time.sleep(PACE_S)
