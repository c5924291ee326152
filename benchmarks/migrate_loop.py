"""The loop bench_migrate.py times: CUDA style (``--style cuda``) or written for the CPU (``--style cpu``).

Prints one JSON line: the median and mean seconds per training step after a warm-up.
"""

import argparse
import json
import statistics
import time

import torch
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("--style", choices=["cuda", "cpu"], required=True)
parser.add_argument("--steps", type=int, default=300)
args = parser.parse_args()

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
if args.style == "cuda":
    model = model.cuda()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
data = [(torch.randn(64, 64), torch.randint(0, 10, (64,))) for _ in range(16)]
times = []
for step in range(args.steps + 50):
    x, y = data[step % len(data)]
    t0 = time.perf_counter()
    if args.style == "cuda":
        x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
    loss = nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if args.style == "cuda":
        torch.cuda.synchronize()
    if step >= 50:
        times.append(time.perf_counter() - t0)
print(json.dumps({"median": statistics.median(times), "mean": statistics.fmean(times)}))
