"""The job of bench_step_costs.py: the MNIST example's model on a fixed batch, with one way to synchronize.

``BENCH_SYNC`` is ``none`` (each rank steps alone), ``scalar`` (a 4-byte all-reduce after each
backward: the ranks wait for each other, no gradient moves), ``flat`` (the gradients all-reduced
as one tensor after the backward) or ``ddp`` (DistributedDataParallel, as examples/mnist.py trains).
Each rank writes ``BENCH_OUT/rank<R>.json``: its step times in ms after ``BENCH_WARMUP`` steps.
"""

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from mnist import SimpleCNN  # noqa: E402

sync = os.environ["BENCH_SYNC"]
steps, warmup = int(os.environ.get("BENCH_STEPS", "220")), int(os.environ.get("BENCH_WARMUP", "20"))
dist.init_process_group("gloo")
torch.manual_seed(0)
model = SimpleCNN()
params = list(model.parameters())
if sync == "ddp":
    model = torch.nn.parallel.DistributedDataParallel(model)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
inputs, targets = torch.randn(32, 1, 28, 28), torch.randint(0, 10, (32,))
scalar = torch.zeros(1)
times = []
for _ in range(steps):
    start = time.perf_counter()
    loss = torch.nn.functional.cross_entropy(model(inputs), targets)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if sync == "scalar":
        dist.all_reduce(scalar)
    elif sync == "flat":
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat)
        torch.nn.utils.vector_to_parameters(flat / dist.get_world_size(), [p.grad for p in params])
    optimizer.step()
    times.append((time.perf_counter() - start) * 1e3)
out = Path(os.environ["BENCH_OUT"]) / f"rank{dist.get_rank()}.json"
out.write_text(json.dumps({"ms": times[warmup:]}))
dist.destroy_process_group()
