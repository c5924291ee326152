"""Test-only: a tiny DDP job (2 linear layers) for probe tests, with optional crash and NaN.

Usage::

    python -m npu_migrate.launch --device-num 2 --probe DIR tiny_train.py --steps 4
    ... tiny_train.py --steps 6 --kill-at 4      # rank 1 kills itself (SIGKILL) in step 4
    ... tiny_train.py --nan-at 3                 # the input of step 3 holds a NaN
    ... tiny_train.py --compile-a-function       # torch.compile(fn) first, as a script that compiles
"""

import argparse
import os
import signal

import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import npu_migrate as nm


class TinyNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.act = nn.Tanh()
        self.fc2 = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--kill-at", type=int, default=0)
    parser.add_argument("--nan-at", type=int, default=0)
    parser.add_argument("--compile-a-function", action="store_true")
    args = parser.parse_args()
    if args.compile_a_function:  # never called: on torch 2.1 making it turns torch's step hooks off
        torch.compile(lambda t: t * 2)
    info = nm.init_distributed()
    nm.seed_everything(0)
    model = DDP(TinyNet().to(info.device), device_ids=info.device_ids)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1 + info.rank)
    for step in range(1, args.steps + 1):
        x = torch.randn(4, 8, generator=gen)
        if step == args.nan_at:
            x[0, 0] = float("nan")
        y = torch.randn(4, 2, generator=gen)
        if step == args.kill_at and info.rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        loss = nn.functional.mse_loss(model(x.to(info.device)), y.to(info.device))
        opt.zero_grad()
        loss.backward()
        opt.step()
    nm.destroy_distributed()


if __name__ == "__main__":
    main()
