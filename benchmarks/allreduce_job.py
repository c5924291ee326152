"""The job both launchers run: join a gloo group, all-reduce once, leave. Plain torch only.

Prints one JSON line from rank 0 with seconds since BENCH_T0 (set by the benchmark just before it
starts the launcher) at script start, torch imported, group joined, all-reduce done, and (with
BENCH_OPTIMIZER=1) after building and stepping an Adam optimizer, as every training script does.
"""

import json
import os
import time

t_script = time.time()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

t_imported = time.time()
dist.init_process_group("gloo")
t_joined = time.time()
value = torch.ones(1)
dist.all_reduce(value)
t_done = time.time()
assert value.item() == dist.get_world_size()
if os.environ.get("BENCH_OPTIMIZER") == "1":  # what every training script does next
    model = torch.nn.Linear(4, 4)
    torch.optim.Adam(model.parameters()).step()
t_trained = time.time()
dist.destroy_process_group()
if os.environ["RANK"] == "0":
    t0 = float(os.environ["BENCH_T0"])
    print(json.dumps({
        "script_start": t_script - t0, "torch_imported": t_imported - t0,
        "joined": t_joined - t0, "all_reduced": t_done - t0, "optimizer_ready": t_trained - t0,
    }), flush=True)
