"""A script without a ``__main__`` guard, as many are: it runs under torchrun, whose ranks keep
Python's default start method (``fork`` on Linux before 3.14), so its DataLoader workers do not run
the script again. Writes $OUT_DIR/unguarded{RANK}.json with the samples each rank saw.
"""

import json
import multiprocessing
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

dist.init_process_group("gloo")
rank = dist.get_rank()
data = TensorDataset(torch.arange(24))
seen = sorted(int(x) for (batch,) in DataLoader(data, batch_size=5, num_workers=2) for x in batch)
total = torch.tensor([float(len(seen))])
dist.all_reduce(total)
Path(os.environ["OUT_DIR"], f"unguarded{rank}.json").write_text(json.dumps(
    {"rank": rank, "seen": seen, "total": total.item(), "start_method": multiprocessing.get_start_method()}))
dist.destroy_process_group()
