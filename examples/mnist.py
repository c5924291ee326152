"""MNIST with DistributedDataParallel, or seed 002's manual gradient averaging, on an Ascend NPU, an NVIDIA GPU or a CPU.

Usage::

    python -m npu_migrate.launch --device-num 2 examples/mnist.py --dataset digits   # offline, about a minute on CPU
    python -m npu_migrate.launch --device-num 8 examples/mnist.py                    # MNIST under --data-dir
    torchrun --nproc-per-node 2 examples/mnist.py --grad-sync allreduce
    python examples/mnist.py --dry-run                                               # one process
    python -m npu_migrate.launch --device-num 8 examples/mnist.py --data-dir oss://bucket/datasets

``--data-dir`` (a directory, ``s3://bucket/prefix`` or ``oss://bucket/prefix``) holds torchvision's
MNIST files (``MNIST/raw/*-ubyte``), or seed 000's ``training.pt`` and ``test.pt`` (each a
``(images, labels)`` pair of tensors, as torchvision once saved them).

``--dataset digits`` needs no download: scikit-learn's 1797 real handwritten digits (8x8),
resized into MNIST's format (1x28x28, normalised like MNIST) with a fixed held-out split of 359.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import common
import npu_migrate as nm
from npu_migrate.log import log_rank0

logger = logging.getLogger(__name__)

MEAN, STD = 0.1307, 0.3081  # MNIST's pixel mean and standard deviation
DIGITS_HELD_OUT = 359       # of scikit-learn's 1797 digits; an odd count, so 2 ranks get unequal shares
SEED000_FILES = ("training.pt", "test.pt")  # seed 000's layout: (uint8 N x 28 x 28 images, labels) each
REMOTE_FILES = ("MNIST/raw/*", "MNIST/processed/*.pt", *SEED000_FILES)  # what a remote --data-dir may hold
OFFLINE = "--dataset digits (real handwritten digits bundled with scikit-learn) or --synthetic"


class SimpleCNN(nn.Module):
    """Seed 002's CNN: two 3x3 convolutions, dropout and two linear layers, for 1x28x28 inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, kernel_size=3, padding=1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(64 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2(x), 2))
        x = self.dropout1(torch.flatten(x, 1))
        x = self.dropout2(F.relu(self.fc1(x)))
        return F.log_softmax(self.fc2(x), dim=1)


def average_gradients(model: nn.Module) -> None:
    """Seed 002's gradient averaging: one all_reduce per parameter, then divide by the world size.

    DDP does the same in buckets, overlapped with the backward pass; this is the version to read.
    """
    world_size = dist.get_world_size()
    for param in model.parameters():
        if param.grad is not None:
            dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)
            param.grad /= world_size


def mnist_tensors(images: torch.Tensor, labels: torch.Tensor) -> common.TensorData:
    """uint8 N x 28 x 28 images -> normalised float N x 1 x 28 x 28, once for the whole set."""
    return common.TensorData(((images.float() / 255 - MEAN) / STD).unsqueeze(1), labels.long())


def load_digits() -> tuple[common.TensorData, common.TensorData]:
    """scikit-learn's 8x8 digits in MNIST's format, split into a fixed training and held-out set.

    MNIST centres each digit, scaled to 20x20, in a 28x28 frame; the 8x8 digits are enlarged to
    20x20 and framed the same way, then normalised with MNIST's mean and standard deviation.
    """
    from sklearn.datasets import load_digits as sklearn_digits

    digits = sklearn_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16  # 0..16 -> 0..1
    images = F.interpolate(images, size=(20, 20), mode="bilinear", align_corners=False).clamp(0, 1)
    images = F.pad(images, (4, 4, 4, 4))
    images = (images - MEAN) / STD
    labels = torch.tensor(digits.target, dtype=torch.long)
    order = torch.from_numpy(np.random.RandomState(0).permutation(len(labels)))  # fixed across versions
    test, train = order[:DIGITS_HELD_OUT], order[DIGITS_HELD_OUT:]
    return common.TensorData(images[train], labels[train]), common.TensorData(images[test], labels[test])


def load_data(args: argparse.Namespace, info: nm.DistInfo) -> tuple[common.TensorData, common.TensorData, str]:
    if args.synthetic:
        return (*common.synthetic_classification((1, 28, 28), 10, 4096, 1000), "synthetic MNIST-shaped data")
    if args.dataset == "digits":
        return (*load_digits(), "scikit-learn digits at 28x28")
    root = common.local_data_dir(args, info, REMOTE_FILES)  # a remote --data-dir: this node's copy
    seed000 = [Path(root) / name for name in SEED000_FILES]
    if all(path.exists() for path in seed000):
        (train_x, train_y), (test_x, test_y) = (torch.load(path, map_location="cpu", weights_only=True)
                                                for path in seed000)
        return mnist_tensors(train_x, train_y), mnist_tensors(test_x, test_y), "MNIST"
    from torchvision import datasets

    remote = args.data_dir if root != args.data_dir else None
    train, test = common.load_torchvision(datasets.MNIST, "MNIST", root, info, OFFLINE, remote=remote)
    return mnist_tensors(train.data, train.targets), mnist_tensors(test.data, test.targets), "MNIST"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_common_args(parser, epochs=10, batch_size=32, lr=1.0)
    parser.add_argument("--dataset", choices=["mnist", "digits"], default="mnist",
                        help="mnist: torchvision's MNIST under --data-dir; digits: scikit-learn's handwritten "
                             "digits, offline (default: %(default)s).")
    parser.add_argument("--grad-sync", choices=["ddp", "allreduce"], default="ddp",
                        help="ddp: DistributedDataParallel; allreduce: seed 002's one all_reduce per parameter "
                             "after backward (default: %(default)s).")
    parser.add_argument("--gamma", type=float, default=0.7,
                        help="Learning-rate decay per epoch (StepLR) (default: %(default)s).")
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = common.finish_args(parser, parser.parse_args(argv))
    info = common.start(args)
    train_set, test_set, name = load_data(args, info)
    # The whole set on the device, once: a batch is then an index_select, no host work at all.
    train_set, test_set = train_set.to(info.device), test_set.to(info.device)
    train_loader, test_loader = common.make_loaders(train_set, test_set, args, info)
    log_rank0(logger, "%s: %d training and %d held-out samples; %d process(es) on %s with %s, %s",
              name, len(train_set), len(test_set), info.world_size, info.device_type, info.backend, args.grad_sync)

    raw_model = SimpleCNN().to(info.device)
    if args.grad_sync == "ddp":
        model, after_backward = DDP(raw_model, device_ids=info.device_ids), None
    else:
        for tensor in raw_model.state_dict().values():  # start every rank from rank 0's weights
            dist.broadcast(tensor, src=0)
        model, after_backward = raw_model, average_gradients
    optimizer = torch.optim.Adadelta(model.parameters(), lr=args.lr)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=args.gamma)
    scaler = nm.grad_scaler(enabled=args.amp)  # a pass-through unless float16 needs loss scaling

    checkpoint = common.Checkpoint(args.checkpoint_dir, info, model=model, optimizer=optimizer,
                                   scheduler=scheduler, scaler=scaler, generator=train_loader.generator)
    done = checkpoint.resume() if args.resume else 0
    if checkpoint.note:
        log_rank0(logger, "%s", checkpoint.note)
    metrics = common.MetricsLog(args.metrics, info, done, args.resume)
    row = None
    for epoch in range(done + 1, args.epochs + 1):
        train = common.train_one_epoch(model, train_loader, optimizer, scaler, F.nll_loss, info, epoch=epoch,
                                       amp=args.amp, limit=args.limit_batches, after_backward=after_backward)
        test = common.evaluate(raw_model, test_loader, F.nll_loss, info, amp=args.amp, limit=args.limit_batches)
        lr = optimizer.param_groups[0]["lr"]
        scheduler.step()
        checkpoint.save(epoch)
        row = metrics.write(epoch, **train, **test, lr=lr, grad_sync=args.grad_sync)
        log_rank0(logger, "%s", common.epoch_line(row, args.epochs))
    if row is not None:
        log_rank0(logger, "test accuracy %.2f%% (%d/%d) on %s after %d epoch(s), %d process(es) on %s",
                  100 * row["test_accuracy"], row["test_correct"], row["test_samples"], name, row["epoch"],
                  info.world_size, info.device_type)
    nm.destroy_distributed()

if __name__ == "__main__":
    main()
