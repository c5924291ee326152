"""The benchmark's baseline: seed 000's MNIST training loop, ported to npu_migrate and nothing more.

Usage::

    python -m npu_migrate.launch --device-num 2 benchmarks/mnist_seed000.py --data-dir DIR --epochs 3 --out FILE

As the seed writes it: torchvision's MNIST dataset with per-sample PIL ``ToTensor()`` and
``Normalize``, a DistributedSampler, one loader worker per process, a tqdm over
``enumerate(train_loader)`` and a printed loss every 10 batches. The model, optimizer and batch
size are examples/mnist.py's, so only the input pipeline differs. Rank 0 appends one JSON line
per epoch to --out with ``samples_per_sec`` measured as examples/mnist.py measures it (all ranks'
samples over the slowest rank's training-loop seconds).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler
from torchvision import datasets, transforms
from tqdm import tqdm

import npu_migrate as nm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from mnist import SimpleCNN  # noqa: E402 - the same model as the example


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", required=True, help="MNIST in torchvision's layout.")
    parser.add_argument("--epochs", type=int, default=3, help="Epochs (default: %(default)s).")
    parser.add_argument("--batch-size", type=int, default=32, help="Batch size per process (default: %(default)s).")
    parser.add_argument("--out", required=True, help="JSON Lines file for rank 0's rows.")
    parser.add_argument("--num-workers", type=int, default=1, help="Loader workers per process, 1 in the seed (default: %(default)s).")
    args = parser.parse_args()

    info = nm.init_distributed()
    torch.manual_seed(1)
    transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))])
    train_dataset = datasets.MNIST(args.data_dir, train=True, transform=transform)
    train_sampler = DistributedSampler(train_dataset)
    train_loader = DataLoader(train_dataset, sampler=train_sampler, batch_size=args.batch_size, num_workers=args.num_workers)
    model = DDP(SimpleCNN().to(info.device), device_ids=info.device_ids)
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)

    for epoch in range(1, args.epochs + 1):
        train_sampler.set_epoch(epoch)
        model.train()
        seen = 0
        nm.synchronize()
        start = time.perf_counter()
        for batch_idx, (data, target) in tqdm(enumerate(train_loader), disable=not info.is_main, file=sys.stdout):
            data, target = data.to(info.device), target.to(info.device)
            optimizer.zero_grad()
            output = model(data)
            loss = F.nll_loss(output, target)
            loss.backward()
            optimizer.step()
            seen += len(target)
            if batch_idx % 10 == 0 and info.is_main:
                print(f"Train Epoch: {epoch} [{batch_idx * len(data)}/{len(train_loader.dataset)}]\tLoss: {loss.item():.6f}")
        nm.synchronize()
        seconds = torch.tensor([time.perf_counter() - start], device=info.device)
        samples = torch.tensor([float(seen)], device=info.device)
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
        dist.all_reduce(samples)
        if info.is_main:
            with open(args.out, "a") as fh:
                fh.write(json.dumps({"epoch": epoch, "samples_per_sec": samples.item() / seconds.item()}) + "\n")
    nm.destroy_distributed()


if __name__ == "__main__":
    main()
