"""A rank that builds DDP after joining its group, trains a step, destroys the group and returns.

What is left when the interpreter is about to finalize is what the test reads: the handler below
is registered before npu_migrate is imported, so it runs after npu_migrate's exit hook (atexit
runs the last registered first), and writes $OUT_DIR/rank{RANK}.json with whether the group object
is still alive and the names of the process's threads (Linux), where gloo's show (pt_gloo_runloop,
gloo_tcp_loop). HOOK=0 leaves npu_migrate out: what torch alone leaves.
"""

import atexit
import importlib
import json
import os
import weakref
from pathlib import Path

GROUP = [lambda: None]


def _left_at_exit() -> None:
    tasks = Path("/proc/self/task")
    threads = sorted((t / "comm").read_text().strip() for t in tasks.iterdir()) if tasks.is_dir() else None
    Path(os.environ["OUT_DIR"], f"rank{os.environ['RANK']}.json").write_text(
        json.dumps({"rank": int(os.environ["RANK"]), "group_alive": GROUP[0]() is not None, "threads": threads}))


atexit.register(_left_at_exit)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

if os.environ.get("HOOK", "1") == "1":
    import npu_migrate  # noqa: F401, E402 - what ported code imports; installs the exit hook


def train() -> None:
    dist.init_process_group("gloo")
    GROUP[0] = weakref.ref(dist.group.WORLD)
    model = DDP(torch.nn.Linear(3, 1))  # on torch 2.14 this imports torch._dynamo, and torch.distributed.nn
    importlib.import_module("torch.distributed.nn")  # on every torch: its group=group.WORLD defaults are the group
    model(torch.ones(2, 3)).sum().backward()
    dist.destroy_process_group()


train()
