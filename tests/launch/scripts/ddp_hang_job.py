"""A DDP training-script stand-in for hang tests: rank 1 never reaches the backward of step 2.

Rank 0 then waits inside ``backward()`` for rank 1's gradients (DDP's all-reduce, issued from C++),
while rank 1 sleeps in Python. Each rank writes $OUT_DIR/at-end{RANK} when it stops training.
"""

import os
import time
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel

import npu_migrate as nm

info = nm.init_distributed()
out = Path(os.environ["OUT_DIR"])
model = DistributedDataParallel(torch.nn.Linear(4, 2))
with torch.no_grad():
    model(torch.ones(2, 4))  # evaluation records nothing
for step in range(3):
    if step == 2 and info.rank == 1:
        (out / f"at-end{info.rank}").touch()
        while True:
            time.sleep(0.05)  # stuck in Python: never reaches this step's backward
    model(torch.ones(2, 4)).sum().backward()
(out / f"at-end{info.rank}").touch()
nm.destroy_distributed()
