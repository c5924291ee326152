"""An mp.spawn script whose ranks print many lines at once, unbuffered (test fixture for whole lines)."""

import sys

import torch
import torch.multiprocessing as mp


def worker(rank: int, lines: int) -> None:
    x = torch.ones(2, device="cuda")
    for step in range(lines):
        print(f"ACCEPT-OK rank={rank} step={step} loss={x.sum().item() / (step + 1):.3f}")
    sys.stderr.write(f"rank {rank} done")  # no newline: it gets one


if __name__ == "__main__":
    mp.spawn(worker, args=(200,), nprocs=torch.cuda.device_count())
