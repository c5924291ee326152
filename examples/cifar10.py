"""CIFAR-10 with ResNet-18 (seed 001) and DistributedDataParallel, on an Ascend NPU, an NVIDIA GPU or a CPU.

Usage::

    python -m npu_migrate.launch --device-num 8 examples/cifar10.py               # CIFAR-10 under --data-dir
    python -m npu_migrate.launch --device-num 2 examples/cifar10.py --synthetic --dry-run
    torchrun --nproc-per-node 2 examples/cifar10.py --amp

What it adds to mnist.py: torchvision's ResNet-18 adapted to 32x32 images, batch norm, random
crops and flips done on the device for a whole batch at once, SGD with Nesterov momentum and a
cosine schedule over --epochs (resume with the same --epochs to repeat a run exactly).
"""

from __future__ import annotations

import argparse
import logging

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import common
import npu_migrate as nm
from npu_migrate.log import log_rank0

logger = logging.getLogger(__name__)

MEAN = (0.4914, 0.4822, 0.4465)  # CIFAR-10's per-channel mean and standard deviation
STD = (0.2470, 0.2435, 0.2616)
REMOTE_FILES = ("cifar-10-batches-py/*",)  # torchvision's layout, as a remote --data-dir holds it
OFFLINE = "--synthetic (for real data offline, see examples/mnist.py --dataset digits)"


def resnet18_cifar(num_classes: int = 10) -> nn.Module:
    """torchvision's ResNet-18 for 32x32 inputs: a 3x3 stem with stride 1 and no max-pool.

    The ImageNet stem (7x7 stride 2, then max-pool) would shrink a 32x32 image to 8x8 before the
    first block; seed 001 resizes images to 224 instead, which costs 49 times the compute.
    """
    from torchvision.models import resnet18

    model = resnet18(weights=None, num_classes=num_classes)
    model.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
    model.maxpool = nn.Identity()
    return model


def cifar_tensors(images, labels) -> common.TensorData:
    """uint8 N x 32 x 32 x 3 (numpy) -> normalised float N x 3 x 32 x 32, once for the whole set."""
    x = torch.as_tensor(images).permute(0, 3, 1, 2).float() / 255
    mean, std = torch.tensor(MEAN).view(1, 3, 1, 1), torch.tensor(STD).view(1, 3, 1, 1)
    return common.TensorData((x - mean) / std, torch.as_tensor(labels, dtype=torch.long))


def augment(x: torch.Tensor) -> torch.Tensor:
    """Random 32x32 crops of the 4-pixel-padded images and random horizontal flips, per sample.

    One gather for the whole batch on the device, instead of PIL transforms per sample.
    """
    n, c, h, w = x.shape
    padded = F.pad(x, (4, 4, 4, 4))
    dy = torch.randint(0, 9, (n, 1), device=x.device)
    dx = torch.randint(0, 9, (n, 1), device=x.device)
    rows = dy + torch.arange(h, device=x.device)
    cols = dx + torch.arange(w, device=x.device)
    flip = torch.rand(n, 1, device=x.device) < 0.5
    cols = torch.where(flip, cols.flip(1), cols)
    batch = torch.arange(n, device=x.device).view(n, 1, 1, 1)
    channel = torch.arange(c, device=x.device).view(1, c, 1, 1)
    return padded[batch, channel, rows.view(n, 1, h, 1), cols.view(n, 1, 1, w)]


def load_data(args: argparse.Namespace, info: nm.DistInfo) -> tuple[common.TensorData, common.TensorData, str]:
    if args.synthetic:
        return (*common.synthetic_classification((3, 32, 32), 10, 2560, 500), "synthetic CIFAR-10-shaped data")
    from torchvision import datasets

    root = common.local_data_dir(args, info, REMOTE_FILES)  # a remote --data-dir: this node's copy
    remote = args.data_dir if root != args.data_dir else None
    train, test = common.load_torchvision(datasets.CIFAR10, "CIFAR-10", root, info, OFFLINE, remote=remote)
    return cifar_tensors(train.data, train.targets), cifar_tensors(test.data, test.targets), "CIFAR-10"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_common_args(parser, epochs=30, batch_size=128, lr=0.1)
    parser.add_argument("--momentum", type=float, default=0.9, help="SGD Nesterov momentum (default: %(default)s).")
    parser.add_argument("--weight-decay", type=float, default=5e-4, help="SGD weight decay (default: %(default)s).")
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = common.finish_args(parser, parser.parse_args(argv))
    info = common.start(args)
    train_set, test_set, name = load_data(args, info)
    train_set, test_set = train_set.to(info.device), test_set.to(info.device)
    train_loader, test_loader = common.make_loaders(train_set, test_set, args, info)
    log_rank0(logger, "%s: %d training and %d test samples; %d process(es) on %s with %s",
              name, len(train_set), len(test_set), info.world_size, info.device_type, info.backend)

    raw_model = resnet18_cifar().to(info.device)
    model = DDP(raw_model, device_ids=info.device_ids)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum,
                                weight_decay=args.weight_decay, nesterov=True)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(args.epochs, 1))
    scaler = nm.grad_scaler(enabled=args.amp)

    checkpoint = common.Checkpoint(args.checkpoint_dir, info, model=model, optimizer=optimizer,
                                   scheduler=scheduler, scaler=scaler, generator=train_loader.generator)
    done = checkpoint.resume() if args.resume else 0
    if checkpoint.note:
        log_rank0(logger, "%s", checkpoint.note)
    metrics = common.MetricsLog(args.metrics, info, done, args.resume)
    row = None
    for epoch in range(done + 1, args.epochs + 1):
        train = common.train_one_epoch(model, train_loader, optimizer, scaler, F.cross_entropy, info, epoch=epoch,
                                       amp=args.amp, limit=args.limit_batches, augment=augment)
        test = common.evaluate(raw_model, test_loader, F.cross_entropy, info, amp=args.amp, limit=args.limit_batches)
        lr = optimizer.param_groups[0]["lr"]
        scheduler.step()
        checkpoint.save(epoch)
        row = metrics.write(epoch, **train, **test, lr=lr)
        log_rank0(logger, "%s", common.epoch_line(row, args.epochs))
    if row is not None:
        log_rank0(logger, "test accuracy %.2f%% (%d/%d) on %s after %d epoch(s), %d process(es) on %s",
                  100 * row["test_accuracy"], row["test_correct"], row["test_samples"], name, row["epoch"],
                  info.world_size, info.device_type)
    nm.destroy_distributed()


if __name__ == "__main__":
    main()
